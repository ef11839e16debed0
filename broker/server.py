"""The asyncio backend (uvloop when installed): moves bytes between sockets and `Handlers`.

Rules this module keeps:
- No request logic here. Each connection feeds a `FrameDecoder`; each frame goes to
  `Handlers.handle`; the `Outcome` is carried out with blocking file calls (appends and reads hit
  the page cache; fsyncs are grouped, below) and the reply is queued.
- Replies leave each connection in request order, whatever order they complete in: a long-poll
  fetch holds back the replies pipelined behind it.
- Group commit: every acks=durable produce of one loop turn waits for one flush per partition,
  run at the end of that turn (`loop.call_soon` runs after all the I/O callbacks already due).
- Limits: a connection that has `CONNECTION_INFLIGHT_MAX` requests unanswered, or whose transport
  buffers more than the high-water mark, stops being read until it drains.
- A frame that cannot be delimited (`ProtocolError`) closes that connection, and only it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Callable
from typing import cast

from broker.handlers import Append, BrokerConfig, Durable, Handlers, Outcome, Read, Reply, Silent, Wait
from broker.partition import Partition
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import NEED_DATA, Frame, FrameDecoder, ProtocolError
from ringlog_proto.messages import Acks

log = logging.getLogger(__name__)

CONNECTION_INFLIGHT_MAX = 1024  # unanswered requests per connection before we stop reading it
WRITE_BUFFER_HIGH_BYTES = 16 * 1024 * 1024  # unsent reply bytes per connection before pausing reads
RETENTION_CHECK_S = 30.0
SHUTDOWN_GRACE_S = 10.0


class _Slot:
    __slots__ = ("buffers", "done")

    def __init__(self) -> None:
        self.buffers: list[bytes] = []
        self.done = False


class Connection(asyncio.Protocol):
    """One client connection. Owned by the event loop's thread."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.slots: list[_Slot] = []
        self.closed = False
        self.peer = "?"
        self._reading_paused = False
        self._writing_paused = False
        self._aborted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.peer = str(transport.get_extra_info("peername"))
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.decoder.buffered and not self._aborted:
            log.info("client %s went away mid-frame (%d bytes unread)", self.peer, self.decoder.buffered)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            while not self.closed:
                frame = self.decoder.next_frame()
                if frame is NEED_DATA:
                    break
                assert isinstance(frame, Frame)
                slot = _Slot()
                self.slots.append(slot)
                self.server.carry_out(self.server.handlers.handle(frame), frame, self, slot)
        except ProtocolError as exc:
            log.warning("closing %s: %s", self.peer, exc)
            self.abort()
            return
        self._update_reading()

    def fill(self, slot: _Slot, outcome: Reply | Silent) -> None:
        """A reply is ready: send every reply at the head of the queue that is ready too."""
        slot.done = True
        if isinstance(outcome, Reply):
            slot.buffers = outcome.buffers
        if self.closed or self.transport is None:
            return
        ready = 0
        out: list[bytes] = []
        for s in self.slots:
            if not s.done:
                break
            out.extend(s.buffers)
            ready += 1
        if ready:
            del self.slots[:ready]
            if out:
                self.transport.writelines(out)
            self._update_reading()

    def abort(self) -> None:
        self.closed = True
        self._aborted = True
        if self.transport is not None:
            self.transport.abort()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.closed:
            return
        pause = self._writing_paused or len(self.slots) >= CONNECTION_INFLIGHT_MAX
        if pause and not self._reading_paused:
            self.transport.pause_reading()
        elif not pause and self._reading_paused:
            self.transport.resume_reading()
        self._reading_paused = pause


