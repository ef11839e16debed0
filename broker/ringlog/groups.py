"""Our protocol's consumer group APIs: OffsetCommit, OffsetFetch, JoinGroup, SyncGroup, Heartbeat
and LeaveGroup, served by the group's coordinator core, whose store and membership both
protocols share (broker/core/coordinator.py, broker/core/groups.py).

Rules this module keeps:
- They are served on the group's coordinator core: the adapter forwards them there from another
  core of this node (JoinGroup and SyncGroup as long polls) and answers NOT_OWNER for a group
  another node coordinates (broker/ringlog/adapter.py).
- The coordinator's answers are its codes, answered in ours (`_GROUP_CODES`). A member joins in
  one step: our clients need no MEMBER_ID_REQUIRED round trip, and name no instance ids.
- A commit's offset is not compared with the partition's log, as Kafka's coordinator stores any
  offset (docs/KAFKA.md, "Committed offsets"; `offset_commit` says what is refused). Its answer
  waits for the store's write, off the loop where the store is a cluster's etcd (the core's
  `offsets_run`).
- JoinGroup and SyncGroup are answered when the group's phase ends (`Later`), never by holding
  the loop.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.core.coordinator import GroupCode, JoinResult, SyncResult
from broker.core.groups import OFFSET_METADATA_MAX, Committed, check_group
from broker.core.outcomes import Later, Outcome, Reply, Silent
from broker.ringlog.context import Context
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame

# the coordinator's answers in our error codes (MEMBER_ID_REQUIRED never: we join in one step)
_GROUP_CODES: dict[GroupCode, m.ErrorCode] = {
    GroupCode.NONE: m.ErrorCode.NONE,
    GroupCode.UNKNOWN_MEMBER_ID: m.ErrorCode.UNKNOWN_MEMBER_ID,
    GroupCode.ILLEGAL_GENERATION: m.ErrorCode.ILLEGAL_GENERATION,
    GroupCode.REBALANCE_IN_PROGRESS: m.ErrorCode.REBALANCE_IN_PROGRESS,
    GroupCode.INCONSISTENT_GROUP_PROTOCOL: m.ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
    GroupCode.MEMBER_ID_REQUIRED: m.ErrorCode.UNKNOWN_MEMBER_ID,
    GroupCode.INVALID_SESSION_TIMEOUT: m.ErrorCode.INVALID_REQUEST,
    GroupCode.NOT_COORDINATOR: m.ErrorCode.NOT_OWNER,
    GroupCode.INVALID_REQUEST: m.ErrorCode.INVALID_REQUEST,
    # our protocol names no instance ids, so none of its requests is fenced; were one, its member
    # id would be one the group no longer has
    GroupCode.FENCED_INSTANCE_ID: m.ErrorCode.UNKNOWN_MEMBER_ID,
}


def offset_commit(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    """A commit into the coordinator's store: a member's with its generation, or one outside
    membership (generation -1), which is refused while the group has members. The offset is
    not compared with the partition's log (Kafka's coordinator stores any offset: one past
    the high watermark is what librdkafka's tests commit); a negative one is refused, this
    protocol's field being >= 0 (docs/PROTOCOL.md §4.10)."""
    assert isinstance(req, m.OffsetCommitRequest)
    check_group(req.group)
    ctx.core.topic_of(frame.topic_id, frame.partition)
    if req.offset < 0:
        raise ValueError(f"cannot commit negative offset {req.offset}")
    if len(req.metadata) > OFFSET_METADATA_MAX:
        return ctx.error(
            frame,
            m.ErrorCode.LIMIT_EXCEEDED,
            f"offset metadata of {len(req.metadata)} characters: at most {OFFSET_METADATA_MAX}",
        )
    ctx.core.space.check_writable()
    key = (frame.topic_id, frame.partition)

    def start(answer: Callable[[Reply | Silent], None]) -> None:
        # Kafka's coordinator stores any offset: it never compares one with the log's end
        # (docs/KAFKA.md, "Committed offsets")
        try:
            code = ctx.core.coordinator.commit_check(req.group, req.generation, req.member_id)
            if code != GroupCode.NONE:
                answer(group_error(ctx, frame, req.group, code))
                return
        except Exception as exc:  # an error answer, as in the adapter's `handle`
            answer(ctx.error_reply(frame, exc))
            return
        offsets = {key: Committed(req.offset, req.metadata)}
        live = frozenset(ctx.core.registry.by_id).__contains__

        def stored(result: object) -> None:
            if isinstance(result, BaseException):  # the store's write failed
                answer(ctx.error_reply(frame, result))
            else:
                ctx.core.coordinator.offsets_exist(req.group)  # stays, Empty, when its members leave
                answer(ctx.reply(frame, m.OffsetCommitResponse()))

        offsets_store = ctx.core.coordinator.offsets
        ctx.core.offsets_run(lambda: offsets_store.commit(req.group, offsets, live), stored)

    return Later(start)


