"""Kafka transactions (KIP-98) against a real `broker serve`, with confluent-kafka's transactional
producer: commits and aborts interleaved, a read_committed consumer sees exactly the committed
records (in order, once) and a read_uncommitted one every record; a second producer with the
same transactional id fences the first (zombie fencing); a transaction timeout above the
broker's maximum is refused.
"""

from __future__ import annotations

import time
import uuid

import pytest

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 1, "backend": "io_uring"}, id="io_uring-1core"),
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2cores"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
TIMEOUT_S = 20


def txn_producer(broker: BrokerProcess, txn_id: str, **extra: object) -> confluent_kafka.Producer:
    return confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id, **extra}
    )


def consume_all(broker: BrokerProcess, topic: str, isolation: str, expect: int) -> list[bytes]:
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        idle = 0
        while idle < 4 and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                idle += 1 if len(got) >= expect else 0
                continue
            if msg.error():
                continue
            got.append(msg.value())
    finally:
        c.close()
    return got


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_commit_and_abort_read_committed(broker: BrokerProcess) -> None:
    Wire(broker.port).create_topic("tx-data", 4)
    p = txn_producer(broker, "tx-ck")
    p.init_transactions(TIMEOUT_S)
    committed: list[bytes] = []
    everything: list[bytes] = []
    for n in range(6):
        p.begin_transaction()
        batch = [f"t{n}-{i}".encode() for i in range(3)]
        for v in batch:
            p.produce("tx-data", v, partition=n % 4)
        everything += batch
        if n % 3 == 2:
            # written first: librdkafka's abort drops records it has not sent yet
            assert p.flush(TIMEOUT_S) == 0
            p.abort_transaction(TIMEOUT_S)
        else:
            p.commit_transaction(TIMEOUT_S)
            committed += batch
    # four partitions (on both cores of a two-core broker): each in order, none lost or repeated
    assert sorted(consume_all(broker, "tx-data", "read_committed", len(committed))) == sorted(committed)
    assert sorted(consume_all(broker, "tx-data", "read_uncommitted", len(everything))) == sorted(everything)


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_a_second_producer_fences_the_first(broker: BrokerProcess) -> None:
    Wire(broker.port).create_topic("tx-zombie", 1)
    old = txn_producer(broker, "tx-z")
    old.init_transactions(TIMEOUT_S)
    old.begin_transaction()
    old.produce("tx-zombie", b"zombie")
    old.flush(TIMEOUT_S)
    new = txn_producer(broker, "tx-z")
    new.init_transactions(TIMEOUT_S)  # aborts the old one's open transaction, bumps the epoch
    new.begin_transaction()
    new.produce("tx-zombie", b"live")
    new.commit_transaction(TIMEOUT_S)
    with pytest.raises(confluent_kafka.KafkaException) as info:
        old.commit_transaction(TIMEOUT_S)
    error = info.value.args[0]
    assert error.fatal() or error.txn_requires_abort(), error
    assert consume_all(broker, "tx-zombie", "read_committed", 1) == [b"live"]


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_a_timeout_above_the_maximum_is_refused(broker: BrokerProcess) -> None:
    p = txn_producer(broker, "tx-long", **{"transaction.timeout.ms": 900_001})
    with pytest.raises(confluent_kafka.KafkaException) as info:
        p.init_transactions(TIMEOUT_S)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.INVALID_TRANSACTION_TIMEOUT
