"""Forwarding between cores, without I/O: correlation ids, limits, failures, topic notices.

Rules this module keeps:
- No sockets, no clock. A backend implements ONE primitive and hands it in:

      send_to_core(core: int, frame: Frame, long_poll: bool,
                   done: Callable[[Frame | BaseException], None] | None) -> None

  "Write this frame to core `core` over the inter-core unix socket, and call `done` with the
  response frame, or with an exception if the connection to that core failed." The backend
  keeps one `PeerLink` (below) per inter-core connection, which does the correlation mapping:
  `PeerLink.request` gives the bytes to write, `receive` takes the bytes read and calls the right
  `done`, `lost` fails everything pending. `done=None` means no answer will come (acks=0).
- Connections per peer core: requests that answer within a loop turn share one connection per
  peer (the owner answers each connection in request order, and these never wait). A long-poll
  fetch (`long_poll=True`) may be held by the owner for up to a minute, and would hold back every
  answer behind it, so it travels on a connection of its own (the backend keeps idle ones for
  reuse). The owner serves the inter-core listener exactly like a client listener.
- The forwarded frame is the client's frame with a correlation id chosen by the link
  (`frames.reframe`); the answer gets the client's id back before it is relayed, and leaves the client
  connection in request order like any other answer (the backend's slot queue).
- A peer that fails (its worker died: the supervisor restarts it) fails every request pending on
  that connection with NOT_OWNER, which clients retry after refreshing metadata. The supervisor
  holds the inter-core listeners, so a connect to a dead worker's core succeeds and would wait in
  the backlog until the restart; instead `PeerPool` asks the supervisor's liveness table
  (broker/core/liveness.py) before each forward and every `PEER_WATCH_S` while forwards are pending:
  a forward to a core that is down is answered NOT_OWNER at once, and the connections to a core
  that went down are closed, failing everything on them at once (the kernel already breaks the
  ones the dead worker had accepted; this catches those still in the backlog). Backstop for a
  peer that is up but does not answer: every forward has a deadline, `--forward-timeout-ms`
  after it was sent (a forwarded long poll: after its max_wait plus that), past which its
  connection is closed and what was on it answered REQUEST_TIMED_OUT (retriable).
- Limits: at most `FORWARD_INFLIGHT_MAX` forwards (and `FORWARD_INFLIGHT_BYTES_MAX` request bytes)
  in flight per peer; more are queued here, and
  `blocked(core)` tells the backend to stop reading the client connections that sent them until
  `when_room(core, resume)` calls back.
- Topic notices (`Notify`, for DeleteTopic): the frame goes to every listed core; the answer is
  sent when all have answered or failed, or after `TOPIC_NOTICE_TIMEOUT_S` (the backend provides
  `call_later(seconds, fn)`); a core that missed it removes the topic's files when it restarts.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol, cast

from broker.core.config import BrokerConfig
from broker.core.limits import FETCH_WAIT_MS_MAX, Limits
from broker.core.liveness import always_alive, peer_liveness
from broker.core.metrics import CoreMetrics
from broker.core.outcomes import Forward, Later, Notify, Reply, Silent
from ringlog_proto.frames import (
    LENDING_DECODER,
    NEED_DATA,
    Buffer,
    Frame,
    FrameDecoder,
    FrameReader,
    frame_decoder,
    reframe,
)
from ringlog_proto.messages import ErrorCode, peek_fetch_max_wait_ms

log = logging.getLogger(__name__)


class AnswersErrors(Protocol):
    """What forwarding needs of our protocol's handlers (`RinglogAdapter`, the frames forwarded
    are ours): the core's config and metrics, and the error response to a frame it could not get
    answered. A protocol, so the core does not import the adapter (which hands it `Forward` and
    `Notify` outcomes in the first place)."""

    config: BrokerConfig
    metrics: CoreMetrics

    def error_answer(self, frame: Frame, code: ErrorCode, message: str) -> Reply: ...


# Forwards waiting for an answer from one peer core. The owner answers a peer connection in order
# and reads it as fast as any client's, so this bounds the memory a slow peer can make us hold
# (up to this many requests, each at most a frame) without limiting a healthy one: at 100 µs per
# request, 256 in flight already covers 25 ms of work.
FORWARD_INFLIGHT_MAX: Final = 256
# ...and at most this many request bytes: 256 produce requests of 1 MiB batches would otherwise be
# 256 MiB held for one peer. One request above it still goes (alone), so any frame can be forwarded.
FORWARD_INFLIGHT_BYTES_MAX: Final = 32 * 1024 * 1024
PEER_IDLE_LINKS_MAX: Final = 8  # idle long-poll connections kept per peer core for reuse
TOPIC_NOTICE_TIMEOUT_S: Final = 5.0  # a peer that cannot close a topic's partitions in 5 s is stuck
CORRELATION_MASK: Final = 0xFFFFFFFF
# How often the pool looks at the liveness table and the forward deadlines while forwards are
# pending: the bound on how long a forward waits for a peer whose worker just died (plus the
# supervisor noticing, which SIGCHLD makes immediate).
PEER_WATCH_S: Final = 0.1
# --forward-timeout-ms's default, for pools made without a config; a worker's takes the flag (for_config)
FORWARD_TIMEOUT_S_DEFAULT: Final = Limits().forward_timeout_ms / 1000
NO_DEADLINE: Final = math.inf
FAILURE_LOG_EVERY_S: Final = 1.0  # at most one "forward failed" warning per peer per second

Done = Callable[[Frame | BaseException], None]
SendToCore = Callable[[int, Frame, bool, Done | None], None]
CallLater = Callable[[float, Callable[[], None]], object]


class PeerLinkError(Exception):
    """The connection to a peer core failed or spoke nonsense; its requests did not complete."""


class PeerTimeout(PeerLinkError):
    """A peer that counts as up did not answer a forward by its deadline (answered REQUEST_TIMED_OUT)."""


class PeerLink:
    """One connection to a peer core (or to another broker's core: broker/core/remote.py),
    sans-I/O: assigns correlation ids, matches answers.

    Owned by the forwarding core's event-loop thread; the backend owns the socket.
    """

    __slots__ = ("_decoder", "_next_id", "_pending", "closed", "core", "peer")

    def __init__(self, core: int, peer: str | None = None) -> None:
        self.core = core  # -1 for a link to another broker (broker/core/remote.py)
        self.peer = peer or f"core {core}"  # what messages call the other end
        self._decoder: FrameDecoder = frame_decoder()
        self._pending: dict[int, tuple[Done, float]] = {}  # correlation id -> (done, deadline)
        self._next_id = 1
        self.closed = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def overdue(self, now: float) -> bool:
        """Whether a request still pending was due before `now` (its deadline passed)."""
        return any(deadline < now for _, deadline in self._pending.values())

    def request(self, frame: Frame, done: Done | None, deadline: float = NO_DEADLINE) -> list[Buffer]:
        """The bytes to write for `frame` (a fresh correlation id); `done` gets the answer, which
        is due by `deadline` (a `PeerPool` clock reading; see `overdue`)."""
        if self.closed:
            raise PeerLinkError(f"the connection to {self.peer} is closed")
        cid = self._next_id
        self._next_id = (cid + 1) & CORRELATION_MASK or 1
        if done is not None:
            self._pending[cid] = (done, deadline)
        return reframe(frame, cid)

    def receive(self, data: Buffer) -> None:
        """Bytes read from the connection: call `done` of every request answered by them.

        Raises `ProtocolError` when the bytes are not frames: close the connection and call `lost`.
        """
        self._decoder.feed(data)
        self._take()

    def lend(self, size: int) -> memoryview | None:
        """`size` bytes of the decoder's own space for the next receive to write into, or None
        where the decoder does not lend (FrameDecoder, without native/frames.c). A follower's
        fetch answers are most of what its links carry: received here, they are neither copied
        into the decoder nor out of it (a large body is a view of where it arrived, which the
        follower's append writes from), as a client's produce is on its connection."""
        decoder = self._decoder
        if type(decoder) is not LENDING_DECODER:
            return None
        return decoder.buffer(size)

    def received_lent(self, n: int) -> None:
        """`receive` of `n` bytes that arrived in the space `lend` gave (its view released, or
        still held by the read: native/frames.c, "Lending", takes frames either way)."""
        cast(FrameReader, self._decoder).received(n)
        self._take()

    def _take(self) -> None:
        while True:
            frame = self._decoder.next_frame()
            if frame is NEED_DATA:
                return
            assert isinstance(frame, Frame)
            entry = self._pending.pop(frame.correlation_id, None)
            if entry is None:
                # An answer to a request sent with done=None: an acks=0 produce the owner refused.
                log.debug("%s answered request %d nobody waits for", self.peer, frame.correlation_id)
                continue
            entry[0](frame)

    def lost(self, exc: BaseException | None) -> None:
        """The connection is gone: fail everything still pending on it (with `exc` itself when it
        is a `PeerLinkError`: the pool's reason for closing it)."""
        self.closed = True
        pending, self._pending = self._pending, {}
        if not pending:
            return
        if isinstance(exc, PeerLinkError):
            reason = exc
        else:
            reason = PeerLinkError(f"connection to {self.peer} lost: {exc or 'closed by the peer'}")
        for done, _ in pending.values():
            done(reason)


class Forwarder:
    """Carries out `Forward` and `Notify` outcomes for one core. Owned by its event-loop thread."""

    def __init__(
        self,
        handlers: AnswersErrors,
        send_to_core: SendToCore,
        call_later: CallLater,
        inflight_max: int = FORWARD_INFLIGHT_MAX,
        inflight_bytes_max: int = FORWARD_INFLIGHT_BYTES_MAX,
    ) -> None:
        assert inflight_max >= 1 and inflight_bytes_max >= 1
        self.handlers = handlers
        self.metrics = handlers.metrics
        self.send_to_core = send_to_core
        self.call_later = call_later
        self.inflight_max = inflight_max
        self.inflight_bytes_max = inflight_bytes_max
        cores = handlers.config.cores
        self._inflight = [0] * cores
        self._inflight_bytes = [0] * cores
        self._queued: list[deque[tuple[Forward, Callable[[Reply | Silent], None]]]] = [
            deque() for _ in range(cores)
        ]
        self._room_waiters: list[list[Callable[[], None]]] = [[] for _ in range(cores)]
        self._draining = [False] * cores  # inside `_after_answer` for that core (see there)
        self._failures_unlogged = [0] * cores
        self._failure_logged_at = [-math.inf] * cores

    # ------------------------------------------------------------------------- gauges

    @property
    def pending(self) -> int:
        """Forwards sent and not answered, plus those queued behind the per-peer limit."""
        return sum(self._inflight) + sum(len(q) for q in self._queued)

    def blocked(self, core: int) -> bool:
        """Whether forwards to `core` are over the limit (stop reading the connection that sent one)."""
        return (
            self._inflight[core] >= self.inflight_max or self._inflight_bytes[core] >= self.inflight_bytes_max
        )

    def when_room(self, core: int, resume: Callable[[], None]) -> None:
        """Call `resume` once forwards to `core` are below the limit again."""
        if not self.blocked(core):
            resume()
        else:
            self._room_waiters[core].append(resume)

    # ------------------------------------------------------------------------- forward

    def forward(self, outcome: Forward, reply: Callable[[Reply | Silent], None]) -> None:
        """Send `outcome.frame` to its owner; `reply` gets the relayed answer (or an error)."""
        self.metrics.forwarded()
        if not outcome.expects_reply:
            self._send(outcome, None)
            reply(Silent())
            return
        core = outcome.core
        if self._queued[core] or (self.blocked(core) and self._inflight[core]):
            self._queued[core].append((outcome, reply))  # in order, behind what already waits
            return
        self._start(outcome, reply)

    def _start(self, outcome: Forward, reply: Callable[[Reply | Silent], None]) -> None:
        core = outcome.core
        cid = outcome.frame.correlation_id
        nbytes = len(outcome.frame.body)
        self._inflight[core] += 1
        self._inflight_bytes[core] += nbytes
        finished = False

        def done(result: Frame | BaseException) -> None:
            nonlocal finished
            if finished:  # a backend calling back twice would be a bug; never answer twice
                return
            finished = True
            self._inflight[core] -= 1
            self._inflight_bytes[core] -= nbytes
            if isinstance(result, BaseException):
                reply(self._failure(outcome, result))
            else:
                reply(_relayed(result, cid))
            self._after_answer(core)

        self._send(outcome, done)

    def _send(self, outcome: Forward, done: Done | None) -> None:
        try:
            self.send_to_core(outcome.core, outcome.frame, outcome.long_poll, done)
        except Exception as exc:  # a backend refusing at once is a failed peer too
            if done is not None:
                done(exc)

    def _after_answer(self, core: int) -> None:
        # A forward to a peer that is down fails inside `_start` (synchronously), which calls back
        # here: the outer call goes on draining the queue instead of recursing once per request.
        if self._draining[core]:
            return
        self._draining[core] = True
        try:
            queue = self._queued[core]
            while queue and not (self.blocked(core) and self._inflight[core]):
                outcome, reply = queue.popleft()
                self._start(outcome, reply)
        finally:
            self._draining[core] = False
        if not self.blocked(core) and self._room_waiters[core]:
            waiters, self._room_waiters[core] = self._room_waiters[core], []
            for resume in waiters:
                resume()

    def _failure(self, outcome: Forward, exc: BaseException) -> Reply:
        frame = outcome.frame
        self._log_failure(outcome.core, exc)
        if isinstance(exc, PeerTimeout):
            return self.handlers.error_answer(
                frame,
                ErrorCode.REQUEST_TIMED_OUT,
                f"core {outcome.core} owns partition {frame.partition} of topic id {frame.topic_id} "
                f"and did not answer in time ({exc}); retry",
            )
        return self.handlers.error_answer(
            frame,
            ErrorCode.NOT_OWNER,
            f"core {outcome.core} owns partition {frame.partition} of topic id {frame.topic_id} "
            f"and could not be reached ({exc}); retry",
        )

    def _log_failure(self, core: int, exc: BaseException) -> None:
        """One warning per peer per `FAILURE_LOG_EVERY_S`, with the count it stands for: while a
        worker restarts, every forward to it fails, and one line each would flood the log."""
        now = time.monotonic()
        self._failures_unlogged[core] += 1
        if now - self._failure_logged_at[core] < FAILURE_LOG_EVERY_S:
            return
        count, self._failures_unlogged[core] = self._failures_unlogged[core], 0
        self._failure_logged_at[core] = now
        more = f" ({count} forwards failed since the last such line)" if count > 1 else ""
        log.warning("forward to core %d failed: %s%s", core, exc, more)

    def fail_all(self) -> None:
        """Shutdown: answer every queued forward with NOT_OWNER (the in-flight ones finish or fail
        with their connections)."""
        for core, queue in enumerate(self._queued):
            while queue:
                outcome, reply = queue.popleft()
                reply(self._failure(outcome, PeerLinkError(f"core {core}: shutting down")))

    # ------------------------------------------------------------------------- notices

    def notify(self, outcome: Notify, reply: Callable[[Reply | Silent], None]) -> None:
        """Send the notice to every core of `outcome.cores`; answer with `finish()` when all
        answered or failed, or at the timeout."""
        waiting = set(outcome.cores)
        answered = False

        def finish() -> None:
            nonlocal answered
            if answered:
                return
            answered = True
            if waiting:
                log.warning(
                    "topic notice: no answer from core(s) %s within %.0f s; they catch up at restart "
                    "or at their next registry refresh",
                    sorted(waiting),
                    TOPIC_NOTICE_TIMEOUT_S,
                )
            answer = outcome.finish()
            if isinstance(answer, Later):
                answer.start(reply)
            else:
                reply(answer)

        def done_for(core: int) -> Done:
            def done(result: Frame | BaseException) -> None:
                if isinstance(result, BaseException):
                    log.warning("topic notice to core %d failed: %s", core, result)
                waiting.discard(core)
                if not waiting:
                    finish()

            return done

        self.call_later(TOPIC_NOTICE_TIMEOUT_S, finish)
        for core in outcome.cores:
            done = done_for(core)
            try:
                self.send_to_core(core, outcome.frame, False, done)
            except Exception as exc:
                done(exc)


def _relayed(answer: Frame, correlation_id: int) -> Reply:
    """The owner's answer with the client's correlation id put back."""
    return Reply(reframe(answer, correlation_id))


class PeerChannel(Protocol):
    """What a backend's end of one inter-core connection offers `PeerPool`."""

    link: PeerLink

    def send(self, frame: Frame, done: Done | None, deadline: float = NO_DEADLINE) -> None: ...
    def close(self) -> None: ...


class PeerPool:
    """Which inter-core connection carries each forward: the `send_to_core` primitive, given a
    backend's way of opening a connection. Owned by the forwarding core's event-loop thread.

    One connection per peer core for ordinary forwards (the owner answers each connection in
    request order, and these never wait). A forwarded long poll may be parked at the owner for up
    to a minute and would hold back every answer behind it, so it gets a connection of its own,
    kept idle afterwards for the next one (at most `PEER_IDLE_LINKS_MAX` per peer).

    Dead peers (module rules): `alive(core)` is the supervisor's liveness table; a forward to a
    core that is down fails at once, and while forwards are pending a watch every `PEER_WATCH_S`
    (through `call_later`) closes the connections to cores that went down and those holding a
    forward past its deadline (`timeout_s` after it was sent, plus max_wait for a long poll).
    """

    def __init__(
        self,
        open_peer: Callable[[int, bool], PeerChannel | None],
        stopping: Callable[[], bool],
        call_later: CallLater | None = None,
        alive: Callable[[int], bool] = always_alive,
        timeout_s: float = FORWARD_TIMEOUT_S_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._open_peer = open_peer  # (core, long_poll) -> a connecting channel, or None
        self._stopping = stopping
        self._call_later = call_later
        self._alive = alive
        self._timeout_s = timeout_s if timeout_s > 0 else math.inf  # 0: no deadline
        self._clock = clock
        self._watching = False
        self._ordinary: dict[int, PeerChannel] = {}
        self._idle: dict[int, list[PeerChannel]] = {}
        self.channels: set[PeerChannel] = set()

    @classmethod
    def for_config(
        cls,
        config: BrokerConfig,
        open_peer: Callable[[int, bool], PeerChannel | None],
        stopping: Callable[[], bool],
        call_later: CallLater,
    ) -> PeerPool:
        """The pool of a worker: the supervisor's liveness table if it gave one, the forward
        deadline from the limits."""
        view = peer_liveness(config.peer_liveness_fd, config.cores)
        return cls(
            open_peer,
            stopping,
            call_later,
            alive=view.alive if view is not None else always_alive,
            timeout_s=config.limits.forward_timeout_ms / 1000,
        )

    def send_to_core(self, core: int, frame: Frame, long_poll: bool, done: Done | None) -> None:
        if not self._alive(core):
            # Its worker is dead or restarting: a connection would wait in the backlog for it.
            self.close_core(core, None)
            if done is not None:
                done(PeerLinkError(f"core {core} is down (its worker is restarting)"))
            return
        deadline = self._clock() + self._timeout_s
        if long_poll:
            assert done is not None
            deadline += _max_wait_s(frame)
            idle = self._idle.get(core)
            pc = idle.pop() if idle else self._open(core, long_poll=True)
            if pc is None:
                done(PeerLinkError(f"cannot reach core {core}"))
                return
            parked = pc

            def done_then_park(result: Frame | BaseException) -> None:
                if not parked.link.closed and parked.link.pending == 0:
                    idle = self._idle.setdefault(core, [])
                    if len(idle) < PEER_IDLE_LINKS_MAX and not self._stopping():
                        idle.append(parked)
                    else:
                        parked.close()
                done(result)

            pc.send(frame, done_then_park, deadline)
            self._watch_soon()
            return
        pc = self._ordinary.get(core)
        if pc is None or pc.link.closed:
            pc = self._open(core, long_poll=False)
            if pc is None:
                if done is not None:
                    done(PeerLinkError(f"cannot reach core {core}"))
                return
            self._ordinary[core] = pc
        pc.send(frame, done, deadline)
        if done is not None:
            self._watch_soon()

    def _open(self, core: int, long_poll: bool) -> PeerChannel | None:
        pc = self._open_peer(core, long_poll)
        if pc is not None:
            self.channels.add(pc)
        return pc

    def gone(self, pc: PeerChannel) -> None:
        """`pc` closed (the backend calls this once): forget it."""
        self.channels.discard(pc)
        core = pc.link.core
        if self._ordinary.get(core) is pc:
            del self._ordinary[core]
        idle = self._idle.get(core)
        if idle and pc in idle:
            idle.remove(pc)

    def close_all(self) -> None:
        for pc in list(self.channels):
            pc.close()

    # ------------------------------------------------------------------------- the watch

    def close_core(self, core: int, reason: PeerLinkError | None) -> None:
        """Close every connection to `core`, failing what is pending on them with `reason`."""
        for pc in [pc for pc in self.channels if pc.link.core == core]:
            self._close(pc, reason or PeerLinkError(f"core {core} went down (its worker is restarting)"))

    def _close(self, pc: PeerChannel, reason: PeerLinkError) -> None:
        self.gone(pc)  # first: the requests failed below may be re-sent, on a new connection
        pc.link.lost(reason)
        pc.close()

    def _watch_soon(self) -> None:
        if not self._watching and self._call_later is not None:
            self._watching = True
            self._call_later(PEER_WATCH_S, self._watch)

    def _watch(self) -> None:
        self._watching = False
        now = self._clock()
        for pc in list(self.channels):
            link = pc.link
            if pc not in self.channels or link.closed:
                continue
            if not self._alive(link.core):
                self.close_core(link.core, None)
            elif link.overdue(now):
                self._close(pc, PeerTimeout(f"core {link.core} did not answer a forward by its deadline"))
        if any(pc.link.pending for pc in self.channels):
            self._watch_soon()


def _max_wait_s(frame: Frame) -> float:
    """How long the owner may hold a forwarded fetch: its max_wait_ms, capped as the owner caps it."""
    wait_ms = peek_fetch_max_wait_ms(frame)
    if wait_ms is None:
        return 0.0
    return max(0, min(wait_ms, FETCH_WAIT_MS_MAX)) / 1000
