"""DescribeCluster (api 60, v0-2), DescribeLogDirs (api 35, v1-4) and DescribeProducers (api 61,
v0): what admin tools ask about the brokers, their log directories and a partition's producers.

Rules this module keeps:
- Every core of every node is a broker, as in Metadata (broker/kafka/metadata.py): DescribeCluster
  lists the live ones with the same ids, hosts and ports, the same controller and cluster id.
  Nothing is needed to ask it; the cluster's authorized operations (when asked) are those the
  principal has on the cluster, none without describe (Kafka's AuthHelper;
  broker/kafka/authorize.py `authorized_operations`). Only the broker endpoint type exists
  here: asking for controllers is MISMATCHED_ENDPOINT_TYPE (v0: INVALID_REQUEST), another type
  UNSUPPORTED_ENDPOINT_TYPE.
- DescribeLogDirs: one log dir per broker, the node's data dir (its real path), listing the
  partitions the core asked holds (it owns them, and in a cluster the view puts a replica on
  this node), each with the bytes of its segments (0 for one never written: its files are made
  on first use) and offset lag 0 (Kafka's lag of a current replica is its high watermark less
  its log end, never positive); total and usable bytes (v4) from the file system. Describe on
  the cluster needed where ACLs are on (else CLUSTER_AUTHORIZATION_FAILED, v3+; no results).
- DescribeProducers: per partition, answered by the core that leads it (another core's or a
  follower's: NOT_LEADER_OR_FOLLOWER, as Kafka's non-leader): the idempotent producers it holds
  batches of (broker/core/producer_state.py), their epoch, last sequence and last batch's max
  timestamp, the coordinator epoch of its last transaction marker and the first offset of its
  open transaction (-1 when none: Kafka's current_txn_start_offset). Read on the topic
  needed where ACLs are on (TOPIC_AUTHORIZATION_FAILED for its partitions).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.core.partition import Partition
from broker.core.views import kafka_broker_id
from broker.kafka.authorize import authorized_operations
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error
from broker.kafka.metadata import live_brokers
from broker.security.acls import CLUSTER_NAME

log = logging.getLogger(__name__)

DESCRIBE_LOG_DIRS: Final = 35
DESCRIBE_CLUSTER: Final = 60
DESCRIBE_PRODUCERS: Final = 61
VERSIONS: Final[dict[int, tuple[int, int]]] = {
    DESCRIBE_LOG_DIRS: (1, 4),  # kio has no v0; v2+ flexible; v5 (is_cordoned) is newer than Kafka 4.0
    DESCRIBE_CLUSTER: (0, 2),  # flexible
    DESCRIBE_PRODUCERS: (0, 0),  # flexible
}
NO_THROTTLE: Final = datetime.timedelta(0)
BROKER_ENDPOINT: Final = 1
CONTROLLER_ENDPOINT: Final = 2
AUTHORIZED_OPERATIONS_OMITTED: Final = -(2**31)  # Kafka's "not asked for"


def describe_cluster(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(DESCRIBE_CLUSTER, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    version = request.api_version
    endpoint = int(getattr(body, "endpoint_type", BROKER_ENDPOINT))
    if endpoint != BROKER_ENDPOINT:
        ctx.core.metrics.error()
        if version == 0:
            code = ErrorCode.invalid_request
        elif endpoint == CONTROLLER_ENDPOINT:
            code = ErrorCode.mismatched_endpoint_type
        else:
            code = ErrorCode.unsupported_endpoint_type
        resp = make(
            schema,
            throttle_time=NO_THROTTLE,
            error_code=code,
            error_message=f"ringlog answers endpoint type {BROKER_ENDPOINT} (brokers), not {endpoint}",
            endpoint_type=endpoint,
            cluster_id=ctx.cluster_id,
            brokers=(),
        )
        return Reply(encode_response(request.correlation_id, resp))
    view = ctx.core.metadata_view([])
    brokers = tuple(
        make(module.DescribeClusterBroker, broker_id=b, host=host, port=port, rack=rack, is_fenced=False)
        for b, host, port, rack in live_brokers(view)
    )
    operations = AUTHORIZED_OPERATIONS_OMITTED
    if body.include_cluster_authorized_operations:
        operations = authorized_operations(ctx.authorizer, ctx.auth.principal, "cluster", CLUSTER_NAME)
    resp = make(
        schema,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        endpoint_type=BROKER_ENDPOINT,
        cluster_id=ctx.cluster_id,
        controller_id=kafka_broker_id(view.controller, 0),
        brokers=brokers,
        cluster_authorized_operations=operations,
    )
    return Reply(encode_response(request.correlation_id, resp))


def describe_log_dirs(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(DESCRIBE_LOG_DIRS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    authorizer = ctx.authorizer
    if authorizer.enabled and not authorizer.allowed(ctx.auth.principal, "describe", "cluster", CLUSTER_NAME):
        core.metrics.error()
        core.metrics.denied()
        resp = make(
            schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.cluster_authorization_failed, results=()
        )
        return Reply(encode_response(request.correlation_id, resp))
    wanted: dict[str, set[int]] | None = None
    if body.topics is not None:
        wanted = {}
        for t in body.topics:
            wanted.setdefault(str(t.topic), set()).update(int(i) for i in t.partitions)
    core.refresh_topics(force=wanted is not None and any(n not in core.registry.by_name for n in wanted))
    topics = []
    for topic in sorted(core.registry.by_id.values(), key=lambda t: t.name):
        if wanted is not None and topic.name not in wanted:
            continue
        indexes = range(topic.partitions) if wanted is None else sorted(wanted[topic.name])
        held = []
        for i in indexes:
            if not 0 <= i < topic.partitions or core.owner(topic.topic_id, i) != core.config.core_id:
                continue
            if core.cluster.clustered and not core.replicated_here(topic.topic_id, i):
                continue
            p = core.partitions.get((topic.topic_id, i))
            held.append(
                make(
                    module.DescribeLogDirsPartition,
                    partition_index=i,
                    partition_size=p.log.size_bytes if p is not None else 0,
                    offset_lag=0,
                    is_future_key=False,
                )
            )
        if held:
            topics.append(make(module.DescribeLogDirsTopic, name=topic.name, partitions=tuple(held)))
    data_dir = os.path.realpath(core.config.data_dir)
    total = usable = -1
    try:
        st = os.statvfs(data_dir)
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError as exc:
        log.warning("statvfs of %s: %s", data_dir, exc)
    result = make(
        module.DescribeLogDirsResult,
        error_code=ErrorCode.none,
        log_dir=data_dir,
        topics=tuple(topics),
        total_bytes=total,
        usable_bytes=usable,
        is_cordoned=False,
    )
    resp = make(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none, results=(result,))
    return Reply(encode_response(request.correlation_id, resp))


def describe_producers(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(DESCRIBE_PRODUCERS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    authorizer = ctx.authorizer
    topics = []
    for t in body.topics:
        name = str(t.name)
        refused = authorizer.enabled and not authorizer.allowed(ctx.auth.principal, "read", "topic", name)
        if refused:
            core.metrics.denied()
        partitions = []
        for i in t.partition_indexes:
            index = int(i)
            code, message, producers = ErrorCode.none, None, ()
            if refused:
                code, message = ErrorCode.topic_authorization_failed, f"not authorized: read topic {name}"
            else:
                try:
                    p = core.partition_named(name, index)
                    if not isinstance(p, Partition):
                        code, message = ErrorCode.not_leader_or_follower, f"partition {index} is on core {p}"
                    else:
                        p.check_leader()
                        held = p.producers
                        producers = tuple(
                            make(
                                module.ProducerState,
                                producer_id=pid,
                                producer_epoch=epoch,
                                last_sequence=sequence,
                                last_timestamp=timestamp,
                                coordinator_epoch=held.transaction_of(pid)[1],
                                current_txn_start_offset=held.transaction_of(pid)[0],
                            )
                            for pid, epoch, sequence, timestamp in held.active()
                        )
                except Exception as exc:
                    code, message = kafka_error(exc)
            if code != ErrorCode.none:
                core.metrics.error()
            partitions.append(
                make(
                    module.PartitionResponse,
                    partition_index=index,
                    error_code=code,
                    error_message=message,
                    active_producers=producers,
                )
            )
        topics.append(make(module.TopicResponse, name=name, partitions=tuple(partitions)))
    resp = make(schema, throttle_time=NO_THROTTLE, topics=tuple(topics))
    return Reply(encode_response(request.correlation_id, resp))
