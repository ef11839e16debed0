"""DeleteGroups (api 42, v0-2) and OffsetDelete (api 47, v0): a group's committed offsets deleted,
whole or per partition, as Kafka's group coordinator deletes them.

Rules this module keeps:
- Kafka's rules (KafkaApis.handleDeleteGroupsRequest / handleOffsetDeleteRequest, the classic
  group's validateDeleteGroup / validateOffsetDelete, OffsetMetadataManager.deleteOffsets):
  a group is answered by its coordinator core (`Core.group_coordinator`; elsewhere
  NOT_COORDINATOR); an empty group id is INVALID_GROUP_ID; a group that neither has members nor
  committed offsets does not exist (GROUP_ID_NOT_FOUND); a group with members is NON_EMPTY_GROUP
  for DeleteGroups, and for OffsetDelete too unless its protocol type is "consumer", where only
  the topics its members subscribe to are refused (GROUP_SUBSCRIBED_TO_TOPIC per partition: the
  members' subscriptions read from their metadata; metadata that does not parse counts as every
  topic) and the others' offsets go. A topic or partition that does not exist is
  UNKNOWN_TOPIC_OR_PARTITION for those partitions; deleting an offset never committed is NONE.
- ACLs where they are on: delete on the group (GROUP_AUTHORIZATION_FAILED: that group of a
  DeleteGroups, the whole OffsetDelete), and for OffsetDelete read on each topic
  (TOPIC_AUTHORIZATION_FAILED for its partitions).
- The offsets are deleted in the group's store (broker/core/groups.py: its file, durably; a
  cluster's etcd, off the loop: `Core.with_offsets`), then the coordinator forgets a deleted
  group (broker/core/coordinator.py). A store that cannot be reached now answers
  COORDINATOR_NOT_AVAILABLE (retriable).
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.coordinator import GroupCode
from broker.core.groups import PartitionId
from broker.core.outcomes import Outcome, Reply
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error
from ringlog_proto.consumer_protocol import CONSUMER_PROTOCOL_TYPE, decode_subscription

DELETE_GROUPS: Final = 42
OFFSET_DELETE: Final = 47
VERSIONS: Final[dict[int, tuple[int, int]]] = {
    DELETE_GROUPS: (0, 2),  # v2 flexible
    OFFSET_DELETE: (0, 0),  # kio has v0 only
}
NO_THROTTLE: Final = datetime.timedelta(0)


def _mine(ctx: Context, group: str) -> bool:
    config = ctx.core.config
    return ctx.core.group_coordinator(group) == (config.node_id, config.core_id)


def _may(ctx: Context, operation: str, resource_type: str, name: str) -> bool:
    authorizer = ctx.authorizer
    if not authorizer.enabled or authorizer.allowed(ctx.auth.principal, operation, resource_type, name):
        return True
    ctx.core.metrics.denied()
    return False


def delete_groups(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(DELETE_GROUPS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    coordinator = core.coordinator
    codes: dict[str, ErrorCode] = {}
    candidates: list[str] = []
    for group in dict.fromkeys(str(g) for g in body.groups_names):
        if not _may(ctx, "delete", "group", group):
            codes[group] = ErrorCode.group_authorization_failed
        elif not group:
            codes[group] = ErrorCode.invalid_group_id
        elif not _mine(ctx, group):
            codes[group] = ErrorCode.not_coordinator
        elif coordinator.check_delete(group) != GroupCode.NONE:
            codes[group] = ErrorCode.non_empty_group
        else:
            candidates.append(group)
    store = coordinator.offsets
    held = frozenset(g for g in candidates if g in coordinator.groups)  # read on the loop

    def delete() -> dict[str, ErrorCode]:
        out = {}
        for group in candidates:
            had = store.delete_group(group)
            out[group] = ErrorCode.none if had or group in held else ErrorCode.group_id_not_found
        return out

    def reply(done: dict[str, ErrorCode] | BaseException) -> Reply:
        if isinstance(done, BaseException):
            done = dict.fromkeys(candidates, kafka_error(done)[0])
        for group, code in done.items():
            if code == ErrorCode.none:
                coordinator.deleted(group)
        codes.update(done)
        results = []
        for group, code in codes.items():
            if code != ErrorCode.none:
                core.metrics.error()
            results.append(make(module.DeletableGroupResult, group_id=group, error_code=code))
        resp = make(schema, throttle_time=NO_THROTTLE, results=tuple(results))
        return Reply(encode_response(request.correlation_id, resp))

    if not candidates:
        return reply({})
    return core.with_offsets(delete, reply)


def offset_delete(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    schema = response_schema(OFFSET_DELETE, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    core = ctx.core
    coordinator = core.coordinator
    group = str(body.group_id)

    def answer(top: ErrorCode, codes: dict[tuple[str, int], ErrorCode] | None = None) -> Reply:
        if top != ErrorCode.none or any(c != ErrorCode.none for c in (codes or {}).values()):
            core.metrics.error()
        topics = ()
        if top == ErrorCode.none and codes is not None:
            topics = tuple(
                make(
                    module.OffsetDeleteResponseTopic,
                    name=t.name,
                    partitions=tuple(
                        make(
                            module.OffsetDeleteResponsePartition,
                            partition_index=q.partition_index,
                            error_code=codes[(t.name, int(q.partition_index))],
                        )
                        for q in t.partitions
                    ),
                )
                for t in body.topics
            )
        resp = make(schema, error_code=top, throttle_time=NO_THROTTLE, topics=topics)
        return Reply(encode_response(request.correlation_id, resp))

    if not _may(ctx, "delete", "group", group):
        return answer(ErrorCode.group_authorization_failed)
    if not group:
        return answer(ErrorCode.invalid_group_id)
    if not _mine(ctx, group):
        return answer(ErrorCode.not_coordinator)
    view = coordinator.view(group)
    subscribed: frozenset[str] | None = frozenset()  # None: every topic
    if view is not None and view.members:
        if view.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return answer(ErrorCode.non_empty_group)
        subscribed = _subscribed(m.metadata for m in view.members)
    codes: dict[tuple[str, int], ErrorCode] = {}
    doomed: list[PartitionId] = []
    for t in body.topics:
        name = str(t.name)
        readable = _may(ctx, "read", "topic", name)
        topic = core.registry.by_name.get(name)
        for q in t.partitions:
            index = int(q.partition_index)
            if topic is None or not 0 <= index < topic.partitions:
                core.refresh_topics(force=True)
                topic = core.registry.by_name.get(name)
            if not readable:
                codes[(name, index)] = ErrorCode.topic_authorization_failed
            elif topic is None or not 0 <= index < topic.partitions:
                codes[(name, index)] = ErrorCode.unknown_topic_or_partition
            elif subscribed is None or name in subscribed:
                codes[(name, index)] = ErrorCode.group_subscribed_to_topic
            else:
                codes[(name, index)] = ErrorCode.none
                doomed.append((topic.topic_id, index))
    store = coordinator.offsets
    in_memory = view is not None

    def delete() -> bool:
        if not in_memory and not store.has_offsets(group):
            return False
        store.delete_offsets(group, doomed)
        return True

    def reply(found: bool | BaseException) -> Reply:
        if isinstance(found, BaseException):
            return answer(kafka_error(found)[0])
        if not found:
            return answer(ErrorCode.group_id_not_found)
        return answer(ErrorCode.none, codes)

    return core.with_offsets(delete, reply)


def _subscribed(metadata: Any) -> frozenset[str] | None:
    """The topics the members' subscriptions name, or None (every topic) when one does not parse."""
    topics: set[str] = set()
    for data in metadata:
        try:
            topics.update(decode_subscription(bytes(data)).topics)
        except ValueError:
            return None
    return frozenset(topics)
