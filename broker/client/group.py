"""Group membership for the consumer: join, get a share of the partitions, heartbeat, rebalance.

Rules this module keeps:
- Kafka's classic protocol with client-side assignment, through the broker's one group
  coordinator (the core `AsyncClient.coordinator(group)` names: `coordinator_for(group, cores)`
  on one node; in a cluster that core of the node `coordinator_node(group, live nodes)` names;
  broker/core/coordinator.py). In a cluster a failed request (NOT_OWNER: the coordinator moved,
  or a lost connection) also refreshes Metadata before the member joins again. The
  same groups Kafka consumers join on the Kafka listener, with Kafka's consumer-protocol bytes
  (ringlog_proto/consumer_protocol.py), so our Consumer and Kafka consumers can share a group.
- Eager rebalancing, as Kafka's range assignor does it: on a rebalance every member gives up all
  its partitions (`revoked`, where the consumer commits its positions), rejoins, and gets its new
  share (`assigned`). Between the two it fetches nothing, so no partition is ever read by two
  members of one generation.
- The leader (the member the coordinator names) computes the assignment with the range assignor
  over the union of the members' subscriptions: each topic's partitions in order, split into
  contiguous ranges over the members subscribed to it, sorted by member id; the first
  `partitions % members` get one more.
- Requests go on a connection of their own to the coordinator core (lane "group"): a JoinGroup
  or SyncGroup waits at the coordinator for the other members, which must not hold back the
  consumer's commits and metadata behind it.
- Refusals that rejoining cannot cure (the ACLs refuse the group or a topic, the credentials are
  refused) end the membership: `failure` holds the error, `failed` is set, and `on_failure` hands
  it to the consumer, whose next `poll` raises it (Kafka's GroupAuthorizationException).
- Heartbeats run every `heartbeat_interval_ms` on the client's loop, independent of `poll`: a
  member is removed only when its process stops heartbeating for `session_timeout_ms`.
- A topic's partitions can be added to (Kafka's CreatePartitions): the leader asks the partition
  counts it assigned again every `metadata_max_age` of the client and, when one grew, rejoins,
  which rebalances the group over the new partitions (Kafka's consumer leader does the same on
  its metadata refresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from broker.client.client import AsyncClient, TopicPartition
from broker.client.errors import AuthenticationError, AuthorizationError, ClientError, error_for
from ringlog_proto.consumer_protocol import (
    CONSUMER_PROTOCOL_TYPE,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from ringlog_proto.messages import (
    ErrorCode,
    GroupAssignment,
    GroupMember,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    SyncGroupRequest,
    SyncGroupResponse,
)

log = logging.getLogger(__name__)

RANGE = "range"
LANE = "group"
# An answer that means "this generation is over: give up the partitions and join again".
_REJOIN = frozenset({ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION})
# refusals that rejoining cannot cure: they end the membership (module rules)
_FATAL = frozenset(
    {
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.SASL_AUTHENTICATION_FAILED,
        ErrorCode.ILLEGAL_SASL_STATE,
    }
)


def range_assign(
    members: Sequence[GroupMember], partitions: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """member id -> topic -> partitions, Kafka's range assignor over `members`' subscriptions
    (`partitions`: topic -> partition count; topics not in it get nobody). A member whose
    subscription does not parse is given nothing."""
    subscribers: dict[str, list[str]] = {}
    out: dict[str, dict[str, list[int]]] = {}
    for m in members:
        out[m.member_id] = {}
        try:
            topics = decode_subscription(m.metadata).topics
        except ValueError as exc:
            log.warning("member %s sent a subscription that does not parse: %s", m.member_id, exc)
            continue
        for topic in topics:
            subscribers.setdefault(topic, []).append(m.member_id)
    for topic, ids in subscribers.items():
        count = partitions.get(topic)
        if not count:
            continue
        ordered = sorted(set(ids))
        share, extra = divmod(count, len(ordered))
        start = 0
        for i, member in enumerate(ordered):
            n = share + (1 if i < extra else 0)
            if n:
                out[member][topic] = list(range(start, start + n))
            start += n
    return out


class GroupMembership:
    """One consumer's membership of `group`, run as a task on the consumer's loop."""

    def __init__(
        self,
        client: AsyncClient,
        group: str,
        topics: Sequence[str],
        *,
        assigned: Callable[[list[TopicPartition]], Awaitable[None]],
        revoked: Callable[[], Awaitable[None]],
        session_timeout_ms: int = 45_000,
        rebalance_timeout_ms: int = 300_000,
        heartbeat_interval_ms: int = 3_000,
        retry_backoff_ms: int = 100,
        on_failure: Callable[[BaseException], None] = lambda exc: None,
    ) -> None:
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be > 0 and below session_timeout_ms")
        self.client = client
        self.group = group
        self.topics = tuple(dict.fromkeys(topics))
        self._assigned = assigned
        self._revoked = revoked
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.joined = asyncio.Event()  # set while this member holds an assignment
        self._holding = False
        self.failure: BaseException | None = None  # a refusal that ended the membership
        self.failed = asyncio.Event()
        self._on_failure = on_failure
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._counts: dict[str, int] = {}  # partition counts of the leader's last assignment

    @property
    def identity(self) -> tuple[int, str]:
        """(generation, member id) that this member's commits carry: the coordinator refuses
        commits of a generation it has moved past (their partitions may have a new owner)."""
        return self.generation, self.member_id

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _request(self, req: object, timeout: float | None = None) -> object:
        # one node: the client learnt the core count from ApiVersions when it started; a cluster:
        # from the Metadata `subscribe` asked for the topics
        coordinator = self.client.coordinator(self.group)
        conn = await self.client.connection(coordinator, lane=LANE)
        return await conn.request(req, timeout=timeout, check=False)  # type: ignore[arg-type]

    async def _run(self) -> None:
        backoff = self.retry_backoff
        while not self._closing:
            try:
                await self._join_and_sync()
                backoff = self.retry_backoff
                await self._heartbeat()
            except asyncio.CancelledError:
                raise
            except (AuthorizationError, AuthenticationError) as exc:
                log.warning("group %s: %s; not rejoining", self.group, exc)
                await self._revoke()
                self.failure = exc
                self.failed.set()
                self._on_failure(exc)
                return
            except ClientError as exc:
                if self._closing:
                    return
                log.warning("group %s: %s; rejoining in %.1f s", self.group, exc, backoff)
                await self._revoke()
                await asyncio.sleep(backoff)
                if self.client.clustered:
                    with contextlib.suppress(ClientError):  # who coordinates it now
                        await self.client.refresh_metadata(self.topics)
                backoff = min(backoff * 2, 5.0)

    async def _revoke(self) -> None:
        if self._holding:
            self._holding = False
            self.joined.clear()
            await self._revoked()

    async def _join_and_sync(self) -> None:
        await self._revoke()
        join_timeout = self.rebalance_timeout_ms / 1000 + 5
        while True:
            resp = await self._request(
                JoinGroupRequest(
                    self.group,
                    self.member_id,
                    self.session_timeout_ms,
                    self.rebalance_timeout_ms,
                    CONSUMER_PROTOCOL_TYPE,
                    (GroupProtocol(RANGE, encode_subscription(self.topics)),),
                ),
                timeout=join_timeout,
            )
            assert isinstance(resp, JoinGroupResponse)
            if resp.error == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                continue
            if resp.error in _REJOIN:
                continue
            if resp.error in _FATAL:
                raise error_for(resp.error, f"JoinGroup of {self.group!r}: {resp.message}")
            if resp.error != ErrorCode.NONE:
                raise ClientError(f"JoinGroup of {self.group!r}: {resp.error.name}: {resp.message}")
            break
        self.member_id, self.generation, self.leader = resp.member_id, resp.generation, resp.leader
        assignments: tuple[GroupAssignment, ...] = ()
        if resp.leader == resp.member_id:
            assignments = await self._assign(resp.members)
        sync = await self._request(
            SyncGroupRequest(self.group, self.generation, self.member_id, assignments), timeout=join_timeout
        )
        assert isinstance(sync, SyncGroupResponse)
        if sync.error == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            raise ClientError(f"group {self.group!r}: this member expired before its assignment")
        if sync.error in _REJOIN:
            raise ClientError(f"group {self.group!r} rebalanced during the assignment")
        if sync.error != ErrorCode.NONE:
            if sync.error in _FATAL:
                raise error_for(sync.error, f"SyncGroup of {self.group!r}: {sync.message}")
            raise ClientError(f"SyncGroup of {self.group!r}: {sync.error.name}: {sync.message}")
        mine = decode_assignment(sync.assignment)
        tps = [TopicPartition(t, p) for t in sorted(mine) for p in sorted(mine[t])]
        log.info(
            "group %s generation %d: member %s assigned %d partition(s)",
            self.group,
            self.generation,
            self.member_id,
            len(tps),
        )
        await self._assigned(tps)
        self._holding = True
        self.joined.set()

    async def _assign(self, members: Sequence[GroupMember]) -> tuple[GroupAssignment, ...]:
        topics: set[str] = set()
        for m in members:
            with contextlib.suppress(ValueError):
                topics.update(decode_subscription(m.metadata).topics)
        counts: dict[str, int] = {}
        for topic in sorted(topics):
            try:
                counts[topic] = (await self.client.topic(topic, refresh=True)).partitions
            except ClientError as exc:
                log.warning("group %s: topic %s is not assignable: %s", self.group, topic, exc)
        self._counts = counts
        plan = range_assign(members, counts)
        return tuple(GroupAssignment(member, encode_assignment(parts)) for member, parts in plan.items())

    async def _heartbeat(self) -> None:
        """Heartbeat until the generation ends (a ClientError: rejoin) or the member closes."""
        recount_at = time.monotonic() + self.client.metadata_max_age
        while not self._closing:
            await asyncio.sleep(self.heartbeat_interval)
            if self._closing:
                return
            if self.leader == self.member_id and time.monotonic() >= recount_at:
                recount_at = time.monotonic() + self.client.metadata_max_age
                await self._check_counts()
            resp = await self._request(HeartbeatRequest(self.group, self.generation, self.member_id))
            error = resp.error  # type: ignore[attr-defined]
            if error == ErrorCode.NONE:
                continue
            if error in _FATAL:  # an ACL removed meanwhile
                raise error_for(error, f"Heartbeat of {self.group!r}: {resp.message}")  # type: ignore[attr-defined]
            if error == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            if error in _REJOIN or error == ErrorCode.UNKNOWN_MEMBER_ID:
                raise ClientError(f"group {self.group!r}: {error.name}")
            raise ClientError(f"Heartbeat of {self.group!r}: {error.name}: {resp.message}")  # type: ignore[attr-defined]

    async def _check_counts(self) -> None:
        """The leader's: raise `ClientError` (rejoin: a rebalance) when a topic it assigned has
        more partitions now than it assigned."""
        for topic, count in self._counts.items():
            try:
                now = (await self.client.topic(topic, refresh=True)).partitions
            except ClientError as exc:
                log.debug("group %s: topic %s not counted: %s", self.group, topic, exc)
                continue
            if now != count:
                raise ClientError(
                    f"group {self.group!r}: topic {topic!r} has {now} partitions, {count} were assigned"
                )

    async def close(self) -> None:
        """Give up the partitions (the consumer commits in `revoked`) and leave the group, so the
        others rebalance at once instead of after this member's session timeout."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(ClientError):
            await self._revoke()
        if self.member_id:
            with contextlib.suppress(ClientError, OSError, asyncio.TimeoutError):
                await self._request(LeaveGroupRequest(self.group, self.member_id), timeout=5)
            self.member_id = ""
