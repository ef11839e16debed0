"""Kafka transactions (KIP-98) against a real `broker serve`, with confluent-kafka's transactional
producer: commits and aborts interleaved, a read_committed consumer sees exactly the committed
records (in order, once) and a read_uncommitted one every record; a second producer with the
same transactional id fences the first (zombie fencing); a transaction timeout above the
broker's maximum is refused.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from kio.schema.errors import ErrorCode

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402, F811  (AdminClient)
from test_kafka_idempotence import KafkaWire  # noqa: E402  (tests/kafka)

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


@pytest.mark.parametrize(
    "broker",
    [{"cores": 2, "backend": "uvloop", "extra": ("--transaction-abort-interval-ms", "200")}],
    indirect=True,
)
def test_an_open_transaction_is_aborted_at_its_timeout(broker: BrokerProcess) -> None:
    """A producer that never ends its transaction: the coordinator aborts it after its timeout
    (fencing the producer with an epoch bump), so read_committed readers move past it."""
    Wire(broker.port).create_topic("tx-hung", 1)
    hung = txn_producer(broker, "tx-hung", **{"transaction.timeout.ms": 1000})
    hung.init_transactions(TIMEOUT_S)
    hung.begin_transaction()
    hung.produce("tx-hung", b"never-committed")
    assert hung.flush(TIMEOUT_S) == 0
    time.sleep(2.0)
    live = txn_producer(broker, "tx-other")
    live.init_transactions(TIMEOUT_S)
    live.begin_transaction()
    live.produce("tx-hung", b"committed")
    live.commit_transaction(TIMEOUT_S)
    assert consume_all(broker, "tx-hung", "read_committed", 1) == [b"committed"]


@pytest.mark.parametrize("broker", CONFIGS[2:], indirect=True)
def test_consume_transform_produce_commits_offsets_with_the_transaction(broker: BrokerProcess) -> None:
    """send_offsets_to_transaction (AddOffsetsToTxn, TxnOffsetCommit): the group's offsets are
    committed by the commit's marker and dropped by an abort's (KIP-447's group metadata)."""
    w = Wire(broker.port)
    w.create_topic("tx-in", 1)
    w.create_topic("tx-out", 1)
    src = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(4):
        src.produce("tx-in", f"in-{i}".encode())
    assert src.flush(TIMEOUT_S) == 0
    group = "tx-ctp"
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe(["tx-in"])
    p = txn_producer(broker, "tx-ctp")
    p.init_transactions(TIMEOUT_S)
    try:
        got: list[confluent_kafka.Message] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg)
        assert len(got) == 4
        for commit, batch in ((True, got[:2]), (False, got[2:])):
            p.begin_transaction()
            for msg in batch:
                p.produce("tx-out", b"out-" + msg.value())
            assert p.flush(TIMEOUT_S) == 0
            offsets = [confluent_kafka.TopicPartition("tx-in", 0, batch[-1].offset() + 1)]
            p.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), TIMEOUT_S)
            if commit:
                p.commit_transaction(TIMEOUT_S)
            else:
                p.abort_transaction(TIMEOUT_S)
        committed = consumer.committed([confluent_kafka.TopicPartition("tx-in", 0)], TIMEOUT_S)
        assert committed[0].offset == 2  # the committed transaction's, not the aborted one's
    finally:
        consumer.close()
    assert consume_all(broker, "tx-out", "read_committed", 2) == [b"out-in-0", b"out-in-1"]


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_the_state_topic_is_internal(broker: BrokerProcess) -> None:
    """__transaction_state, made by the first FindCoordinator of a transactional id: Metadata
    says internal, a client's produce is INVALID_TOPIC_EXCEPTION and its deletion is refused."""
    import sys

    topic_schema = sys.modules[request_schema(3, 9).__module__].MetadataRequestTopic
    kw = KafkaWire(broker.port)
    try:  # a Metadata naming it first does not auto-create it (Kafka's rule)
        resp = kw.call(
            3,
            9,
            topics=(make(topic_schema, name="__transaction_state"),),
            allow_auto_topic_creation=True,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        assert [str(t.name) for t in resp.topics] == ["__transaction_state"]
        assert resp.topics[0].error_code != ErrorCode.none
    finally:
        kw.close()
    txn_producer(broker, "tx-internal").init_transactions(TIMEOUT_S)
    kw = KafkaWire(broker.port)
    try:
        resp = kw.call(
            3,
            9,
            topics=None,
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    finally:
        kw.close()
    internal = {str(t.name): t.is_internal for t in resp.topics}
    assert internal["__transaction_state"] is True
    errors: list[object] = []
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "retries": 0})
    p.produce("__transaction_state", b"x", key=b"k", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(TIMEOUT_S)
    assert errors and errors[0].code() == confluent_kafka.KafkaError.TOPIC_EXCEPTION, errors
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(confluent_kafka.KafkaException):
        admin.delete_topics(["__transaction_state"])["__transaction_state"].result(TIMEOUT_S)


@pytest.mark.parametrize("broker", [CONFIGS[0], CONFIGS[3]], indirect=True)
def test_kill_9_mid_transaction(broker: BrokerProcess) -> None:
    """kill -9 with a transaction open: after the restart its records stay invisible to
    read_committed (the partition's walk finds it open, the LSO holds), the coordinator reloads
    the id's state from __transaction_state, and the next producer of the id aborts it (fencing
    the old epoch); what was committed before the kill is there once."""
    Wire(broker.port).create_topic("tx-kill", 2)
    old = txn_producer(broker, "tx-kill")
    old.init_transactions(TIMEOUT_S)
    old.begin_transaction()
    old.produce("tx-kill", b"before", partition=0)
    old.produce("tx-kill", b"before", partition=1)
    old.commit_transaction(TIMEOUT_S)
    old.begin_transaction()
    old.produce("tx-kill", b"open", partition=0)
    old.produce("tx-kill", b"open", partition=1)
    assert old.flush(TIMEOUT_S) == 0
    broker.kill()
    broker.start()
    new = txn_producer(broker, "tx-kill")
    new.init_transactions(TIMEOUT_S)
    new.begin_transaction()
    new.produce("tx-kill", b"after", partition=0)
    new.produce("tx-kill", b"after", partition=1)
    new.commit_transaction(TIMEOUT_S)
    got = consume_all(broker, "tx-kill", "read_committed", 4)
    assert sorted(got) == [b"after", b"after", b"before", b"before"]


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_aiokafka_and_kafka_python_transactions(broker: BrokerProcess) -> None:
    """The other Python clients' transactional producers (every txn API at v0, kafka-python 3 up
    to v3): a commit and an abort each, read_committed sees the commits only."""
    aiokafka = pytest.importorskip("aiokafka")
    kafka = pytest.importorskip("kafka")
    Wire(broker.port).create_topic("tx-py", 1)

    async def aio() -> None:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tx-aio")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait("tx-py", b"aio-committed")
            await p.begin_transaction()
            await p.send_and_wait("tx-py", b"aio-aborted")
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(aio())
    kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tx-kp")
    try:
        kp.init_transactions()
        kp.begin_transaction()
        kp.send("tx-py", b"kp-committed").get(TIMEOUT_S)
        kp.commit_transaction()
        kp.begin_transaction()
        kp.send("tx-py", b"kp-aborted").get(TIMEOUT_S)
        kp.abort_transaction()
    finally:
        kp.close(0)
    got = consume_all(broker, "tx-py", "read_committed", 2)
    assert got == [b"aio-committed", b"kp-committed"]
    assert len(consume_all(broker, "tx-py", "read_uncommitted", 4)) == 4


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_a_hanging_transaction_found_and_aborted_by_hand(broker: BrokerProcess) -> None:
    """KIP-664 by hand: ListTransactions and DescribeTransactions name an open transaction, its
    producer id, epoch and partitions; a WriteTxnMarkers abort (what Admin.abortTransaction
    sends) ends it on the partition, so read_committed readers move past it."""
    import sys

    from kio.static.primitive import i32, i64

    Wire(broker.port).create_topic("tx-hang", 1)
    hung = txn_producer(broker, "tx-hang")
    hung.init_transactions(TIMEOUT_S)
    hung.begin_transaction()
    hung.produce("tx-hang", b"hung")
    assert hung.flush(TIMEOUT_S) == 0
    kw = KafkaWire(broker.port)
    try:
        listed = kw.call(66, 1, state_filters=("Ongoing",), producer_id_filters=(), duration_filter=i64(-1))
        assert [(str(t.transactional_id), t.transaction_state) for t in listed.transaction_states] == [
            ("tx-hang", "Ongoing")
        ]
        (state,) = kw.call(65, 0, transactional_ids=("tx-hang",)).transaction_states
        assert (state.transaction_state, [(str(t.topic), t.partitions) for t in state.topics]) == (
            "Ongoing",
            [("tx-hang", (0,))],
        )
        module = sys.modules[request_schema(27, 1).__module__]
        marker = make(
            module.WritableTxnMarker,
            producer_id=state.producer_id,
            producer_epoch=state.producer_epoch,
            transaction_result=False,
            topics=(make(module.WritableTxnMarkerTopic, name="tx-hang", partition_indexes=(i32(0),)),),
            coordinator_epoch=i32(0),
        )
        resp = kw.call(27, 1, markers=(marker,))
        assert [p.error_code for t in resp.markers[0].topics for p in t.partitions] == [ErrorCode.none]
    finally:
        kw.close()
    other = txn_producer(broker, "tx-after")
    other.init_transactions(TIMEOUT_S)
    other.begin_transaction()
    other.produce("tx-hang", b"after")
    other.commit_transaction(TIMEOUT_S)
    assert consume_all(broker, "tx-hang", "read_committed", 1) == [b"after"]


@pytest.mark.parametrize(
    "broker",
    [{"cores": 1, "backend": "uvloop", "extra": ("--transactional-id-expiration-ms", "400")}],
    indirect=True,
)
def test_an_idle_transactional_id_expires(broker: BrokerProcess) -> None:
    """--transactional-id-expiration-ms (Kafka's transactional.id.expiration.ms): an id idle that
    long is forgotten, so its next InitProducerId gets a new producer id at epoch 0; before
    that, the same producer id at the next epoch."""
    import datetime

    from kio.static.primitive import i16, i64

    kw = KafkaWire(broker.port)

    def init() -> tuple[int, int]:
        resp = kw.call(
            22,
            4,
            transactional_id="tx-expiring",
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(-1),
            producer_epoch=i16(-1),
        )
        assert resp.error_code == ErrorCode.none
        return int(resp.producer_id), int(resp.producer_epoch)

    try:
        pid, epoch = init()
        assert init() == (pid, epoch + 1)  # idle for milliseconds: kept
        time.sleep(1.2)  # the expiry scan runs every 400 ms here
        new_pid, new_epoch = init()
        assert new_pid != pid and new_epoch == 0
    finally:
        kw.close()


HANG_FLAGS = (
    "--transaction-max-timeout-ms",
    "1000",  # librdkafka's least transaction.timeout.ms
    "--transaction-abort-interval-ms",
    "100",
    "--transaction-hang-check-interval-ms",
    "200",
)


def transactional_batch(pid: int, epoch: int, *values: bytes) -> bytes:
    import struct

    from crc32c import crc32c

    from ringlog_proto.batch import CRC_START, encode_batch
    from ringlog_proto.batch_header import TRANSACTIONAL_BIT

    out = bytearray(encode_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=0))
    struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def last_stable_offset(kw: KafkaWire, topic: str, partition: int) -> int:
    import sys

    from kio.static.primitive import i8, i32, i64

    module = sys.modules[request_schema(2, 5).__module__]
    latest = make(
        module.ListOffsetsPartition,
        partition_index=i32(partition),
        current_leader_epoch=i32(-1),
        timestamp=i64(-1),
    )
    resp = kw.call(
        2,
        5,
        replica_id=i32(-1),
        isolation_level=i8(1),
        topics=(make(module.ListOffsetsTopic, name=topic, partitions=(latest,)),),
    )
    (p,) = resp.topics[0].partitions
    assert p.error_code == ErrorCode.none
    return int(p.offset)


