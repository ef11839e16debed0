"""The group coordinator's state machine, driven without sockets under a fake clock: joins,
generations, the leader's assignment, session expiry, rebalance timeout, leaving, commits."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.core.coordinator import (
    GroupCode,
    GroupCoordinator,
    GroupState,
    JoinResult,
    SyncResult,
)
from broker.core.groups import Committed, GroupOffsetStore

SESSION_MS = 10_000
REBALANCE_MS = 30_000
DELAY_MS = 3_000


class FakeLoop:
    """call_later and a clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = 0

    def clock(self) -> float:
        return self.now

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(fn)
        self._seq += 1
        heapq.heappush(self._timers, (self.now + delay_s, self._seq, timer))
        return timer

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._timers and self._timers[0][0] <= end:
            at, _, timer = heapq.heappop(self._timers)
            self.now = at
            if not timer.cancelled:
                timer.fn()
        self.now = end


class Timer:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def coord(loop: FakeLoop, tmp_path: Path) -> GroupCoordinator:
    return GroupCoordinator(
        GroupOffsetStore(str(tmp_path)), loop.call_later, loop.clock, initial_rebalance_delay_ms=DELAY_MS
    )


class Answers:
    def __init__(self) -> None:
        self.got: list[JoinResult | SyncResult] = []

    def __call__(self, result: JoinResult | SyncResult) -> None:
        self.got.append(result)

    @property
    def one(self) -> JoinResult | SyncResult:
        assert len(self.got) == 1, self.got
        return self.got[0]


def join(
    coord: GroupCoordinator,
    member_id: str = "",
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),),
) -> Answers:
    answers = Answers()
    coord.join(
        "g",
        member_id,
        "consumer",
        protocols,
        SESSION_MS,
        REBALANCE_MS,
        answers,
        client_id="c",
        require_known_member_id=False,
    )
    return answers


def sync(coord: GroupCoordinator, result: JoinResult, assignments: dict[str, bytes] | None = None) -> Answers:
    answers = Answers()
    coord.sync("g", result.generation, result.member_id, assignments or {}, answers)
    return answers


def stable_pair(coord: GroupCoordinator, loop: FakeLoop) -> tuple[JoinResult, JoinResult]:
    a, b = join(coord), join(coord)
    assert not a.got and not b.got  # the initial delay holds the first generation back
    loop.advance(DELAY_MS / 1000)
    ra, rb = a.one, b.one
    assert isinstance(ra, JoinResult) and isinstance(rb, JoinResult)
    sb = sync(coord, rb)
    assert not sb.got  # a follower waits for the leader's assignment
    sa = sync(coord, ra, {ra.member_id: b"A", rb.member_id: b"B"})
    assert sa.one == SyncResult(GroupCode.NONE, b"A", "consumer", "range")
    assert sb.one == SyncResult(GroupCode.NONE, b"B", "consumer", "range")
    return ra, rb


def test_two_members_one_generation_leader_gets_metadata(coord: GroupCoordinator, loop: FakeLoop) -> None:
    ra, rb = stable_pair(coord, loop)
    assert ra.generation == rb.generation == 1
    assert ra.leader == rb.leader == ra.member_id
    assert [m[0] for m in ra.members] == [ra.member_id, rb.member_id] and rb.members == ()
    assert ra.member_id.startswith("c-") and ra.member_id != rb.member_id
    assert coord.groups["g"].state == GroupState.STABLE
    assert coord.heartbeat("g", 1, rb.member_id) == GroupCode.NONE
    assert coord.heartbeat("g", 0, rb.member_id) == GroupCode.ILLEGAL_GENERATION
    assert coord.heartbeat("g", 1, "nobody") == GroupCode.UNKNOWN_MEMBER_ID


def test_member_id_required_first(coord: GroupCoordinator) -> None:
    answers = Answers()
    coord.join(
        "g", "", "consumer", [("range", b"")], SESSION_MS, REBALANCE_MS, answers, require_known_member_id=True
    )
    first = answers.one
    assert first.code == GroupCode.MEMBER_ID_REQUIRED and first.member_id
    again = Answers()
    coord.join("g", first.member_id, "consumer", [("range", b"")], SESSION_MS, REBALANCE_MS, again)
    assert coord.groups["g"].members.keys() == {first.member_id}


def test_no_common_protocol_is_inconsistent(coord: GroupCoordinator, loop: FakeLoop) -> None:
    stable_pair(coord, loop)
    third = join(coord, protocols=(("roundrobin", b""),))
    assert third.one.code == GroupCode.INCONSISTENT_GROUP_PROTOCOL


