"""Stock Kafka clients against a real `broker serve`: kcat, confluent-kafka (librdkafka) and
kafka-python 3 on the same port as our own protocol, on both backends and with two cores.

Every core is a Kafka broker (node id = core id, its direct port) and each partition's leader is
its owning core (ringlog_proto.routing.shard_for), so the expected leaders are computed here from
the same function the broker uses."""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess

import pytest

from broker.client import Admin, Consumer, Producer
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import read_exactly
from ringlog_proto import messages as m
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

KCAT = shutil.which("kcat")
PARTITIONS = 4


def expected_brokers(broker: BrokerProcess) -> dict[int, int]:
    """node id -> port: every core, at its direct port."""
    return {core: broker.core_ports[core] for core in range(broker.cores)}


def make_topics(broker: BrokerProcess) -> dict[str, tuple[int, int]]:
    """Two topics made with our own protocol on the shared port: name -> (topic id, partitions)."""
    wire = Wire(broker.port)
    try:
        return {
            "orders": (wire.create_topic("orders", PARTITIONS), PARTITIONS),
            "audit": (wire.create_topic("audit", 1), 1),
        }
    finally:
        wire.close()


def leaders(topic_id: int, partitions: int, cores: int) -> dict[int, int]:
    return {p: shard_for(topic_id, p, cores) for p in range(partitions)}


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (scripts/setup.sh installs it)")
def test_kcat_lists_brokers_topics_and_leaders(broker: BrokerProcess) -> None:
    topics = make_topics(broker)
    out = subprocess.run(
        [KCAT, "-b", broker.bootstrap, "-L", "-m", "10"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    brokers = {int(n): int(port) for n, port in re.findall(r"broker (\d+) at 127\.0\.0\.1:(\d+)", out)}
    assert brokers == expected_brokers(broker), out
    assert re.search(r"broker 0 at \S+ \(controller\)", out), out
    for name, (topic_id, partitions) in topics.items():
        assert f'topic "{name}" with {partitions} partitions:' in out, out
        section = out.split(f'topic "{name}"', 1)[1].split("topic ", 1)[0]
        found = {int(p): int(lead) for p, lead in re.findall(r"partition (\d+), leader (\d+)", section)}
        assert found == leaders(topic_id, partitions, broker.cores), out
        for p, lead in found.items():
            assert f"partition {p}, leader {lead}, replicas: {lead}, isrs: {lead}" in section, out


def test_confluent_admin_list_topics(broker: BrokerProcess) -> None:
    topics = make_topics(broker)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    md = admin.list_topics(timeout=10)
    assert {b.id: b.port for b in md.brokers.values()} == expected_brokers(broker)
    assert {b.host for b in md.brokers.values()} == {"127.0.0.1"}
    assert md.controller_id == 0
    assert md.cluster_id and admin.list_topics(timeout=10).cluster_id == md.cluster_id  # stable
    assert set(md.topics) == set(topics)
    for name, (topic_id, partitions) in topics.items():
        t = md.topics[name]
        assert t.error is None
        assert {p.id: p.leader for p in t.partitions.values()} == leaders(topic_id, partitions, broker.cores)
        for p in t.partitions.values():
            assert p.replicas == [p.leader] and p.isrs == [p.leader]
    # librdkafka's admin handle is a producer, whose Metadata naming a topic allows creating it:
    # as on Kafka with auto.create.topics.enable (the default), asking creates it.
    asked = admin.list_topics("asked-for", timeout=10).topics["asked-for"]
    assert asked.error is None and len(asked.partitions) == 1
    assert "asked-for" in admin.list_topics(timeout=10).topics


def test_kafka_python_admin_and_consumer(broker: BrokerProcess) -> None:
    topics = make_topics(broker)
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        assert sorted(admin.list_topics()) == sorted(topics)
        cluster = admin.describe_cluster()
        assert {b["broker_id"]: b["port"] for b in cluster["brokers"]} == expected_brokers(broker)
        assert cluster["controller_id"] == 0
    finally:
        admin.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        assert consumer.topics() == set(topics)
        assert consumer.partitions_for_topic("orders") == set(range(PARTITIONS))
    finally:
        consumer.close()


def test_our_client_and_kafka_clients_share_the_port(broker: BrokerProcess) -> None:
    """Our protocol and Kafka's on one port, connections of both open at once."""
    admin = Admin(broker.bootstrap)
    kafka_admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        admin.create_topic("shared", partitions=2)
        with Producer(broker.bootstrap) as producer:
            producer.send("shared", b"hello", key=b"k")
        assert "shared" in kafka_admin.list_topics(timeout=10).topics
        with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.subscribe("shared")
            got = []
            for _ in range(50):
                got.extend(r.value for r in consumer.poll(timeout_ms=200))
                if got:
                    break
        assert got == [b"hello"]
        assert admin.list_topics() == ["shared"]
        assert "shared" in kafka_admin.list_topics(timeout=10).topics
    finally:
        admin.close()


def kafka_api_versions_v0(sock: socket.socket, correlation_id: int) -> int:
    """A raw ApiVersions v0 (header v1, client_id "t"): the error code of its answer."""
    body = struct.pack(">hhih", 18, 0, correlation_id, 1) + b"t"
    sock.sendall(struct.pack(">i", len(body)) + body)
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    reply = read_exactly(sock, size)
    corr, error = struct.unpack_from(">ih", reply)
    assert corr == correlation_id
    return int(error)


def closed_by_peer(sock: socket.socket, timeout: float = 5) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_first_frame_closes_only_that_connection(broker: BrokerProcess) -> None:
    ours = Wire(broker.port)
    theirs = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    bad = Wire(broker.port)
    try:
        assert kafka_api_versions_v0(theirs, 1) == 0
        assert isinstance(ours.rpc(m.ApiVersionsRequest()), m.ApiVersionsResponse)
        bad.sock.sendall(b"\x00\x00\x00\x10\x17garbage-garbage!")  # byte 4 neither 0x52 nor 0x00
        assert bad.closed_by_peer()
        assert broker.wait_for_log("begin neither a ringlog frame nor a Kafka request")
        # The others are served as before.
        assert kafka_api_versions_v0(theirs, 2) == 0
        assert isinstance(ours.rpc(m.MetadataRequest()), m.MetadataResponse)
    finally:
        ours.close()
        theirs.close()
        bad.close()


def test_unsupported_kafka_api_closes_with_one_line(broker: BrokerProcess) -> None:
    """ListOffsets v0 is not advertised and its response has no top-level error code: closed."""
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    try:
        assert kafka_api_versions_v0(sock, 1) == 0
        body = struct.pack(">hhih", 2, 0, 2, 1) + b"t" + struct.pack(">ii", -1, 0)
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert closed_by_peer(sock)
        assert broker.wait_for_log("kafka api 2 v0 is not supported")
    finally:
        sock.close()


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_below_v3_is_refused_per_partition(broker: BrokerProcess, version: int) -> None:
    """Produce v0-2 is advertised (librdkafka < 2.11 stops compressing otherwise) and refused with
    UNSUPPORTED_VERSION for each partition, in the response shape of the version asked."""
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    try:
        body = (
            struct.pack(">hhih", 0, version, 7, 1)
            + b"t"
            + struct.pack(">hii", 1, 1000, 1)
            + struct.pack(">h", 1)
            + b"x"
            + struct.pack(">iii", 1, 3, 0)
        )
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", read_exactly(sock, 4))
        data = read_exactly(sock, size)
        corr, topics, n = struct.unpack_from(">iih", data)
        assert (corr, topics, n, data[10:11]) == (7, 1, 1, b"x")
        parts, index, code, offset = struct.unpack_from(">iihq", data, 11)
        assert (parts, index, code, offset) == (1, 3, 35, -1)
        assert size == 4 + 4 + 2 + 1 + 4 + 4 + 2 + 8 + (8 if version >= 2 else 0) + (4 if version >= 1 else 0)
    finally:
        sock.close()
