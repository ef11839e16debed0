"""A real `broker serve` answers every Kafka api and version kio knows, and fetches well.

- Every api key kio has, at its lowest and highest non-flexible and flexible versions, sent over
  one socket with empty values: each gets a response kio reads with the right correlation id, and
  the connection stays usable (a Metadata after each works). confluent-kafka's AdminClient calls
  for configs, ACLs and partitions (a shrink) end in errors, not hangs.
- OffsetForLeaderEpoch (v0-3): epoch 0 ends at the log end, a later one is undefined; librdkafka
  validating a seek with it reads on.
- Fetch waits on every partition it names (a record in the last of four wakes it), respects
  min_bytes, answers an incremental fetch session with FETCH_SESSION_ID_NOT_FOUND and
  read_committed with the last stable offset = the high watermark.

One broker per backend for the module (one core: every partition is this core's)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire, own_snapshot
from labkit.kafka_requests import build, frame, read_response

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewPartitions,
    ResourcePatternType,
    ResourceType,
)


@pytest.fixture(scope="module", params=["uvloop", "io_uring"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp(f"kerrors-{request.param}")
    proc = BrokerProcess(tmp / "data", tmp / "broker.log", backend=request.param).start()
    wire = Wire(proc.port)
    try:
        wire.create_topic("four", 4)
        wire.create_topic("one", 1)
        wire.create_topic("lep", 1)  # OffsetForLeaderEpoch's alone: its end offsets are exact
    finally:
        wire.close()
    yield proc
    assert proc.stop() == 0, proc.log()


class KafkaSocket:
    """One raw Kafka connection: kio-encoded requests, kio-decoded answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def send(self, key: int, version: int, body: Any) -> int:
        self.correlation += 1
        self.sock.sendall(frame(key, version, self.correlation, body))
        return self.correlation

    def recv(self, key: int, version: int, correlation: int) -> Any:
        size = struct.unpack(">i", self._exactly(4))[0]
        corr, resp = read_response(key, version, struct.pack(">i", size) + self._exactly(size))
        assert corr == correlation, (key, version, corr, correlation)
        return resp

    def rpc(self, key: int, version: int, body: Any, answer_version: int | None = None) -> Any:
        corr = self.send(key, version, body)
        return self.recv(key, version if answer_version is None else answer_version, corr)

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()


def edge_versions(key: int) -> list[int]:
    """The lowest and highest non-flexible and flexible versions kio has of `key`."""
    versions = sorted(schema_name_map[api_key_map[key]])
    out: set[int] = set()
    for flexible in (False, True):
        these = [v for v in versions if request_schema(key, v).__flexible__ == flexible]  # type: ignore[union-attr]
        if these:
            out |= {these[0], these[-1]}
    return sorted(out)


EDGES = [(key, version) for key in sorted(api_key_map) for version in edge_versions(key)]


def metadata_works(conn: KafkaSocket) -> None:
    schema = request_schema(3, 1)
    assert schema is not None
    resp = conn.rpc(3, 1, make(schema, topics=None))
    assert {t.name for t in resp.topics} >= {"four", "one"}


def test_every_api_and_version_is_answered_and_the_connection_stays(server: BrokerProcess) -> None:
    """Pipelined on one connection, each followed by a Metadata: every answer in order, read by
    kio with its own correlation id, and the Metadata after it answered too."""
    conn = KafkaSocket(server.port)
    metadata = request_schema(3, 1)
    assert metadata is not None
    try:
        sent = []
        for key, version in EDGES:
            schema = request_schema(key, version)
            assert schema is not None
            corr = conn.send(key, version, build(schema, **({"acks": 1} if key == 0 else {})))
            answer_version = 0 if key == 18 and version > 3 else version  # ApiVersions above ours: v0
            sent.append((key, answer_version, corr))
            sent.append((3, 1, conn.send(3, 1, make(metadata, topics=None))))
        for key, version, corr in sent:
            resp = conn.recv(key, version, corr)
            if key == 3 and version == 1:
                assert {t.name for t in resp.topics} >= {"four", "one"}
    finally:
        conn.close()
    assert "protocol error" not in server.log()


