"""Kafka Metadata from kept topic entries (broker/kafka/metadata_entries.py, fast_encode's
Metadata) is byte for byte what kio writes for the whole view, at every version 0-12: on random
inputs, and through the adapter on one node and a cluster-shaped view, before and after each
change that alters an entry (create, delete, partitions added, a leader moved, a node down),
whether the change was this core's or another's (the registry file rewritten)."""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.core.cluster_view import ClusterView, NodeAddress, PartitionState
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.topics import TopicRegistry, invalid_topic_name
from broker.core.transactions import is_internal
from broker.core.views import MetadataView, kafka_broker_id
from broker.kafka import fast_encode
from broker.kafka.adapter import KafkaAdapter
from broker.kafka.codec import encode_response, make, request_schema, response_schema
from broker.kafka.metadata import live_brokers
from broker.kafka.metadata_entries import topic_uuid
from labkit.kafka_requests import frame as frame_of
from labkit.kafka_requests import request_of
from ringlog_proto.frames import ProtocolError

VERSIONS = range(fast_encode.METADATA_VERSIONS[0], fast_encode.METADATA_VERSIONS[1] + 1)
OMITTED = fast_encode.OPERATIONS_OMITTED
i32s = st.integers(-(2**31), 2**31 - 1)
ids = st.lists(i32s, max_size=4)


# ----------------------------------------------------------------------------- kio, the reference


def kio_topic(module: Any, code: int, name: str | None, topic_id: uuid.UUID | None, internal: bool,
              partitions: list[Any], operations: int) -> Any:  # fmt: skip
    return make(
        module.MetadataResponseTopic,
        error_code=ErrorCode(code),
        name=name,
        topic_id=topic_id,
        is_internal=internal,
        partitions=tuple(
            make(
                module.MetadataResponsePartition,
                error_code=ErrorCode(pcode),
                partition_index=index,
                leader_id=leader,
                leader_epoch=epoch,
                replica_nodes=tuple(replicas),
                isr_nodes=tuple(isr),
                offline_replicas=tuple(offline),
            )
            for pcode, index, leader, epoch, replicas, isr, offline in partitions
        ),
        topic_authorized_operations=operations,
    )


def kio_metadata(version: int, correlation_id: int, brokers: list[Any], cluster_id: str | None,
                 controller: int, topics: list[Any], cluster_operations: int) -> bytes:  # fmt: skip
    schema = response_schema(3, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    resp = make(
        schema,
        throttle_time=datetime.timedelta(0),
        brokers=tuple(
            make(module.MetadataResponseBroker, node_id=b, host=h, port=p, rack=r) for b, h, p, r in brokers
        ),
        cluster_id=cluster_id,
        controller_id=controller,
        topics=tuple(kio_topic(module, *t) for t in topics),
        cluster_authorized_operations=cluster_operations,
    )
    return b"".join(encode_response(correlation_id, resp))


def kio_answer(
    core: Core,
    cluster_id: str,
    version: int,
    correlation_id: int,
    names: list[str] | None,
    may_describe: Callable[[str], bool] | None = None,
) -> bytes:
    """What kio writes for the whole view (every partition built and encoded on the spot): the
    answer the handler gave before its entries were kept."""
    view: MetadataView = core.metadata_view(names)
    topics = []
    for t in view.topics:
        if may_describe is not None and not may_describe(t.name):
            if names is None:
                continue
            topics.append((ErrorCode.topic_authorization_failed, t.name, None, False, [], OMITTED))
            continue
        if not t.known:
            code = (
                ErrorCode.invalid_topic_exception
                if invalid_topic_name(t.name)
                else ErrorCode.unknown_topic_or_partition
            )
            topics.append((code, t.name, None, False, [], OMITTED))
            continue
        live = {n.node_id for n in view.nodes if n.live}
        parts = [
            (
                ErrorCode.none if p.leader_node >= 0 else ErrorCode.leader_not_available,
                p.index,
                kafka_broker_id(p.leader_node, p.owner_core) if p.leader_node >= 0 else -1,
                p.leader_epoch,
                [kafka_broker_id(n, c) for n, c in p.replicas],
                [kafka_broker_id(n, c) for n, c in p.isr],
                [kafka_broker_id(n, c) for n, c in p.replicas if n not in live],
            )
            for p in t.partitions
        ]
        topics.append(
            (ErrorCode.none, t.name, topic_uuid(cluster_id, t.topic_id), is_internal(t.name), parts, OMITTED)
        )
    controller = kafka_broker_id(view.controller, 0)
    return kio_metadata(version, correlation_id, live_brokers(view), cluster_id, controller, topics, OMITTED)


# ----------------------------------------------------------------------------- the encoder alone

partitions_st = st.lists(st.tuples(st.sampled_from([0, 5, 9]), i32s, i32s, i32s, ids, ids, ids), max_size=4)
brokers_st = st.lists(
    st.tuples(i32s, st.text(max_size=12), i32s, st.none() | st.text(max_size=8)), max_size=3
)


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    correlation_id=i32s,
    brokers=brokers_st,
    cluster_id=st.none() | st.text(max_size=22),
    controller=i32s,
    topics=st.lists(
        st.tuples(
            st.sampled_from([0, 3, 17, 29, 100]),
            st.text(max_size=20),
            st.none() | st.uuids(),
            st.booleans(),
            partitions_st,
            i32s,
        ),
        max_size=4,
    ),
    cluster_operations=i32s,
)
def test_metadata_response_random(
    version: int,
    correlation_id: int,
    brokers: list[Any],
    cluster_id: str | None,
    controller: int,
    topics: list[Any],
    cluster_operations: int,
) -> None:
    if version == 0:
        brokers = [(b, h, p, None) for b, h, p, _ in brokers]  # v0 has no rack: kio writes none
    entries = []
    for code, name, topic_id, internal, partitions, operations in topics:
        layout = fast_encode.metadata_layout(version)
        entry = fast_encode.metadata_topic(
            layout, code, name, topic_id.bytes if topic_id else None, internal, partitions
        )
        assert entry == fast_encode.metadata_topic(
            version, code, name, topic_id.bytes if topic_id else None, internal, partitions
        )  # one entry serves every version of its layout
        if version >= 8:
            entry = fast_encode.with_operations(version, entry, operations)
        entries.append(entry)
    ours = fast_encode.metadata_response(
        version, correlation_id, brokers, cluster_id, controller, entries, cluster_operations
    )
    assert len(ours) == 1
    assert ours[0] == kio_metadata(
        version, correlation_id, brokers, cluster_id, controller, topics, cluster_operations
    )


