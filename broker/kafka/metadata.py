"""Metadata (api 3, v0-12): the core's one metadata view, in Kafka's shape.

Rules this module keeps:
- Every core of every node is a broker (`kafka_broker_id`): node id and core, the node's host, the
  core's direct port (the public port when unknown); each partition's leader is the core serving
  it on its leader node, so stock clients connect straight to the owning core. Replicas and ISR
  are the cores holding the partition on each replica node; the controller is core 0 of the
  cluster's controller node.
- Auto topic creation, as Kafka's KafkaApis does it: a request naming topics (not a listing of
  every topic) that allows it (`allow_auto_topic_creation`, v4+; always for v0-3), on a broker
  with `--auto-create-topics` (the default, as auto.create.topics.enable), creates the named
  topics that do not exist and have a valid name, with the broker's defaults
  (`Core.auto_create_topics`), and answers once they exist. With ACLs on, that needs create on the
  cluster or on the topic (and describe on it, as every named topic does); without it the topic
  is TOPIC_AUTHORIZATION_FAILED. Otherwise an unknown topic is UNKNOWN_TOPIC_OR_PARTITION, and an
  invalid name INVALID_TOPIC_EXCEPTION. With ACLs on, a topic the principal may not describe is
  left out of a listing of every topic and answered TOPIC_AUTHORIZATION_FAILED when named.
- Topic ids (v10+): Kafka's are UUIDs; ours are numbers never reused within a cluster (or a data
  dir), so a topic's UUID is derived from the cluster id and its number (`topic_uuid`): stable
  across restarts and alike on every node and core, never the zero UUID Kafka reserves for "none"
  (an unknown topic named by name answers it), and never starting with "-" in base64 (Kafka's
  own rule for the ids it makes). A request naming topics by id (v10+, as Kafka: the names are
  then not read, and nothing is auto-created) answers an id it does not know UNKNOWN_TOPIC_ID,
  with a null name.
- Authorized operations (v8+), when asked: each topic's and (v8-10) the cluster's, as Kafka's
  bit field (broker/kafka/authorize.py `authorized_operations`), else Kafka's "omitted".
"""

from __future__ import annotations

import datetime
import hashlib
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.core.topics import invalid_topic_name
from broker.core.transactions import is_internal
from broker.core.views import MetadataView, NodeView, kafka_broker_id
from broker.kafka.authorize import authorized_operations
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.security.acls import CLUSTER_NAME

METADATA: Final = 3
VERSIONS: Final = (0, 12)  # v9+ flexible, v10+ topic ids; v13 (a top-level error) is Kafka 3.9's
_GONE = NodeView(-1, "", 0, 0, (), live=False)  # a replica's node the view does not know
OPERATIONS_OMITTED: Final = -(2**31)  # Kafka's "not asked for"


def topic_uuid(cluster_id: str, topic_id: int) -> uuid.UUID:
    """The Kafka topic id (a UUID) of our topic `topic_id` in the cluster `cluster_id` (module
    rules)."""
    digest = bytearray(hashlib.sha256(f"{cluster_id}/topic/{topic_id}".encode()).digest()[:16])
    digest[0] &= 0x7F  # base64 never starts with "-" (index 62); the UUID is never zero
    digest[15] |= 0x01
    return uuid.UUID(bytes=bytes(digest))


def topic_names_by_uuid(ctx: Context, ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str | None]:
    """The name of each topic UUID asked for (None: no such topic here)."""
    wanted = set(ids)
    found: dict[uuid.UUID, str | None] = dict.fromkeys(wanted)
    for _ in range(2):  # a miss: the registry once more, as a name's miss does
        for topic in ctx.core.registry.by_id.values():
            u = topic_uuid(ctx.cluster_id, topic.topic_id)
            if u in wanted:
                found[u] = topic.name
        if all(found.values()):
            break
        ctx.core.refresh_topics(force=True)
    return found