def test_confluent_admin_gets_errors_not_hangs(server: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    started = time.monotonic()
    calls = {
        "describe_configs": admin.describe_configs([ConfigResource(ResourceType.TOPIC, "four")]),
        "create_partitions": admin.create_partitions([NewPartitions("four", 2)]),  # not an increase
        "create_acls": admin.create_acls(
            [
                AclBinding(
                    ResourceType.TOPIC,
                    "four",
                    ResourcePatternType.LITERAL,
                    "User:alice",
                    "*",
                    AclOperation.READ,
                    AclPermissionType.ALLOW,
                )
            ]
        ),
        "describe_acls": admin.describe_acls(
            confluent_kafka.admin.AclBindingFilter(
                ResourceType.ANY,
                None,
                ResourcePatternType.ANY,
                None,
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        ),
    }
    describe_acls = calls.pop("describe_acls")
    described = calls.pop("describe_configs")  # answered now (broker/kafka/configs.py)
    for name, result in calls.items():
        futures = result.values() if isinstance(result, dict) else [result]
        for future in futures:
            with pytest.raises(confluent_kafka.KafkaException) as caught:
                future.result(timeout=15)
            assert caught.value.args[0].code() != confluent_kafka.KafkaError._TIMED_OUT, name
    # Without authentication ACLs are off: SECURITY_DISABLED, as a Kafka broker without an
    # authorizer answers (create_acls raised it above); librdkafka reports the DescribeAcls
    # answer's top-level error as an empty list, so nothing is listed
    assert describe_acls.result(timeout=15) == []
    for future in described.values():
        assert future.result(timeout=15)["retention.ms"].value is not None
    assert time.monotonic() - started < 15
    assert "four" in admin.list_topics(timeout=10).topics  # the client is still connected and served


# ----------------------------------------------------------------------------- OffsetForLeaderEpoch


def produce(server: BrokerProcess, topic: str, partition: int, count: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=partition)
    assert producer.flush(20) == 0


def test_offset_for_leader_epoch_every_version(server: BrokerProcess) -> None:
    produce(server, "lep", 0, 3)
    conn = KafkaSocket(server.port)
    try:
        for version in (2, 3):
            schema = request_schema(23, version)
            assert schema is not None
            module = __import__(schema.__module__, fromlist=["x"])
            topics = (
                make(
                    module.OffsetForLeaderTopic,
                    topic="lep",
                    partitions=tuple(
                        make(
                            module.OffsetForLeaderPartition,
                            partition=0,
                            current_leader_epoch=current,
                            leader_epoch=e,
                        )
                        for current, e in ((0, 0), (-1, 5), (1, 0), (0, -1))
                    ),
                ),
                make(
                    module.OffsetForLeaderTopic,
                    topic="nope",
                    partitions=(
                        make(
                            module.OffsetForLeaderPartition,
                            partition=0,
                            current_leader_epoch=-1,
                            leader_epoch=0,
                        ),
                    ),
                ),
            )
            resp = conn.rpc(23, version, make(schema, replica_id=-2, topics=topics))
            got = [
                (t.topic, [(p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions])
                for t in resp.topics
            ]
            assert got == [
                (
                    "lep",
                    [
                        (ErrorCode.none, 0, 3),
                        (ErrorCode.none, -1, -1),
                        (ErrorCode.unknown_leader_epoch, -1, -1),
                        (ErrorCode.none, -1, -1),
                    ],
                ),
                ("nope", [(ErrorCode.unknown_topic_or_partition, -1, -1)]),
            ]
        for version in (0, 1):  # kio has no v0-1: written by hand
            body = struct.pack(">hhih", 23, version, 9, 1) + b"t" + struct.pack(">ih", 1, 3) + b"lep"
            body += struct.pack(">iiiii", 2, 0, 0, 0, 7)
            conn.sock.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", conn._exactly(4))[0]
            data = conn._exactly(size)
            corr, topics_n, _ = struct.unpack_from(">iih", data)
            assert (corr, topics_n, data[10:13]) == (9, 1, b"lep")
            pos = 13 + 4
            rows = []
            for _ in range(2):
                if version == 1:
                    rows.append(struct.unpack_from(">hiiq", data, pos))
                    pos += 18
                else:
                    rows.append(struct.unpack_from(">hiq", data, pos))
                    pos += 14
            assert pos == size
            if version == 1:
                assert rows == [(0, 0, 0, 3), (0, 0, -1, -1)]
            else:
                assert rows == [(0, 0, 3), (0, 0, -1)]
        metadata_works(conn)
    finally:
        conn.close()


def test_librdkafka_validates_a_seek_with_offset_for_leader_epoch(server: BrokerProcess) -> None:
    produce(server, "four", 2, 5)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": "seek", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("four", 2, 0)])
        first = consumer.poll(10)
        assert first is not None and first.error() is None, first and first.error()
        before = own_snapshot(server.port)["requests"].get("kafka_23", 0)
        consumer.seek(confluent_kafka.TopicPartition("four", 2, 1, leader_epoch=0))
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.offset())
        assert got[:4] == [1, 2, 3, 4]
        assert own_snapshot(server.port)["requests"].get("kafka_23", 0) > before
    finally:
        consumer.close()


# ----------------------------------------------------------------------------- Fetch


def fetch_body(version: int, partitions: list[tuple[str, int, int]], **options: Any) -> Any:
    schema = request_schema(1, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    topics: dict[str, list[Any]] = {}
    for topic, index, offset in partitions:
        topics.setdefault(topic, []).append(
            make(
                module.FetchPartition,
                partition=index,
                current_leader_epoch=-1,
                fetch_offset=offset,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
        )
    values = {
        "replica_id": -1,
        "max_wait": 5000,
        "min_bytes": 1,
        "max_bytes": 1 << 24,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "forgotten_topics_data": (),
        "rack_id": "",
        **options,
    }
    import datetime

    values["max_wait"] = datetime.timedelta(milliseconds=values["max_wait"])
    return make(
        schema,
        topics=tuple(make(module.FetchTopic, topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
        **values,
    )


def ends(server: BrokerProcess, topic: str, partitions: int) -> list[int]:
    conn = KafkaSocket(server.port)
    try:
        resp = conn.rpc(1, 11, fetch_body(11, [(topic, p, 0) for p in range(partitions)], max_wait=0))
        return [p.high_watermark for t in resp.responses for p in t.partitions]
    finally:
        conn.close()


def test_fetch_of_four_partitions_wakes_when_the_last_grows(server: BrokerProcess) -> None:
    offsets = ends(server, "four", 4)
    conn = KafkaSocket(server.port)
    try:
        started = time.monotonic()
        corr = conn.send(1, 11, fetch_body(11, [("four", p, offsets[p]) for p in range(4)]))
        time.sleep(0.2)
        produce(server, "four", 3, 1)
        resp = conn.recv(1, 11, corr)
        took = time.monotonic() - started
        [topic] = resp.responses
        by_index = {p.partition_index: p for p in topic.partitions}
        assert by_index[3].records and by_index[3].high_watermark == offsets[3] + 1
        assert all(not by_index[p].records for p in range(3))
        assert took < 1.0, took
        metadata_works(conn)
    finally:
        conn.close()


def test_fetch_min_bytes_waits_for_enough_then_answers_at_the_deadline(server: BrokerProcess) -> None:
    offsets = ends(server, "four", 4)
    produce(server, "four", 0, 1)  # a few dozen bytes: less than min_bytes
    conn = KafkaSocket(server.port)
    try:
        started = time.monotonic()
        resp = conn.rpc(
            1,
            11,
            fetch_body(11, [("four", p, offsets[p]) for p in range(4)], max_wait=600, min_bytes=100_000),
        )
        took = time.monotonic() - started
        assert 0.5 <= took < 3, took
        [topic] = resp.responses
        assert [bool(p.records) for p in topic.partitions] == [True, False, False, False]
        # min_bytes reached at once: no wait
        started = time.monotonic()
        resp = conn.rpc(1, 11, fetch_body(11, [("four", 0, offsets[0])], max_wait=5000, min_bytes=10))
        assert time.monotonic() - started < 1 and resp.responses[0].partitions[0].records
        # an error answers at once (Kafka does so too)
        started = time.monotonic()
        resp = conn.rpc(1, 11, fetch_body(11, [("four", 1, offsets[1]), ("nope", 0, 0)], max_wait=5000))
        assert time.monotonic() - started < 1
        assert resp.responses[1].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
    finally:
        conn.close()


def test_fetch_sessions_and_read_committed(server: BrokerProcess) -> None:
    produce(server, "one", 0, 1)
    conn = KafkaSocket(server.port)
    try:
        # An incremental fetch of a session we never gave out: what Kafka answers an unknown one.
        resp = conn.rpc(1, 11, fetch_body(11, [("one", 0, 0)], session_id=1234, session_epoch=3))
        assert (resp.error_code, resp.session_id, resp.responses) == (
            ErrorCode.fetch_session_id_not_found,
            0,
            (),
        )
        # A full fetch asking for a new session (epoch 0): sessionless, full, session id 0.
        resp = conn.rpc(1, 11, fetch_body(11, [("one", 0, 0)], session_epoch=0, max_wait=0))
        assert (resp.error_code, resp.session_id) == (ErrorCode.none, 0)
        assert resp.responses[0].partitions[0].records
        # read_committed: no transactions, so the last stable offset is the high watermark.
        resp = conn.rpc(1, 11, fetch_body(11, [("one", 0, 0)], isolation_level=1, max_wait=0))
        p = resp.responses[0].partitions[0]
        assert p.last_stable_offset == p.high_watermark > 0 and p.aborted_transactions == ()
        assert p.records
    finally:
        conn.close()