def test_an_unknown_topic_id_has_a_null_name() -> None:
    u, version = uuid.UUID(int=7), 12  # v10-11's name is not nullable: `metadata` refuses them
    entry = fast_encode.metadata_topic(version, ErrorCode.unknown_topic_id, None, u.bytes, False, ())
    topics = [(ErrorCode.unknown_topic_id, None, u, False, [], OMITTED)]
    ours = fast_encode.metadata_response(version, 3, [], "c", 0, [entry])
    assert ours[0] == kio_metadata(version, 3, [], "c", 0, topics, OMITTED)


def test_a_long_listing_counts_past_one_varint_byte() -> None:
    partitions = [(0, i, 0, 0, [0], [0], []) for i in range(300)]
    topics = [(0, f"t{i}", uuid.UUID(int=i + 1), False, partitions, OMITTED) for i in range(130)]
    for version in (9, 12):
        entries = [fast_encode.metadata_topic(version, c, n, u.bytes, i, p) for c, n, u, i, p, _ in topics]
        ours = fast_encode.metadata_response(version, 1, [(0, "h", 1, None)], "c", 0, entries)
        assert ours[0] == kio_metadata(version, 1, [(0, "h", 1, None)], "c", 0, topics, OMITTED)


# ----------------------------------------------------------------------------- through the adapter


@pytest.fixture
def adapter(tmp_path: Path) -> KafkaAdapter:
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=3, core_ports=(9100, 9101, 9102))
    return KafkaAdapter(Core(config), config)


