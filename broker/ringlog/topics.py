"""Our protocol's topic APIs: Metadata, CreateTopic, DeleteTopic, DescribeConfigs, AlterConfigs.

Rules this module keeps:
- Alone, the core creates, deletes and alters a topic itself; in a cluster the metadata store
  (etcd) does, written off the loop (the core's `in_cluster`), and this core's registry is
  refreshed before the answer. An alteration's answer waits, a bounded time, until the registry
  shows it, so that the client's next request here sees what it just changed.
- An alteration is checked against the registry before the store is asked: a bad value is refused
  without a round trip. AlterConfigs is both of Kafka's alterations, replacing (AlterConfigs) and
  changing (IncrementalAlterConfigs), stored as the core stores them.
- CreateTopic's limits stand for topic configs (`limit_configs`): -1 the broker's default (no
  override), -2 keep forever (Kafka's -1); a replication other than 1 needs a cluster. Replicas
  placed by hand are checked here for their shape only (`_assignment_refusal`): the cluster's
  store checks the nodes.
- A topic the principal may not describe (ACLs on) is left out of a Metadata listing and answered
  TOPIC_AUTHORIZATION_FAILED when named, without its id or settings: whether it exists is not told
  either (Kafka's rule). broker/ringlog/access.py decides; `metadata_reply` writes it.
- Each known topic's entry in a Metadata answer is kept between requests, and only this core's
  offsets written into it per request (broker/ringlog/metadata_entries.py).
- DeleteTopic from another core is that core's notice that it deleted the topic: this core closes
  its partitions of it before the deleting core answers its client (`deleted_elsewhere`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from broker.core.outcomes import Outcome, Reply
from broker.core.topic_configs import ConfigChange, ConfigOp, ConfigSource, changing, replacing
from broker.core.topics import Topic
from broker.ringlog.context import Context
from ringlog_proto import messages as m
from ringlog_proto.frames import Buffer, Frame

_SOURCES: dict[ConfigSource, m.ConfigSource] = {
    ConfigSource.TOPIC: m.ConfigSource.TOPIC,
    ConfigSource.STATIC_BROKER: m.ConfigSource.BROKER_FLAG,
    ConfigSource.DEFAULT: m.ConfigSource.DEFAULT,
}
_OPS: dict[m.ConfigOp, ConfigOp] = {
    m.ConfigOp.SET: ConfigOp.SET,
    m.ConfigOp.DELETE: ConfigOp.DELETE,
    m.ConfigOp.APPEND: ConfigOp.APPEND,
    m.ConfigOp.SUBTRACT: ConfigOp.SUBTRACT,
}


@dataclass(frozen=True, slots=True)
class _Listed(m.MetadataResponse):
    """A MetadataResponse whose topics are written already (broker/ringlog/metadata_entries.py)."""

    entries: tuple[Buffer, ...] = ()

    def write(self, w: m.Writer) -> None:
        self.write_head(w)
        w.array(len(self.entries))
        w.parts.extend(self.entries)
        self.write_nodes(w)


def _topic_bytes(t: m.TopicMetadata) -> bytes:
    w = m.Writer()
    m.MetadataResponse.write_topic(w, t)
    return b"".join(w.parts)


def metadata(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.MetadataRequest)
    return metadata_creating(ctx, req, frame)


def metadata_creating(
    ctx: Context,
    req: m.MetadataRequest,
    frame: Frame,
    may_describe: Callable[[str], bool] | None = None,
    may_create: Callable[[str], bool] | None = None,
) -> Outcome:
    """The Metadata answer, once the topics it may create exist. A request that allows it
    (v4 `allow_auto_create`: a producer's lookup) on a broker with `--auto-create-topics`
    creates the named topics that do not exist, as Kafka's Metadata does
    (`Core.auto_create_topics`: `--default-partitions`, the topic config defaults, the
    cluster's default replication). With ACLs on (broker/ringlog/access.py) only those the
    principal may describe and create (`may_create`: create on the cluster or the topic);
    one it may not create is answered TOPIC_AUTHORIZATION_FAILED, as Kafka answers it."""
    names = req.topics
    if not (req.allow_auto_create and names and ctx.config.auto_create_topics):
        return metadata_reply(ctx, req, frame, may_describe)
    missing = ctx.core.missing_topics(names)
    may = may_describe
    if may_create is not None:
        refused = {n for n in missing if not may_create(n)}
        if refused:
            may = lambda n: n not in refused and (may_describe is None or may_describe(n))  # noqa: E731
        missing = [n for n in missing if n not in refused]
    if may_describe is not None:
        missing = [n for n in missing if may_describe(n)]
    if not missing:
        return metadata_reply(ctx, req, frame, may)
    return ctx.core.auto_create_topics(missing, lambda: metadata_reply(ctx, req, frame, may))


def metadata_reply(
    ctx: Context, req: m.MetadataRequest, frame: Frame, may_describe: Callable[[str], bool] | None = None
) -> Reply:
    """The Metadata answer. With `may_describe` (ACLs on: broker/ringlog/access.py) a topic the
    principal may not describe is left out of a listing of every topic, and answered
    TOPIC_AUTHORIZATION_FAILED, without its id or settings, when named: whether it exists is
    not told either (Kafka's rule)."""
    view = ctx.core.metadata_view(req.topics or None, partitions=False)
    entries: list[Buffer] = []
    for t in view.topics:
        if may_describe is not None and not may_describe(t.name):  # one decision per topic
            if not req.topics:
                continue  # left out of a listing
            refused = m.TopicMetadata(m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, t.name, 0)
            entries.append(_topic_bytes(refused))
        elif not t.known:
            entries.append(_topic_bytes(m.TopicMetadata(m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, t.name, 0)))
        else:
            entries.append(ctx.metadata_entries.entry(ctx.core, t))
    resp = _Listed(
        host=view.host,
        port=view.port,
        cores=view.cores,
        steering=view.steering,
        core_ports=view.core_ports,
        node_id=view.node_id,
        clustered=view.clustered,
        nodes=tuple(
            m.NodeMetadata(n.node_id, n.host, n.port, n.cores, n.core_ports, n.rack, n.live)
            for n in view.nodes
        ),
        entries=tuple(entries),
    )
    return ctx.reply(frame, resp)


def create_topic(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.CreateTopicRequest)
    if req.assignment:
        refusal = _assignment_refusal(ctx, req)
        if refusal is not None:
            return ctx.error(frame, m.ErrorCode.INVALID_REQUEST, refusal)
    elif req.replication not in (-1, 1) and not ctx.core.cluster.clustered:
        return ctx.error(
            frame,
            m.ErrorCode.INVALID_CONFIG,
            f"one node keeps one copy: replication {req.replication} needs a cluster",
        )
    configs = {
        **limit_configs(req.retention_ms, req.retention_bytes, req.segment_bytes),
        **dict(req.configs),
    }
    settings = ctx.config.cluster
    if settings is not None:
        calls = settings.calls
        registry = ctx.core.registry

        def create() -> Topic:
            return calls.create_topic(
                registry,
                req.name,
                req.partitions,
                configs,
                replication=req.replication,
                assignment=req.assignment or None,
            )

        return ctx.core.in_cluster(
            create,
            lambda t: ctx.reply(frame, m.CreateTopicResponse(topic_id=t.topic_id)),
            lambda exc: ctx.error_reply(frame, exc),
        )
    topic = ctx.core.create_topic(req.name, req.partitions, configs)
    return ctx.reply(frame, m.CreateTopicResponse(topic_id=topic.topic_id))


def _assignment_refusal(ctx: Context, req: m.CreateTopicRequest) -> str | None:
    """Why replicas placed by hand cannot be taken as they come (None: they can; a cluster's
    store checks the nodes): one list per partition, as many replicas in each as
    `replication` says (-1: any), and on a single node this node alone in each."""
    counts = {len(replicas) for replicas in req.assignment}
    if len(req.assignment) != req.partitions:
        return f"the assignment places {len(req.assignment)} partition(s), not {req.partitions}"
    if req.replication != -1 and counts != {req.replication}:
        return f"the assignment's replica counts {sorted(counts)} are not replication {req.replication}"
    me = ctx.config.node_id
    if not ctx.core.cluster.clustered and any(tuple(r) != (me,) for r in req.assignment):
        return f"a single node (node {me}) keeps the one copy of each partition: assign [{me}] only"
    return None


def delete_topic(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.DeleteTopicRequest)
    settings = ctx.config.cluster
    if settings is not None:
        calls = settings.calls
        return ctx.core.in_cluster(
            lambda: calls.delete_topic(req.name),
            lambda _t: ctx.reply(frame, m.DeleteTopicResponse()),
            lambda exc: ctx.error_reply(frame, exc),
        )
    return ctx.core.delete_topic(req.name, lambda: ctx.reply(frame, m.DeleteTopicResponse()), frame)


def deleted_elsewhere(ctx: Context, frame: Frame) -> Outcome:
    """Another core deleted a topic: close our partitions of it before it answers its client."""
    ctx.core.refresh_topics(force=True)
    return ctx.reply(frame, m.DeleteTopicResponse())


def describe_configs(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.DescribeConfigsRequest)
    entries = ctx.core.topic_config_entries(req.topic, req.keys or None)
    configs = tuple(m.ConfigDescription(e.name, e.value or "", _SOURCES[e.source], e.doc) for e in entries)
    return ctx.reply(frame, m.DescribeConfigsResponse(configs=configs))


def alter_configs(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    """A topic's configs altered: the same alterations as Kafka's AlterConfigs (replacing)
    and IncrementalAlterConfigs (changing), stored as the core stores them."""
    assert isinstance(req, m.AlterConfigsRequest)
    if req.incremental:
        alteration = changing(ConfigChange(c.name, _OPS[c.op], c.value) for c in req.changes)
    else:
        alteration = replacing({c.name: c.value for c in req.changes})
    settings = ctx.config.cluster
    if settings is None or req.validate_only:
        ctx.core.alter_topic_configs(req.topic, alteration, req.validate_only)
        return ctx.reply(frame, m.AlterConfigsResponse())
    calls, registry = settings.calls, ctx.core.registry
    ctx.core.refresh_topics()
    registry.altered(req.topic, alteration)  # refused here, before the store is asked
    stored: list[Topic] = []

    def alter() -> Topic:
        stored.append(calls.alter_topic_configs(registry, req.topic, alteration))
        return stored[0]

    def mirrored(topic: Topic) -> bool:
        current = registry.by_name.get(topic.name)
        return current is not None and current.configs == topic.configs

    return ctx.core.in_cluster(
        alter,
        lambda _t: ctx.reply(frame, m.AlterConfigsResponse()),
        lambda exc: ctx.error_reply(frame, exc),
        until=mirrored,
    )


def limit_configs(retention_ms: int, retention_bytes: int, segment_bytes: int) -> dict[str, str]:
    """The topic configs a CreateTopic's limits stand for: -1 the broker's default (no override),
    -2 keep forever (Kafka's -1), else the value (checked with the other configs)."""
    configs = {}
    for name, value in (
        ("retention.ms", retention_ms),
        ("retention.bytes", retention_bytes),
        ("segment.bytes", segment_bytes),
    ):
        if value != -1:
            configs[name] = "-1" if value == -2 and name != "segment.bytes" else str(value)
    return configs
