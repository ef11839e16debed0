"""What a core does with the cluster: gives its partitions the roles the view names, fetches the
ones it follows from their leaders' cores, and proposes in-sync-set changes for the ones it leads.

Rules this module keeps:
- Driven by the core's loop only (timers from `call_later`, answers from `RemoteLinks`, writes
  through the backend's `run_replica_append`), so a core needs no lock and no thread of its own.
  Calls to the store (an in-sync-set change) run on the backend's `run_blocking` threads.
- The view (broker/core/cluster_view.py) is polled every `POLL_S`: a stat, and a read only when
  the node's agent replaced the file. Roles follow it: the node leading a partition leads it at
  the view's epoch; the others follow that leader at that epoch (a partition's own rules ignore
  an older epoch, so a late view never steps back).
- One `ReplicaFetcher` per (leader node, leader core), one long-poll ReplicaFetch in flight each,
  carrying every partition this core follows there. The next fetch goes out as soon as the
  appends of the last answer completed: a follower keeps at most one answer's appends in
  flight per leader core. A lost link or an error answer backs off (the fetcher's per-partition
  back-off, and `LINK_RETRY_S` for the link).
- Only a leader proposes in-sync-set changes, one at a time per partition, fenced in the store
  by its epoch (`ClusterAdmin.alter_isr`): it learns the result from the view like every node.
  It proposes no follower to join whose node the view does not count as serving (not live, or
  draining: stopping gracefully), which the store would refuse anyway: such a node still
  fetches, and counting it for the high watermark while the proposal is out would tie acks=all
  to a node about to leave.
  Replicas a proposal adds hold the high watermark from the moment it is sent until its answer
  is known (broker/core/replication.py): the store may apply it, and elect one of them, first.
- A replica the view no longer places on this node (a reassignment or a drain completed, an
  addition cancelled) stops fetching and gives up its role at once; its files go as soon as no
  append of its is in flight (`Core.remove_moved_away`), tried again at each poll until then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from broker.core.cluster_view import ClusterView, PartitionState, ViewFile
from broker.core.outcomes import FollowerAppend
from broker.core.replica_fetcher import ReplicaFetcher
from broker.core.replication import LeaderState, NotLeaderError
from broker.core.topics import TopicError
from broker.storage import layout
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Frame
from ringlog_proto.routing import owner

if TYPE_CHECKING:
    from broker.core.core import Core
    from broker.core.partition import Partition

log = logging.getLogger(__name__)

POLL_S: Final = 0.02
ISR_CHECK_S: Final = 0.25
LINK_RETRY_S: Final = 0.1
ANSWER_MARGIN_S: Final = 5.0  # a long poll's deadline: its max wait plus this

T = TypeVar("T")


class Loop(Protocol):
    """The backend primitives this module uses (broker/backends/backend_core.py)."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> object: ...

    def run_replica_append(self, outcome: FollowerAppend, done: Callable[[], None]) -> None: ...

    def run_blocking(self, fn: Callable[[], T], done: Callable[[T | BaseException], None]) -> None: ...

    def stopping(self) -> bool: ...


# (tid, p, leader, epoch, isr) -> the partition's state after (`ClusterCalls.alter_isr`)
AlterIsr = Callable[[int, int, int, int, Sequence[int]], PartitionState]


@dataclass(slots=True)
class _Fetching:
    fetcher: ReplicaFetcher
    address: tuple[str, int]
    in_flight: bool = False
    appending: int = 0
    timer: object | None = None
    keys: set[tuple[int, int]] = field(default_factory=set)
    received_ns: int = 0  # an answer with records to append arrived then (monotonic); 0: none


