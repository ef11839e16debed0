"""The group coordinator: classic consumer-group membership and the offsets it guards.

Rules this module keeps:
- Protocol-neutral: members, generations, protocols (name, opaque metadata bytes) and assignments
  (opaque bytes the leader computes: client-side assignment, range, roundrobin and
  cooperative-sticky all just pass through). Results are `GroupCode`s named as Kafka's error
  codes; the Kafka adapter (broker/kafka/groups.py) encodes them, and our own protocol can.
- A group lives on its coordinator core (`routing.coordinator_for`); requests for it elsewhere
  are refused by the caller (Kafka's NOT_COORDINATOR), never handled here.
- The classic state machine: Empty -> PreparingRebalance (members (re)join; the join phase ends
  when every member has rejoined, or at the longest rebalance timeout, dropping those that did
  not; a group that was Empty first waits `initial_rebalance_delay_ms` for more members) ->
  CompletingRebalance (a new generation; every joiner is answered, the leader - the first member,
  kept across generations while it stays - with every member's metadata; the leader's SyncGroup
  hands out assignments, followers' SyncGroups wait for it) -> Stable. A join, leave or session
  expiry during Stable or CompletingRebalance starts a new rebalance; Dead only for a group
  being dropped. Member ids are assigned here (`<client id>-<uuid4>`); with
  `require_known_member_id` (Kafka's JoinGroup v4+) a first join gets MEMBER_ID_REQUIRED with
  its id and must join again with it (within its session timeout).
- Answers that wait (JoinGroup, SyncGroup) are callbacks called exactly once; `close()` answers
  every waiting one (NOT_COORDINATOR: the client finds the coordinator again).
- Timers come from the core's loop (`call_later`), the clock from `clock` (seconds, monotonic),
  so the machine runs without sockets under a fake clock. A member's session timer is armed once
  and re-armed at its deadline when heartbeats moved it, not re-created per heartbeat. A member
  waiting for its JoinGroup or SyncGroup answer does not expire.
- Membership is in memory, lost with the core (clients rejoin, as after a Kafka coordinator
  failover); committed offsets are durable (broker/core/groups.py). A group known to have
  committed offsets (`offsets_exist`: told by the adapters when a commit is stored or a read
  finds some) stays while it has no members, Empty, as Kafka's does while its offsets are kept:
  ListGroups lists it, DescribeGroups says Empty, its generations go on. Any other group that
  becomes Empty is forgotten (its next member starts at generation 1 again, as after a restart).
- Static membership (group.instance.id, KIP-345), as Kafka's classic coordinator keeps it: a
  member joining with an instance id is static, given the id `<instance id>-<uuid4>` at once (no
  MEMBER_ID_REQUIRED round). A join with an empty member id and an instance id the group already
  maps is that member restarting: it takes the old member's place (its assignment, its place as
  leader) under a new member id, the old id is fenced (its waiting JoinGroup or SyncGroup is
  answered FENCED_INSTANCE_ID, its later requests UNKNOWN_MEMBER_ID), and a Stable group is not
  rebalanced unless the protocol it would choose changes: the join is answered at once with the
  current generation and the old leader's id (so a restarted leader does not compute an
  assignment nobody would receive), and its SyncGroup gets the assignment it had. In
  CompletingRebalance the replacement starts a rebalance (the leader may be assigning to the old
  id); in PreparingRebalance it joins the rebalance. A request naming an instance id that maps
  to another member id is FENCED_INSTANCE_ID (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
  OffsetCommit); naming one the group does not map is UNKNOWN_MEMBER_ID. Static members leave as
  dynamic ones do: by LeaveGroup (which clients do not send for them on close) or session expiry.
- A group without members may be deleted (Kafka's DeleteGroups: `check_delete`, then its offsets
  go and `deleted` forgets it); one with members is NON_EMPTY_GROUP.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from broker.core.groups import Committed, GroupOffsetStore, PartitionId

log = logging.getLogger(__name__)

SESSION_TIMEOUT_MS_MIN = 6_000  # Kafka's group.min.session.timeout.ms
SESSION_TIMEOUT_MS_MAX = 1_800_000  # Kafka's group.max.session.timeout.ms
INITIAL_REBALANCE_DELAY_MS = 3_000  # Kafka's group.initial.rebalance.delay.ms
# Protocols one member may list: Kafka clients send one per assignor (Java and librdkafka two or
# three). Every join compares a member's list with the others', so an unbounded list (~650k fit in
# a request) made one JoinGroup hold its core for minutes. More: INVALID_REQUEST.
PROTOCOLS_MAX = 64


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class GroupCode(Enum):
    """What the coordinator answers; the values are Kafka's error names (kio's ErrorCode)."""

    NONE = "none"
    UNKNOWN_MEMBER_ID = "unknown_member_id"
    ILLEGAL_GENERATION = "illegal_generation"
    REBALANCE_IN_PROGRESS = "rebalance_in_progress"
    INCONSISTENT_GROUP_PROTOCOL = "inconsistent_group_protocol"
    MEMBER_ID_REQUIRED = "member_id_required"
    INVALID_SESSION_TIMEOUT = "invalid_session_timeout"
    NOT_COORDINATOR = "not_coordinator"
    INVALID_REQUEST = "invalid_request"
    FENCED_INSTANCE_ID = "fenced_instance_id"
    NON_EMPTY_GROUP = "non_empty_group"


class Cancellable(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], Any]


@dataclass(frozen=True, slots=True)
class JoinResult:
    code: GroupCode
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # (id, instance id, metadata): the leader's


@dataclass(frozen=True, slots=True)
class SyncResult:
    code: GroupCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes  # for the group's protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupView:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    generation: int
    members: tuple[MemberView, ...]


JoinDone = Callable[[JoinResult], None]
SyncDone = Callable[[SyncResult], None]


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_ms: int
    rebalance_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_done: JoinDone | None = None
    sync_done: SyncDone | None = None
    deadline: float = 0.0
    timer_armed: bool = False

    def metadata_for(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")


@dataclass(slots=True, eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static: dict[str, str] = field(default_factory=dict)  # instance id -> its member's id
    pending: dict[str, float] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> deadline
    join_timer: Cancellable | None = None
    delaying: bool = False  # the initial rebalance delay of a group that was Empty runs
    has_offsets: bool = False  # committed offsets are kept for it: it stays while Empty

    def candidates(self) -> set[str]:
        """The protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()


