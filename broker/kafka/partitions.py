"""CreatePartitions (api 37, v0-3): a topic's partition count grown, as Kafka's controller grows it.

Rules this module keeps:
- Kafka's rules (ReplicationControlManager.createPartitions, ControllerApis): only an increase
  (the same count or fewer: INVALID_PARTITIONS, with Kafka's messages), an unknown topic
  UNKNOWN_TOPIC_OR_PARTITION, a topic named twice INVALID_REQUEST ("Duplicate topic name."),
  alter on the topic needed where ACLs are on (TOPIC_AUTHORIZATION_FAILED for that topic alone),
  `validate_only` checks without changing anything. Manual assignments are refused as
  CreateTopics refuses them (INVALID_REQUEST). Each topic is answered on its own.
- One node: each topic through `Core.create_partitions` (the registry; the new partitions open
  on their owning cores on first use). A cluster: through the store, off the loop
  (`ClusterCalls.create_partitions`: the record, then the new partitions placed as a new topic's),
  answered once this node's registry shows the new counts.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error

CREATE_PARTITIONS: Final = 37
CREATE_PARTITIONS_VERSIONS: Final = (0, 3)  # v2+ flexible
MANUAL_ASSIGNMENT: Final = "manual replica assignment is not supported"

Result = tuple[str, ErrorCode, str | None]


def create_partitions(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(CREATE_PARTITIONS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    validate_only = bool(body.validate_only)
    counts: dict[str, int] = {}
    early: dict[str, tuple[ErrorCode, str | None]] = {}  # answered before any change
    for t in body.topics:
        name = str(t.name)
        if name in counts or name in early:
            early[name] = (ErrorCode.invalid_request, "Duplicate topic name.")
            counts.pop(name, None)
            continue
        if not _may_alter(ctx, name):
            early[name] = (ErrorCode.topic_authorization_failed, f"not authorized: alter topic {name}")
        elif t.assignments is not None:
            early[name] = (ErrorCode.invalid_request, MANUAL_ASSIGNMENT)
        else:
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
                calls.create_partitions(registry, name, count, validate_only)
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


def _may_alter(ctx: Context, topic: str) -> bool:
    """Whether the request's principal may alter `topic` (always, where ACLs are off)."""
    authorizer = ctx.authorizer
    if not authorizer.enabled or authorizer.allowed(ctx.auth.principal, "alter", "topic", topic):
        return True
    ctx.core.metrics.denied()
    return False
