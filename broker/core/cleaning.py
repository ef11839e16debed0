"""A core's log cleaner: which of its compacted partitions to clean and when, the clean on a
blocking thread, and the swap back on the loop (Kafka's LogCleanerManager and one cleaner thread,
per core).

Rules this module keeps:
- Owned by the core's loop; the clean itself (broker/storage/cleaner.py) runs in a process of its
  own (broker/storage/clean_process.py: the loop never waits for the interpreter's lock), which a
  `run_blocking` thread waits for, one at a time per core (files only, never the core's
  objects); its result is swapped in on the loop (broker/storage/log_cleaning.py `install`),
  between requests, so appends, reads, the producer state and the epoch history never see a half
  swap.
- `tick()` (the backend's timer, every `backoff_ms`, and again as soon as a clean ends) picks the
  partition that most needs it: one whose clean is due for its max compaction lag or its
  tombstones' delete horizon first, then the highest dirty ratio above its topic's minimum (as
  Kafka's `grabFilthiestCompactedLog`), assessed in turns of the loop (broker/core/sweeps.py).
  Replicas decide for themselves: each cleans its own log.
- A partition that closes (its topic deleted, the core stopping) cancels its clean in flight:
  the thread stops at its next read or write and removes its files; a result that comes back for
  a log that changed meanwhile is discarded, never installed (`install` checks).
- A clean takes no more than the partition's last stable offset, and its plan the partition's
  aborted transactions and producers' last markers; once swapped in, the partition's aborted
  list keeps only the entries of the markers each cleaned segment kept (broker/storage/cleaner.py).
- The offset map (the dedupe buffer, `--log-cleaner-dedupe-buffer-size`) is the clean's process's
  memory, a fixed amount while a clean runs, none between cleans.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.core.blocking import BlockingCallAbandoned, RunBlocking
from broker.core.partition import Partition
from broker.core.sweeps import Sweep
from broker.storage import log_cleaning
from broker.storage.clean_process import CleanProcess
from broker.storage.cleaner import CleanerConfig, CleanResult, CleanStats
from broker.storage.log_cleaning import CleanerCheckpoint, Planned
from broker.storage.offset_map import ENTRY_BYTES
from broker.storage.throttle import CleanCancelled
from ringlog_proto.batch import now_ms

log = logging.getLogger(__name__)

_URGENT = ("max compaction lag", "tombstones past their delete horizon")


@dataclass(slots=True)
class _Running:
    partition: Partition
    planned: Planned
    process: CleanProcess
    reason: str


class LogCleaning:
    """One core's cleaner (module rules). `partitions()` lists the core's open partitions."""

    def __init__(
        self,
        config: CleanerConfig,
        partitions: Callable[[], Iterable[Partition]],
        run_blocking: RunBlocking,
        clock: Callable[[], int] = now_ms,
        sweep: Sweep[Partition] | None = None,
    ) -> None:
        self.config = config
        self._partitions = partitions
        # the assessment pass, in turns of the core's loop (the core's `partition_sweep`); without
        # one (tests), whole in `tick`
        self._sweep: Sweep[Partition] = sweep if sweep is not None else Sweep("cleaner", None)
        self._run_blocking = run_blocking
        self._clock = clock
        self._running: _Running | None = None
        self._checkpoints: dict[str, CleanerCheckpoint] = {}
        self._closed = False
        self.cleans = 0  # cleans installed
        self.discarded = 0  # cleans whose log changed under them, or that failed
        self.last_stats: CleanStats | None = None

    @property
    def busy(self) -> bool:
        return self._running is not None

    @property
    def map_bytes(self) -> int:
        """The offset map's memory in a clean's process."""
        return self.config.dedupe_buffer_bytes // ENTRY_BYTES * ENTRY_BYTES

    def checkpoint(self, p: Partition) -> CleanerCheckpoint:
        """The partition's checkpoint, brought down to where a truncation (a follower's) left the
        log since it was last asked: what is appended there again is dirty (and saved at once)."""
        cp = self._checkpoints.get(p.directory)
        if cp is None:
            cp = self._checkpoints[p.directory] = log_cleaning.load_checkpoint(p.directory)
        truncated = p.log.take_truncation()
        if truncated is not None and truncated < cp.cleaned_to:
            cp.cleaned_to = truncated
            self._save(p.directory, cp)
        return cp

    def _save(self, directory: str, cp: CleanerCheckpoint) -> None:
        saved = CleanerCheckpoint(cp.cleaned_to, cp.next_horizon_ms)
        self._run_blocking(
            lambda: log_cleaning.save_checkpoint(directory, saved), lambda r: self._saved(directory, r)
        )

    def tick(self) -> bool:
        """Start the clean of the partition that most needs one, if any and none is running.
        Returns whether one started by the time it returns: with a core's loop the partitions are
        assessed in turns of it (broker/core/sweeps.py) and the clean starts when the pass ends.

        The choice need not be atomic across partitions: it only ranks them, and the one chosen is
        assessed again when the pass ends, so what its clean plans is its state then (a partition
        closed meanwhile is not cleaned: the next tick picks again)."""
        if self._closed or self._running is not None or not self.config.enabled or self._sweep.running:
            return False
        now = self._clock()
        best: list[tuple[tuple[bool, float], Partition]] = []

        def visit(p: Partition) -> None:
            d = self._assess(p, now)
            if d is None or d.reason is None:
                return
            rank = (d.reason in _URGENT, d.ratio)
            if not best or rank > best[0][0]:
                best[:] = [(rank, p)]

        started: list[bool] = []
        self._sweep.start(self._partitions(), visit, lambda: started.append(self._start(best, now)))
        return bool(started and started[0])

    def _assess(self, p: Partition, now: int) -> log_cleaning.Dirtiness | None:
        log_ = p.log
        if not log_.config.compacts or log_.closed:
            return None
        try:
            return log_cleaning.assess(log_, self.checkpoint(p), now, p.high_watermark, p.last_stable_offset)
        except Exception as exc:
            log.warning("%s: cannot tell how dirty it is: %s", log_.directory, exc)
            return None

    def _start(self, best: list[tuple[tuple[bool, float], Partition]], now: int) -> bool:
        """Start the clean of the partition the pass found dirtiest, as it is now."""
        if not best or self._closed or self._running is not None:
            return False
        p = best[0][1]
        d = self._assess(p, now)
        if d is None or d.reason is None:
            return False
        planned = log_cleaning.plan(
            p.log, d, now, p.producers.last_offsets(), p.producers.last_markers(), p.aborted.entries()
        )
        if planned is None:
            return False
        process = CleanProcess(self.config.dedupe_buffer_bytes, self.config.io_max_bytes_per_s)
        running = self._running = _Running(p, planned, process, d.reason)
        log.info("%s: cleaning (%s, dirty ratio %.2f)", p.directory, d.reason, d.ratio)
        self._run_blocking(lambda: process.run(planned.plan), lambda result: self._done(running, result))
        return True

    def _done(self, running: _Running, result: CleanResult | BaseException) -> None:
        self._running = None
        p = running.partition
        if isinstance(result, BaseException):
            if not isinstance(result, CleanCancelled | BlockingCallAbandoned):
                self.discarded += 1
                log.warning("%s: clean failed: %s", p.directory, result)
            self._next()
            return
        if not log_cleaning.install(p.log, running.planned, result):
            self.discarded += 1
            log.info("%s: clean discarded: the log changed while it ran", p.directory)
            self._next()
            return
        for group in result.groups:
            p.aborted.replace_between(group.base_offset, group.replaces[-1].next_offset, group.aborted)
        self.cleans += 1
        self.last_stats = s = result.stats
        cp = self.checkpoint(p)
        cp.cleaned_to = result.cleaned_to
        horizon = result.next_horizon_ms
        if horizon is not None:  # one kept past what the map covered: due with that part's clean
            horizon = max(horizon, self._clock() + self.config.backoff_ms)
        cp.next_horizon_ms = horizon
        self._save(p.directory, cp)
        log.info(
            "%s: cleaned (%s) to offset %d: %d of %d records and %d of %d bytes kept, %.1f MB/s, "
            "%d keys in a map of %d bytes",
            p.directory,
            running.reason,
            result.cleaned_to,
            s.records_kept,
            s.records_read,
            s.bytes_written,
            sum(seg.size for g in result.groups for seg in g.replaces),
            (s.bytes_read + s.bytes_written) / max(s.elapsed_s, 1e-9) / 1e6,
            s.map_keys,
            s.map_bytes,
        )
        self._next()

    @staticmethod
    def _saved(directory: str, result: object) -> None:
        if isinstance(result, BaseException) and not isinstance(result, BlockingCallAbandoned):
            log.warning("%s: the cleaner's checkpoint was not saved: %s", directory, result)

    def _next(self) -> None:
        """A clean ended: go on at once with the next log that needs one (Kafka's cleaner thread
        backs off only when there is none)."""
        try:
            self.tick()
        except Exception:
            log.exception("the log cleaner's next round failed to start")

    def forget(self, p: Partition) -> None:
        """`p` closes: its clean in flight stops, and its checkpoint is read again if it reopens."""
        running = self._running
        if running is not None and running.partition is p:
            running.process.cancel()
        self._checkpoints.pop(p.directory, None)

    def close(self) -> None:
        """The core stops: the clean in flight stops (its files are removed), none starts."""
        self._closed = True
        self._sweep.cancel()
        if self._running is not None:
            self._running.process.cancel()