def offset_fetch(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.OffsetFetchRequest)
    check_group(req.group)
    ctx.core.topic_of(frame.topic_id, frame.partition)
    store = ctx.core.coordinator.offsets

    def read() -> Committed:
        return store.committed(req.group, frame.topic_id, frame.partition)

    def reply(result: Committed | BaseException) -> Reply:
        if isinstance(result, BaseException):
            return ctx.error_reply(frame, result)
        return ctx.reply(frame, m.OffsetFetchResponse(offset=result.offset, metadata=result.metadata))

    return ctx.core.with_offsets(read, reply)


def group_error(ctx: Context, frame: Frame, group: str, code: GroupCode) -> Reply:
    return ctx.error(frame, _GROUP_CODES[code], f"group {group!r}: {code.value}")


def join_group(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    """Answered when the group's join phase ends (`Later`): members assigned by the broker
    in one step (our clients need no MEMBER_ID_REQUIRED round trip)."""
    assert isinstance(req, m.JoinGroupRequest)
    check_group(req.group)

    def start(answer: Callable[[Reply | Silent], None]) -> None:
        def done(result: JoinResult) -> None:
            if result.code != GroupCode.NONE:
                answer(group_error(ctx, frame, req.group, result.code))
                return
            members = tuple(m.GroupMember(member, meta) for member, _instance, meta in result.members)
            resp = m.JoinGroupResponse(
                generation=result.generation,
                protocol=result.protocol_name or "",
                leader=result.leader,
                member_id=result.member_id,
                members=members,
            )
            answer(ctx.reply(frame, resp))

        ctx.core.coordinator.join(
            req.group,
            req.member_id,
            req.protocol_type,
            [(p.name, p.metadata) for p in req.protocols],
            req.session_timeout_ms,
            req.rebalance_timeout_ms,
            done,
            client_id="ringlog",
        )

    return Later(start)


def sync_group(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    """Answered when the leader's assignment arrives (`Later`)."""
    assert isinstance(req, m.SyncGroupRequest)
    check_group(req.group)

    def start(answer: Callable[[Reply | Silent], None]) -> None:
        def done(result: SyncResult) -> None:
            if result.code != GroupCode.NONE:
                answer(group_error(ctx, frame, req.group, result.code))
            else:
                answer(ctx.reply(frame, m.SyncGroupResponse(assignment=result.assignment)))

        assignments = {a.member_id: a.assignment for a in req.assignments}
        ctx.core.coordinator.sync(req.group, req.generation, req.member_id, assignments, done)

    return Later(start)


def heartbeat(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.HeartbeatRequest)
    check_group(req.group)
    code = ctx.core.coordinator.heartbeat(req.group, req.generation, req.member_id)
    if code != GroupCode.NONE:
        return group_error(ctx, frame, req.group, code)
    return ctx.reply(frame, m.HeartbeatResponse())


def leave_group(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.LeaveGroupRequest)
    check_group(req.group)
    (code,) = ctx.core.coordinator.leave(req.group, [(req.member_id, None)])
    if code != GroupCode.NONE:
        return group_error(ctx, frame, req.group, code)
    return ctx.reply(frame, m.LeaveGroupResponse())
