"""Auto topic creation against a real `broker serve`, with the clients stream processors use: a
producer writing to a topic nobody created gets it made with the broker's defaults
(`--default-partitions`), as Kafka's auto.create.topics.enable does; a consumer (which asks
Metadata not to create) and a request that does not allow it create nothing; off
(`--no-auto-create-topics`), the producer is told the topic is unknown instead of waiting in
silence; with ACLs, only a principal with create on the cluster or the topic creates it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from labkit.securitylab import Unavailable, add_user, broker_cli, sasl_conf, start_broker
from ringlog_proto import messages as m

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from test_kafka_errors import KafkaSocket  # noqa: E402  (tests/kafka)

DEFAULT_PARTITIONS = 3
CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]


@pytest.fixture(params=CONFIGS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    options = request.param
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        cores=options["cores"],
        backend=options["backend"],
        # a group's first join waits this long for more members (Kafka's default is 3 s), as in
        # tests/conftest.py's brokers
        extra=("--default-partitions", str(DEFAULT_PARTITIONS), "--group-initial-rebalance-delay-ms", "100"),
    ).start()
    yield proc
    assert proc.stop() == 0, proc.log()


def partitions_of(b: BrokerProcess, topic: str) -> int | None:
    """The topic's partition count as our protocol's Metadata tells it (None: no such topic);
    our Metadata never creates a topic."""
    wire = Wire(b.port)
    try:
        resp = wire.rpc(m.MetadataRequest((topic,)))
        assert isinstance(resp, m.MetadataResponse)
        for t in resp.topics:
            if t.name == topic and t.error == m.ErrorCode.NONE:
                return len(t.partitions)
        return None
    finally:
        wire.close()


def test_librdkafka_producer_creates_its_topic_with_the_default_partitions(broker: BrokerProcess) -> None:
    errors: list[Any] = []
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 15000})
    for i in range(10):
        p.produce("made-by-writing", b"v%d" % i, on_delivery=lambda err, _m: errors.append(err))
    assert p.flush(20) == 0
    assert errors == [None] * 10
    assert partitions_of(broker, "made-by-writing") == DEFAULT_PARTITIONS
    c = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "g", "auto.offset.reset": "earliest"}
    )
    try:
        c.subscribe(["made-by-writing"])
        got: list[bytes] = []
        for _ in range(200):
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            if len(got) == 10:
                break
        assert sorted(got) == sorted(b"v%d" % i for i in range(10))
    finally:
        c.close()


def test_a_consumer_of_a_missing_topic_creates_nothing(broker: BrokerProcess) -> None:
    """librdkafka's consumers ask Metadata not to create (allow.auto.create.topics=false)."""
    c = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g"})
    try:
        c.subscribe(["nobody-writes-here"])
        for _ in range(10):
            c.poll(0.2)
    finally:
        c.close()
    assert partitions_of(broker, "nobody-writes-here") is None


def test_aiokafka_and_kafka_python_producers_create_their_topics(broker: BrokerProcess) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    kafka = pytest.importorskip("kafka")

    async def with_aiokafka() -> None:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await p.start()
        try:
            md = await asyncio.wait_for(p.send_and_wait("made-by-aiokafka", b"a"), 20)
            assert md.offset == 0
        finally:
            await p.stop()

    asyncio.run(with_aiokafka())
    kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        md = kp.send("made-by-kafka-python", b"k").get(timeout=20)
        assert md.offset == 0
    finally:
        kp.close()
    assert partitions_of(broker, "made-by-aiokafka") == DEFAULT_PARTITIONS
    assert partitions_of(broker, "made-by-kafka-python") == DEFAULT_PARTITIONS


@pytest.mark.parametrize("broker", [CONFIGS[0]], indirect=True)
def test_metadata_creates_only_what_it_may(broker: BrokerProcess) -> None:
    """Raw Metadata: v4+ with allow_auto_topic_creation false creates nothing; v1 (which has no
    such field: Kafka creates) and v8 allowing it create; a listing of every topic never creates;
    an invalid name is INVALID_TOPIC_EXCEPTION and creates nothing."""
    conn = KafkaSocket(broker.port)
    try:

        def ask(version: int, names: list[str] | None, allow: bool = True) -> dict[str, int]:
            schema = request_schema(3, version)
            assert schema is not None
            topic = sys.modules[schema.__module__].MetadataRequestTopic
            topics = None if names is None else tuple(make(topic, name=n) for n in names)
            fields: dict[str, Any] = {
                "topics": topics,
                "allow_auto_topic_creation": allow,  # make() leaves it out of v0-3
                "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False,
            }
            resp = conn.rpc(3, version, make(schema, **fields))
            return {t.name: t.error_code for t in resp.topics}

        assert ask(8, ["kept-out"], allow=False) == {"kept-out": ErrorCode.unknown_topic_or_partition}
        assert partitions_of(broker, "kept-out") is None
        assert ask(1, ["by-v1"]) == {"by-v1": ErrorCode.none}
        assert ask(8, ["by-v8"]) == {"by-v8": ErrorCode.none}
        assert partitions_of(broker, "by-v8") == DEFAULT_PARTITIONS
        assert ask(8, ["bad name!"]) == {"bad name!": ErrorCode.invalid_topic_exception}
        assert set(ask(8, None)) == {"by-v1", "by-v8"}
    finally:
        conn.close()


def test_off_a_producer_is_told_the_topic_is_unknown(tmp_path: Path) -> None:
    """librdkafka holds a record for an unknown topic `topic.metadata.propagation.max.ms` (30 s by
    default) in case it is being created, then fails it as unknown: shortened here."""
    off = BrokerProcess(tmp_path / "off", tmp_path / "off.log", extra=("--no-auto-create-topics",)).start()
    try:
        errors: list[Any] = []
        conf = {"bootstrap.servers": off.bootstrap, "topic.metadata.propagation.max.ms": 1000}
        p = confluent_kafka.Producer({**conf, "message.timeout.ms": 10000})
        p.produce("never-made", b"v", on_delivery=lambda err, _m: errors.append(err))
        p.flush(15)
        assert [e.code() for e in errors] == [KafkaError.UNKNOWN_TOPIC_OR_PART]  # the broker's answer
        assert partitions_of(off, "never-made") is None
    finally:
        assert off.stop() == 0, off.log()


PW = {"admin": "admin-secret", "alice": "alice-secret"}


def test_with_acls_creating_needs_create_on_the_cluster_or_the_topic(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for user, pw in PW.items():
        add_user(data, user, pw)
    for op in ("write", "describe"):
        broker_cli(data, "acls", "add", "User:alice", op, "topic:alice-", "--prefixed")
    broker_cli(data, "acls", "add", "User:alice", "create", "topic:alice-own")
    args = ("--sasl-mechanisms", "SCRAM-SHA-512", "--super-users", "User:admin")
    try:
        b = start_broker(tmp_path, "uvloop", args)
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        alice = sasl_conf(b, "alice", PW["alice"])

        def produce(topic: str) -> Any:
            errors: list[Any] = []
            p = confluent_kafka.Producer({**alice, "message.timeout.ms": 4000, "retries": 0})
            p.produce(topic, b"v", on_delivery=lambda err, _m: errors.append(err))
            p.flush(15)
            return errors[0]

        assert produce("alice-own") is None  # create on the topic
        refused = produce("alice-other")  # write and describe, but no create
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        admin = AdminClient(sasl_conf(b, "admin", PW["admin"]))
        topics = set(admin.list_topics(timeout=10).topics)
        assert "alice-own" in topics and "alice-other" not in topics
    finally:
        b.stop()
