"""Producer id expiration (Kafka's producer.id.expiration.ms, KIP-854) against a real `broker
serve` with a short `--producer-id-expiration-ms`: an idempotent producer's state is kept while it
writes, forgotten once it has been idle that long (DescribeProducers no longer lists it, also
after a restart), and a confluent-kafka producer writing again after such a pause still delivers
every record once (the broker answers UNKNOWN_PRODUCER_ID; librdkafka bumps its epoch and
resends)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

EXPIRATION_MS = 2000  # the retention pass then runs every 2 s (broker/backends/backend_core.py)
CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]


@pytest.fixture(params=CONFIGS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    options = request.param
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        cores=options["cores"],
        backend=options["backend"],
        extra=("--producer-id-expiration-ms", str(EXPIRATION_MS)),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, proc.log()


def producers(server: BrokerProcess, topic: str) -> list[tuple[int, int, int]]:
    """(producer id, epoch, last sequence) of each producer partition 0 of `topic` holds, as
    Kafka's DescribeProducers tells them (kafka-python's admin client)."""
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        state = admin.describe_producers([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        admin.close()
    return [(p.producer_id, p.producer_epoch, p.last_sequence) for p in state.active_producers]


def test_an_idle_producer_is_forgotten_and_delivers_once_when_it_writes_again(server: BrokerProcess) -> None:
    topic_id = Wire(server.port).create_topic("expiring", 1)
    errors: list[Any] = []
    p = confluent_kafka.Producer(
        {"bootstrap.servers": server.bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )

    def send(value: bytes) -> None:
        p.produce("expiring", value, partition=0, on_delivery=lambda err, _m: err and errors.append(err))
        assert p.flush(20) == 0

    send(b"a0")
    [(pid, epoch, last)] = producers(server, "expiring")
    assert last == 0
    # writing every half expiration for more than two expirations (and two retention passes): kept
    for i in range(1, 6):
        time.sleep(EXPIRATION_MS / 2000)
        send(b"a%d" % i)
    assert producers(server, "expiring") == [(pid, epoch, 5)]
    # idle for the expiration and a pass past it: forgotten
    deadline = time.monotonic() + 20
    while producers(server, "expiring") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert producers(server, "expiring") == []
    assert "forgot 1 idle producer" in server.log()
    for i in range(5):
        send(b"b%d" % i)
    assert errors == []
    [(again, _epoch, last)] = producers(server, "expiring")
    assert again == pid and last == 4, "started over at sequence 0 (librdkafka bumped its epoch)"
    records = [r.value for r in Wire(server.port).fetch_all(topic_id, 0)]
    assert records == [b"a%d" % i for i in range(6)] + [b"b%d" % i for i in range(5)]


@pytest.mark.parametrize("server", [CONFIGS[0]], indirect=True)
def test_a_restart_does_not_bring_back_an_expired_producer(server: BrokerProcess) -> None:
    """The state is rebuilt from the log at start, each producer idle since the append time of
    the segment holding its last batch: one idle past the expiration is forgotten at once."""
    Wire(server.port).create_topic("restarted", 1)
    p = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap, "enable.idempotence": True})
    p.produce("restarted", b"x", partition=0)
    assert p.flush(20) == 0
    assert len(producers(server, "restarted")) == 1
    assert server.stop() == 0
    time.sleep(EXPIRATION_MS / 1000 + 0.5)
    server.start()
    assert producers(server, "restarted") == []


@pytest.mark.parametrize("server", [CONFIGS[0]], indirect=True)
def test_the_expiration_is_described_as_kafkas_broker_config(server: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    configs = admin.describe_configs([resource])[resource].result(15)
    assert configs["producer.id.expiration.ms"].value == str(EXPIRATION_MS)
