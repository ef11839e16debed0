"""Our Metadata from kept topic entries (broker/ringlog/metadata_entries.py) is byte for byte the
answer built and encoded whole from the core's view: one node and a cluster-shaped view, before
and after each change (create, delete, partitions added, configs altered, records produced, a
leader moved, a node down), a listing and topics named, ACLs leaving topics out."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.core.cluster_view import ClusterView, NodeAddress, PartitionState
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Reply
from broker.core.topic_configs import replacing
from broker.ringlog.adapter import RinglogAdapter
from broker.ringlog.topics import metadata_reply
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch


def whole(core: Core, names: tuple[str, ...], may_describe: Callable[[str], bool] | None = None) -> bytes:
    """The answer as it was made before entries were kept: every partition built and encoded."""
    view = core.metadata_view(names or None)
    refused = set() if may_describe is None else {t.name for t in view.topics if not may_describe(t.name)}
    shown = [t for t in view.topics if names or t.name not in refused]
    topics = tuple(
        m.TopicMetadata(m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, t.name, 0)
        if t.name in refused
        else m.TopicMetadata(
            m.ErrorCode.NONE if t.known else m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            t.name,
            t.topic_id,
            t.retention_ms,
            t.retention_bytes,
            t.segment_bytes,
            tuple(
                m.PartitionMetadata(
                    p.index,
                    p.owner_core,
                    p.start_offset,
                    p.end_offset,
                    p.leader_node,
                    p.leader_epoch,
                    p.replicas,
                    p.isr,
                )
                for p in t.partitions
            ),
        )
        for t in shown
    )
    resp = m.MetadataResponse(
        host=view.host,
        port=view.port,
        cores=view.cores,
        steering=view.steering,
        topics=topics,
        core_ports=view.core_ports,
        node_id=view.node_id,
        clustered=view.clustered,
        nodes=tuple(
            m.NodeMetadata(n.node_id, n.host, n.port, n.cores, n.core_ports, n.rack, n.live)
            for n in view.nodes
        ),
    )
    return b"".join(m.encode_response(resp, 7))


def kept(
    h: RinglogAdapter, names: tuple[str, ...], may_describe: Callable[[str], bool] | None = None
) -> bytes:
    req = m.MetadataRequest(names)
    frame = m.request_frame(req, 7)
    reply = metadata_reply(h.ctx, req, frame, may_describe)
    assert isinstance(reply, Reply)
    return b"".join(reply.buffers)


def assert_same(h: RinglogAdapter, names: tuple[str, ...] = ()) -> None:
    for _ in range(2):  # made, then kept
        assert kept(h, names) == whole(h.core, names)


@pytest.fixture
def handlers(tmp_path: Path):
    h = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path), cores=2, core_ports=(9100, 9101))))
    yield h
    h.core.close()


def produce(h: RinglogAdapter, topic_id: int, partition: int, n: int) -> None:
    outcome = h.handle(
        m.request_frame(m.ProduceRequest(topic_id, partition, m.Acks.WRITTEN, 1000, encode_batch([b"x"] * n)))
    )
    if isinstance(outcome, Append):  # this core's partition (another core's is answered with its number)
        run_ops(SyncFileIO(), outcome.pending.ops)
        outcome.complete()


def test_one_node_across_changes(handlers: RinglogAdapter) -> None:
    core = handlers.core
    assert_same(handlers)
    orders = core.create_topic("orders", 6).topic_id
    core.create_topic("logs", 1, {"retention.ms": "60000"})
    assert_same(handlers)
    for i in range(6):
        produce(handlers, orders, i, i + 1)  # offsets of this core's partitions move, the rest stay -1
    assert_same(handlers)
    assert_same(handlers, ("orders", "nope"))
    produce(handlers, orders, 0, 3)
    assert_same(handlers)
    core.alter_topic_configs("logs", replacing({"retention.ms": "120000"}))
    assert_same(handlers)
    core.registry.replace_topic(dataclasses.replace(core.registry.by_name["orders"], partitions=8))
    assert_same(handlers)
    core.registry.delete("logs")
    assert_same(handlers)


def test_cluster_view_across_changes(handlers: RinglogAdapter) -> None:
    core = handlers.core
    orders = core.create_topic("orders", 3).topic_id
    produce(handlers, orders, 0, 2)
    produce(handlers, orders, 1, 2)
    nodes = {n: NodeAddress(n, f"node{n}", 9092 + n, (9200 + n, 9300 + n), f"rack{n}") for n in (0, 1, 2)}
    states = {
        (orders, 0): PartitionState((0, 1, 2), 0, 3, (0, 1, 2)),
        (orders, 1): PartitionState((1, 2), 1, 1, (1,)),  # (orders, 2): no state yet
    }

    def view(generation: int, live: set[int]) -> ClusterView:
        return ClusterView(0, generation, True, nodes, dict(states), 1, frozenset(live))

    core.cluster = view(1, {0, 1, 2})
    assert_same(handlers)
    states[(orders, 0)] = PartitionState((0, 1, 2), 1, 4, (1, 2))
    states[(orders, 2)] = PartitionState((2, 0), 2, 1, (2, 0))
    core.cluster = view(2, {0, 1})
    assert_same(handlers)
    assert_same(handlers, ("orders",))


def test_acls_leave_topics_out_of_kept_entries(handlers: RinglogAdapter) -> None:
    core = handlers.core
    for name in ("seen", "hidden"):
        core.create_topic(name, 2)
    assert_same(handlers)

    def may(name: str) -> bool:
        return name == "seen"

    for names in ((), ("seen", "hidden", "nope")):
        assert kept(handlers, names, may) == whole(core, names, may)
