"""CreatePartitions (api 37, v0-3), a topic's partition count grown as Kafka's controller grows
it, and DeleteRecords (api 21, v0-2), a partition's log start moved up as Kafka's leader moves it.

Rules this module keeps:
- Kafka's rules (ReplicationControlManager.createPartitions, ControllerApis): only an increase
  (the same count or fewer: INVALID_PARTITIONS, with Kafka's messages), an unknown topic
  UNKNOWN_TOPIC_OR_PARTITION, a topic named twice INVALID_REQUEST ("Duplicate topic name."),
  alter on the topic needed where ACLs are on (TOPIC_AUTHORIZATION_FAILED for that topic alone),
  `validate_only` checks without changing anything. Replicas placed by hand (`assignments`, one
  list per new partition, as many replicas as the topic has) follow Kafka's rules as
  CreateTopics' do (broker/kafka/replicas.py; a count that does not match the partitions added
  is INVALID_REPLICA_ASSIGNMENT). Each topic is answered on its own.
- One node: each topic through `Core.create_partitions` (the registry; the new partitions open
  on their owning cores on first use). A cluster: through the store, off the loop
  (`ClusterCalls.create_partitions`: the record, then the new partitions placed as a new topic's),
  answered once this node's registry shows the new counts.
- DeleteRecords, Kafka's rules (KafkaApis.handleDeleteRecordsRequest, Partition.deleteRecordsOnLeader):
  per partition, on the core that owns it (another core's: NOT_LEADER_OR_FOLLOWER, as a broker
  that does not lead it answers; the clients send each partition to its leader); offset -1 is the
  high watermark, an offset past it or another negative one is OFFSET_OUT_OF_RANGE, one at or
  below the log start changes nothing; the answer's low watermark is the log start after. Delete
  on the topic where ACLs are on (TOPIC_AUTHORIZATION_FAILED for its partitions alone). The start
  is durable before the answer (broker/storage/log_start.py); followers take it from their
  leader's next fetch answer (`Partition.follow_log_start`), where Kafka's leader waits for them
  to report it before answering.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.kafka import replicas
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error

CREATE_PARTITIONS: Final = 37
CREATE_PARTITIONS_VERSIONS: Final = (0, 3)  # v2+ flexible
DELETE_RECORDS: Final = 21
DELETE_RECORDS_VERSIONS: Final = (0, 2)  # v2 flexible
NO_LOW_WATERMARK: Final = -1  # Kafka's DeleteRecordsResponse.INVALID_LOW_WATERMARK

Result = tuple[str, ErrorCode, str | None]


def create_partitions(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(CREATE_PARTITIONS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    validate_only = bool(body.validate_only)
    counts: dict[str, int] = {}
    assignments: dict[str, list[tuple[int, ...]] | None] = {}  # node ids per new partition
    early: dict[str, tuple[ErrorCode, str | None]] = {}  # answered before any change
    for t in body.topics:
        name = str(t.name)
        if name in counts or name in early:
            early[name] = (ErrorCode.invalid_request, "Duplicate topic name.")
            counts.pop(name, None)
            continue
        if not _may_alter(ctx, name):
            early[name] = (ErrorCode.topic_authorization_failed, f"not authorized: alter topic {name}")
            continue
        try:
            assignments[name] = replicas.partitions_assignment(core, t.assignments)
        except Exception as exc:
            early[name] = kafka_error(exc)
            continue
        counts[name] = int(t.count)
    order = list(dict.fromkeys(str(t.name) for t in body.topics))

    def answer(done: dict[str, tuple[ErrorCode, str | None]]) -> Reply:
        results = []
        for name in order:
            code, message = early.get(name) or done[name]
            if code != ErrorCode.none:
                core.metrics.error()
            results.append(
                make(module.CreatePartitionsTopicResult, name=name, error_code=code, error_message=message)
            )
        resp = make(schema, throttle_time=datetime.timedelta(0), results=tuple(results))
        return Reply(encode_response(request.correlation_id, resp))

    cluster = core.config.cluster
    if cluster is None:
        done: dict[str, tuple[ErrorCode, str | None]] = {}
        for name, count in counts.items():
            try:
                assignment = assignments[name]
                topic = core.registry.by_name.get(name)
                if assignment is not None and topic is not None and count > topic.partitions:
                    replicas.check_added(assignment, count - topic.partitions)
                core.create_partitions(name, count, validate_only)
                done[name] = (ErrorCode.none, None)
            except Exception as exc:
                done[name] = kafka_error(exc)
        return answer(done)

    calls = cluster.calls
    registry = core.registry

    def grow_all() -> dict[str, tuple[ErrorCode, str | None]]:
        out: dict[str, tuple[ErrorCode, str | None]] = {}
        for name, count in counts.items():
            try:
                calls.create_partitions(registry, name, count, validate_only, assignments[name])
                out[name] = (ErrorCode.none, None)
            except Exception as exc:
                code, message = kafka_error(exc)
                if "replication factor" in str(exc):
                    code = ErrorCode.invalid_replication_factor
                out[name] = (code, message)
        return out

    def answered(result: Any) -> Reply:
        if isinstance(result, BaseException):
            failed = kafka_error(result)
            result = dict.fromkeys(counts, failed)
        return answer(result)

    def grown(result: dict[str, tuple[ErrorCode, str | None]]) -> bool:
        return validate_only or all(
            (t := registry.by_name.get(name)) is not None and t.partitions >= counts[name]
            for name, (code, _) in result.items()
            if code == ErrorCode.none
        )

    return core.in_cluster(grow_all, answered, until=grown)


def delete_records(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(DELETE_RECORDS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    topics = []
    for t in body.topics:
        name = str(t.name)
        allowed = _may(ctx, "delete", name)
        results = []
        for q in t.partitions:
            index = int(q.partition_index)
            low, code = NO_LOW_WATERMARK, ErrorCode.none
            if not allowed:
                code = ErrorCode.topic_authorization_failed
            else:
                try:
                    p = core.partition_named(name, index)
                    if isinstance(p, int):
                        code = ErrorCode.not_leader_or_follower
                    else:
                        low = p.delete_records(int(q.offset))
                except Exception as exc:
                    code = kafka_error(exc)[0]
            if code != ErrorCode.none:
                core.metrics.error()
            results.append(
                make(
                    module.DeleteRecordsPartitionResult,
                    partition_index=index,
                    low_watermark=low,
                    error_code=code,
                )
            )
        topics.append(make(module.DeleteRecordsTopicResult, name=name, partitions=tuple(results)))
    resp = make(schema, throttle_time=datetime.timedelta(0), topics=tuple(topics))
    return Reply(encode_response(request.correlation_id, resp))


def _may_alter(ctx: Context, topic: str) -> bool:
    return _may(ctx, "alter", topic)


def _may(ctx: Context, operation: str, topic: str) -> bool:
    """Whether the request's principal may do `operation` on `topic` (always, where ACLs are off)."""
    authorizer = ctx.authorizer
    if not authorizer.enabled or authorizer.allowed(ctx.auth.principal, operation, "topic", topic):
        return True
    ctx.core.metrics.denied()
    return False
