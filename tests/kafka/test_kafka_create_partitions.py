"""CreatePartitions (api 37) against a real `broker serve`, with the clients' own admin calls:
confluent-kafka, kafka-python 3 and aiokafka grow a topic; Kafka's refusals (the same count,
fewer, an unknown topic, a duplicate name, an assignment naming no broker of this node) come back
as Kafka's errors; `validate_only` changes nothing. The new partitions are served at once by the
cores that own them (`routing.shard_for`, two cores): librdkafka produces to every one and reads
it back, every core's Metadata and `kcat -L` show the new count, and a restart keeps it. The
clients cope with a topic that grows under them: a librdkafka consumer subscribed to it is given
the new partitions, and so is our own group consumer (its leader notices and rebalances), our
producer sends to a partition its cached metadata does not have yet."""

from __future__ import annotations

import asyncio
import datetime
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from broker.client import Consumer, Producer
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402

kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from test_kafka_errors import KafkaSocket  # noqa: E402  (tests/kafka)

KCAT = shutil.which("kcat")
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
        extra=("--group-initial-rebalance-delay-ms", "100"),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, proc.log()


def counts(admin: AdminClient) -> dict[str, int]:
    return {name: len(t.partitions) for name, t in admin.list_topics(timeout=10).topics.items()}


def error_of(future: object) -> str | None:
    try:
        future.result(timeout=15)  # type: ignore[attr-defined]
    except confluent_kafka.KafkaException as exc:
        return str(exc.args[0].name())
    return None


def test_confluent_admin_grows_a_topic_and_kafkas_refusals(server: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    admin.create_topics([NewTopic("grow", 2)])["grow"].result(15)
    assert admin.create_partitions([NewPartitions("grow", 5)])["grow"].result(15) is None
    assert counts(admin)["grow"] == 5
    # validate_only: checked, nothing changed
    assert admin.create_partitions([NewPartitions("grow", 9)], validate_only=True)["grow"].result(15) is None
    assert error_of(admin.create_partitions([NewPartitions("grow", 3)], validate_only=True)["grow"]) == (
        "INVALID_PARTITIONS"
    )
    assert counts(admin)["grow"] == 5
    assert error_of(admin.create_partitions([NewPartitions("grow", 5)])["grow"]) == "INVALID_PARTITIONS"
    assert error_of(admin.create_partitions([NewPartitions("grow", 4)])["grow"]) == "INVALID_PARTITIONS"
    assert error_of(admin.create_partitions([NewPartitions("nope", 4)])["nope"]) == "UNKNOWN_TOPIC_OR_PART"
    manual = NewPartitions("grow", 6, replica_assignment=[[1000]])  # no such broker here
    assert error_of(admin.create_partitions([manual])["grow"]) == "INVALID_REPLICA_ASSIGNMENT"
    assert counts(admin)["grow"] == 5
    assert "level=error" not in server.log()


def test_a_duplicate_name_is_invalid_request_and_the_rest_is_done(server: BrokerProcess) -> None:
    """librdkafka refuses duplicates before sending: the request is made by hand."""
    Wire(server.port).create_topic("dup", 1)
    Wire(server.port).create_topic("other", 1)
    schema = request_schema(37, 3)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["CreatePartitionsTopic"])
    topics = tuple(
        make(module.CreatePartitionsTopic, name=name, count=count, assignments=None)
        for name, count in (("dup", 2), ("other", 3), ("dup", 3))
    )
    conn = KafkaSocket(server.port)
    try:
        resp = conn.rpc(
            37, 3, make(schema, topics=topics, timeout=datetime.timedelta(0), validate_only=False)
        )
    finally:
        conn.close()
    assert [(r.name, r.error_code, r.error_message) for r in resp.results] == [
        ("dup", ErrorCode.invalid_request, "Duplicate topic name."),
        ("other", ErrorCode.none, None),
    ]
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert (counts(admin)["dup"], counts(admin)["other"]) == (1, 3)


