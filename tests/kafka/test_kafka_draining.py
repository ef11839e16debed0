"""A node of a cluster that is draining (stopping gracefully, broker/cluster/agent.py) takes no
new group work, as a Kafka broker in controlled shutdown hands its coordinators over: its
FindCoordinator names another node, its JoinGroup and Heartbeat answer NOT_COORDINATOR (clients
look the coordinator up again and move on), and its Metadata no longer offers it as a broker.
The view is what the node's agent publishes; here it is set on a core directly."""

from __future__ import annotations

import datetime
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.core.cluster_view import ClusterView, NodeAddress
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Later, Reply
from broker.kafka.adapter import KafkaAdapter
from broker.kafka.codec import request_schema
from labkit.kafka_requests import build, frame, read_response, request_of
from ringlog_proto.routing import coordinator_node

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, METADATA = 10, 11, 12, 3
VIEW = ClusterView(
    node_id=1,
    generation=1,
    clustered=True,
    nodes={n: NodeAddress(n, f"10.0.0.{n}", 9092, (9100,)) for n in (1, 2)},
    live=frozenset({1, 2}),
)
GROUP = next(f"g{i}" for i in range(100) if coordinator_node(f"g{i}", [1, 2]) == 1)  # node 1's


@pytest.fixture
def adapter(tmp_path: Path) -> KafkaAdapter:
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=1, node_id=1)
    core = Core(config, call_later=lambda _delay, _callback: None)  # timers never fire here
    core.cluster = VIEW
    return KafkaAdapter(core, config)


def ask(adapter: KafkaAdapter, api: int, version: int, **fields: Any) -> Any:
    schema = request_schema(api, version)
    assert schema is not None
    outcome = adapter.handle(request_of(frame(api, version, 7, build(schema, **fields))))
    if isinstance(outcome, Later):
        answers: list[Reply] = []
        outcome.start(answers.append)  # type: ignore[arg-type]
        (outcome,) = answers
    assert isinstance(outcome, Reply)
    return read_response(api, version, b"".join(outcome.buffers))[1]


def join(adapter: KafkaAdapter) -> Any:
    schema = request_schema(JOIN_GROUP, 5)
    assert schema is not None
    protocol = sys.modules[schema.__module__].JoinGroupRequestProtocol
    return ask(
        adapter,
        JOIN_GROUP,
        5,
        group_id=GROUP,
        session_timeout=datetime.timedelta(seconds=10),
        rebalance_timeout=datetime.timedelta(seconds=10),
        member_id="",
        protocol_type="consumer",
        protocols=(build(protocol, name="range", metadata=b""),),
    )


def test_a_draining_node_hands_its_groups_over(adapter: KafkaAdapter) -> None:
    found = ask(adapter, FIND_COORDINATOR, 2, key=GROUP, key_type=0)
    assert (found.error_code, found.node_id, found.host) == (ErrorCode.none, 1000, "10.0.0.1")
    assert join(adapter).error_code == ErrorCode.member_id_required  # its coordinator: served

    adapter.core.cluster = replace(VIEW, generation=2, draining=frozenset({1}))
    found = ask(adapter, FIND_COORDINATOR, 2, key=GROUP, key_type=0)
    assert (found.error_code, found.node_id, found.host) == (ErrorCode.none, 2000, "10.0.0.2")
    assert join(adapter).error_code == ErrorCode.not_coordinator
    beat = ask(adapter, HEARTBEAT, 3, group_id=GROUP, generation_id=1, member_id="m")
    assert beat.error_code == ErrorCode.not_coordinator
    brokers = ask(adapter, METADATA, 8, topics=()).brokers
    assert [b.node_id for b in brokers] == [2000]  # node 2's one core; node 1 is not offered
