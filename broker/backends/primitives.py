"""What a backend provides its core: the primitives `BackendCore` (broker/backends/backend_core.py)
runs on, each with its meaning, and the defaults of those a backend may leave out.

Rules this module keeps:
- The backend contract. A backend's core subclass calls `open_core()` once its loop works, and
  provides `call_later`, `call_soon`, `end_of_turn`, `run_ops` (storage operations, fileio.py's
  meaning; `run_append` too if it gathers appends), `read` (an extent), `open_peer`,
  `open_remote` (a TCP link to another broker's core: broker/core/remote.py), `stop_accepting`,
  `threadsafe_post` (a wake-up of its loop from other threads, set up by the first blocking call)
  and, if it has any, `io_pending` and `after_sweep`. It serves its listeners, calls
  `accepted(conn)` for each new connection, `started(...)` once all listen, `request_stop()` on
  SIGTERM/SIGINT, then runs the steps of `shutdown()`, and `close_blocking()` once its loop has
  ended, before it releases what `threadsafe_post` uses. Its connection class
  (a `ServedConnection`) provides `write`, `unsent`, `reading_changed`, `abort`, `close` and
  `fileno`, and calls `received`, `sent_some`, `lost` and `closing`; its peer class (a
  `PeerStream`) provides `write` and `close`, and calls `received` and `gone`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from broker.storage.fileio import Buffer, Op, SyncFileIO, run_ops

if TYPE_CHECKING:
    from broker.backends.blocking import Post
    from broker.backends.connection import GatherPart, PeerStream, ServedConnection
    from broker.core.partition import Partition
    from broker.storage.segment import Extent


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class BackendPrimitives:
    """The backend's part of a core: `BackendCore` extends it, a backend's core subclass provides
    what raises here and may replace the defaults."""

    loop_io: SyncFileIO  # the backend's blocking file calls made on the loop thread

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Cancellable:
        raise NotImplementedError

    def call_soon(self, callback: Callable[[], None]) -> None:
        raise NotImplementedError

    def end_of_turn(self, callback: Callable[[], None]) -> None:
        """Run `callback` once after the completions of this loop turn (the group commit)."""
        raise NotImplementedError

    def run_ops(self, ops: Sequence[Op], done: Callable[[OSError | None], None]) -> None:
        """Execute storage operations in order (fileio.py's meaning); `done(None)` or `done(error)`."""
        raise NotImplementedError

    def appends_now(self, ops: Sequence[Op], conn: ServedConnection | GatherPart | None) -> bool:
        """Whether the backend would run these append operations on the loop, synchronously:
        then an append to a partition with none in flight is written, made visible and answered
        at once (`run_ops_now`) instead of through `run_append`. `conn` is the connection whose
        request it is (a backend that gathers appends may wait for the rest of its bytes); None
        for the broker's own (a follower's copy), which nothing follows."""
        return False

    def run_ops_now(self, ops: Sequence[Op]) -> OSError | None:
        """Execute `ops` on the loop, now (only for what `appends_now` accepted); the error, if any."""
        try:
            run_ops(self.loop_io, ops)
        except OSError as exc:
            return exc
        return None

    def run_append(
        self, partition: Partition, ops: Sequence[Op], done: Callable[[OSError | None], None]
    ) -> None:
        """An append's operations: `run_ops` unless the backend gathers them (io_uring)."""
        self.run_ops(ops, done)

    def run_flush(
        self, ops: Sequence[Op], done: Callable[[OSError | None], None], alone: bool = True
    ) -> None:
        """A group commit's operations (a `FlushPlan`'s): `run_ops` unless the backend runs them
        beside its loop (uvloop: a thread). `alone`: no other partition's flush starts with it
        (io_uring may then hold its loop for the sync: uring_options.py's `--flush-syncs`)."""
        self.run_ops(ops, done)

    def read(self, extent: Extent, done: Callable[[Buffer | BaseException], None]) -> None:
        """Read `extent`; `done(data)` or `done(error)`."""
        raise NotImplementedError

    def open_peer(self, core: int, long_poll: bool) -> PeerStream | None:
        """Start connecting to peer core `core` (None: cannot, the forward fails retriably)."""
        raise NotImplementedError

    def open_remote(self, host: str, port: int, long_poll: bool) -> PeerStream | None:
        """Start connecting to another broker's core listening at `host` (an IP literal) and
        `port` over TCP, without blocking the loop: TCP_NODELAY, failing after
        `REMOTE_CONNECT_TIMEOUT_S` (broker/core/limits.py); None: cannot even start (no socket).
        Core code does not call this but `remote_links` (broker/core/remote.py), which keeps one
        link per (remote address, long_poll) and reconnects."""
        raise NotImplementedError

    def stop_accepting(self) -> None:
        raise NotImplementedError

    def io_pending(self) -> int:
        """Operations the backend still waits for after closing everything (shutdown waits a little)."""
        return 0

    def threadsafe_post(self) -> Post:
        """Called once, on the loop thread, by the first `run_blocking`: set up a wake-up of the loop
        and return `post(callback)`, which any thread may call to run `callback` on the loop thread
        in a later turn, waking the loop promptly if it waits. The backend calls `close_blocking()`
        once its loop has ended, before it releases what `post` uses."""
        raise NotImplementedError

    def after_sweep(self) -> None:
        """The backend's own part of the sweep (the io_uring backend shrinks quiet recv buffers)."""
