"""A partition's replication state: its role, the leader's view of its followers, and the
follower's fetch loop towards one leader core. Pure classes: no I/O, no clock of their own.

Rules this module keeps:
- A `Partition` (broker/core/partition.py) holds at most one role: `LeaderState`, `FollowerState`,
  or None (not replicated: a single node, leader of itself at epoch 0, whose high watermark is
  its log end, exactly as before replication; nothing here runs on its produce path).
- The leader's high watermark is the smallest log end over the in-sync replicas, its own
  included, and never moves backwards within its term. While a proposal that adds replicas to
  the ISR is unanswered, those replicas count as in sync for the HW already (Kafka's "maximal
  ISR", KIP-497): the store may hold the larger ISR, and the controller elect one of the
  newcomers, the moment the proposal applies, before the leader hears of it; a record
  acknowledged meanwhile must be on them too, or that election truncates it away.
- A follower's log end is what its ReplicaFetch says (the fetch offset: everything below it is
  stored there), never more than the leader's end, and forgotten when it leaves the ISR. A
  follower counts as caught up when a fetch reaches the leader's end; it should leave the ISR
  once it has not been caught up for `lag_max_ms`, and join it when caught up (`isr_proposal`:
  the controller decides, the leader learns the new ISR by `set_isr`).
- acks=all: a produce is answered once the high watermark passes its last offset (`wait`), and
  refused before anything is written when fewer than `min_insync` replicas are in sync
  (`NotEnoughReplicasError`); its waiters fail when the ISR shrinks below that or the leader
  steps down.
- The follower's fetch loop is broker/core/replica_fetcher.py (it drives partitions, which hold
  these states: a module of its own keeps the imports acyclic).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

DEFAULT_MIN_INSYNC = 2
DEFAULT_LAG_MAX_MS = 30_000


class NotLeaderError(Exception):
    """A produce, consumer fetch or replica fetch reached a replica that does not lead the
    partition at the epoch asked (a follower, or a leader of a stale or future epoch)."""


class NotEnoughReplicasError(Exception):
    """acks=all with fewer replicas in sync than min_insync: refused, or (after the append)
    the ISR shrank below it before the batches were replicated."""


@dataclass(slots=True)
class FollowerProgress:
    log_end: int  # -1 until its first fetch this term
    caught_up_ms: int  # when a fetch last reached the leader's log end


@dataclass(frozen=True, slots=True)
class IsrProposal:
    leave: tuple[int, ...]  # in sync, but not caught up for longer than lag_max_ms
    join: tuple[int, ...]  # out of sync, now caught up to the leader's end

    def __bool__(self) -> bool:
        return bool(self.leave or self.join)


_Waiter = tuple[int, int, Callable[[], None], Callable[[BaseException], None]]


class LeaderState:
    """What a leader tracks for one partition in one term (epoch)."""

    __slots__ = (
        "_seq",
        "_waiters",
        "epoch",
        "followers",
        "high_watermark",
        "isr",
        "joining",
        "min_insync",
        "node_id",
        "replicas",
    )

    def __init__(
        self,
        node_id: int,
        epoch: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        high_watermark: int,
        now_ms: int,
        min_insync: int = DEFAULT_MIN_INSYNC,
    ) -> None:
        self.node_id = node_id
        self.epoch = epoch
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr) | {node_id}
        self.joining: frozenset[int] = frozenset()  # proposed to join the ISR, no answer yet
        self.min_insync = min_insync
        self.high_watermark = high_watermark
        self.followers = {r: FollowerProgress(-1, now_ms) for r in self.replicas if r != node_id}
        self._waiters: list[_Waiter] = []  # a heap by offset
        self._seq = itertools.count()

    # ------------------------------------------------------------------------- questions

    def enough_in_sync(self) -> bool:
        return len(self.isr) >= min(self.min_insync, len(self.replicas) or 1)

    def isr_proposal(self, now_ms: int, lag_max_ms: int, leader_end: int) -> IsrProposal:
        members = self.isr | self.joining
        leave = tuple(
            sorted(
                r for r, f in self.followers.items() if r in members and now_ms - f.caught_up_ms > lag_max_ms
            )
        )
        join = tuple(
            sorted(r for r, f in self.followers.items() if r not in self.isr and f.log_end >= leader_end)
        )
        return IsrProposal(leave, join)

    # ------------------------------------------------------------------------- events

    def follower_fetched(self, node: int, fetch_offset: int, leader_end: int, now_ms: int) -> bool:
        """A ReplicaFetch of `node` at `fetch_offset`: its log end. True if the HW advanced."""
        f = self.followers.get(node)
        if f is None:  # a replica the leader did not know of (assignment changed): track it
            f = self.followers[node] = FollowerProgress(-1, now_ms)
        f.log_end = min(fetch_offset, leader_end)
        if f.log_end >= leader_end:
            f.caught_up_ms = now_ms
        return self.advance(leader_end)

    def proposing(self, isr: Iterable[int]) -> None:
        """An ISR change is being proposed to the store: the replicas it adds count for the HW from
        now until `proposal_answered` (see the module's rules)."""
        self.joining = frozenset(isr) - self.isr

    def proposal_answered(self, isr: Iterable[int] | None, leader_end: int) -> bool:
        """The store's answer to the proposal: the ISR it holds now (None: no answer, or the
        proposal was refused in a way that says nothing of what the store holds). After an
        unknown outcome the newcomers stay counted until a later proposal is answered (they may
        be in the stored ISR). Those the answer holds stay counted until a view names them in
        the ISR too: the views lag the store, and one read before the proposal applied (without
        them) may still arrive. True if the HW advanced."""
        if isr is None:
            return False
        answered = frozenset(isr) | {self.node_id}
        joined = self.joining & answered
        self.joining = frozenset()
        advanced = self.set_isr(answered, leader_end)
        self.joining = joined  # until a view shows them: one published before the answer may come after
        return advanced

    def set_isr(self, isr: Iterable[int], leader_end: int) -> bool:
        """The controller's new ISR. True if the HW advanced; waiters fail when it is too small.
        A replica taken out forgets its progress: it joins again only by fetching again (the
        controller takes out dead nodes, and a dead node's last fetch would otherwise still look
        caught up while the partition is idle, and be proposed back at once)."""
        new = frozenset(isr) | {self.node_id}
        for r in self.isr - new - self.joining:
            f = self.followers.get(r)
            if f is not None:
                f.log_end = -1
        self.isr = new
        if self.joining:
            self.joining -= self.isr
        if not self.enough_in_sync():
            self.fail_waiters(
                NotEnoughReplicasError(f"{len(self.isr)} replicas in sync, fewer than {self.min_insync}")
            )
        return self.advance(leader_end)

    def advance(self, leader_end: int) -> bool:
        """Recompute the HW from the ISR's log ends (the leader's is `leader_end`)."""
        hw = leader_end
        followers = self.followers
        for r in self.isr if not self.joining else self.isr | self.joining:
            if r != self.node_id:
                f = followers.get(r)
                end = -1 if f is None else f.log_end
                if end < hw:
                    hw = end
        if hw <= self.high_watermark:
            return False
        self.high_watermark = hw
        return True

    def wait(self, offset: int, done: Callable[[], None], failed: Callable[[BaseException], None]) -> None:
        """Call `done()` once the HW reaches `offset` (the end of a produce), `failed(exc)` if the
        ISR shrinks below min_insync or the leader steps down first."""
        if self.high_watermark >= offset:
            done()
            return
        heapq.heappush(self._waiters, (offset, next(self._seq), done, failed))

    def take_ready(self) -> list[Callable[[], None]]:
        """The waiters the HW has passed, oldest offset first (the caller runs them)."""
        ready = []
        waiters = self._waiters
        while waiters and waiters[0][0] <= self.high_watermark:
            ready.append(heapq.heappop(waiters)[2])
        return ready

    def fail_waiters(self, exc: BaseException) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, _, failed in sorted(waiters, key=lambda w: (w[0], w[1])):
            failed(exc)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class FollowerState:
    """What a follower knows of its partition's leader in one term."""

    __slots__ = ("epoch", "high_watermark", "leader")

    def __init__(self, epoch: int, leader: int, high_watermark: int) -> None:
        self.epoch = epoch
        self.leader = leader
        self.high_watermark = high_watermark
