"""Transaction markers from a coordinator to the partitions and groups of a transaction (Kafka's
TransactionMarkerChannelManager).

Rules this module keeps:
- Each data partition's marker is written by the partition's leader (one node: the core that
  owns it; a cluster: the core owning it on the leader node the view names), through its door
  `Partition.write_marker` (acks=all, as Kafka's coordinator writes them), as that core's own
  append; each group's by the group's coordinator core (`Core.group_coordinator`,
  `Core.complete_txn_offsets`: in a cluster the offsets are in the store, the marker still goes
  where the group lives). A target on this core is written directly; one on another core of
  this node goes over the peer links (`links`, filled in by the backend; until it is, such a
  target waits and is tried again); one on another node over the core's remote links
  (`Core.remote_links`, the links replication fetches over) to that core's direct port, as one
  WRITE_TXN_MARKERS frame of our protocol per (node, core).
- A target is retried after `RETRY_S` until it is written (Kafka retries NOT_LEADER, storage
  errors and the like forever: the transaction stays prepared and its producer hears
  CONCURRENT_TRANSACTIONS meanwhile). A target that moved (no longer led where it was sent, a
  link that failed or timed out) is routed again from the view as it is then. A partition of a
  deleted topic is dropped; a marker the partition refuses as fenced (an older producer epoch
  or coordinator epoch than it has seen) is dropped too, logged: a newer coordinator or
  producer has ended that transaction there.
- The receiving core of a WRITE_TXN_MARKERS (`write_local`) writes the targets it holds,
  retrying its own failures, and answers not-written for any it does not lead (any more), so
  the coordinator routes them again; a marker may thus be written twice, which changes nothing
  (an empty marker, as Kafka's retries can write).
- `done()` is called once, when every target is written or dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from broker.core.own_appends import OwnAppend, append_own
from broker.core.producer_state import CoordinatorFencedError, FencedEpochError
from broker.core.replication import NotLeaderError
from broker.core.topics import TopicError, TopicFault
from broker.core.txn_coordinator import MarkerRequest
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame
from ringlog_proto.routing import owner

log = logging.getLogger(__name__)

RETRY_S: Final = 0.1


class MarkerLinks(Protocol):
    """How markers reach another core of this node (the backend's peer links)."""

    def write_markers(
        self,
        core: int,
        request: MarkerRequest,
        partitions: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[bool], None],
    ) -> None:
        """Ask `core` to write `request`'s markers to these of its targets; `done(True)` once
        each is written or dropped, `done(False)` when any must be tried again."""
        ...


def marker_frame(request: MarkerRequest, partitions: list[tuple[int, int]], groups: list[str]) -> Frame:
    """The WRITE_TXN_MARKERS frame of our protocol asking for these targets' markers."""
    return m.request_frame(
        m.WriteTxnMarkersRequest(
            request.producer_id,
            request.producer_epoch,
            request.coordinator_epoch,
            request.commit,
            tuple(partitions),
            tuple(groups),
            request.txn_id,
        )
    )


def marker_answer(
    request: MarkerRequest, where: str, done: Callable[[bool], None]
) -> Callable[[Frame | BaseException], None]:
    """The callback reading a WRITE_TXN_MARKERS answer from `where`: `done(True)` for NONE."""

    def answered(result: Frame | BaseException) -> None:
        if isinstance(result, BaseException):
            log.warning("markers of %s to %s: %s (tried again)", request.txn_id, where, result)
            done(False)
            return
        try:
            resp = m.decode_response(result)
        except Exception as exc:
            log.error("markers of %s to %s: an answer that does not read: %s", request.txn_id, where, exc)
            done(False)
            return
        if resp.error != m.ErrorCode.NONE:
            log.info(
                "markers of %s to %s: %s %s (routed again)",
                request.txn_id,
                where,
                resp.error.name,
                resp.message,
            )
        done(resp.error == m.ErrorCode.NONE)

    return answered