def test_protocol_chosen_is_supported_by_all(coord: GroupCoordinator, loop: FakeLoop) -> None:
    a = join(coord, protocols=(("cooperative-sticky", b"1"), ("range", b"2")))
    b = join(coord, protocols=(("range", b"3"),))
    loop.advance(DELAY_MS / 1000)
    assert a.one.protocol_name == b.one.protocol_name == "range"
    assert isinstance(a.one, JoinResult) and [m[2] for m in a.one.members] == [b"2", b"3"]


def test_session_expiry_rebalances_the_rest(coord: GroupCoordinator, loop: FakeLoop) -> None:
    ra, rb = stable_pair(coord, loop)
    for _ in range(4):  # a keeps heartbeating, b is silent
        loop.advance(3)
        code = coord.heartbeat("g", ra.generation, ra.member_id)
    assert code == GroupCode.REBALANCE_IN_PROGRESS  # b expired after 10 s: a rebalance started
    assert rb.member_id not in coord.groups["g"].members
    again = join(coord, ra.member_id)  # a rejoins: the only member, so the join phase ends now
    r = again.one
    assert isinstance(r, JoinResult)
    assert (r.code, r.generation, r.leader, len(r.members)) == (GroupCode.NONE, 2, ra.member_id, 1)
    assert coord.heartbeat("g", 1, rb.member_id) == GroupCode.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_drops_members_that_do_not_rejoin(coord: GroupCoordinator, loop: FakeLoop) -> None:
    ra, rb = stable_pair(coord, loop)
    newcomer = join(coord)
    assert coord.groups["g"].state == GroupState.PREPARING_REBALANCE
    a_again = join(coord, ra.member_id)
    for _ in range(int(REBALANCE_MS / 1000 / 5)):  # b heartbeats (keeping its session) but never rejoins
        loop.advance(5)
        if a_again.got:
            break
        assert coord.heartbeat("g", rb.generation, rb.member_id) == GroupCode.REBALANCE_IN_PROGRESS
    r = a_again.one
    assert isinstance(r, JoinResult) and r.generation == 2
    assert {m[0] for m in r.members} == {ra.member_id, newcomer.one.member_id}
    assert coord.heartbeat("g", 2, rb.member_id) == GroupCode.UNKNOWN_MEMBER_ID


def test_leave_rebalances_and_last_leave_empties(coord: GroupCoordinator, loop: FakeLoop) -> None:
    ra, rb = stable_pair(coord, loop)
    assert coord.leave("g", [(rb.member_id, None), ("ghost", None)]) == [
        GroupCode.NONE,
        GroupCode.UNKNOWN_MEMBER_ID,
    ]
    again = join(coord, ra.member_id)
    assert again.one.generation == 2
    assert coord.leave("g", [(ra.member_id, None)]) == [GroupCode.NONE]
    assert "g" not in coord.groups  # an empty group is forgotten (its offsets stay on disk)


def test_a_follower_waiting_for_sync_learns_of_a_rebalance(coord: GroupCoordinator, loop: FakeLoop) -> None:
    a, b = join(coord), join(coord)
    loop.advance(DELAY_MS / 1000)
    waiting = sync(coord, b.one)  # type: ignore[arg-type]
    join(coord)  # a third member arrives before the leader synced
    assert waiting.one == SyncResult(GroupCode.REBALANCE_IN_PROGRESS)
    assert sync(coord, a.one).one.code == GroupCode.REBALANCE_IN_PROGRESS  # type: ignore[arg-type]


def test_commits_are_checked_against_the_generation(
    coord: GroupCoordinator, loop: FakeLoop, tmp_path: Path
) -> None:
    offsets = {(1, 0): Committed(5, "")}
    assert coord.commit("simple", offsets) == GroupCode.NONE  # no members: a simple commit
    ra, rb = stable_pair(coord, loop)
    assert coord.commit("g", offsets) == GroupCode.UNKNOWN_MEMBER_ID  # members: -1 is refused
    assert coord.commit("g", offsets, 0, ra.member_id) == GroupCode.ILLEGAL_GENERATION
    assert coord.commit("g", {(1, 0): Committed(7, "m")}, 1, rb.member_id) == GroupCode.NONE
    fresh = GroupOffsetStore(str(tmp_path))  # what a restarted core reads
    assert fresh.committed("g", 1, 0) == Committed(7, "m")
    assert fresh.committed("simple", 1, 0) == Committed(5, "")
    assert fresh.committed("g", 2, 0) == Committed(-1, "")  # a recreated topic has a new id