def metadata_request(version: int, names: list[str] | None, **flags: bool) -> Any:
    schema = request_schema(3, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    wanted = (
        None
        if names is None
        else tuple(make(module.MetadataRequestTopic, name=n, topic_id=None) for n in names)
    )
    if version == 0 and names is None:
        wanted = ()  # v0: an empty list asks for every topic
    values = {
        "allow_auto_topic_creation": False,
        "include_cluster_authorized_operations": False,
        "include_topic_authorized_operations": False,
    }
    values.update(flags)
    return make(schema, topics=wanted, **values)


def handled(adapter: KafkaAdapter, version: int, names: list[str] | None, correlation_id: int = 5) -> bytes:
    outcome = adapter.handle(
        request_of(frame_of(3, version, correlation_id, metadata_request(version, names)))
    )
    return b"".join(outcome.buffers)  # type: ignore[union-attr]


def assert_every_version_is_kio_s(adapter: KafkaAdapter, names: list[str] | None = None) -> None:
    core = adapter.core
    cluster_id = adapter.ctx.cluster_id
    for version in VERSIONS:
        for _ in range(2):  # made, then kept
            assert handled(adapter, version, names) == kio_answer(core, cluster_id, version, 5, names), (
                version
            )


def test_one_node_every_version_across_changes(adapter: KafkaAdapter, tmp_path: Path) -> None:
    core = adapter.core
    assert_every_version_is_kio_s(adapter)  # no topic
    core.create_topic("orders", 5)
    core.create_topic("__transaction_state", 2)  # internal
    assert_every_version_is_kio_s(adapter)
    assert_every_version_is_kio_s(adapter, ["orders", "nope", "bad/name"])
    core.registry.create("later", 1)
    assert_every_version_is_kio_s(adapter)
    topic = core.registry.by_name["orders"]
    core.registry.replace_topic(dataclasses.replace(topic, partitions=9))  # partitions added
    assert_every_version_is_kio_s(adapter)
    core.registry.delete("later")
    assert_every_version_is_kio_s(adapter)
    core.registry.create("later", 3)  # the same name again: a new topic id
    assert_every_version_is_kio_s(adapter)
    # another core's change: the registry file rewritten under this core
    other = TopicRegistry(str(tmp_path), core.registry.topic_defaults, remove_orphans=False)
    with other.locked():
        other.load()
        other.delete("orders")
        other.create("orders", 2)
    assert_every_version_is_kio_s(adapter)
    assert core.registry.by_name["orders"].partitions == 2


def cluster_of(generation: int, states: dict[tuple[int, int], PartitionState], live: set[int]) -> ClusterView:
    nodes = {
        n: NodeAddress(n, f"node{n}", 9092 + n, tuple(9200 + 10 * n + k for k in range(n + 1)), f"rack{n}")
        for n in (0, 1, 2)
    }
    return ClusterView(
        node_id=0,
        generation=generation,
        clustered=True,
        nodes=nodes,
        partitions=states,
        controller=1,
        live=frozenset(live),
    )


def test_cluster_view_every_version_across_changes(adapter: KafkaAdapter) -> None:
    core = adapter.core
    orders = core.create_topic("orders", 3).topic_id
    logs = core.create_topic("logs", 2).topic_id
    states = {
        (orders, 0): PartitionState((0, 1, 2), 0, 3, (0, 1, 2)),
        (orders, 1): PartitionState((1, 2, 0), 1, 1, (1, 2)),
        # (orders, 2): no state written yet
        (logs, 0): PartitionState((2, 1), 2, 7, (2,)),
        (logs, 1): PartitionState((1, 0), -1, 2, ()),  # offline
    }
    core.cluster = cluster_of(1, states, {0, 1, 2})
    assert_every_version_is_kio_s(adapter)
    states[(orders, 0)] = PartitionState((0, 1, 2), 1, 4, (1, 2))  # the leader moved, ISR shrank
    core.cluster = cluster_of(2, states, {0, 1, 2})
    assert_every_version_is_kio_s(adapter)
    core.cluster = cluster_of(3, states, {0, 1})  # node 2 down: its replicas offline, no leader there
    assert_every_version_is_kio_s(adapter)
    states[(orders, 2)] = PartitionState((2, 0), 0, 1, (0, 2))
    core.cluster = cluster_of(4, states, {0, 1, 2})
    assert_every_version_is_kio_s(adapter, ["logs", "orders", "nope"])


def test_acls_filter_kept_entries_per_request(adapter: KafkaAdapter, monkeypatch: pytest.MonkeyPatch) -> None:
    core = adapter.core
    for name in ("seen", "hidden"):
        core.create_topic(name, 2)
    assert_every_version_is_kio_s(adapter)  # entries kept for every topic
    may = lambda name: name == "seen"  # noqa: E731
    authorizer = adapter.ctx.authorizer
    monkeypatch.setattr(authorizer, "enabled", True)
    monkeypatch.setattr(
        authorizer, "allowed", lambda principal, op, kind, name: op == "describe" and may(name)
    )
    for version in VERSIONS:
        for names in (None, ["seen", "hidden", "nope"]):
            expected = kio_answer(core, adapter.ctx.cluster_id, version, 5, names, may)
            assert handled(adapter, version, names) == expected


def test_authorized_operations_are_written_per_request(adapter: KafkaAdapter) -> None:
    core = adapter.core
    core.create_topic("orders", 2)
    for version in range(8, 13):
        plain = handled(adapter, version, None)
        asking = {"include_topic_authorized_operations": True, "include_cluster_authorized_operations": True}
        raw = frame_of(3, version, 5, metadata_request(version, None, **asking))
        asked = b"".join(adapter.handle(request_of(raw)).buffers)  # type: ignore[union-attr]
        assert len(asked) == len(plain) and asked != plain
        assert handled(adapter, version, None) == plain  # the kept entry still says "omitted"


@pytest.mark.parametrize("version", [10, 11])
def test_an_unknown_topic_id_before_v12_closes_the_connection(adapter: KafkaAdapter, version: int) -> None:
    schema = request_schema(3, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    wanted = (make(module.MetadataRequestTopic, name=None, topic_id=uuid.UUID(int=5)),)
    body = make(
        schema,
        topics=wanted,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    with pytest.raises(ProtocolError, match="unknown topic id"):
        adapter.handle(request_of(frame_of(3, version, 5, body)))