class GroupCoordinator:
    """The groups one core coordinates: membership in memory, committed offsets on disk."""

    def __init__(
        self,
        offsets: GroupOffsetStore,
        call_later: CallLater,
        clock: Callable[[], float] = time.monotonic,
        initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS,
    ) -> None:
        self.offsets = offsets
        self.call_later = call_later
        self.clock = clock
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.groups: dict[str, Group] = {}

    # ------------------------------------------------------------------------- JoinGroup

    def join(
        self,
        group_id: str,
        member_id: str,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_ms: int,
        rebalance_ms: int,
        done: JoinDone,
        *,
        instance_id: str | None = None,
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = False,
    ) -> None:
        """Join (or rejoin) `group_id`; `done(result)` is called once, now or when the join phase
        ends."""
        g = self.groups.get(group_id)
        if g is None:
            if member_id:
                done(JoinResult(GroupCode.UNKNOWN_MEMBER_ID, member_id))
                return
            g = self.groups[group_id] = Group(group_id)
        protos = tuple(protocols)
        if len(protos) > PROTOCOLS_MAX:
            done(JoinResult(GroupCode.INVALID_REQUEST, member_id))
            return
        if not protocol_type or not protos:
            done(JoinResult(GroupCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        if not SESSION_TIMEOUT_MS_MIN <= session_ms <= SESSION_TIMEOUT_MS_MAX:
            done(JoinResult(GroupCode.INVALID_SESSION_TIMEOUT, member_id))
            return
        others = [m for m in g.members.values() if m.member_id != member_id]
        if others:
            supported = set.intersection(*({name for name, _ in m.protocols} for m in others))
            if protocol_type != g.protocol_type or not supported & {name for name, _ in protos}:
                done(JoinResult(GroupCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
                return
        now = self.clock()
        if instance_id is not None:
            if not member_id and instance_id in g.static:
                self._replace_static(g, instance_id, protos, session_ms, rebalance_ms, done)
                return
            if self._fenced(g, member_id, instance_id):
                done(JoinResult(GroupCode.FENCED_INSTANCE_ID, member_id))
                return
            if member_id and instance_id not in g.static:  # Kafka: an instance id it does not know
                done(JoinResult(GroupCode.UNKNOWN_MEMBER_ID, member_id))
                return
        if not member_id or member_id in g.pending:
            if not member_id and instance_id is not None:  # static: its id at once (module rules)
                member_id = f"{instance_id}-{uuid.uuid4()}"
                g.static[instance_id] = member_id
            elif not member_id:
                member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
                if require_known_member_id:
                    self._expect(g, member_id, now + session_ms / 1000)
                    done(JoinResult(GroupCode.MEMBER_ID_REQUIRED, member_id))
                    return
            else:
                del g.pending[member_id]
            m = Member(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_ms,
                rebalance_ms,
                protocol_type,
                protos,
                join_done=done,
                deadline=now + session_ms / 1000,
            )
            g.members[member_id] = m
            if g.protocol_type is None:
                g.protocol_type = protocol_type
            self._arm(g, m)
            log.info("group %s: member %s joins", g.group_id, member_id)
            if g.state == GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(g)
            else:
                self._prepare_rebalance(g, f"member {member_id} joined")
            return
        existing = g.members.get(member_id)
        if existing is None:
            done(JoinResult(GroupCode.UNKNOWN_MEMBER_ID, member_id))
            return
        m = existing
        m.deadline = now + session_ms / 1000
        m.session_ms, m.rebalance_ms = session_ms, rebalance_ms
        changed = protos != m.protocols
        if m.join_done is not None and m.join_done is not done:  # a join it gave up on (reconnected)
            earlier, m.join_done = m.join_done, None
            earlier(JoinResult(GroupCode.REBALANCE_IN_PROGRESS, member_id))
        if g.state == GroupState.PREPARING_REBALANCE:
            m.protocols, m.join_done = protos, done
            self._maybe_complete_join(g)
        elif g.state == GroupState.COMPLETING_REBALANCE and not changed:
            done(self._join_result(g, m))  # its JoinGroup answer was lost: the same again
        elif g.state == GroupState.STABLE and not changed and member_id != g.leader:
            done(self._join_result(g, m))
        else:  # CompletingRebalance or Stable with new metadata, or the leader rejoining
            m.protocols, m.join_done = protos, done
            self._prepare_rebalance(g, f"member {member_id} rejoined")

    @staticmethod
    def _fenced(g: Group | None, member_id: str, instance_id: str | None) -> bool:
        """Whether a request naming `member_id` and `instance_id` comes from an old incarnation
        of a static member: the instance id maps to another member id (Kafka's
        isStaticMemberFenced)."""
        if g is None or instance_id is None or not member_id:
            return False
        mapped = g.static.get(instance_id)
        return mapped is not None and mapped != member_id

    def _replace_static(
        self,
        g: Group,
        instance_id: str,
        protocols: tuple[tuple[str, bytes], ...],
        session_ms: int,
        rebalance_ms: int,
        done: JoinDone,
    ) -> None:
        """A static member restarting (a join with no member id and a known instance id): it takes
        its old member's place under a new id, the old id fenced; a Stable group is not
        rebalanced unless the protocol it would choose changes (module rules)."""
        old_id = g.static[instance_id]
        m = g.members[old_id]
        joining, syncing = m.join_done, m.sync_done
        m.join_done = m.sync_done = None
        if joining is not None:  # the old incarnation, if alive, is a duplicate: fenced
            joining(JoinResult(GroupCode.FENCED_INSTANCE_ID, old_id))
        if syncing is not None:
            syncing(SyncResult(GroupCode.FENCED_INSTANCE_ID))
        leader_before = g.leader
        m.member_id = new_id = f"{instance_id}-{uuid.uuid4()}"
        g.members = {(new_id if k == old_id else k): v for k, v in g.members.items()}  # its place kept
        g.static[instance_id] = new_id
        if g.leader == old_id:
            g.leader = new_id
        m.protocols, m.session_ms, m.rebalance_ms = protocols, session_ms, rebalance_ms
        m.deadline = self.clock() + session_ms / 1000
        log.info("group %s: static member %s restarts as %s", g.group_id, old_id, new_id)
        if g.state == GroupState.STABLE and self._choose_protocol(g) == g.protocol:
            # the old leader's id: a restarted leader must not compute an assignment that a
            # Stable group would never hand out (Kafka's answer before JoinGroup v9)
            done(
                JoinResult(
                    GroupCode.NONE, new_id, g.generation, g.protocol_type, g.protocol, leader_before or ""
                )
            )
            return
        m.join_done = done
        if g.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(g)
        else:  # CompletingRebalance (the leader may be assigning to the old id), or a new protocol
            self._prepare_rebalance(g, f"static member {instance_id} restarted as {new_id}")

    def _expect(self, g: Group, member_id: str, deadline: float) -> None:
        """A MEMBER_ID_REQUIRED id: the join phase waits for it until its session timeout."""
        g.pending[member_id] = deadline

        def expired() -> None:
            if g.pending.pop(member_id, None) is not None:
                log.info("group %s: member id %s was never used", g.group_id, member_id)
                self._maybe_complete_join(g)
                self._forget_if_empty(g)

        self.call_later(max(0.0, deadline - self.clock()), expired)

    def _join_result(self, g: Group, m: Member) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if m.member_id == g.leader:
            members = tuple(
                (x.member_id, x.instance_id, x.metadata_for(g.protocol)) for x in g.members.values()
            )
        return JoinResult(
            GroupCode.NONE,
            m.member_id,
            g.generation,
            g.protocol_type,
            g.protocol,
            g.leader or "",
            members,
        )

    # ------------------------------------------------------------------------- rebalances

    def _prepare_rebalance(self, g: Group, reason: str) -> None:
        if g.state == GroupState.COMPLETING_REBALANCE:
            for m in g.members.values():  # their assignments will not come: rejoin
                if m.sync_done is not None:
                    done, m.sync_done = m.sync_done, None
                    done(SyncResult(GroupCode.REBALANCE_IN_PROGRESS))
        was_empty = g.state == GroupState.EMPTY
        g.state = GroupState.PREPARING_REBALANCE
        if g.join_timer is not None:
            g.join_timer.cancel()
        log.info("group %s: rebalancing (generation %d): %s", g.group_id, g.generation, reason)
        rebalance_s = max((m.rebalance_ms for m in g.members.values()), default=0) / 1000
        if was_empty and self.initial_rebalance_delay_ms > 0:
            g.delaying = True
            delay_s = min(self.initial_rebalance_delay_ms / 1000, rebalance_s)

            def delayed() -> None:
                g.delaying = False
                g.join_timer = self.call_later(
                    max(0.0, rebalance_s - delay_s), lambda: self._complete_join(g)
                )
                self._maybe_complete_join(g)

            g.join_timer = self.call_later(delay_s, delayed)
            return
        g.join_timer = self.call_later(rebalance_s, lambda: self._complete_join(g))
        self._maybe_complete_join(g)

    def _forget_if_empty(self, g: Group) -> None:
        """An Empty group with no member ids handed out and no committed offsets is dropped from
        memory: ids of groups used once must not pile up. One with offsets stays (module rules):
        as many as the store holds groups."""
        if (
            g.state == GroupState.EMPTY
            and not g.members
            and not g.pending
            and not g.has_offsets
            and self.groups.get(g.group_id) is g
        ):
            del self.groups[g.group_id]

    def offsets_exist(self, group_id: str) -> None:
        """The group has committed offsets (a commit was stored, or a read found some): it exists,
        Empty while it has no members, as a Kafka group does while its offsets are kept. Called
        only on the group's coordinator core."""
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        g.has_offsets = True

    def _maybe_complete_join(self, g: Group) -> None:
        if g.state != GroupState.PREPARING_REBALANCE or g.delaying or g.pending:
            return
        if all(m.join_done is not None for m in g.members.values()):
            self._complete_join(g)

    def _complete_join(self, g: Group) -> None:
        """The join phase ends: members that did not rejoin are dropped, a new generation starts."""
        if g.state != GroupState.PREPARING_REBALANCE or self.groups.get(g.group_id) is not g:
            return
        if g.join_timer is not None:
            g.join_timer.cancel()
            g.join_timer = None
        g.delaying = False
        for m in [m for m in g.members.values() if m.join_done is None]:
            log.info("group %s: member %s did not rejoin in time: removed", g.group_id, m.member_id)
            del g.members[m.member_id]
            if m.instance_id is not None and g.static.get(m.instance_id) == m.member_id:
                del g.static[m.instance_id]
        g.generation += 1
        if not g.members:
            g.state, g.protocol, g.leader = GroupState.EMPTY, None, None
            log.info("group %s: empty (generation %d)", g.group_id, g.generation)
            self._forget_if_empty(g)
            return
        g.protocol = self._choose_protocol(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = GroupState.COMPLETING_REBALANCE
        now = self.clock()
        log.info(
            "group %s: generation %d with %d members, protocol %s, leader %s",
            g.group_id,
            g.generation,
            len(g.members),
            g.protocol,
            g.leader,
        )
        for m in list(g.members.values()):
            m.assignment = b""
            m.deadline = now + m.session_ms / 1000
            done, m.join_done = m.join_done, None
            assert done is not None
            done(self._join_result(g, m))

    @staticmethod
    def _choose_protocol(g: Group) -> str:
        """The protocol every member supports that most members list first among those (ties: the
        leader's, then the first member's, order of preference)."""
        candidates = g.candidates()
        votes: dict[str, int] = {}
        for m in g.members.values():
            first = next(name for name, _ in m.protocols if name in candidates)
            votes[first] = votes.get(first, 0) + 1
        rank: dict[str, int] = {}  # the first member's order; a dict, not list.index: linear
        for name, _ in next(iter(g.members.values())).protocols:
            if name in candidates:
                rank.setdefault(name, -len(rank))
        return max(rank, key=lambda name: (votes.get(name, 0), rank[name]))

    # ------------------------------------------------------------------------- SyncGroup

    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: Mapping[str, bytes],
        done: SyncDone,
        instance_id: str | None = None,
    ) -> None:
        """A member asks for its assignment; the leader's call carries everyone's."""
        g = self.groups.get(group_id)
        if self._fenced(g, member_id, instance_id):
            done(SyncResult(GroupCode.FENCED_INSTANCE_ID))
            return
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            done(SyncResult(GroupCode.UNKNOWN_MEMBER_ID))
            return
        if generation != g.generation:
            done(SyncResult(GroupCode.ILLEGAL_GENERATION))
            return
        m.deadline = self.clock() + m.session_ms / 1000
        if g.state == GroupState.PREPARING_REBALANCE:
            done(SyncResult(GroupCode.REBALANCE_IN_PROGRESS))
        elif g.state == GroupState.STABLE:
            done(SyncResult(GroupCode.NONE, m.assignment, g.protocol_type, g.protocol))
        elif g.state == GroupState.COMPLETING_REBALANCE:
            if m.sync_done is not None:
                m.sync_done(SyncResult(GroupCode.REBALANCE_IN_PROGRESS))
            m.sync_done = done
            if member_id == g.leader:
                for x in g.members.values():
                    x.assignment = assignments.get(x.member_id, b"")
                g.state = GroupState.STABLE
                log.info("group %s: generation %d is stable", g.group_id, g.generation)
                for x in g.members.values():
                    if x.sync_done is not None:
                        answer, x.sync_done = x.sync_done, None
                        answer(SyncResult(GroupCode.NONE, x.assignment, g.protocol_type, g.protocol))
        else:
            done(SyncResult(GroupCode.UNKNOWN_MEMBER_ID))

    # ------------------------------------------------------------------------- Heartbeat, LeaveGroup

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, instance_id: str | None = None
    ) -> GroupCode:
        g = self.groups.get(group_id)
        if self._fenced(g, member_id, instance_id):
            return GroupCode.FENCED_INSTANCE_ID
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            return GroupCode.UNKNOWN_MEMBER_ID
        m.deadline = self.clock() + m.session_ms / 1000
        if g.state == GroupState.PREPARING_REBALANCE:
            return GroupCode.REBALANCE_IN_PROGRESS
        if generation != g.generation:
            return GroupCode.ILLEGAL_GENERATION
        return GroupCode.NONE

    def leave(self, group_id: str, members: Sequence[tuple[str, str | None]]) -> list[GroupCode]:
        """Each of `members` ((member id, instance id)) leaves: a code per member."""
        g = self.groups.get(group_id)
        codes = []
        for given_id, instance_id in members:
            if self._fenced(g, given_id, instance_id):
                codes.append(GroupCode.FENCED_INSTANCE_ID)
                continue
            member_id = given_id
            if g is not None and instance_id is not None and instance_id in g.static:
                member_id = g.static[instance_id]  # an admin's removal may name the instance only
            m = g.members.get(member_id) if g is not None else None
            if g is None or m is None:
                codes.append(GroupCode.UNKNOWN_MEMBER_ID)
                continue
            codes.append(GroupCode.NONE)
            self._remove(g, m, "left the group")
        return codes

    def _remove(self, g: Group, m: Member, reason: str) -> None:
        del g.members[m.member_id]
        if m.instance_id is not None and g.static.get(m.instance_id) == m.member_id:
            del g.static[m.instance_id]
        log.info("group %s: member %s %s", g.group_id, m.member_id, reason)
        joining, syncing = m.join_done, m.sync_done
        m.join_done = m.sync_done = None
        if joining is not None:
            joining(JoinResult(GroupCode.UNKNOWN_MEMBER_ID, m.member_id))
        if syncing is not None:
            syncing(SyncResult(GroupCode.UNKNOWN_MEMBER_ID))
        if g.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(g, f"member {m.member_id} {reason}")
        else:
            self._maybe_complete_join(g)

    # ------------------------------------------------------------------------- sessions

    def _arm(self, g: Group, m: Member) -> None:
        if m.timer_armed:
            return
        m.timer_armed = True
        self.call_later(max(0.0, m.deadline - self.clock()), lambda: self._session_check(g, m))

    def _session_check(self, g: Group, m: Member) -> None:
        m.timer_armed = False
        if g.members.get(m.member_id) is not m or self.groups.get(g.group_id) is not g:
            return
        now = self.clock()
        if m.join_done is not None or m.sync_done is not None:
            m.deadline = max(m.deadline, now + m.session_ms / 1000)  # waiting for us, not gone
        if now < m.deadline:
            self._arm(g, m)
            return
        self._remove(g, m, f"expired (no heartbeat for {m.session_ms} ms)")

    # ------------------------------------------------------------------------- offsets

    def commit_check(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        instance_id: str | None = None,
        transactional: bool = False,
    ) -> GroupCode:
        """Whether a commit by (generation, member) may be stored: any commit with generation
        -1 while the group has no members (a "simple" consumer's, or our protocol's); else a
        member's of the current generation, not an old incarnation of a static one.

        `transactional` (a TxnOffsetCommit, Kafka's validateOffsetCommit with isTransactional):
        one naming no member (generation -1, no member or instance id: every v0-2 request, and
        a producer not fed by a group member) is stored whatever the group's members; one naming
        a member is checked as above (KIP-447's zombie fencing), but a group completing a
        rebalance does not refuse it."""
        g = self.groups.get(group_id)
        if transactional and generation < 0 and not member_id and instance_id is None:
            return GroupCode.NONE
        if self._fenced(g, member_id, instance_id):
            return GroupCode.FENCED_INSTANCE_ID
        if g is None or not g.members:
            if generation < 0:
                return GroupCode.NONE
            return GroupCode.ILLEGAL_GENERATION if g is None else GroupCode.UNKNOWN_MEMBER_ID
        if g.state == GroupState.COMPLETING_REBALANCE and not transactional:
            return GroupCode.REBALANCE_IN_PROGRESS
        m = g.members.get(member_id)
        if m is None:
            return GroupCode.UNKNOWN_MEMBER_ID
        if generation != g.generation:
            return GroupCode.ILLEGAL_GENERATION
        m.deadline = self.clock() + m.session_ms / 1000
        return GroupCode.NONE

    def commit(
        self,
        group_id: str,
        offsets: Mapping[PartitionId, Committed],
        generation: int = -1,
        member_id: str = "",
        live: Callable[[int], bool] | None = None,
    ) -> GroupCode:
        """Store `offsets` if `commit_check` allows (raises what the file write raises); `live`
        says which topic ids still exist (the others' offsets are dropped)."""
        code = self.commit_check(group_id, generation, member_id)
        if code == GroupCode.NONE and offsets:
            self.offsets.commit(group_id, offsets, live)
            self.offsets_exist(group_id)
        return code

    # ------------------------------------------------------------------------- deletion

    def check_delete(self, group_id: str) -> GroupCode:
        """Whether the group may be deleted now (Kafka's validateDeleteGroup): not while it has
        members (NON_EMPTY_GROUP). Whether it exists at all is the caller's to find out: a group
        without members lives on in its committed offsets (the store)."""
        g = self.groups.get(group_id)
        return GroupCode.NON_EMPTY_GROUP if g is not None and g.members else GroupCode.NONE

    def deleted(self, group_id: str) -> None:
        """The group's offsets are deleted: it is forgotten, unless a member joined meanwhile (it
        then goes on, as a group that never had offsets)."""
        g = self.groups.get(group_id)
        if g is None:
            return
        g.has_offsets = False
        if not g.members:
            if g.join_timer is not None:
                g.join_timer.cancel()
            del self.groups[group_id]
            log.info("group %s: deleted", group_id)

    # ------------------------------------------------------------------------- views, shutdown

    def view(self, group_id: str) -> GroupView | None:
        g = self.groups.get(group_id)
        if g is None:
            return None
        stable = g.state == GroupState.STABLE
        return GroupView(
            g.group_id,
            g.state.value,
            g.protocol_type or "",
            g.protocol or "",
            g.generation,
            tuple(
                MemberView(
                    m.member_id,
                    m.instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata_for(g.protocol),
                    m.assignment if stable else b"",
                )
                for m in g.members.values()
            ),
        )

    def close(self) -> None:
        """The core stops: every waiting JoinGroup and SyncGroup is answered NOT_COORDINATOR."""
        for g in self.groups.values():
            if g.join_timer is not None:
                g.join_timer.cancel()
            g.state = GroupState.DEAD
            for m in g.members.values():
                if m.join_done is not None:
                    m.join_done(JoinResult(GroupCode.NOT_COORDINATOR, m.member_id))
                if m.sync_done is not None:
                    m.sync_done(SyncResult(GroupCode.NOT_COORDINATOR))
                m.join_done = m.sync_done = None
        self.groups.clear()