def test_transactional_commits_are_checked_as_kafka_checks_them(
    coord: GroupCoordinator, loop: FakeLoop
) -> None:
    """KIP-447: a TxnOffsetCommit naming a member is fenced as a commit is; one naming none
    (TxnOffsetCommit v0-2) is stored whatever the group's members; a rebalance being completed
    does not refuse one (Kafka's validateOffsetCommit with isTransactional)."""
    ra, rb = stable_pair(coord, loop)
    assert coord.commit_check("g", -1, "", transactional=True) == GroupCode.NONE
    assert coord.commit_check("g", -1, "") == GroupCode.UNKNOWN_MEMBER_ID  # not so for a plain one
    assert coord.commit_check("g", 1, rb.member_id, transactional=True) == GroupCode.NONE
    assert coord.commit_check("g", 0, rb.member_id, transactional=True) == GroupCode.ILLEGAL_GENERATION
    assert coord.commit_check("g", 1, "gone", transactional=True) == GroupCode.UNKNOWN_MEMBER_ID
    assert coord.commit_check("g", -1, "gone", transactional=True) == GroupCode.UNKNOWN_MEMBER_ID
    assert coord.commit_check("nobody", 3, "m", transactional=True) == GroupCode.ILLEGAL_GENERATION
    join(coord, ra.member_id)  # a rebalance: its join completes at once (b must rejoin too)
    join(coord, rb.member_id)
    assert coord.groups["g"].state == GroupState.COMPLETING_REBALANCE
    assert coord.commit_check("g", 2, rb.member_id) == GroupCode.REBALANCE_IN_PROGRESS
    assert coord.commit_check("g", 2, rb.member_id, transactional=True) == GroupCode.NONE


def test_close_answers_waiting_joins(coord: GroupCoordinator) -> None:
    a = join(coord)
    coord.close()
    assert a.one.code == GroupCode.NOT_COORDINATOR


def test_a_group_with_offsets_stays_empty_when_its_members_leave(
    coord: GroupCoordinator, loop: FakeLoop
) -> None:
    """As Kafka's: listed and described Empty while its offsets are kept, generations going on."""
    ra, rb = stable_pair(coord, loop)
    assert coord.commit("g", {(1, 0): Committed(3, "")}, 1, ra.member_id) == GroupCode.NONE
    assert coord.leave("g", [(ra.member_id, None), (rb.member_id, None)]) == [GroupCode.NONE] * 2
    loop.advance(REBALANCE_MS / 1000)
    view = coord.view("g")
    assert view is not None and (view.state, view.protocol_type, view.members) == ("Empty", "consumer", ())
    assert coord.commit("g", {(1, 0): Committed(4, "")}) == GroupCode.NONE  # a simple commit, now
    again = join(coord)
    loop.advance(DELAY_MS / 1000)
    assert again.one.code == GroupCode.NONE and again.one.generation == 3  # 2 was the empty one
    # a group known only by its offsets (a simple commit, or read after a restart) exists too
    coord.offsets_exist("only-offsets")
    view = coord.view("only-offsets")
    assert view is not None and (view.state, view.generation, view.members) == ("Empty", 0, ())


# ----------------------------------------------------------------------------- static membership


def static_join(
    coord: GroupCoordinator,
    instance: str,
    member_id: str = "",
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),),
) -> Answers:
    answers = Answers()
    coord.join(
        "g",
        member_id,
        "consumer",
        protocols,
        SESSION_MS,
        REBALANCE_MS,
        answers,
        instance_id=instance,
        client_id="c",
        require_known_member_id=True,  # JoinGroup v4+: static members are not asked for it
    )
    return answers


def static_pair(coord: GroupCoordinator, loop: FakeLoop) -> tuple[JoinResult, JoinResult]:
    a, b = static_join(coord, "a"), static_join(coord, "b")
    loop.advance(DELAY_MS / 1000)
    ra, rb = a.one, b.one
    assert isinstance(ra, JoinResult) and isinstance(rb, JoinResult)
    assert ra.member_id.startswith("a-") and rb.member_id.startswith("b-")
    assert [(x[0], x[1]) for x in ra.members] == [(ra.member_id, "a"), (rb.member_id, "b")]
    sb = sync(coord, rb)
    assert sync(coord, ra, {ra.member_id: b"A", rb.member_id: b"B"}).one.code == GroupCode.NONE
    assert sb.one == SyncResult(GroupCode.NONE, b"B", "consumer", "range")
    return ra, rb