class Server:
    """One broker process on the asyncio backend."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.io = SyncFileIO()
        self.handlers = Handlers(config)
        self.connections: set[Connection] = set()
        self._flush_waiting: dict[
            Partition, list[tuple[Callable[[], None], Callable[[BaseException], None]]]
        ] = {}
        self._flush_scheduled = False
        self._waits: set[asyncio.TimerHandle] = set()
        self._stopping: asyncio.Event | None = None

    # ------------------------------------------------------------------------- outcomes

    def carry_out(self, outcome: Outcome, frame: Frame, conn: Connection, slot: _Slot) -> None:
        if isinstance(outcome, Reply | Silent):
            conn.fill(slot, outcome)
        elif isinstance(outcome, Append):
            self._append(outcome, frame, conn, slot)
        elif isinstance(outcome, Durable):
            self._after_flush(
                outcome.partition,
                lambda: conn.fill(slot, outcome.reply),
                lambda exc: conn.fill(slot, outcome.fail(exc)),
            )
        elif isinstance(outcome, Read):
            try:
                extent = outcome.extent
                data = self.io.pread(extent.segment.store_fd, extent.length, extent.position)
                reply = outcome.finish(data)
            except Exception as exc:  # becomes an error reply
                reply = self.handlers.error_reply(frame, exc)
            conn.fill(slot, reply)
        else:
            self._wait(outcome, conn, slot, outcome.deadline_ms)

    def _append(self, outcome: Append, frame: Frame, conn: Connection, slot: _Slot) -> None:
        log_ = outcome.partition.log
        try:
            run_ops(self.io, outcome.pending.ops)
        except OSError as exc:
            log.error("append to %s failed: %s", outcome.pending.segment.store_path, exc)
            log_.abort_append(outcome.pending)
            conn.fill(slot, outcome.fail(exc))
            return
        reply = outcome.complete()
        if outcome.acks != Acks.DURABLE:
            conn.fill(slot, reply)
            return
        self._after_flush(
            outcome.partition,
            lambda: conn.fill(slot, reply),
            lambda exc: conn.fill(slot, outcome.fail(exc)),
        )

    def _after_flush(
        self, partition: Partition, done: Callable[[], None], failed: Callable[[BaseException], None]
    ) -> None:
        self._flush_waiting.setdefault(partition, []).append((done, failed))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._group_commit)

    def _group_commit(self) -> None:
        """One flush per partition for every durable produce of this loop turn."""
        self._flush_scheduled = False
        waiting, self._flush_waiting = self._flush_waiting, {}
        for partition, callbacks in waiting.items():
            log_ = partition.log
            try:
                plan = log_.prepare_flush()
                run_ops(self.io, plan.ops)
                log_.complete_flush(plan)
            except Exception as exc:  # every waiter learns of it
                if isinstance(exc, OSError):
                    log_.fail_flush(exc)
                log.error("flush of %s failed: %s", log_.directory, exc)
                for _, failed in callbacks:
                    failed(exc)
                continue
            for done, _ in callbacks:
                done()

    def _wait(self, outcome: Wait, conn: Connection, slot: _Slot, deadline_ms: int) -> None:
        """Park a fetch until its partition grows or its deadline passes."""
        loop = asyncio.get_running_loop()
        partition = outcome.partition
        timer: asyncio.TimerHandle | None = None

        def wake() -> None:
            if timer is not None:
                timer.cancel()
                self._waits.discard(timer)
            if conn.closed:
                return
            again = self.handlers.handle(outcome.frame)
            if isinstance(again, Wait) and not self._stopping_now():
                self._wait(again, conn, slot, deadline_ms)  # spurious: keep the first deadline
            elif isinstance(again, Wait):
                conn.fill(slot, again.on_timeout())
            else:
                self.carry_out(again, outcome.frame, conn, slot)

        def timeout() -> None:
            self._waits.discard(timer)  # type: ignore[arg-type]
            with contextlib.suppress(ValueError):
                partition.waiters.remove(wake)
            if not conn.closed:
                conn.fill(slot, outcome.on_timeout())

        delay = max(0.0, (deadline_ms - now_ms()) / 1000)
        timer = loop.call_later(delay, timeout)
        self._waits.add(timer)
        partition.waiters.append(wake)

    def _stopping_now(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    # ------------------------------------------------------------------------- lifecycle

    async def serve(self, ready: Callable[[int], None] | None = None) -> None:
        """Serve until SIGINT/SIGTERM; then stop accepting, answer in-flight requests, flush, close."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stopping.set)
        server = await loop.create_server(
            lambda: Connection(self),
            self.config.host,
            self.config.port,
            reuse_address=True,
            backlog=1024,
        )
        port = server.sockets[0].getsockname()[1]
        log.info(
            "serving on %s:%d (data dir %s, backend %s)",
            self.config.host,
            port,
            os.path.abspath(self.config.data_dir),
            "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio (uvloop not installed)",
        )
        if ready is not None:
            ready(port)
        retention = loop.create_task(self._retention_loop())
        await self._stopping.wait()
        log.info("shutting down: no new connections, answering in-flight requests")
        server.close()
        retention.cancel()
        for p in self.handlers.partitions.values():
            p.wake_waiters()  # parked fetches answer now (their re-handle sees _stopping)
        await self._drain()
        if self._flush_scheduled:
            self._group_commit()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        self.handlers.close()
        log.info("stopped cleanly")

    async def _drain(self) -> None:
        deadline = asyncio.get_running_loop().time() + SHUTDOWN_GRACE_S
        while any(c.slots for c in self.connections) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(RETENTION_CHECK_S)
            deleted = self.handlers.apply_retention()
            if deleted:
                log.info("retention deleted %d segment(s)", deleted)


# glibc malloc: request bodies of up to a frame (8 MiB) come and go with every produce. By default
# glibc serves blocks over 128 KiB with mmap and trims the heap top past 128 KiB, so each large
# request costs page faults and brk calls (measured: a fresh broker ingests 1 KiB records at about
# a third of the rate it reaches once glibc has raised its thresholds by itself). Fixing them from
# the start keeps those pages in the heap for reuse.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MALLOC_MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024  # above the largest frame: frames stay on the heap
MALLOC_TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024  # free memory kept before returning it to the OS
MALLOC_TOP_PAD_BYTES = 16 * 1024 * 1024


def tune_malloc() -> bool:
    """Set glibc's malloc thresholds (see above). False where there is no glibc (musl, macOS)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
                (M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
                (M_TOP_PAD, MALLOC_TOP_PAD_BYTES),
            )
        )
    except (OSError, AttributeError):
        return False
    return ok


def run(config: BrokerConfig, ready: Callable[[int], None] | None = None) -> None:
    """Run a broker until a signal stops it, on uvloop when it is installed."""
    if not tune_malloc():
        log.info("glibc malloc tuning unavailable; large requests will cost more page faults")
    try:
        import uvloop  # noqa: PLC0415 - optional: the portable fallback is plain asyncio

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(Server(config).serve(ready))