def test_new_partitions_are_served_by_their_owning_cores_and_survive_a_restart(server: BrokerProcess) -> None:
    topic_id = Wire(server.port).create_topic("served", 1)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert admin.create_partitions([NewPartitions("served", 6)])["served"].result(15) is None
    # every core's Metadata (each core is a broker at its own port) shows the new count at once,
    # each partition led by the core `shard_for` names
    for core in range(server.cores):
        port = server.core_ports.get(core, server.port)
        each = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
        topic = each.list_topics("served", timeout=10).topics["served"]
        assert {p.id: p.leader for p in topic.partitions.values()} == {
            i: shard_for(topic_id, i, server.cores) for i in range(6)
        }
    if KCAT:
        out = subprocess.run(
            [KCAT, "-b", server.bootstrap, "-L", "-J", "-t", "served"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        [listed] = [t for t in json.loads(out)["topics"] if t["topic"] == "served"]
        assert len(listed["partitions"]) == 6
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
    for i in range(6):
        producer.produce("served", value=b"v%d" % i, partition=i)
    assert producer.flush(20) == 0
    assert read_all(server, "served", 6) == {i: [b"v%d" % i] for i in range(6)}
    assert server.stop() == 0
    server.start()
    assert counts(AdminClient({"bootstrap.servers": server.bootstrap}))["served"] == 6
    assert read_all(server, "served", 6) == {i: [b"v%d" % i] for i in range(6)}


def read_all(server: BrokerProcess, topic: str, partitions: int) -> dict[int, list[bytes]]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    out: dict[int, list[bytes]] = {i: [] for i in range(partitions)}
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, i, 0) for i in range(partitions)])
        deadline = time.monotonic() + 20
        while sum(map(len, out.values())) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out[msg.partition()].append(msg.value())
    finally:
        consumer.close()
    return out


def test_kafka_python_and_aiokafka_admins_grow_topics(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.errors import InvalidPartitionsError

    wire = Wire(server.port)
    wire.create_topic("kp", 1)
    wire.create_topic("aio", 1)
    wire.close()
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        kp.create_partitions({"kp": KpNewPartitions(total_count=3)})
        with pytest.raises(InvalidPartitionsError):
            kp.create_partitions({"kp": KpNewPartitions(total_count=2)})
    finally:
        kp.close()

    async def grow() -> None:
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin import NewPartitions as AioNewPartitions

        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap)
        await client.start()
        try:
            await client.create_partitions({"aio": AioNewPartitions(total_count=4)})
        finally:
            await client.close()

    asyncio.run(grow())
    got = counts(AdminClient({"bootstrap.servers": server.bootstrap}))
    assert (got["kp"], got["aio"]) == (3, 4)


def test_a_librdkafka_consumer_is_given_the_new_partitions(server: BrokerProcess) -> None:
    Wire(server.port).create_topic("subscribed", 1)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": server.bootstrap,
            "group.id": "growing",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    try:
        consumer.subscribe(["subscribed"])
        wait_assigned(consumer, 1)
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        assert admin.create_partitions([NewPartitions("subscribed", 3)])["subscribed"].result(15) is None
        wait_assigned(consumer, 3)
        producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap})
        producer.produce("subscribed", value=b"new", partition=2)
        assert producer.flush(20) == 0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                assert (msg.partition(), msg.value()) == (2, b"new")
                break
        else:
            pytest.fail("the record in the new partition was not read")
    finally:
        consumer.close()


def wait_assigned(consumer: object, n: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        consumer.poll(0.1)  # type: ignore[attr-defined]
        if len(consumer.assignment()) == n:  # type: ignore[attr-defined]
            return
    pytest.fail(f"assigned {consumer.assignment()}, not {n} partitions")  # type: ignore[attr-defined]


def test_our_clients_cope_with_a_topic_that_grows(server: BrokerProcess) -> None:
    Wire(server.port).create_topic("ours", 2)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    with (
        Producer(server.bootstrap) as producer,
        Consumer(
            server.bootstrap,
            group="ours-group",
            auto_offset_reset="earliest",
            metadata_max_age_ms=500,
            heartbeat_interval_ms=200,
            session_timeout_ms=6000,
        ) as consumer,
    ):
        producer.send("ours", b"before", partition=1).result(15)  # the count, 2, is cached now
        consumer.subscribe("ours")
        assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1]
        assert admin.create_partitions([NewPartitions("ours", 4)])["ours"].result(15) is None
        # a partition the producer's cached metadata does not have: asked again, then sent
        assert producer.send("ours", b"after", partition=3).result(15).offset == 0
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (3, b"after") not in got:
            got.extend((r.partition, r.value) for r in consumer.poll(timeout_ms=200))
        assert (1, b"before") in got and (3, b"after") in got, got
        assert sorted(tp.partition for tp in consumer.assignment()) == [0, 1, 2, 3]
        with pytest.raises(Exception, match="no partition 4"):
            producer.send("ours", b"never", partition=4).result(15)