def test_a_static_member_restarting_in_a_stable_group_keeps_its_assignment(
    coord: GroupCoordinator, loop: FakeLoop
) -> None:
    ra, rb = static_pair(coord, loop)
    back = static_join(coord, "b").one  # b restarted: no member id, the same instance id
    assert isinstance(back, JoinResult)
    assert (back.code, back.generation, back.leader, back.members) == (GroupCode.NONE, 1, ra.member_id, ())
    assert back.member_id.startswith("b-") and back.member_id != rb.member_id
    assert coord.groups["g"].state == GroupState.STABLE  # no rebalance
    assert sync(coord, back).one == SyncResult(GroupCode.NONE, b"B", "consumer", "range")
    assert coord.heartbeat("g", 1, back.member_id, "b") == GroupCode.NONE
    assert coord.heartbeat("g", 1, ra.member_id, "a") == GroupCode.NONE
    # the old incarnation is fenced where it names its instance id, unknown where it does not
    assert coord.heartbeat("g", 1, rb.member_id, "b") == GroupCode.FENCED_INSTANCE_ID
    assert coord.heartbeat("g", 1, rb.member_id) == GroupCode.UNKNOWN_MEMBER_ID
    assert sync(coord, rb, {}).one.code == GroupCode.UNKNOWN_MEMBER_ID
    assert coord.commit_check("g", 1, rb.member_id, "b") == GroupCode.FENCED_INSTANCE_ID
    assert coord.commit_check("g", 1, back.member_id, "b") == GroupCode.NONE
    assert static_join(coord, "b", rb.member_id).one.code == GroupCode.FENCED_INSTANCE_ID
    assert static_join(coord, "zz", rb.member_id).one.code == GroupCode.UNKNOWN_MEMBER_ID
    assert coord.leave("g", [(rb.member_id, "b")]) == [GroupCode.FENCED_INSTANCE_ID]
    view = coord.view("g")
    assert view is not None and [(m.member_id, m.instance_id) for m in view.members] == [
        (ra.member_id, "a"),
        (back.member_id, "b"),
    ]


def test_a_static_leader_restarting_is_told_the_old_leader_id(
    coord: GroupCoordinator, loop: FakeLoop
) -> None:
    """So that it computes no assignment a Stable group would never hand out (Kafka before v9)."""
    ra, rb = static_pair(coord, loop)
    back = static_join(coord, "a").one
    assert isinstance(back, JoinResult)
    assert (back.code, back.generation, back.leader, back.members) == (GroupCode.NONE, 1, ra.member_id, ())
    assert coord.groups["g"].leader == back.member_id and coord.groups["g"].state == GroupState.STABLE
    assert sync(coord, back).one == SyncResult(GroupCode.NONE, b"A", "consumer", "range")
    # the next rebalance is led by the new incarnation
    assert coord.leave("g", [(rb.member_id, "b")]) == [GroupCode.NONE]
    again = static_join(coord, "a", back.member_id)
    assert again.one.leader == back.member_id and again.one.generation == 2


def test_a_static_restart_that_changes_the_protocol_or_meets_an_assignment_rebalances(
    coord: GroupCoordinator, loop: FakeLoop
) -> None:
    ra, _ = static_pair(coord, loop)
    # the group's protocol would change: a rebalance, as in Kafka
    both = (("roundrobin", b"x"), ("range", b"y"))
    coord.groups["g"].members[ra.member_id].protocols = both  # a already lists roundrobin first
    back = static_join(coord, "b", protocols=both)
    assert not back.got and coord.groups["g"].state == GroupState.PREPARING_REBALANCE
    a_again = static_join(coord, "a", ra.member_id, protocols=both)
    r = back.one
    assert isinstance(r, JoinResult) and (r.generation, r.protocol_name) == (2, "roundrobin")
    ra2 = a_again.one
    assert isinstance(ra2, JoinResult)
    # while the leader assigns (CompletingRebalance), a restart rebalances; the old incarnation's
    # waiting SyncGroup is fenced
    waiting = sync(coord, r)
    restarted = static_join(coord, "b")
    assert waiting.one.code == GroupCode.FENCED_INSTANCE_ID
    assert not restarted.got and coord.groups["g"].state == GroupState.PREPARING_REBALANCE
    static_join(coord, "a", ra2.member_id, protocols=both)
    assert restarted.one.code == GroupCode.NONE and restarted.one.generation == 3


def test_a_static_member_that_expires_or_leaves_is_gone(coord: GroupCoordinator, loop: FakeLoop) -> None:
    ra, rb = static_pair(coord, loop)
    for _ in range(4):  # a heartbeats, b is silent past its session
        loop.advance(3)
        coord.heartbeat("g", ra.generation, ra.member_id, "a")
    assert "b" not in coord.groups["g"].static
    fresh = static_join(coord, "b")  # a new member for the instance id: joins the rebalance
    static_join(coord, "a", ra.member_id)
    assert fresh.one.code == GroupCode.NONE and fresh.one.member_id != rb.member_id
    assert fresh.one.generation == 2
    # a LeaveGroup naming only the instance id (an admin's removal) removes it
    assert coord.leave("g", [("", "b")]) == [GroupCode.NONE]
    assert "b" not in coord.groups["g"].static