class PeerMarkerLinks:
    """`MarkerLinks` over the backend's inter-core links (`send_to_core`, broker/core/forwarding.py):
    one WRITE_TXN_MARKERS frame of our protocol per core."""

    def __init__(
        self, send_to_core: Callable[[int, Frame, bool, Callable[[Frame | BaseException], None]], None]
    ) -> None:
        self.send_to_core = send_to_core

    def write_markers(
        self,
        core: int,
        request: MarkerRequest,
        partitions: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[bool], None],
    ) -> None:
        frame = marker_frame(request, partitions, groups)
        self.send_to_core(core, frame, False, marker_answer(request, f"core {core}", done))


class MarkerSender:
    """The markers of one coordinator core (module rules)."""

    # core: the Core (broker/core/core.py), which imports this module
    def __init__(self, core: Any, own_append: OwnAppend) -> None:
        self.core = core
        self.own_append = own_append
        self.links: MarkerLinks | None = None
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def send(self, request: MarkerRequest, done: Callable[[], None]) -> None:
        self._route(request, sorted(request.partitions), sorted(request.groups), done)

    def _leader_of(self, tid: int, index: int) -> tuple[int, int] | None:
        """(node, core) leading partition `index` of topic id `tid` now; None: none is (the
        view names no live leader yet)."""
        core = self.core
        view = core.cluster
        if not view.clustered:
            return core.config.node_id, core.owner(tid, index)
        state = view.state_of(tid, index)
        if state is None or state.leader not in view.live:
            return None
        node = view.nodes.get(state.leader)
        if node is None or not node.cores:
            return None
        if state.leader == core.config.node_id:
            return state.leader, core.owner(tid, index)
        return state.leader, owner(tid, index, range(node.cores))

    def _route(
        self,
        request: MarkerRequest,
        partitions: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[], None],
    ) -> None:
        """Send each target's marker where it is led now; `done()` once all are written."""
        core = self.core
        here = (core.config.node_id, core.config.core_id)
        targets: dict[tuple[int, int], tuple[list[tuple[int, int]], list[str]]] = {}
        unplaced: list[tuple[int, int]] = []
        for tid, index in partitions:
            where = self._leader_of(tid, index)
            if where is None:
                if core.cluster.clustered and not self._exists(tid, index):
                    log.info("marker of %s to %d/%d dropped: the topic is gone", request.txn_id, tid, index)
                    continue
                unplaced.append((tid, index))
            else:
                targets.setdefault(where, ([], []))[0].append((tid, index))
        for group in groups:
            targets.setdefault(core.group_coordinator(group), ([], []))[1].append(group)
        left = len(targets) + (1 if unplaced else 0)
        if not left:
            done()
            return
        one_done = one_target(left, done)
        if unplaced:
            log.info("markers of %s to %s: no leader yet (tried again)", request.txn_id, unplaced)
            self._later(lambda: self._route(request, unplaced, [], one_done))
        for (node, owner_core), (parts, grps) in targets.items():
            if (node, owner_core) == here:
                self._write_here(request, parts, grps, one_done)
            else:
                self._send_to(request, node, owner_core, parts, grps, one_done)

    def _write_here(
        self,
        request: MarkerRequest,
        parts: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[], None],
    ) -> None:
        """The coordinator's own targets: a partition that turns out led elsewhere is routed
        again after `RETRY_S`."""
        target_done = one_target(len(parts) + len(groups), done)
        for tid, index in parts:

            def elsewhere(tid: int = tid, index: int = index) -> None:
                self._later(lambda: self._route(request, [(tid, index)], [], target_done))

            self.write_partition(request, tid, index, target_done, elsewhere)
        for group in groups:
            self.write_group(request, group, target_done)

    def _exists(self, tid: int, index: int) -> bool:
        core = self.core
        topic = core.registry.by_id.get(tid)
        if topic is None:
            core.refresh_topics(force=True)
            topic = core.registry.by_id.get(tid)
        return topic is not None and index < topic.partitions

    def _send_to(
        self,
        request: MarkerRequest,
        node: int,
        owner_core: int,
        parts: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[], None],
    ) -> None:
        """The targets led by another core, of this node or another: one frame; what is not
        written is routed again after `RETRY_S`."""

        def answered(ok: bool) -> None:
            if ok:
                done()
            else:
                self._later(lambda: self._route(request, parts, groups, done))

        core = self.core
        if node == core.config.node_id:
            links = self.links
            if links is None:
                log.warning("markers of %s for core %d: no links to it yet", request.txn_id, owner_core)
                answered(False)
                return
            links.write_markers(owner_core, request, parts, groups, answered)
            return
        address = core.cluster.nodes.get(node)
        remote = core.remote_links
        if address is None or remote is None:
            answered(False)
            return
        where = (address.host, address.core_port(owner_core))
        deadline = time.monotonic() + core.config.limits.forward_timeout_ms / 1000
        frame = marker_frame(request, parts, groups)
        try:
            remote.request(
                where, frame, deadline, marker_answer(request, f"node {node} core {owner_core}", answered)
            )
        except ValueError as exc:  # an address that is not an IP literal: the view is wrong
            log.error("markers of %s to node %d: %s", request.txn_id, node, exc)
            answered(False)

    def write_local(
        self,
        request: MarkerRequest,
        partitions: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[bool], None],
    ) -> None:
        """The markers of targets on this core (another core's or node's request);
        `done(False)` when any is not led here (the sender routes it again)."""
        left = len(partitions) + len(groups)
        moved: list[tuple[int, int]] = []
        if not left:
            done(True)
            return
        one_done = one_target(left, lambda: done(not moved))

        for tid, index in partitions:

            def elsewhere(tid: int = tid, index: int = index) -> None:
                moved.append((tid, index))
                one_done()

            self.write_partition(request, tid, index, one_done, elsewhere)
        for group in groups:
            self.write_group(request, group, one_done)

    def _later(self, call: Callable[[], None]) -> None:
        if not self._closed:
            self.core.call_later(RETRY_S, call)

    def write_partition(
        self,
        request: MarkerRequest,
        tid: int,
        index: int,
        done: Callable[[], None],
        elsewhere: Callable[[], None],
    ) -> None:
        """One partition's marker, written here; retried until written or dropped, or
        `elsewhere()` once this core does not lead it (any more)."""

        def again() -> None:
            self._later(lambda: self.write_partition(request, tid, index, done, elsewhere))

        try:
            p = self.core.partition_by_id(tid, index)
            pending = p.write_marker(
                request.producer_id, request.producer_epoch, request.coordinator_epoch, request.commit
            )
        except NotLeaderError as exc:
            log.info("marker of %s to %d/%d: %s (routed again)", request.txn_id, tid, index, exc)
            elsewhere()
            return
        except TopicError as exc:
            if exc.kind is TopicFault.UNKNOWN:
                log.info("marker of %s to %d/%d dropped: %s", request.txn_id, tid, index, exc)
                done()
                return
            log.warning("marker of %s to %d/%d: %s (tried again)", request.txn_id, tid, index, exc)
            again()
            return
        except (FencedEpochError, CoordinatorFencedError) as exc:
            log.warning("marker of %s to %d/%d dropped: %s", request.txn_id, tid, index, exc)
            done()
            return
        except Exception as exc:
            log.warning("marker of %s to %d/%d: %s (tried again)", request.txn_id, tid, index, exc)
            again()
            return

        def written(error: BaseException | None) -> None:
            if error is None:
                done()
            elif isinstance(error, NotLeaderError):
                log.info("marker of %s to %d/%d: %s (routed again)", request.txn_id, tid, index, error)
                elsewhere()
            else:
                log.warning("marker of %s to %d/%d: %s (tried again)", request.txn_id, tid, index, error)
                again()

        append_own(self.own_append, p, pending, written)

    def write_group(self, request: MarkerRequest, group: str, done: Callable[[], None]) -> None:
        """One group's marker (its producer's pending offsets committed or dropped), here."""

        def completed(result: bool | BaseException) -> None:
            if isinstance(result, BaseException):
                log.warning("marker of %s to group %r: %s (tried again)", request.txn_id, group, result)
                self._later(lambda: self.write_group(request, group, done))
                return
            done()

        self.core.complete_txn_offsets(group, request.producer_id, request.commit, completed)


def one_target(count: int, done: Callable[[], None]) -> Callable[[], None]:
    """A callback for each of `count` targets that calls `done()` after the last."""
    left = count

    def one() -> None:
        nonlocal left
        left -= 1
        if not left:
            done()

    return one
