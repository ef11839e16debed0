"""TxnOffsetCommit v0-4 and OffsetFetch v6-7's require_stable, with raw kio requests on a real
core of either backend, served in this process: TxnOffsetCommit is answered but not advertised
until the transaction coordinator is wired (broker/kafka/groups.py NOT_ADVERTISED), so these
tests list it for the core they serve, and complete a transaction as its marker will
(`Core.complete_txn_offsets`, run on the core's loop).

Kafka's behaviour followed: GroupCoordinator handleTxnCommitOffsets (offsets pending per
producer id until the marker; v3+ member checks, KIP-447), GroupMetadataManager getOffsets
(UNSTABLE_OFFSET_COMMIT and offset -1 for a partition with pending offsets when asked with
require_stable)."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from inprocess import BACKENDS, Post, on_loop, served
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from broker.backends.backend_core import BackendCore
from broker.kafka.codec import make, request_schema
from broker.kafka.groups import TXN_OFFSET_COMMIT
from labkit.brokerproc import Wire
from labkit.kafka_requests import frame, read_response


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


def txn_commit(
    port: int,
    version: int,
    group: str,
    producer_id: int,
    offsets: dict[tuple[str, int], int],
    epoch: int = 0,
    generation: int = -1,
    member_id: str = "",
    instance_id: str | None = None,
) -> dict[tuple[str, int], ErrorCode]:
    schema = request_schema(TXN_OFFSET_COMMIT, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), o in offsets.items():
        by_topic.setdefault(topic, []).append(
            make(
                module.TxnOffsetCommitRequestPartition,
                partition_index=i32(p),
                committed_offset=i64(o),
                committed_leader_epoch=i32(-1),
                committed_metadata=f"m{o}",
            )
        )
    extra = {}
    if version >= 3:
        extra = {"generation_id": i32(generation), "member_id": member_id, "group_instance_id": instance_id}
    body = make(
        schema,
        transactional_id="tx",
        group_id=group,
        producer_id=i64(producer_id),
        producer_epoch=i16(epoch),
        topics=tuple(
            make(module.TxnOffsetCommitRequestTopic, name=t, partitions=tuple(ps))
            for t, ps in by_topic.items()
        ),
        **extra,
    )
    resp = kafka_rpc(port, TXN_OFFSET_COMMIT, version, body)
    return {(t.name, int(p.partition_index)): p.error_code for t in resp.topics for p in t.partitions}


def offset_fetch(
    port: int, version: int, group: str, topic: str, partitions: list[int], require_stable: bool = False
) -> dict[int, tuple[int, ErrorCode]]:
    schema = request_schema(9, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    topics = (
        make(module.OffsetFetchRequestTopic, name=topic, partition_indexes=tuple(map(i32, partitions))),
    )
    extra = {"require_stable": require_stable} if version >= 7 else {}
    resp = kafka_rpc(port, 9, version, make(schema, group_id=group, topics=topics, **extra))
    assert resp.error_code == ErrorCode.none
    return {
        int(p.partition_index): (int(p.committed_offset), p.error_code) for p in resp.topics[0].partitions
    }


def marker(post: Post, server: BackendCore, group: str, producer_id: int, commit: bool) -> object:
    """What a transaction marker's group target does on the group's coordinator core."""
    done = threading.Event()
    out: list[object] = []

    def answered(result: object) -> None:
        out.append(result)
        done.set()

    post(lambda: server.core.complete_txn_offsets(group, producer_id, commit, answered))
    assert done.wait(10)
    return out[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_txn_offsets_are_pending_until_the_marker_at_every_version(backend: str, tmp_path: Path) -> None:
    def client(port: int, server: BackendCore, post: Post) -> None:
        w = Wire(port)
        w.create_topic("t", 2)
        w.close()
        for version in range(5):
            group, pid = f"g{version}", 100 + version
            codes = txn_commit(
                port, version, group, pid, {("t", 0): 10, ("t", 1): 11, ("t", 5): 1, ("nope", 0): 1}
            )
            assert codes == {
                ("t", 0): ErrorCode.none,
                ("t", 1): ErrorCode.none,
                ("t", 5): ErrorCode.unknown_topic_or_partition,
                ("nope", 0): ErrorCode.unknown_topic_or_partition,
            }
            unstable = (-1, ErrorCode.unstable_offset_commit)
            assert offset_fetch(port, 7, group, "t", [0, 1], require_stable=True) == {
                0: unstable,
                1: unstable,
            }
            nothing = (-1, ErrorCode.none)
            for fetch_version in (5, 6, 7):  # not asked to be stable: nothing committed yet
                assert offset_fetch(port, fetch_version, group, "t", [0, 1]) == {0: nothing, 1: nothing}
            commit = version != 2  # one of them aborted
            assert marker(post, server, group, pid, commit) is True
            assert marker(post, server, group, pid, commit) is False  # a marker sent again
            want = {0: (10, ErrorCode.none), 1: (11, ErrorCode.none)} if commit else {0: nothing, 1: nothing}
            assert offset_fetch(port, 7, group, "t", [0, 1], require_stable=True) == want
            assert offset_fetch(port, 6, group, "t", [0, 1]) == want

    served(backend, tmp_path, client)


@pytest.mark.parametrize("backend", BACKENDS)
def test_member_checks_and_a_stale_epoch(backend: str, tmp_path: Path) -> None:
    """v3+ name the member the offsets were consumed as (KIP-447): a group without that member is
    refused as a commit would be; v0-2 (and v3+ naming nobody) are stored whatever the group."""

    def client(port: int, server: BackendCore, post: Post) -> None:
        w = Wire(port)
        w.create_topic("t", 1)
        w.close()
        for version in (3, 4):
            group = f"m{version}"
            refused = {("t", 0): ErrorCode.illegal_generation}  # a generation the group never had
            assert txn_commit(port, version, group, 7, {("t", 0): 5}, generation=4, member_id="m") == refused
            # generation -1 in a group without members: stored, as a plain commit is (the same check)
            stored = {("t", 0): ErrorCode.none}
            assert txn_commit(port, version, group, 7, {("t", 0): 5}, member_id="m") == stored
            # the group is known now (it has offsets, pending): a member it lacks is unknown
            unknown = {("t", 0): ErrorCode.unknown_member_id}
            assert txn_commit(port, version, group, 7, {("t", 0): 5}, generation=4, member_id="m") == unknown
        assert txn_commit(port, 4, "g", 7, {("t", 0): 5}, epoch=3) == {("t", 0): ErrorCode.none}
        for version in (0, 4):  # an older epoch of the producer than the one pending: a zombie
            assert txn_commit(port, version, "g", 7, {("t", 0): 6}, epoch=2) == {
                ("t", 0): ErrorCode.invalid_producer_epoch
            }
        assert txn_commit(port, 1, "", 7, {("t", 0): 6}) == {("t", 0): ErrorCode.invalid_group_id}
        store = server.core.coordinator.offsets
        assert on_loop(post, lambda: store.pending_for("g", [(1, 0)])) == {(1, 0)}

    served(backend, tmp_path, client)
