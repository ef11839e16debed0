"""Committed offsets follow Kafka's coordinator (group-coordinator's OffsetMetadataManager): any
offset is stored and answered NONE, whatever the partition's log holds. One past the high
watermark (librdkafka's own test suite commits such offsets), 10^12, and a negative one (-5:
OffsetFetch then returns -5 as stored, and clients read a negative committed offset as none) are
accepted; nothing is compared with the log end. What it checks is the metadata's length (4096,
offset.metadata.max.bytes): OFFSET_METADATA_TOO_LARGE for that partition. Our protocol keeps the
same rules (one store): LIMIT_EXCEEDED for the metadata, and it refuses negative offsets (its
field is documented >= 0).

Both backends, one uvloop core and two io_uring cores (the group's coordinator core is then not
every partition's owner)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import frame, read_response
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch
from ringlog_proto.routing import coordinator_for

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

PARTITIONS = 4


@pytest.fixture(params=[("uvloop", 1), ("io_uring", 2)], ids=["uvloop-1core", "io_uring-2cores"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    backend, cores = request.param
    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", cores=cores, backend=backend).start()
    yield b
    assert b.stop() == 0, b.log()


def kafka_rpc(port: int, key: int, version: int, body: Any) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame(key, version, 7, body))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "the broker closed the connection"
            data += chunk
    corr, resp = read_response(key, version, data)
    assert corr == 7
    return resp


def commit(
    port: int,
    version: int,
    group: str,
    topic: str,
    offsets: dict[int, int],
    metadata: dict[int, str] | None = None,
) -> list[ErrorCode]:
    schema = request_schema(8, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    parts = tuple(
        make(
            module.OffsetCommitRequestPartition,
            partition_index=i32(p),
            committed_offset=o,
            committed_leader_epoch=i32(-1),
            committed_metadata=(metadata or {}).get(p, ""),
            commit_timestamp=-1,
        )
        for p, o in offsets.items()
    )
    body = make(
        schema,
        group_id=group,
        generation_id_or_member_epoch=i32(-1),
        member_id="",
        group_instance_id=None,
        retention_time_ms=-1,
        topics=(make(module.OffsetCommitRequestTopic, name=topic, partitions=parts),),
    )
    resp = kafka_rpc(port, 8, version, body)
    return [p.error_code for p in resp.topics[0].partitions]


def fetch(port: int, version: int, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    schema = request_schema(9, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    topics = (
        make(module.OffsetFetchRequestTopic, name=topic, partition_indexes=tuple(map(i32, partitions))),
    )
    resp = kafka_rpc(port, 9, version, make(schema, group_id=group, topics=topics))
    return {int(p.partition_index): int(p.committed_offset) for p in resp.topics[0].partitions}


def test_kafka_commits_are_stored_as_kafkas_coordinator_stores_them(broker: BrokerProcess) -> None:
    conf = {"bootstrap.servers": broker.bootstrap}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("k", PARTITIONS)])["k"].result(15)
    p = Producer(conf)
    for part in range(PARTITIONS):
        p.produce("k", b"x", partition=part)  # every partition's high watermark is 1
    p.flush(15)
    c = Consumer({**conf, "group.id": "kg", "enable.auto.commit": False})
    try:
        # past the high watermark: librdkafka's commit goes through, committed() reads it back
        beyond = [TopicPartition("k", 0, 2), TopicPartition("k", 1, 10**12), TopicPartition("k", 2, 1)]
        assert all(tp.error is None for tp in c.commit(offsets=beyond, asynchronous=False))
        got = {tp.partition: tp.offset for tp in c.committed([TopicPartition("k", i) for i in range(3)], 15)}
        assert got == {0: 2, 1: 10**12, 2: 1}
    finally:
        c.close()
    # negative offsets (librdkafka never sends one): stored and returned as they came, v2 and v7
    for version, group in ((2, "neg2"), (7, "neg7")):
        port = broker.core_ports[coordinator_for(group, broker.cores)]  # the group's coordinator core
        assert commit(port, version, group, "k", {0: -5, 1: 3}) == [ErrorCode.none, ErrorCode.none]
        for fetch_version in (1, 5, 6, 7):  # v6+ flexible, v7 with require_stable (no txn: the same)
            assert fetch(port, fetch_version, group, "k", [0, 1, 2]) == {0: -5, 1: 3, 2: -1}
    # what Kafka's coordinator does check: metadata over offset.metadata.max.bytes (4096), per
    # partition; the others of the request are stored
    port = broker.core_ports[coordinator_for("meta", broker.cores)]
    codes = commit(port, 7, "meta", "k", {0: 4, 1: 5}, {0: "m" * 4097, 1: "m" * 4096})
    assert codes == [ErrorCode.offset_metadata_too_large, ErrorCode.none]
    assert fetch(port, 5, "meta", "k", [0, 1]) == {0: -1, 1: 5}


def test_our_protocol_keeps_the_same_rule(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    try:
        tid = w.create_topic("t", 2)
        resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"v"])))
        assert resp.error == m.ErrorCode.NONE
        for p, offset in ((0, 2), (1, 10**12)):  # past each partition's high watermark (1 and 0)
            ok = w.rpc(m.OffsetCommitRequest(topic_id=tid, partition=p, group="g", offset=offset))
            assert ok.error == m.ErrorCode.NONE, ok
            got = w.rpc(m.OffsetFetchRequest(topic_id=tid, partition=p, group="g"))
            assert isinstance(got, m.OffsetFetchResponse) and got.offset == offset
        refused = w.rpc(m.OffsetCommitRequest(topic_id=tid, partition=0, group="g", offset=-5))
        assert refused.error == m.ErrorCode.INVALID_REQUEST
        long = w.rpc(
            m.OffsetCommitRequest(topic_id=tid, partition=0, group="g", offset=7, metadata="m" * 4097)
        )
        assert long.error == m.ErrorCode.LIMIT_EXCEEDED, long
        got = w.rpc(m.OffsetFetchRequest(topic_id=tid, partition=0, group="g"))
        assert isinstance(got, m.OffsetFetchResponse) and got.offset == 2
    finally:
        w.close()
