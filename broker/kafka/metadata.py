"""Metadata (api 3, v0-8): the core's one metadata view, in Kafka's shape.

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
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.core.topics import invalid_topic_name
from broker.core.views import MetadataView, NodeView, kafka_broker_id
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.security.acls import CLUSTER_NAME

METADATA: Final = 3
VERSIONS: Final = (0, 8)  # v9+ are flexible
_GONE = NodeView(-1, "", 0, 0, (), live=False)  # a replica's node the view does not know


def metadata(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    # v0: an empty list means every topic; v1+: null means every topic, empty means none.
    if body.topics is None or (request.api_version == 0 and not body.topics):
        names: list[str] | None = None
    else:
        names = [t.name for t in body.topics]
    schema = response_schema(METADATA, request.api_version)
    assert schema is not None
    may: Callable[[str], bool] | None = None
    refused: set[str] = set()  # named, unknown, and the principal may not create them
    if ctx.authorizer.enabled:
        principal, allowed = ctx.auth.principal, ctx.authorizer.allowed
        may = lambda name: name not in refused and allowed(principal, "describe", "topic", name)  # noqa: E731

    def answer() -> Reply:
        view = ctx.core.metadata_view(names)
        resp = metadata_response(ctx, schema, view, may, listed_all=names is None)
        return Reply(encode_response(request.correlation_id, resp))

    core = ctx.core
    if names is None or not core.config.auto_create_topics:
        return answer()
    if not getattr(body, "allow_auto_topic_creation", True):  # v0-3 have no such field: allowed
        return answer()
    core.refresh_topics()
    known = core.registry.by_name
    missing = [n for n in dict.fromkeys(names) if n not in known and not invalid_topic_name(n)]
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
) -> Any:
    """`view` as the Metadata response of `schema`'s version: every core of every node a
    broker (`kafka_broker_id`), each partition led by the core serving it on its leader node.
    With `may_describe` (ACLs on), a topic the principal may not describe is left out of a
    listing of every topic and answered TOPIC_AUTHORIZATION_FAILED when asked for by name,
    whether or not it exists (its existence is not told either)."""
    module = sys.modules[schema.__module__]
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
                is_internal=False,
                partitions=partitions,
            )
        )
    return make(
        schema,
        throttle_time=datetime.timedelta(0),
        brokers=brokers,
        cluster_id=ctx.cluster_id,
        controller_id=kafka_broker_id(view.controller, 0),
        topics=tuple(topics),
    )
