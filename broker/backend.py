"""What both I/O backends do alike: dispatch an outcome, park a long poll, keep a reply's slot.

Rules this module keeps:
- The two backends (broker/server.py on uvloop, broker/uring_server.py on io_uring) differ in how
  they move bytes and run file operations, not in what an outcome means. That meaning lives here
  once: `BackendCore.carry_out` sends each outcome to the backend's own `_append`, `_read` and
  `_after_flush`, or handles it without I/O of its own (replies, forwards, long polls).
- A connection answers in request order: every request gets a `Slot` when it arrives, and a
  connection sends the replies at the head of its slots that are done (`ReplyTarget.fill`).
- A parked fetch re-runs its handler when its partition grows, keeping its first deadline; at
  shutdown (`stopping()`) it answers with what there is instead of parking again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, MutableSequence
from typing import Protocol

from broker.forwarding import Forwarder
from broker.handlers import (
    Append,
    Durable,
    Forward,
    Handlers,
    Notify,
    Outcome,
    Read,
    Reply,
    Silent,
    Wait,
)
from broker.partition import Partition
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import HEADER_SIZE, NEED_DATA, Frame, FrameDecoder


class Slot:
    """A request's place in its connection's reply order."""

    __slots__ = ("buffers", "done", "started_ns")

    def __init__(self, started_ns: int) -> None:
        self.buffers: list[bytes] = []
        self.done = False
        self.started_ns = started_ns  # for the latency histogram (metrics.reply)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class ReplyTarget(Protocol):
    """A backend's client connection, as far as requests and outcomes are concerned."""

    closed: bool
    from_peer: bool
    decoder: FrameDecoder  # the bytes received and not yet taken as frames
    slots: MutableSequence[Slot]  # the requests not yet answered, in arrival order

    def fill(self, slot: Slot, outcome: Reply | Silent) -> None: ...
    def wait_for_forward_room(self, forwarder: Forwarder, core: int) -> None: ...


class BackendCore:
    """The outcome-handling half of a backend. Subclasses provide the I/O."""

    handlers: Handlers
    forwarder: Forwarder

    def __init__(self) -> None:
        self.parked_long_polls = 0

    # ------------------------------------------------------------------------- the backend's part

    def _append(self, outcome: Append, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        raise NotImplementedError

    def _read(self, outcome: Read, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        raise NotImplementedError

    def _after_flush(
        self, partition: Partition, done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        raise NotImplementedError

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Cancellable:
        raise NotImplementedError

    def stopping(self) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------------- shared

    def take_requests(self, conn: ReplyTarget) -> None:
        """Handle every whole frame `conn`'s decoder holds, in order, each with its reply slot.

        Raises `ProtocolError` when the bytes cannot be framed: the backend closes `conn`.
        """
        handlers = self.handlers
        handle = handlers.handle
        metrics = handlers.metrics
        from_peer = conn.from_peer
        decoder = conn.decoder
        slots = conn.slots
        while not conn.closed:
            frame = decoder.next_frame()
            if frame is NEED_DATA:
                return
            assert isinstance(frame, Frame)
            slot = Slot(metrics.request(frame.api_key, len(frame.body) + HEADER_SIZE))
            if from_peer:
                metrics.forwarded_in()
            slots.append(slot)
            self.carry_out(handle(frame, from_peer), frame, conn, slot)

    def carry_out(self, outcome: Outcome, frame: Frame, conn: ReplyTarget, slot: Slot) -> None:
        if isinstance(outcome, Reply | Silent):
            conn.fill(slot, outcome)
        elif isinstance(outcome, Append):
            self._append(outcome, frame, conn, slot)
        elif isinstance(outcome, Read):
            self._read(outcome, frame, conn, slot)
        elif isinstance(outcome, Durable):
            self._after_flush(
                outcome.partition,
                lambda: conn.fill(slot, outcome.reply),
                lambda exc: conn.fill(slot, outcome.fail(exc)),
            )
        elif isinstance(outcome, Forward):
            self.forwarder.forward(outcome, lambda reply: conn.fill(slot, reply))
            if self.forwarder.blocked(outcome.core):
                conn.wait_for_forward_room(self.forwarder, outcome.core)
        elif isinstance(outcome, Notify):
            self.forwarder.notify(outcome, lambda reply: conn.fill(slot, reply))
        else:
            self._park(outcome, conn, slot, outcome.deadline_ms)

    def _park(self, outcome: Wait, conn: ReplyTarget, slot: Slot, deadline_ms: int) -> None:
        """Park a fetch until its partition grows or its deadline passes."""
        partition = outcome.partition
        timer: Cancellable | None = None

        def wake() -> None:
            if timer is not None:
                timer.cancel()
            self.parked_long_polls -= 1
            if conn.closed:
                return
            again = self.handlers.handle(outcome.frame, conn.from_peer)
            if isinstance(again, Wait) and not self.stopping():
                self._park(again, conn, slot, deadline_ms)  # spurious: keep the first deadline
            elif isinstance(again, Wait):
                conn.fill(slot, again.on_timeout())
            else:
                self.carry_out(again, outcome.frame, conn, slot)

        def timeout() -> None:
            self.parked_long_polls -= 1
            with contextlib.suppress(ValueError):
                partition.waiters.remove(wake)
            if not conn.closed:
                conn.fill(slot, outcome.on_timeout())

        timer = self.call_later(max(0.0, (deadline_ms - now_ms()) / 1000), timeout)
        self.parked_long_polls += 1
        partition.waiters.append(wake)