@pytest.mark.parametrize(
    "broker",
    [{**c.values[0], "extra": HANG_FLAGS} for c in (CONFIGS[1], CONFIGS[2])],
    indirect=True,
    ids=["io_uring-1core", "uvloop-2cores"],
)
def test_a_hanging_transaction_is_aborted_by_the_sweep(broker: BrokerProcess) -> None:
    """A transactional batch no coordinator knows of (a Produce naming a transactional id that
    never asked its coordinator, with an idempotent producer id): read_committed is stuck
    before it until the sweep (max timeout 1000 ms + 2 x 100 ms idle, a round every 200 ms)
    finds no coordinator holding it and aborts it; then a committed transaction after it is read.
    Each partition of the topic (both cores' on two cores) hangs and is freed."""
    import datetime
    import sys

    from kio.static.primitive import i16, i32

    from ringlog_proto.routing import shard_for

    tid = Wire(broker.port).create_topic("tx-ghost", 2)
    # a raw Kafka request goes to the core leading its partition (as Metadata says)
    wires = [KafkaWire(broker.core_ports.get(shard_for(tid, i, broker.cores), broker.port)) for i in range(2)]
    try:
        pid, epoch = wires[0].init_producer_id()
        module = sys.modules[request_schema(0, 8).__module__]
        for i, kw in enumerate(wires):
            records = transactional_batch(pid, epoch, b"ghost")
            data = make(
                module.TopicProduceData,
                name="tx-ghost",
                partition_data=(make(module.PartitionProduceData, index=i32(i), records=records),),
            )
            resp = kw.call(
                0,
                8,
                transactional_id="tx-ghost",
                acks=i16(-1),
                timeout=datetime.timedelta(seconds=10),
                topic_data=(data,),
            )
            assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none

        def stable() -> list[int]:
            return [last_stable_offset(kw, "tx-ghost", i) for i, kw in enumerate(wires)]

        assert stable() == [0, 0]
        deadline = time.monotonic() + TIMEOUT_S
        while stable() != [2, 2] and time.monotonic() < deadline:  # the batch, the marker
            time.sleep(0.1)
        assert stable() == [2, 2]
    finally:
        for kw in wires:
            kw.close()
    live = txn_producer(broker, "tx-live", **{"transaction.timeout.ms": 1000})
    live.init_transactions(TIMEOUT_S)
    live.begin_transaction()
    live.produce("tx-ghost", b"live", partition=1)
    live.commit_transaction(TIMEOUT_S)
    assert consume_all(broker, "tx-ghost", "read_committed", 1) == [b"live"]
    assert "hanging transaction aborted" in broker.log()


