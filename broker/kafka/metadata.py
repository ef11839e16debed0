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
- Topic ids (v10+): derived from the cluster id and our topic number
  (broker/kafka/metadata_entries.py `topic_uuid`). A request naming topics by id (v10+, as Kafka:
  the names are then not read, and nothing is auto-created) answers an id it does not know
  UNKNOWN_TOPIC_ID, with a null name.
- Each known topic's entry is encoded once and kept while its placement holds
  (broker/kafka/metadata_entries.py): a listing joins kept bytes. What depends on the request
  (which topics the principal may see, the errors, authorized operations) is made per request.
- Authorized operations (v8+), when asked: each topic's and (v8-10) the cluster's, as Kafka's
  bit field (broker/kafka/authorize.py `authorized_operations`), else Kafka's "omitted".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.core.topics import Topic, invalid_topic_name
from broker.core.views import MetadataView, kafka_broker_id
from broker.kafka.authorize import authorized_operations
from broker.kafka.codec import KafkaRequest
from broker.kafka.context import Context
from broker.kafka.fast_encode import (
    OPERATIONS_OMITTED,
    metadata_layout,
    metadata_response,
    metadata_topic,
    with_operations,
)
from broker.kafka.metadata_entries import topic_uuid
from broker.security.acls import CLUSTER_NAME
from ringlog_proto.frames import ProtocolError

METADATA: Final = 3
VERSIONS: Final = (0, 12)  # v9+ flexible, v10+ topic ids; v13 (a top-level error) is Kafka 3.9's


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
            if unknown_ids and version < 12:  # its answer's null name: v12+ (Kafka refuses ids before)
                raise ProtocolError(f"Metadata v{version} cannot answer an unknown topic id: v12+ can")
        else:
            names = [str(t.name) for t in body.topics if t.name is not None]
    may: Callable[[str], bool] | None = None
    refused: set[str] = set()  # named, unknown, and the principal may not create them
    if ctx.authorizer.enabled:
        principal, allowed = ctx.auth.principal, ctx.authorizer.allowed
        may = lambda name: name not in refused and allowed(principal, "describe", "topic", name)  # noqa: E731

    def answer() -> Reply:
        return Reply(
            metadata_answer(
                ctx,
                version,
                request.correlation_id,
                ctx.core.metadata_view([]),
                ctx.core.metadata_views.topics_named(names),
                may,
                listed_all=names is None,
                unknown_ids=unknown_ids,
                topic_operations=bool(getattr(body, "include_topic_authorized_operations", False)),
                cluster_operations=bool(getattr(body, "include_cluster_authorized_operations", False)),
            )
        )

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


def metadata_answer(
    ctx: Context,
    version: int,
    correlation_id: int,
    view: MetadataView,
    named: Iterable[tuple[str, Topic | None]],
    may_describe: Callable[[str], bool] | None = None,
    listed_all: bool = False,
    unknown_ids: Iterable[uuid.UUID] = (),
    topic_operations: bool = False,
    cluster_operations: bool = False,
) -> list[bytes]:
    """`view` (its nodes: `Core.metadata_view([])`) and the topics `named`
    (`Core.metadata_views.topics_named`) as the framed Metadata response of `version`: every
    core of every node a broker (`kafka_broker_id`), each partition led by the core serving it
    on its leader node, each known topic's entry kept by `ctx.metadata_entries`. With
    `may_describe` (ACLs on), a topic the principal may not describe is left out of a listing of
    every topic and answered TOPIC_AUTHORIZATION_FAILED when asked for by name, whether or not
    it exists (its existence is not told either). `unknown_ids`: topic ids asked for that no
    topic has (UNKNOWN_TOPIC_ID); `topic_operations`, `cluster_operations`: the authorized
    operations were asked for (module rules)."""
    authorizer, principal = ctx.authorizer, ctx.auth.principal
    layout = metadata_layout(version)
    entries = ctx.metadata_entries
    topics: list[bytes] = []
    for name, topic in named:
        if may_describe is not None and not may_describe(name):
            if listed_all:
                continue  # left out of a listing of every topic
            refused = ErrorCode.topic_authorization_failed  # whether or not it exists
        elif topic is None:
            invalid = invalid_topic_name(name) is not None
            refused = ErrorCode.invalid_topic_exception if invalid else ErrorCode.unknown_topic_or_partition
        else:
            entry = entries.entry(ctx.core, ctx.cluster_id, view, topic, layout)
            if topic_operations and version >= 8:
                operations = authorized_operations(authorizer, principal, "topic", name)
                entry = with_operations(version, entry, operations)
            topics.append(entry)
            continue
        topics.append(metadata_topic(version, refused, name, None, False, ()))
    topics.extend(
        metadata_topic(version, ErrorCode.unknown_topic_id, None, u.bytes, False, ()) for u in unknown_ids
    )
    return metadata_response(
        version,
        correlation_id,
        live_brokers(view),
        ctx.cluster_id,
        kafka_broker_id(view.controller, 0),
        topics,
        authorized_operations(authorizer, principal, "cluster", CLUSTER_NAME)
        if cluster_operations
        else OPERATIONS_OMITTED,
    )
