"""A clean run in a process of its own (`python -m broker.storage.clean_process`), so that the
core's loop never waits for the cleaner: the clean (broker/storage/cleaner.py) is pure Python,
and on a thread of the worker it held the interpreter's lock for most of each switch interval
(5 ms), which a produce then waited for at every system call (bench/compaction.py measured a
produce's p50 at 0.4 ms idle and 15 ms while a thread cleaned).

Rules this module keeps:
- The worker's blocking thread runs `CleanProcess.run(plan)`: it starts the child, hands it the
  plan as JSON on stdin, waits, and reads the result as JSON from stdout. The child runs `clean`
  with its own offset map (the dedupe buffer is the child's memory, allocated for the clean and
  gone with it) and its own I/O cap, at a lower CPU priority (`NICE`) and on any CPU, not pinned
  to the worker's as it would be by inheritance: sharing that CPU, even at the lowest priority
  (SCHED_IDLE), still cost the core's acks=all produces a p50 of 7 ms against 0.5 ms idle
  (bench/compaction.py); anywhere else, nothing measurable.
- It dies with the worker: PR_SET_PDEATHSIG(SIGKILL) first thing (the worker's blocking threads
  live as long as the worker), and a child whose parent is already gone exits at once. So no
  orphan goes on writing `.cleaned` files a restarted broker's recovery removes.
- `cancel()` (the loop's thread) kills the child and the run raises `CleanCancelled`; the
  `.cleaned` files a killed clean leaves are removed here (the log's next open would too).
- Files only: the child opens the segments' files by name, as the thread did.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from typing import Any

from broker.storage.cleaner import (
    CleanedGroup,
    CleanPlan,
    CleanResult,
    CleanStats,
    SourceSegment,
    clean,
)
from broker.storage.fileio import SyncFileIO
from broker.storage.layout import CLEANED_SUFFIX
from broker.storage.offset_map import OffsetMap
from broker.storage.throttle import CleanCancelled, Throttle
from broker.storage.txn_index import AbortedTxn, MarkerEntry

NICE = 10  # the child's niceness: about a tenth of the CPU the loop gets when both want it
PR_SET_PDEATHSIG = 1


class CleanProcess:
    """One clean in a child process (module rules); `run` on a blocking thread, `cancel` from
    anywhere."""

    def __init__(self, dedupe_buffer_bytes: int, io_max_bytes_per_s: float | None) -> None:
        self.dedupe_buffer_bytes = dedupe_buffer_bytes
        self.io_max_bytes_per_s = io_max_bytes_per_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()

    def run(self, plan: CleanPlan) -> CleanResult:
        request = {
            "plan": plan_to_json(plan),
            "dedupe_buffer_bytes": self.dedupe_buffer_bytes,
            "io_max_bytes_per_s": self.io_max_bytes_per_s,
        }
        with self._lock:
            if self._cancelled:
                raise CleanCancelled("the cleaning was cancelled")
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        out, err = self._proc.communicate(json.dumps(request).encode())
        if self._cancelled:
            _remove_cleaned(plan.directory)
            raise CleanCancelled("the cleaning was cancelled")
        if self._proc.returncode != 0:
            _remove_cleaned(plan.directory)
            detail = err.decode(errors="replace").strip().splitlines()
            last = detail[-1] if detail else ""
            raise OSError(f"the clean's process exited {self._proc.returncode}: {last}")
        return result_from_json(json.loads(out))


def _remove_cleaned(directory: str) -> None:
    """The `.cleaned` files of a clean that was killed (one clean at a time per partition)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.endswith(CLEANED_SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))


def plan_to_json(plan: CleanPlan) -> dict[str, Any]:
    doc = asdict(plan)
    doc["producers_last"] = [[pid, offset] for pid, offset in plan.producers_last.items()]
    doc["markers_last"] = [[pid, offset] for pid, offset in plan.markers_last.items()]
    doc["aborted"] = [list(entry) for entry in plan.aborted]
    return doc


def plan_from_json(doc: dict[str, Any]) -> CleanPlan:
    return CleanPlan(
        directory=doc["directory"],
        segments=tuple(SourceSegment(**s) for s in doc["segments"]),
        dirty_from=doc["dirty_from"],
        upto=doc["upto"],
        now_ms=doc["now_ms"],
        delete_retention_ms=doc["delete_retention_ms"],
        segment_bytes=doc["segment_bytes"],
        producers_last={pid: offset for pid, offset in doc["producers_last"]},
        markers_last={pid: offset for pid, offset in doc["markers_last"]},
        aborted=tuple(AbortedTxn(*entry) for entry in doc["aborted"]),
    )


def result_to_json(result: CleanResult) -> dict[str, Any]:
    return asdict(result)


def result_from_json(doc: dict[str, Any]) -> CleanResult:
    groups = [
        CleanedGroup(
            g["base_offset"],
            tuple(SourceSegment(**s) for s in g["replaces"]),
            g["size"],
            g["store_path"],
            g["index_path"],
            tuple(AbortedTxn(*entry) for entry in g["aborted"]),
            None if g["markers"] is None else tuple(MarkerEntry(*m) for m in g["markers"]),
        )
        for g in doc["groups"]
    ]
    return CleanResult(groups, doc["cleaned_to"], doc["next_horizon_ms"], CleanStats(**doc["stats"]))


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the worker died before prctl took effect
        os._exit(1)


def main() -> int:
    _die_with_parent(int(sys.argv[1]))
    with contextlib.suppress(OSError):
        os.nice(NICE)
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # not the worker's CPU alone
    request = json.loads(sys.stdin.buffer.read())
    plan = plan_from_json(request["plan"])
    result = clean(
        plan, OffsetMap(request["dedupe_buffer_bytes"]), SyncFileIO(), Throttle(request["io_max_bytes_per_s"])
    )
    sys.stdout.write(json.dumps(result_to_json(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