def metadata(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    version = request.api_version
    unknown_ids: list[uuid.UUID] = []
    # v0: an empty list means every topic; v1+: null means every topic, empty means none.
    if body.topics is None or (version == 0 and not body.topics):
        names: list[str] | None = None
    else:
        ids = [t.topic_id for t in body.topics if getattr(t, "topic_id", None)]
        if ids:  # named by id (v10+): Kafka reads the ids alone
            found = topic_names_by_uuid(ctx, ids)
            names = [n for n in dict.fromkeys(found[i] for i in ids) if n is not None]
            unknown_ids = [i for i in dict.fromkeys(ids) if found[i] is None]
        else:
            names = [str(t.name) for t in body.topics if t.name is not None]
    schema = response_schema(METADATA, version)
    assert schema is not None
    may: Callable[[str], bool] | None = None
    refused: set[str] = set()  # named, unknown, and the principal may not create them
    if ctx.authorizer.enabled:
        principal, allowed = ctx.auth.principal, ctx.authorizer.allowed
        may = lambda name: name not in refused and allowed(principal, "describe", "topic", name)  # noqa: E731

    def answer() -> Reply:
        view = ctx.core.metadata_view(names)
        resp = metadata_response(
            ctx,
            schema,
            view,
            may,
            listed_all=names is None,
            unknown_ids=unknown_ids,
            topic_operations=bool(getattr(body, "include_topic_authorized_operations", False)),
            cluster_operations=bool(getattr(body, "include_cluster_authorized_operations", False)),
        )
        return Reply(encode_response(request.correlation_id, resp))

    core = ctx.core
    if names is None or not core.config.auto_create_topics:
        return answer()
    if any(getattr(t, "topic_id", None) for t in body.topics or ()):
        return answer()  # named by id: nothing to create (Kafka's rule)
    if not getattr(body, "allow_auto_topic_creation", True):  # v0-3 have no such field: allowed
        return answer()
    missing = core.missing_topics(names)
    if missing and ctx.authorizer.enabled:
        principal, allowed = ctx.auth.principal, ctx.authorizer.allowed
        if not allowed(principal, "create", "cluster", CLUSTER_NAME):
            refused.update(n for n in missing if not allowed(principal, "create", "topic", n))
        missing = [n for n in missing if n not in refused and allowed(principal, "describe", "topic", n)]
    if not missing:
        return answer()
    return core.auto_create_topics(missing, answer)


def live_brokers(view: MetadataView) -> list[tuple[int, str, int, str | None]]:
    """(Kafka broker id, host, port, rack) of every core of every live node: the brokers Metadata
    and DescribeCluster list."""
    return [
        (kafka_broker_id(node.node_id, core), node.host, node.core_port(core), node.rack or None)
        for node in view.nodes
        if node.live
        for core in range(node.cores)
    ]


def metadata_response(
    ctx: Context,
    schema: type[Any],
    view: MetadataView,
    may_describe: Callable[[str], bool] | None = None,
    listed_all: bool = False,
    unknown_ids: Iterable[uuid.UUID] = (),
    topic_operations: bool = False,
    cluster_operations: bool = False,
) -> Any:
    """`view` as the Metadata response of `schema`'s version: every core of every node a
    broker (`kafka_broker_id`), each partition led by the core serving it on its leader node.
    With `may_describe` (ACLs on), a topic the principal may not describe is left out of a
    listing of every topic and answered TOPIC_AUTHORIZATION_FAILED when asked for by name,
    whether or not it exists (its existence is not told either). `unknown_ids`: topic ids asked
    for that no topic has (UNKNOWN_TOPIC_ID); `topic_operations`, `cluster_operations`: the
    authorized operations were asked for (module rules)."""
    module = sys.modules[schema.__module__]
    authorizer, principal = ctx.authorizer, ctx.auth.principal
    brokers = tuple(
        make(module.MetadataResponseBroker, node_id=broker_id, host=host, port=port, rack=rack)
        for broker_id, host, port, rack in live_brokers(view)
    )
    topics = []
    for t in view.topics:
        refused: ErrorCode | None = None
        if may_describe is not None and not may_describe(t.name):
            if listed_all:
                continue  # left out of a listing of every topic
            refused = ErrorCode.topic_authorization_failed  # whether or not it exists
        elif not t.known:
            invalid = invalid_topic_name(t.name) is not None
            refused = ErrorCode.invalid_topic_exception if invalid else ErrorCode.unknown_topic_or_partition
        if refused is not None:
            topics.append(
                make(
                    module.MetadataResponseTopic,
                    error_code=refused,
                    name=t.name,
                    topic_id=None,
                    is_internal=False,
                    partitions=(),
                )
            )
            continue
        partitions = tuple(
            make(
                module.MetadataResponsePartition,
                error_code=ErrorCode.none if p.leader_node >= 0 else ErrorCode.leader_not_available,
                partition_index=p.index,
                leader_id=kafka_broker_id(p.leader_node, p.owner_core) if p.leader_node >= 0 else -1,
                leader_epoch=p.leader_epoch,
                replica_nodes=tuple(kafka_broker_id(n, c) for n, c in p.replicas),
                isr_nodes=tuple(kafka_broker_id(n, c) for n, c in p.isr),
                offline_replicas=tuple(
                    kafka_broker_id(n, c) for n, c in p.replicas if not (view.node(n) or _GONE).live
                ),
            )
            for p in t.partitions
        )
        topics.append(
            make(
                module.MetadataResponseTopic,
                error_code=ErrorCode.none,
                name=t.name,
                topic_id=topic_uuid(ctx.cluster_id, t.topic_id),
                is_internal=is_internal(t.name),
                partitions=partitions,
                topic_authorized_operations=(
                    authorized_operations(authorizer, principal, "topic", t.name)
                    if topic_operations
                    else OPERATIONS_OMITTED
                ),
            )
        )
    topics.extend(
        make(
            module.MetadataResponseTopic,
            error_code=ErrorCode.unknown_topic_id,
            name=None,
            topic_id=u,
            is_internal=False,
            partitions=(),
        )
        for u in unknown_ids
    )
    return make(
        schema,
        throttle_time=datetime.timedelta(0),
        brokers=brokers,
        cluster_id=ctx.cluster_id,
        controller_id=kafka_broker_id(view.controller, 0),
        topics=tuple(topics),
        cluster_authorized_operations=(
            authorized_operations(authorizer, principal, "cluster", CLUSTER_NAME)
            if cluster_operations
            else OPERATIONS_OMITTED
        ),
    )
