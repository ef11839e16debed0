"""Kafka topic ids (Metadata v10-12, DeleteTopics v6) against a real `broker serve`: each topic's
UUID is the same from every core and after a restart, is what confluent-kafka's `describe_topics`
reports, names the topic in a Metadata or DeleteTopics by id (an unknown id is UNKNOWN_TOPIC_ID),
and DeleteTopics v4-6 keep Kafka's rules for names and ids given together, twice or not at all.
The clients still read metadata after the version bump: kcat -L (librdkafka 2.0.2),
confluent-kafka's, kafka-python 3's and aiokafka's topic listings, and the authorized operations
librdkafka asks Metadata for (describe_cluster, describe_topics)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.kafka.adapter import cluster_id_for
from broker.kafka.codec import make, request_schema
from broker.kafka.metadata_entries import topic_uuid
from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicCollection  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

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
        tmp_path / "data", tmp_path / "broker.log", cores=options["cores"], backend=options["backend"]
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, proc.log()


def librdkafka_text(u: uuid.UUID) -> str:
    """A UUID as librdkafka prints one (base64 without padding; Kafka's own is url-safe)."""
    return base64.b64encode(u.bytes).decode().rstrip("=")


def metadata(
    port: int, version: int, names: list[str] | None = None, ids: list[uuid.UUID] | None = None
) -> Any:
    schema = request_schema(3, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["MetadataRequestTopic"])
    topics = None
    if names is not None or ids is not None:
        topics = tuple(make(module.MetadataRequestTopic, name=n, topic_id=None) for n in names or ()) + tuple(
            make(module.MetadataRequestTopic, name=None, topic_id=i) for i in ids or ()
        )
    body = make(
        schema,
        topics=topics,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=True,
    )
    conn = KafkaSocket(port)
    try:
        return conn.rpc(3, version, body)
    finally:
        conn.close()


def test_topic_ids_are_stable_and_name_topics(server: BrokerProcess) -> None:
    topic_id = Wire(server.port).create_topic("ided", 3)
    expected = topic_uuid(cluster_id_for(str(server.data_dir)), topic_id)
    ports = [server.core_ports.get(c, server.port) for c in range(server.cores)]
    for port in ports:
        for version in (10, 11, 12):
            [t] = metadata(port, version, ["ided"]).topics
            assert (t.name, t.topic_id, t.error_code) == ("ided", expected, ErrorCode.none)
            assert t.topic_authorized_operations > 0  # asked for: every operation (ACLs off)
    stranger = uuid.UUID(int=12345)
    by_id = metadata(server.port, 12, ids=[expected, stranger]).topics
    assert [(t.name, t.topic_id, t.error_code) for t in by_id] == [
        ("ided", expected, ErrorCode.none),
        (None, stranger, ErrorCode.unknown_topic_id),
    ]
    assert len(by_id[0].partitions) == 3
    [unknown] = metadata(server.port, 12, ["nope"]).topics
    assert (unknown.error_code, unknown.topic_id) == (ErrorCode.unknown_topic_or_partition, None)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    described = admin.describe_topics(TopicCollection(["ided"]), include_authorized_operations=True)
    topic = described["ided"].result(15)
    assert str(topic.topic_id) == librdkafka_text(expected)
    assert topic.authorized_operations  # librdkafka reads them from Metadata
    assert admin.describe_cluster(include_authorized_operations=True).result(15).authorized_operations
    assert server.stop() == 0
    server.start()
    [t] = metadata(server.port, 12, ["ided"]).topics
    assert t.topic_id == expected


def test_metadata_readers_after_the_bump(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient

    Wire(server.port).create_topic("listed", 2)
    if KCAT:
        out = subprocess.run(
            [KCAT, "-b", server.bootstrap, "-L", "-J"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert {t["topic"]: len(t["partitions"]) for t in json.loads(out)["topics"]} == {"listed": 2}
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert len(admin.list_topics(timeout=10).topics["listed"].partitions) == 2
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        assert "listed" in kp.list_topics()
        [described] = kp.describe_topics(["listed"])
        assert len(described["partitions"]) == 2
    finally:
        kp.close()

    async def aio() -> list[Any]:
        from aiokafka.admin import AIOKafkaAdminClient

        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap)
        await client.start()
        try:
            return await client.describe_topics(["listed"])
        finally:
            await client.close()

    [t] = asyncio.run(aio())
    assert len(t["partitions"]) == 2


def delete(port: int, version: int, topics: list[tuple[str | None, uuid.UUID | None]]) -> list[Any]:
    schema = request_schema(20, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["DeleteTopicState"])
    if version < 6:
        body = make(schema, topic_names=tuple(n for n, _ in topics), timeout=datetime.timedelta(seconds=10))
    else:
        states = tuple(make(module.DeleteTopicState, name=n, topic_id=i) for n, i in topics)
        body = make(schema, topics=states, timeout=datetime.timedelta(seconds=10))
    conn = KafkaSocket(port)
    try:
        return list(conn.rpc(20, version, body).responses)
    finally:
        conn.close()


def test_delete_topics_by_name_and_by_id(server: BrokerProcess) -> None:
    wire = Wire(server.port)
    ids = {name: wire.create_topic(name, 1) for name in ("a", "b", "c", "d", "e")}
    wire.close()
    cluster_id = cluster_id_for(str(server.data_dir))
    u = {name: topic_uuid(cluster_id, i) for name, i in ids.items()}
    stranger = uuid.UUID(int=99)
    got = delete(
        server.port,
        6,
        [
            ("a", None),
            (None, u["b"]),
            ("c", u["c"]),
            (None, stranger),
            (None, None),
            ("d", None),
            ("d", None),
        ],
    )
    answered = {(r.name, r.topic_id): (r.error_code, r.error_message) for r in got}
    assert answered == {
        ("a", u["a"]): (ErrorCode.none, None),
        ("b", u["b"]): (ErrorCode.none, None),
        ("c", u["c"]): (ErrorCode.invalid_request, "You may not specify both topic name and topic id."),
        (None, stranger): (ErrorCode.unknown_topic_id, None),
        (None, None): (ErrorCode.invalid_request, "Neither topic name nor id were specified."),
        ("d", None): (ErrorCode.invalid_request, "Duplicate topic name."),
    }
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert set(admin.list_topics(timeout=10).topics) == {"c", "d", "e"}
    for version in (4, 5):
        [r] = delete(server.port, version, [("nope", None)])
        assert (r.name, r.error_code) == ("nope", ErrorCode.unknown_topic_or_partition)
    [r] = delete(server.port, 4, [("c", None)])
    assert (r.name, r.error_code) == ("c", ErrorCode.none)
    # confluent-kafka and kafka-python 3 delete with whatever version they choose
    assert admin.delete_topics(["d"], request_timeout=10)["d"].result(15) is None
    from kafka.admin import KafkaAdminClient

    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        kp.delete_topics(["e"])
    finally:
        kp.close()
    assert set(admin.list_topics(timeout=10).topics) == set()
