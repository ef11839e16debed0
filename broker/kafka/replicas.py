"""ElectLeaders (api 43, v0-2), AlterPartitionReassignments (api 45, v0) and
ListPartitionReassignments (api 46, v0), and the broker ids of replicas placed by hand
(CreateTopics' and CreatePartitions' assignments), as Kafka's controller answers them
(ReplicationControlManager: electLeaders, alterPartitionReassignments,
listPartitionReassignments, validateManualPartitionAssignment).

Rules this module keeps:
- Kafka's broker ids are cores (`views.kafka_broker_id`); a replica is a node. A broker id given
  names its node, whichever of the node's cores it is (the core holding a partition is
  `routing.owner`'s choice, not the client's): an id no registered node has is
  INVALID_REPLICA_ASSIGNMENT ("... no such broker is registered."), as are a list naming one
  broker twice or two cores of one node (a node holds one replica of a partition), and an empty
  list. Answers name each replica by the core that holds it, as Metadata does.
- CreateTopics' assignments follow Kafka's rules: num_partitions and replication_factor must be
  -1 (INVALID_REQUEST otherwise, with Kafka's messages), the partitions numbered 0..n-1 once
  each, every list of the same length; the first replica is the preferred leader.
- ElectLeaders: election type 0 preferred, 1 unclean (v0 has none: preferred); another is
  INVALID_REQUEST. Each partition is answered NONE (elected), ELECTION_NOT_NEEDED,
  PREFERRED_LEADER_NOT_AVAILABLE or ELIGIBLE_LEADERS_NOT_AVAILABLE, an unknown one
  UNKNOWN_TOPIC_OR_PARTITION. A null topic list is every partition of every topic, the answer
  leaving out those whose election was not needed (Kafka's rule). The answer waits (as
  CreateTopics does) until this node's view shows the leaders elected.
- AlterPartitionReassignments: per partition, a replica list starts (or replaces) a
  reassignment, null cancels the one under way (NO_REASSIGNMENT_IN_PROGRESS without one);
  ListPartitionReassignments lists those under way (replicas, adding, removing), of the topics
  and partitions asked or of every one (null), unknown ones left out.
- One node: every partition is this node's; an election is never needed, a reassignment can
  name only this node (nothing moves), and none is ever under way. A cluster: the store, off
  the loop (`ClusterCalls`), whose rules are broker/cluster/controller.py's.
- ACLs: alter on the cluster for ElectLeaders and AlterPartitionReassignments, describe on it
  for ListPartitionReassignments (broker/kafka/authorize.py), as Kafka's ControllerApis.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Sequence
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.cluster_view import PartitionState
from broker.core.core import Core
from broker.core.outcomes import Outcome, Reply
from broker.core.replica_changes import Election, ReplicaFault, ReplicaRefused
from broker.core.topics import Topic
from broker.core.views import kafka_broker_id
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error
from broker.kafka.unsupported import error_response
from ringlog_proto.routing import owner

ELECT_LEADERS: Final = 43
ALTER_PARTITION_REASSIGNMENTS: Final = 45
LIST_PARTITION_REASSIGNMENTS: Final = 46
VERSIONS: Final[dict[int, tuple[int, int]]] = {
    ELECT_LEADERS: (0, 2),  # v2 flexible
    ALTER_PARTITION_REASSIGNMENTS: (0, 0),  # flexible; v1 (KIP-860) is not answered
    LIST_PARTITION_REASSIGNMENTS: (0, 0),  # flexible
}
UNCLEAN: Final = "unclean.leader.election.enable"

Key = tuple[str, int]  # topic name, partition


# ----------------------------------------------------------------------------- broker ids


def nodes_by_broker(core: Core) -> dict[int, int]:
    """Kafka broker id -> node id, for every core of every node the cluster has registered (one
    node: this one's cores)."""
    view = core.cluster
    if view.clustered:
        return {kafka_broker_id(n.node_id, c): n.node_id for n in view.nodes.values() for c in range(n.cores)}
    me = core.config.node_id
    return {kafka_broker_id(me, c): me for c in range(core.config.cores)}


def replica_nodes(core: Core, broker_ids: Sequence[int]) -> tuple[int, ...]:
    """The nodes of a replica list given in broker ids (module rules), in the order given;
    raises `ReplicaRefused` (INVALID_REPLICA_ASSIGNMENT) with Kafka's message."""
    if not broker_ids:
        raise ReplicaRefused(
            ReplicaFault.ASSIGNMENT, "The manual partition assignment includes an empty replica list."
        )
    known = nodes_by_broker(core)
    by_node: dict[int, int] = {}
    for broker in sorted(int(b) for b in broker_ids):
        node = known.get(broker)
        if node is None:
            raise ReplicaRefused(
                ReplicaFault.ASSIGNMENT,
                f"The manual partition assignment includes broker {broker}, "
                "but no such broker is registered.",
            )
        if node in by_node:
            other = by_node[node]
            message = (
                f"The manual partition assignment includes the broker {broker} more than once."
                if other == broker
                else f"The manual partition assignment includes brokers {other} and {broker}, both "
                f"cores of node {node}: a node holds one replica of a partition."
            )
            raise ReplicaRefused(ReplicaFault.ASSIGNMENT, message)
        by_node[node] = broker
    return tuple(known[int(b)] for b in broker_ids)


def broker_of(core: Core, node: int, topic_id: int, partition: int) -> int:
    """The broker id (core) holding the partition's replica on `node`, as Metadata names it."""
    view = core.cluster
    address = view.nodes.get(node) if view.clustered else None
    cores = address.cores if address is not None else core.config.cores
    return kafka_broker_id(node, owner(topic_id, partition, range(cores)) if cores else 0)


def topic_assignment(core: Core, topic: Any) -> list[tuple[int, ...]] | None:
    """A CreateTopics topic's replicas placed by hand, as node ids per partition (None: none
    given). Raises ValueError (INVALID_REQUEST) or `ReplicaRefused` with Kafka's messages."""
    if not topic.assignments:
        return None
    if int(topic.replication_factor) != -1:
        raise ValueError(
            "A manual partition assignment was specified, but replication factor was not set to -1."
        )
    if int(topic.num_partitions) != -1:
        raise ValueError("A manual partition assignment was specified, but numPartitions was not set to -1.")
    by_index: dict[int, tuple[int, ...]] = {}
    replication: int | None = None
    for a in topic.assignments:
        index = int(a.partition_index)
        if index in by_index:
            raise ReplicaRefused(
                ReplicaFault.ASSIGNMENT, f"Found multiple manual partition assignments for partition {index}"
            )
        nodes = replica_nodes(core, a.broker_ids)
        _same_count(len(nodes), replication)
        replication = len(nodes)
        by_index[index] = nodes
    if sorted(by_index) != list(range(len(by_index))):
        raise ReplicaRefused(
            ReplicaFault.ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence"
        )
    return [by_index[i] for i in range(len(by_index))]


def partitions_assignment(core: Core, assignments: Any) -> list[tuple[int, ...]] | None:
    """A CreatePartitions topic's replicas of the new partitions, as node ids (None: placed by
    the broker). The counts are checked where the topic's are known (the core, the store)."""
    if assignments is None:
        return None
    out: list[tuple[int, ...]] = []
    for a in assignments:
        nodes = replica_nodes(core, a.broker_ids)
        _same_count(len(nodes), len(out[0]) if out else None)
        out.append(nodes)
    return out


def check_added(assignment: Sequence[Sequence[int]], added: int) -> None:
    """One list per partition added (Kafka's message otherwise)."""
    if len(assignment) != added:
        raise ReplicaRefused(
            ReplicaFault.ASSIGNMENT,
            f"Attempted to add {added} additional partition(s), but only {len(assignment)} "
            "assignment(s) were specified.",
        )


def _same_count(count: int, replication: int | None) -> None:
    if replication is not None and count != replication:
        raise ReplicaRefused(
            ReplicaFault.ASSIGNMENT,
            f"The manual partition assignment includes a partition with {count} replica(s), but "
            f"this is not consistent with previous partitions, which have {replication} replica(s).",
        )


# ----------------------------------------------------------------------------- ElectLeaders


def _election_code(fault: ReplicaRefused, election: Election) -> ErrorCode:
    if fault.kind is ReplicaFault.NOT_AVAILABLE and election is Election.PREFERRED:
        return ErrorCode.preferred_leader_not_available
    return kafka_error(fault)[0]


def elect_leaders(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(ELECT_LEADERS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    try:
        election = Election(int(getattr(body, "election_type", 0)))
    except ValueError:
        message = f"Unknown election type {int(body.election_type)}"
        resp = error_response(ELECT_LEADERS, schema, body, ErrorCode.invalid_request, message)
        return Reply(encode_response(request.correlation_id, resp))
    core.refresh_topics()
    registry = core.registry
    every = body.topic_partitions is None
    if every:
        order = sorted(registry.by_name)
        asked = [(name, i) for name in order for i in range(registry.by_name[name].partitions)]
    else:
        asked = [(str(t.topic), int(p)) for t in body.topic_partitions for p in t.partitions]
        order = list(dict.fromkeys(str(t.topic) for t in body.topic_partitions))
    results: dict[Key, tuple[ErrorCode, str | None]] = {}
    ids: dict[Key, tuple[int, int]] = {}
    for name, index in asked:
        topic = _topic(core, name)
        if topic is None or not 0 <= index < topic.partitions:
            unknown = f"No such partition as {name}-{index}"
            results[(name, index)] = (ErrorCode.unknown_topic_or_partition, unknown)
        elif not core.cluster.clustered:
            results[(name, index)] = (ErrorCode.election_not_needed, "a single node leads every partition")
        else:
            ids[(name, index)] = (topic.topic_id, index)

    def answer() -> Reply:
        topics = []
        for name in order:
            parts = [
                make(module.PartitionResult, partition_id=index, error_code=code, error_message=message)
                for (n, index), (code, message) in results.items()
                if n == name and not (every and code == ErrorCode.election_not_needed)
            ]
            topics.append(make(module.ReplicaElectionResult, topic=name, partition_result=tuple(parts)))
        resp = make(
            schema,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.none,
            replica_election_results=tuple(topics),
        )
        return Reply(encode_response(request.correlation_id, resp))

    cluster = core.config.cluster
    if cluster is None or not ids:
        return answer()
    calls = cluster.calls

    def elect() -> dict[tuple[int, int], PartitionState | ReplicaRefused]:
        return calls.elect_leaders(election, list(ids.values()))

    def answered(outcome: Any) -> Reply:
        for key, ident in ids.items():
            got = outcome if isinstance(outcome, BaseException) else outcome.get(ident)
            if isinstance(got, ReplicaRefused):
                results[key] = (_election_code(got, election), str(got))
            elif isinstance(got, BaseException):
                results[key] = kafka_error(got)
            else:
                results[key] = (ErrorCode.none, None)
        return answer()

    def shown(outcome: dict[tuple[int, int], PartitionState | ReplicaRefused]) -> bool:
        view = core.cluster
        return all(
            (now := view.state_of(*ident)) is not None and now.leader_epoch >= state.leader_epoch
            for ident, state in outcome.items()
            if isinstance(state, PartitionState)
        )

    return core.in_cluster(elect, answered, until=shown)


# ----------------------------------------------------------------------------- reassignments


def alter_partition_reassignments(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(ALTER_PARTITION_REASSIGNMENTS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    core.refresh_topics()
    cluster = core.config.cluster
    results: dict[Key, tuple[ErrorCode, str | None]] = {}
    todo: dict[Key, tuple[int, int, tuple[int, ...] | None, bool]] = {}  # tid, p, target, unclean
    order: list[tuple[str, list[int]]] = []
    for t in body.topics:
        name = str(t.name)
        indexes: list[int] = []
        order.append((name, indexes))
        topic = _topic(core, name)
        for q in t.partitions:
            index = int(q.partition_index)
            indexes.append(index)
            key = (name, index)
            try:
                if topic is None:
                    raise ReplicaRefused(ReplicaFault.UNKNOWN, f"Unable to find a topic named {name}.")
                if not 0 <= index < topic.partitions:
                    raise ReplicaRefused(ReplicaFault.UNKNOWN, f"Unable to find partition {name}:{index}.")
                target = None if q.replicas is None else replica_nodes(core, q.replicas)
                if cluster is None:
                    if target is None:
                        raise ReplicaRefused(
                            ReplicaFault.NO_REASSIGNMENT, "No partition reassignment is in progress."
                        )
                    results[key] = (ErrorCode.none, None)  # this node, where it is: nothing moves
                    continue
                default = "true" if cluster.unclean_election else "false"
                unclean = topic.configs.get(UNCLEAN, default) == "true"
                todo[key] = (topic.topic_id, index, target, unclean)
            except Exception as exc:
                results[key] = kafka_error(exc)

    def answer() -> Reply:
        topics = tuple(
            make(
                module.ReassignableTopicResponse,
                name=name,
                partitions=tuple(
                    make(
                        module.ReassignablePartitionResponse,
                        partition_index=index,
                        error_code=results[(name, index)][0],
                        error_message=results[(name, index)][1],
                    )
                    for index in indexes
                ),
            )
            for name, indexes in order
        )
        resp = make(
            schema,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.none,
            error_message=None,
            responses=topics,
        )
        return Reply(encode_response(request.correlation_id, resp))

    if cluster is None or not todo:
        return answer()
    calls = cluster.calls

    def alter_all() -> dict[Key, tuple[ErrorCode, str | None]]:
        out: dict[Key, tuple[ErrorCode, str | None]] = {}
        for key, (tid, index, target, unclean) in todo.items():
            try:
                calls.alter_reassignment(tid, index, target, unclean)
                out[key] = (ErrorCode.none, None)
            except Exception as exc:
                out[key] = kafka_error(exc)
        return out

    def answered(outcome: Any) -> Reply:
        if isinstance(outcome, BaseException):
            outcome = dict.fromkeys(todo, kafka_error(outcome))
        results.update(outcome)
        return answer()

    return core.in_cluster(alter_all, answered)


def list_partition_reassignments(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(LIST_PARTITION_REASSIGNMENTS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    core.refresh_topics()
    asked: dict[int, set[int]] | None = None  # topic id -> the partitions asked (None: every one)
    if body.topics is not None:
        asked = {}
        for t in body.topics:
            topic = _topic(core, str(t.name))
            if topic is not None:
                asked.setdefault(topic.topic_id, set()).update(int(i) for i in t.partition_indexes)

    def answer(found: Any) -> Reply:
        if isinstance(found, BaseException):
            code, message = kafka_error(found)
            resp = make(
                schema, throttle_time=datetime.timedelta(0), error_code=code, error_message=message, topics=()
            )
            return Reply(encode_response(request.correlation_id, resp))
        by_topic: dict[int, list[Any]] = {}
        for (tid, index), state in sorted(found.items()):
            if asked is not None and index not in (asked.get(tid) or ()):
                continue
            removing = state.removing
            adding = state.adding or tuple(t for t in state.target if t not in state.replicas)
            by_topic.setdefault(tid, []).append(
                make(
                    module.OngoingPartitionReassignment,
                    partition_index=index,
                    replicas=tuple(broker_of(core, n, tid, index) for n in state.replicas),
                    adding_replicas=tuple(broker_of(core, n, tid, index) for n in adding),
                    removing_replicas=tuple(broker_of(core, n, tid, index) for n in removing),
                )
            )
        topics = tuple(
            make(module.OngoingTopicReassignment, name=topic.name, partitions=tuple(parts))
            for tid, parts in sorted(by_topic.items())
            if (topic := core.registry.by_id.get(tid)) is not None
        )
        resp = make(
            schema,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.none,
            error_message=None,
            topics=topics,
        )
        return Reply(encode_response(request.correlation_id, resp))

    cluster = core.config.cluster
    if cluster is None or asked == {}:
        return answer({})
    calls = cluster.calls
    ids = None if asked is None else set(asked)
    return core.in_cluster(lambda: calls.reassignments(ids), answer)


def _topic(core: Core, name: str) -> Topic | None:
    topic = core.registry.by_name.get(name)
    if topic is None:
        core.refresh_topics(force=True)
        topic = core.registry.by_name.get(name)
    return topic
