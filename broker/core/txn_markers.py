"""Transaction markers from a coordinator to the partitions and groups of a transaction (Kafka's
TransactionMarkerChannelManager, on one node).

Rules this module keeps:
- Each data partition's marker is written by the core that owns the partition, through its door
  `Partition.write_marker` (acks=all, as Kafka's coordinator writes them), as the core's own
  append; each group's by the group's coordinator core (`Core.complete_txn_offsets`). A target
  on this core is written directly; one on another core of this node goes over the peer links
  (`links`, filled in by the backend; until it is, such a target waits and is tried again).
- A target is retried after `RETRY_S` until it is written (Kafka retries NOT_LEADER, storage
  errors and the like forever: the transaction stays prepared and its producer hears
  CONCURRENT_TRANSACTIONS meanwhile). A partition of a deleted topic is dropped; a marker the
  partition refuses as fenced (an older producer epoch or coordinator epoch than it has seen)
  is dropped too, logged: a newer coordinator or producer has ended that transaction there.
- `done()` is called once, when every target is written or dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final, Protocol

from broker.core.outcomes import Append, Reply, Silent
from broker.core.producer_state import CoordinatorFencedError, FencedEpochError
from broker.core.topics import TopicError, TopicFault
from broker.core.txn_coordinator import MarkerRequest
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame

log = logging.getLogger(__name__)

RETRY_S: Final = 0.1

OwnAppend = Callable[[Append, Callable[[Reply | Silent], None]], None]


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
        frame = m.request_frame(
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

        def answered(result: Frame | BaseException) -> None:
            if isinstance(result, BaseException):
                log.warning("markers of %s to core %d: %s (tried again)", request.txn_id, core, result)
                done(False)
                return
            try:
                resp = m.decode_response(result)
            except Exception as exc:
                log.error(
                    "markers of %s to core %d: an answer that does not read: %s", request.txn_id, core, exc
                )
                done(False)
                return
            if resp.error != m.ErrorCode.NONE:
                log.warning(
                    "markers of %s to core %d: %s %s", request.txn_id, core, resp.error.name, resp.message
                )
            done(resp.error == m.ErrorCode.NONE)

        self.send_to_core(core, frame, False, answered)


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
        core = self.core
        me = core.config.core_id
        local_parts: list[tuple[int, int]] = []
        remote: dict[int, tuple[list[tuple[int, int]], list[str]]] = {}
        for tid, index in sorted(request.partitions):
            owner = core.owner(tid, index)
            if owner == me:
                local_parts.append((tid, index))
            else:
                remote.setdefault(owner, ([], []))[0].append((tid, index))
        local_groups: list[str] = []
        for group in sorted(request.groups):
            _node, owner = core.group_coordinator(group)
            if owner == me:
                local_groups.append(group)
            else:
                remote.setdefault(owner, ([], []))[1].append(group)
        left = len(local_parts) + len(local_groups) + len(remote)
        if not left:
            done()
            return

        def one_done() -> None:
            nonlocal left
            left -= 1
            if not left:
                done()

        for tid, index in local_parts:
            self.write_partition(request, tid, index, one_done)
        for group in local_groups:
            self.write_group(request, group, one_done)
        for owner, (parts, groups) in remote.items():
            self._to_core(request, owner, parts, groups, one_done)

    def write_local(
        self,
        request: MarkerRequest,
        partitions: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[], None],
    ) -> None:
        """The markers of targets on this core (another core's request over the links)."""
        left = len(partitions) + len(groups)
        if not left:
            done()
            return

        def one_done() -> None:
            nonlocal left
            left -= 1
            if not left:
                done()

        for tid, index in partitions:
            self.write_partition(request, tid, index, one_done)
        for group in groups:
            self.write_group(request, group, one_done)

    def _later(self, call: Callable[[], None]) -> None:
        if not self._closed:
            self.core.call_later(RETRY_S, call)

    def _to_core(
        self,
        request: MarkerRequest,
        owner: int,
        parts: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[], None],
    ) -> None:
        links = self.links
        if links is None:
            log.warning("markers of %s for core %d: no links to it yet", request.txn_id, owner)
            self._later(lambda: self._to_core(request, owner, parts, groups, done))
            return

        def answered(ok: bool) -> None:
            if ok:
                done()
            else:
                self._later(lambda: self._to_core(request, owner, parts, groups, done))

        links.write_markers(owner, request, parts, groups, answered)

    def write_partition(self, request: MarkerRequest, tid: int, index: int, done: Callable[[], None]) -> None:
        """One partition's marker, written here; retried until written or dropped."""

        def again() -> None:
            self._later(lambda: self.write_partition(request, tid, index, done))

        try:
            p = self.core.partition_by_id(tid, index)
            pending = p.write_marker(
                request.producer_id, request.producer_epoch, request.coordinator_epoch, request.commit
            )
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
        failed: list[BaseException] = []

        def fail(exc: BaseException) -> Silent:
            pending.fail()
            failed.append(exc)
            return Silent()

        def written(_answer: Reply | Silent) -> None:
            if failed:
                log.warning("marker of %s to %d/%d: %s (tried again)", request.txn_id, tid, index, failed[0])
                again()
            else:
                done()

        self.own_append(Append(p, pending.pending, pending.waits, pending.complete, Silent, fail), written)

    def write_group(self, request: MarkerRequest, group: str, done: Callable[[], None]) -> None:
        """One group's marker (its producer's pending offsets committed or dropped), here."""

        def completed(result: bool | BaseException) -> None:
            if isinstance(result, BaseException):
                log.warning("marker of %s to group %r: %s (tried again)", request.txn_id, group, result)
                self._later(lambda: self.write_group(request, group, done))
                return
            done()

        self.core.complete_txn_offsets(group, request.producer_id, request.commit, completed)