@pytest.mark.parametrize("broker", CONFIGS[2:], indirect=True)
def test_kill_9_between_prepare_commit_and_its_markers(broker: BrokerProcess) -> None:
    """The coordinator's core has written PrepareCommit and answered EndTxn, but the data
    partition's core is stopped (SIGSTOP: its marker cannot be written), then the broker is
    killed -9. At restart the coordinator loads the prepared transaction and sends its markers
    at once: read_committed sees it committed, whole."""
    import os
    import signal

    from kio.static.primitive import i8

    from ringlog_proto.routing import shard_for

    tid = Wire(broker.port).create_topic("tx-prep", 4)
    kw = KafkaWire(broker.port)
    try:
        found = kw.call(10, 1, key="tx-prep", key_type=i8(1))
        assert found.error_code == ErrorCode.none
    finally:
        kw.close()
    coordinator = next(c for c, port in broker.core_ports.items() if port == int(found.port))
    other = 1 - coordinator
    data = [i for i in range(4) if shard_for(tid, i, 2) == other]
    assert data, "no partition of the topic on the other core"
    p = txn_producer(broker, "tx-prep")
    p.init_transactions(TIMEOUT_S)
    p.begin_transaction()
    for i in data:
        p.produce("tx-prep", f"prepared-{i}".encode(), partition=i)
    assert p.flush(TIMEOUT_S) == 0
    os.kill(broker.worker_pids[other], signal.SIGSTOP)
    try:
        p.commit_transaction(TIMEOUT_S)  # answered at PrepareCommit; the markers wait
        time.sleep(0.3)
        completed = "transactional id tx-prep: CompleteCommit"
        assert completed not in broker.log()
    finally:
        broker.kill()  # the stopped worker dies with the supervisor (SIGKILL needs no CONT)
    logged = len(broker.log())
    broker.start()
    got = consume_all(broker, "tx-prep", "read_committed", len(data))
    assert sorted(got) == sorted(f"prepared-{i}".encode() for i in data)
    assert completed in broker.log()[logged:]