class ReplicaManager:
    def __init__(
        self,
        core: Core,
        loop: Loop,
        alter_isr: AlterIsr | None,
        min_insync: int,
        lag_max_ms: int,
        max_wait_ms: int = 500,
    ) -> None:
        self.core = core
        self.loop = loop
        self.alter_isr = alter_isr
        self.min_insync = min_insync
        self.lag_max_ms = lag_max_ms
        self.max_wait_ms = max_wait_ms
        self.node_id = core.config.node_id
        self.core_id = core.config.core_id
        self.views = ViewFile(layout.run_dir(core.config.data_dir))
        self.fetching: dict[tuple[int, int], _Fetching] = {}
        self._isr_in_flight: set[tuple[int, int]] = set()
        self._isr_sweep = core.partition_sweep("in-sync check")
        self._moved: set[tuple[int, int]] = set()  # replicas moved off this node, still open

    def start(self) -> None:
        self._poll()
        self._check_isr()

    # --------------------------------------------------------------------------- the view

    def _poll(self) -> None:
        if self.loop.stopping():
            return
        view = self.views.poll()
        if view is not None:
            try:
                self.apply(view)
            except Exception:
                log.exception("applying cluster view %d", view.generation)
        if self._moved:
            self._remove_moved()
        self.loop.call_later(POLL_S, self._poll)

    def _remove_moved(self) -> None:
        """Close and remove the replicas moved off this node that the view still places elsewhere
        (one placed here again meanwhile stays: it has its role back)."""
        view = self.core.cluster
        self._moved = set(self.core.remove_moved_away([k for k in self._moved if view.placed_elsewhere(*k)]))

    def apply(self, view: ClusterView) -> None:
        h = self.core
        h.cluster = view
        me = self.node_id
        wanted: dict[tuple[int, int], set[tuple[int, int]]] = {}
        addresses: dict[tuple[int, int], tuple[str, int]] = {}
        refreshed = False
        for (tid, index), state in view.partitions.items():
            if h.owner(tid, index) != self.core_id:
                continue
            if me not in state.replicas:
                moved = h.partitions.get((tid, index))
                if moved is not None:
                    h.give_role(moved)  # reassigned away: it stops leading, then closes
                    self._moved.add((tid, index))
                continue
            try:
                partition = h.partition_by_id(tid, index)
            except TopicError:
                if refreshed:
                    continue
                h.refresh_topics(force=True)  # the agent copied the topic in a moment ago
                refreshed = True
                try:
                    partition = h.partition_by_id(tid, index)
                except TopicError:
                    continue
            except NotLeaderError:
                continue
            h.give_role(partition)
            if state.leader == me:
                continue
            leader = view.nodes.get(state.leader)
            if leader is None or state.leader not in view.live or not leader.cores:
                continue  # offline or unknown: nothing to fetch from until the view names one
            core = owner(tid, index, range(leader.cores))
            key = (state.leader, core)
            wanted.setdefault(key, set()).add((tid, index))
            addresses[key] = (leader.host, leader.core_port(core))
        for key, existing in list(self.fetching.items()):
            keep = wanted.get(key, set())
            for gone in existing.keys - keep:
                existing.fetcher.remove(*gone)
            existing.keys &= keep
            if not existing.keys and not existing.in_flight and not existing.appending:
                del self.fetching[key]
        for key, keys in wanted.items():
            fetching = self.fetching.get(key)
            if fetching is None or fetching.address != addresses[key]:
                fetching = self.fetching[key] = _Fetching(
                    ReplicaFetcher(me, max_wait_ms=self.max_wait_ms), addresses[key]
                )
            for tid, index in keys - fetching.keys:
                fetching.fetcher.add(h.partitions[(tid, index)])
            fetching.keys |= keys
            self._fetch(key)
        h.transactions.follow()  # transaction coordinators move with their state partitions' leaders

    # --------------------------------------------------------------------------- following

    def _fetch(self, key: tuple[int, int]) -> None:
        fetching = self.fetching.get(key)
        if fetching is None or fetching.in_flight or fetching.appending or self.loop.stopping():
            return
        if fetching.timer is not None:
            return  # a retry is scheduled
        req = fetching.fetcher.request(now_ms())
        if req is None:
            retry = fetching.fetcher.next_retry_ms()
            if retry is not None:
                self._later(key, fetching, max(0.0, (retry - now_ms()) / 1000))
            return
        fetching.in_flight = True
        if fetching.received_ns:  # the answer before this fetch was applied: what it took
            self.core.metrics.replica_appended(fetching.received_ns)
            fetching.received_ns = 0
        deadline = time.monotonic() + self.max_wait_ms / 1000 + ANSWER_MARGIN_S
        links = self.core.remote_links
        assert links is not None, "a clustered core has remote links"
        frame = m.request_frame(req)
        sent_ns = time.monotonic_ns()

        def answered(result: Frame | BaseException) -> None:
            if not isinstance(result, BaseException):
                self.core.metrics.replica_fetched(sent_ns)
                fetching.received_ns = time.monotonic_ns()
            self._fetched(key, fetching, result)

        links.request(fetching.address, frame, deadline, answered, long_poll=True)

    def _later(self, key: tuple[int, int], fetching: _Fetching, delay_s: float) -> None:
        def again() -> None:
            fetching.timer = None
            self._fetch(key)

        fetching.timer = self.loop.call_later(delay_s, again)

    def _fetched(self, key: tuple[int, int], fetching: _Fetching, result: Frame | BaseException) -> None:
        fetching.in_flight = False
        if self.fetching.get(key) is not fetching:
            return  # replaced meanwhile (the leader moved): its answer is not ours to apply
        if isinstance(result, BaseException):
            log.debug("replica fetch from node %d core %d: %s", key[0], key[1], result)
            self._later(key, fetching, LINK_RETRY_S)
            return
        try:
            resp = m.decode_response(result)
            if not isinstance(resp, m.ReplicaFetchResponse) or resp.error != m.ErrorCode.NONE:
                raise ValueError(getattr(resp, "message", "") or f"answer {resp!r}")
            applied = fetching.fetcher.apply(resp, now_ms())
        except Exception as exc:
            log.warning("replica fetch from node %d core %d: %s", key[0], key[1], exc)
            fetching.received_ns = 0
            self._later(key, fetching, LINK_RETRY_S)
            return
        if not applied.appends:
            fetching.received_ns = 0  # nothing appended: not a replication round trip
            self._fetch(key)
            return
        fetching.appending = len(applied.appends)

        def appended() -> None:
            fetching.appending -= 1
            if not fetching.appending:
                self._fetch(key)

        for outcome in applied.appends:
            self.loop.run_replica_append(outcome, appended)

    # --------------------------------------------------------------------------- leading

    def _check_isr(self) -> None:
        """Every `ISR_CHECK_S`: a pass over this core's partitions (in turns of its loop,
        broker/core/sweeps.py) proposing the in-sync-set changes of those it leads. Each
        partition's proposal is its own (fenced by its epoch, one in flight each), so nothing holds
        across partitions; a pass still running when the next is due makes that one skip.

        Every partition is looked at, not only those with a follower behind: a follower that
        stops fetching from an idle partition it had caught up with leaves no event behind, only
        the time since its last fetch, which only a look tells."""
        if self.loop.stopping():
            return
        self.loop.call_later(ISR_CHECK_S, self._check_isr)
        if self.alter_isr is None:
            return
        self.core.sweep_partitions(self._isr_sweep, self._check_isr_of)

    def _check_isr_of(self, partition: Partition) -> None:
        replica = partition.replica
        key = (partition.topic_id, partition.index)
        if not isinstance(replica, LeaderState) or key in self._isr_in_flight:
            return
        proposal = partition.isr_proposal(now_ms(), self.lag_max_ms)
        if not proposal:
            return
        join = set(proposal.join) & self.core.cluster.serving
        keep = (replica.isr - set(proposal.leave)) | (join - set(proposal.leave))
        if keep == replica.isr:
            return
        isr = tuple(r for r in replica.replicas if r in keep)
        self._propose(key, replica.epoch, isr)

    def _propose(self, key: tuple[int, int], epoch: int, isr: tuple[int, ...]) -> None:
        alter = self.alter_isr
        assert alter is not None
        tid, index = key
        self._isr_in_flight.add(key)
        partition = self.core.partitions.get(key)
        if partition is not None:
            partition.proposing_isr(epoch, isr)  # newcomers hold the HW until the answer
        log.info("partition %d/%d: proposing in-sync set %s at epoch %d", tid, index, list(isr), epoch)

        def call() -> PartitionState:
            return alter(tid, index, self.node_id, epoch, isr)

        def done(result: PartitionState | BaseException) -> None:
            self._isr_in_flight.discard(key)
            partition = self.core.partitions.get(key)
            if isinstance(result, BaseException):
                log.warning("partition %d/%d: in-sync set change refused: %s", tid, index, result)
                return  # what the store holds is unknown: newcomers keep holding the HW
            if partition is not None and result.leader_epoch == epoch:
                partition.isr_answered(epoch, tuple(result.isr))

        self.loop.run_blocking(call, done)
