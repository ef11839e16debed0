"""Per-core metrics: counters a backend bumps per request, snapshots written once a second.

Rules this module keeps:
- Cheap on the hot path: a request costs two method calls that add to ints in lists and slots
  (no dicts keyed by strings, no locks, no clock beyond the `time.monotonic_ns()` the backend
  already takes). Everything costly (percentiles, JSON, files) happens in `snapshot()` and
  `publish()`, about once a second.
- One `CoreMetrics` per worker process, owned by its event loop's thread. Cores never share one:
  each publishes `<data_dir>/run/metrics-core-<k>.json` (atomic replace, no fsync: it is a view,
  not data), and readers (the STATS API, `broker stats`, the supervisor's Prometheus endpoint)
  merge the files.
- Gauges (queue depths) are not counted here: the backend knows them, so `snapshot` takes
  callables and reads them only when a snapshot is taken.

The backend contract (uvloop in broker/backends/aio.py, io_uring in broker/backends/uring.py):
    started_ns = metrics.request(api_key, nbytes_in)   # a frame arrived
    started_ns = metrics.kafka_request(api_key, nbytes_in)  # a Kafka request arrived
    metrics.reply(nbytes_out, started_ns)              # its answer was queued (not for acks=0)
    metrics.forwarded()                                # sent to the owning core instead
    metrics.forwarded_in()                             # a request that came from another core
    metrics.asked()                                    # a question to another core
    metrics.error()                                    # done by the adapters for every error answer
    publish(data_dir, metrics.snapshot(gauges))        # ~1/s and at shutdown
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Required, TypedDict

from broker.core.heap import collector_pauses
from broker.storage import layout
from ringlog_proto.messages import ApiKey

log = logging.getLogger(__name__)

LATENCY_BUCKETS = 32  # bucket i holds latencies of bit_length(i) microseconds: up to ~35 min
API_SLOTS = 32  # api keys counted by index; larger keys (unknown apis) land in the last slot
KAFKA_API_SLOTS = 128  # Kafka's api keys, counted apart (named kafka_<key>); larger ones in the last
PUBLISH_SKIP_LOG_S = 60.0  # at most one warning this often about snapshots a full disk refused
GAUGES = ("inflight_requests", "pending_forwards", "parked_long_polls", "commit_waiters")


class Snapshot(TypedDict, total=False):
    """A core's metrics as `CoreMetrics.snapshot` takes them and its published file holds them
    (JSON). Readers take every field but the core as optional, defaulting to none counted."""

    core: Required[int]
    pid: int
    backend: str
    time: float
    started_at: float
    requests: dict[str, int]  # by api name (ours) or kafka_<key>, those asked at least once
    requests_total: int
    bytes_in: int
    bytes_out: int
    replies: int
    errors: int
    auth_failures: int
    auth_denied: int
    forwarded: int
    forwarded_in: int
    flushes: int
    flush_waiters: int
    flush_syncs_inline: int
    busy_poll_pauses: int
    flush_syncfs: int
    reads_mapped: int
    reads_file: int
    long_poll_wakes: int
    long_poll_rewaits: int
    replica_fetch_wakes: int
    replica_fetch_rewaits: int
    gauges: dict[str, int]  # by name (GAUGES)
    latency_us_log2: list[int]  # LATENCY_BUCKETS counts
    replica_fetch_us_log2: list[int]  # LATENCY_BUCKETS counts: a follower's ReplicaFetch, sent -> answered
    replica_append_us_log2: list[int]  # a follower's answer received -> its next fetch sent
    replica_append_us_total: int
    replica_ack_us_log2: list[int]  # a leader's acks=all produce, written -> the HW passes it
    replica_ack_us_total: int
    # the worker process's cyclic collector (broker/core/heap.py): collections by generation,
    # their time in all and the longest one
    gc_collections: list[int]
    gc_pause_us_total: int
    gc_pause_us_max: int


class CoreMetrics:
    """Counters of one core. Owned by that core's event-loop thread."""

    __slots__ = (
        "auth_denied",
        "auth_failures",
        "backend",
        "busy_poll_pauses",
        "bytes_in",
        "bytes_out",
        "core",
        "errors",
        "flush_syncfs",
        "flush_syncs_inline",
        "flush_waiters",
        "flushes",
        "forwarded_in_count",
        "forwarded_out",
        "kafka_requests_by_api",
        "latency_us",
        "long_poll_rewaits",
        "long_poll_wakes",
        "reads_file",
        "reads_mapped",
        "replica_ack_us",
        "replica_ack_us_total",
        "replica_append_us",
        "replica_append_us_total",
        "replica_fetch_rewaits",
        "replica_fetch_us",
        "replica_fetch_wakes",
        "replies",
        "requests_by_api",
        "started_at",
    )

    def __init__(self, core: int, backend: str = "") -> None:
        self.core = core
        self.backend = backend
        self.requests_by_api = [0] * API_SLOTS
        self.kafka_requests_by_api = [0] * KAFKA_API_SLOTS
        self.bytes_in = 0
        self.bytes_out = 0
        self.replies = 0
        self.errors = 0
        self.auth_failures = 0  # failed SASL exchanges (broker/security/sasl.py)
        self.auth_denied = 0  # requests the ACLs refused (broker/security/acls.py)
        self.forwarded_out = 0
        self.forwarded_in_count = 0
        self.latency_us = [0] * LATENCY_BUCKETS
        self.flushes = 0
        self.flush_waiters = 0
        self.flush_syncs_inline = 0  # io_uring: flushes whose fdatasync ran on the loop itself
        self.busy_poll_pauses = 0  # io_uring: the busy poll paused, its CPU shared with a CPU-bound task
        self.flush_syncfs = 0  # of `flushes`, those made durable by a syncfs of a group commit
        self.reads_mapped = 0  # fetch reads served from the page cache's pages (io_uring)
        self.reads_file = 0  # fetch reads that read the file (a ring read, or a pread)
        self.long_poll_wakes = 0  # parked consumer fetches woken (re-handled)
        self.long_poll_rewaits = 0  # of those, the ones that found too little and waited again
        self.replica_fetch_wakes = 0  # the same for followers' fetches (`Wait.log_end`)
        self.replica_fetch_rewaits = 0
        # a follower's ReplicaFetch from sent to answered (its long poll included): the round
        # trip every acks=all produce waits for at least once
        self.replica_fetch_us = [0] * LATENCY_BUCKETS
        # The two halves of the round trip an acks=all produce waits for: on the follower, from
        # an answer received to the next fetch sent (its append between them: that fetch carries
        # the new log end); on the leader, from a produce written to the HW passing it (the
        # follower's half, both trips across the link and the leader's wake and answer). Their
        # totals give means, which the log2 buckets are too coarse to.
        self.replica_append_us = [0] * LATENCY_BUCKETS
        self.replica_append_us_total = 0
        self.replica_ack_us = [0] * LATENCY_BUCKETS
        self.replica_ack_us_total = 0
        self.started_at = time.time()

    # ------------------------------------------------------------------------- hot path

    def request(self, api_key: int, nbytes: int) -> int:
        """A request frame of `nbytes` arrived; returns the monotonic ns to pass to `reply`."""
        self.requests_by_api[api_key if api_key < API_SLOTS else API_SLOTS - 1] += 1
        self.bytes_in += nbytes
        return time.monotonic_ns()

    def kafka_request(self, api_key: int, nbytes: int) -> int:
        """A Kafka request of `nbytes` arrived (its api keys are not ours); as `request`."""
        self.kafka_requests_by_api[min(api_key, KAFKA_API_SLOTS - 1)] += 1
        self.bytes_in += nbytes
        return time.monotonic_ns()

    def reply(self, nbytes: int, started_ns: int, replied_ns: int | None = None) -> None:
        """The answer to a request that arrived at `started_ns` was queued for sending at
        `replied_ns` (now when None)."""
        self.bytes_out += nbytes
        self.replies += 1
        us = ((time.monotonic_ns() if replied_ns is None else replied_ns) - started_ns) // 1000
        self.latency_us[min(us.bit_length(), LATENCY_BUCKETS - 1)] += 1

    def forwarded(self) -> None:
        """A request was sent to its owning core over the inter-core channel."""
        self.forwarded_out += 1

    def forwarded_in(self) -> None:
        """A request arrived from another core (on the inter-core listener)."""
        self.forwarded_in_count += 1

    def error(self) -> None:
        self.errors += 1

    def auth_failure(self) -> None:
        self.auth_failures += 1

    def denied(self) -> None:
        self.auth_denied += 1

    def flushed(self, waiters: int) -> None:
        """One group-commit flush of a partition ran for `waiters` durable produces: their ratio
        says how well group commit batches."""
        self.flushes += 1
        self.flush_waiters += waiters

    def flushed_together(self, flushes: int) -> None:
        """A group commit started `flushes` partitions' flushes with one syncfs per file system
        instead of their own syncs (broker/storage/fileio.py's `SYNCFS_MIN`)."""
        self.flush_syncfs += flushes

    def synced_inline(self) -> None:
        """A flush's fdatasync ran on the io_uring loop itself (`--flush-syncs`), not on the ring:
        against `flushes`, how often the core was idle enough to hold it."""
        self.flush_syncs_inline += 1

    def poll_paused(self) -> None:
        """The io_uring loop's busy poll paused (broker/backends/uring_loop.py `YIELD_LOST_S`): a
        CPU-bound task shares the worker's CPU, and the poll would only hand it slices."""
        self.busy_poll_pauses += 1

    def read(self, mapped: bool) -> None:
        """A fetch's read of a segment: from the page cache's pages as they are (`mapped`), or
        by reading the file (its pages were not all in memory, or the backend always reads)."""
        if mapped:
            self.reads_mapped += 1
        else:
            self.reads_file += 1

    def woken(self, replica: bool, rewait: bool) -> None:
        """A parked fetch (a follower's: `replica`) was woken and re-handled; `rewait`: it found
        too little and waits again (a wake for nothing: the whole request handled in vain)."""
        if replica:
            self.replica_fetch_wakes += 1
            self.replica_fetch_rewaits += rewait
        else:
            self.long_poll_wakes += 1
            self.long_poll_rewaits += rewait

    def replica_fetched(self, sent_ns: int) -> None:
        """This core's ReplicaFetch sent at `sent_ns` (monotonic) was answered now."""
        us = (time.monotonic_ns() - sent_ns) // 1000
        self.replica_fetch_us[min(us.bit_length(), LATENCY_BUCKETS - 1)] += 1

    def replica_appended(self, received_ns: int) -> None:
        """This core's ReplicaFetch answered at `received_ns` (monotonic) was applied and the
        next fetch is being sent now."""
        us = (time.monotonic_ns() - received_ns) // 1000
        self.replica_append_us[min(us.bit_length(), LATENCY_BUCKETS - 1)] += 1
        self.replica_append_us_total += us

    def replica_acked(self, written_ns: int) -> None:
        """An acks=all produce written at `written_ns` (monotonic) is replicated now."""
        us = (time.monotonic_ns() - written_ns) // 1000
        self.replica_ack_us[min(us.bit_length(), LATENCY_BUCKETS - 1)] += 1
        self.replica_ack_us_total += us

    # ------------------------------------------------------------------------- snapshots

    def snapshot(self, gauges: Mapping[str, Callable[[], int]] | None = None) -> Snapshot:
        """Everything as a JSON-able dict; `gauges` are read now."""
        requests = {_api_name(k): n for k, n in enumerate(self.requests_by_api) if n}
        requests.update((f"kafka_{k}", n) for k, n in enumerate(self.kafka_requests_by_api) if n)
        gc = collector_pauses()
        return {
            "core": self.core,
            "pid": os.getpid(),
            "backend": self.backend,
            "time": time.time(),
            "started_at": self.started_at,
            "requests": requests,
            "requests_total": sum(self.requests_by_api) + sum(self.kafka_requests_by_api),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "replies": self.replies,
            "errors": self.errors,
            "auth_failures": self.auth_failures,
            "auth_denied": self.auth_denied,
            "forwarded": self.forwarded_out,
            "forwarded_in": self.forwarded_in_count,
            "flushes": self.flushes,
            "flush_waiters": self.flush_waiters,
            "flush_syncs_inline": self.flush_syncs_inline,
            "busy_poll_pauses": self.busy_poll_pauses,
            "flush_syncfs": self.flush_syncfs,
            "reads_mapped": self.reads_mapped,
            "reads_file": self.reads_file,
            "long_poll_wakes": self.long_poll_wakes,
            "long_poll_rewaits": self.long_poll_rewaits,
            "replica_fetch_wakes": self.replica_fetch_wakes,
            "replica_fetch_rewaits": self.replica_fetch_rewaits,
            "gauges": {name: int(read()) for name, read in (gauges or {}).items()},
            "latency_us_log2": list(self.latency_us),
            "replica_fetch_us_log2": list(self.replica_fetch_us),
            "replica_append_us_log2": list(self.replica_append_us),
            "replica_append_us_total": self.replica_append_us_total,
            "replica_ack_us_log2": list(self.replica_ack_us),
            "replica_ack_us_total": self.replica_ack_us_total,
            "gc_collections": list(gc.collections),
            "gc_pause_us_total": gc.total_us,
            "gc_pause_us_max": gc.longest_us,
        }


def _api_name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return f"api_{key}" if key < API_SLOTS - 1 else "other"


# ----------------------------------------------------------------------------- files


def snapshot_path(data_dir: str, core: int) -> str:
    return layout.metrics_snapshot_path(data_dir, core)


def publish(data_dir: str, snap: Snapshot) -> None:
    """Replace this core's snapshot file atomically (readers see the old or the new one).

    On a full disk the snapshot is skipped (the previous one stays), with one warning per
    `PUBLISH_SKIP_LOG_S` saying how many were skipped: a broker on a full disk keeps serving
    and must not log a line per second per core about it. Other errors raise."""
    path = snapshot_path(data_dir, snap["core"])
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(snap, f)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a full disk must not collect half-written snapshots
            os.unlink(tmp)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _skipped_publish(exc)


_skips = {"count": 0, "logged_at": float("-inf")}


def _skipped_publish(exc: OSError) -> None:
    _skips["count"] += 1
    now = time.monotonic()
    if now - _skips["logged_at"] >= PUBLISH_SKIP_LOG_S:
        log.warning(
            "metrics snapshot not published: %s (%d skipped; the last one published stays)",
            exc.strerror or exc,
            _skips["count"],
        )
        _skips["logged_at"] = now
        _skips["count"] = 0


def read_snapshots(data_dir: str, cores: int) -> list[Snapshot]:
    """The published snapshot of each core 0..cores-1 that has one (unreadable files skipped)."""
    out = []
    for core in range(cores):
        try:
            with open(snapshot_path(data_dir, core), encoding="utf-8") as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


# ----------------------------------------------------------------------------- derived figures


def percentile_us(buckets: Iterable[int], q: float) -> int:
    """The upper bound (in µs) of the log2 bucket holding quantile `q` (0 when empty).

    Bucket i holds latencies whose bit length is i, i.e. [2**(i-1), 2**i) µs; its upper bound
    2**i - 1 overstates by at most 2x, which is what a log2 histogram can say.
    """
    counts = list(buckets)
    total = sum(counts)
    if total == 0:
        return 0
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n:
            return (1 << i) - 1 if i else 0
    return (1 << (len(counts) - 1)) - 1


def prometheus_text(snapshots: Iterable[Snapshot]) -> str:
    """The Prometheus text exposition of per-core snapshots, every series labelled by core."""
    lines: list[str] = []
    snaps = list(snapshots)

    def family(name: str, kind: str, help_: str, rows: Iterable[tuple[str, object]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {value}" for labels, value in rows)

    def per_core(key: str) -> list[tuple[str, object]]:
        return [(f'core="{s["core"]}"', s.get(key, 0)) for s in snaps]

    family(
        "ringlog_requests_total",
        "counter",
        "Requests received, by api.",
        [
            (f'core="{s["core"]}",api="{api}"', n)
            for s in snaps
            for api, n in sorted(s.get("requests", {}).items())
        ],
    )
    family("ringlog_bytes_in_total", "counter", "Request bytes received.", per_core("bytes_in"))
    family("ringlog_bytes_out_total", "counter", "Response bytes sent.", per_core("bytes_out"))
    family("ringlog_errors_total", "counter", "Error responses.", per_core("errors"))
    family(
        "ringlog_authentication_failures_total",
        "counter",
        "Failed SASL authentications.",
        per_core("auth_failures"),
    )
    family(
        "ringlog_authorization_denied_total",
        "counter",
        "Requests refused by the ACLs.",
        per_core("auth_denied"),
    )
    family(
        "ringlog_forwarded_total",
        "counter",
        "Requests forwarded to their owning core.",
        per_core("forwarded"),
    )
    family(
        "ringlog_forwarded_in_total",
        "counter",
        "Requests served for another core.",
        per_core("forwarded_in"),
    )
    family("ringlog_flushes_total", "counter", "Group-commit flushes of a partition.", per_core("flushes"))
    family(
        "ringlog_flush_waiters_total",
        "counter",
        "Durable produces answered by those flushes.",
        per_core("flush_waiters"),
    )
    family(
        "ringlog_flush_syncs_inline_total",
        "counter",
        "Flushes whose fdatasync the io_uring loop ran itself (--flush-syncs).",
        per_core("flush_syncs_inline"),
    )
    family(
        "ringlog_busy_poll_pauses_total",
        "counter",
        "Times the io_uring busy poll paused (0.1-5 s): a CPU-bound task shares the worker's CPU.",
        per_core("busy_poll_pauses"),
    )
    family(
        "ringlog_flush_syncfs_total",
        "counter",
        "Flushes started together, made durable by one syncfs per file system.",
        per_core("flush_syncfs"),
    )
    family(
        "ringlog_reads_mapped_total",
        "counter",
        "Fetch reads served from the page cache's pages, with no copy or wait (io_uring).",
        per_core("reads_mapped"),
    )
    family(
        "ringlog_reads_file_total",
        "counter",
        "Fetch reads that read the segment file (pages not all in memory, or the uvloop backend).",
        per_core("reads_file"),
    )
    for key, help_ in (
        ("long_poll_wakes", "Parked consumer fetches woken and handled again."),
        ("long_poll_rewaits", "Of those, the ones that found too little and waited again."),
        ("replica_fetch_wakes", "Parked follower fetches woken and handled again."),
        ("replica_fetch_rewaits", "Of those, the ones that found nothing new and waited again."),
    ):
        family(f"ringlog_{key}_total", "counter", help_, per_core(key))
    family(
        "ringlog_gc_collections_total",
        "counter",
        "Collections of the worker's cyclic garbage collector, by generation (2: full).",
        [
            (f'core="{s["core"]}",generation="{g}"', n)
            for s in snaps
            for g, n in enumerate(s.get("gc_collections", []))
        ],
    )
    family(
        "ringlog_gc_pause_us_total",
        "counter",
        "Microseconds the worker's cyclic garbage collector held its loop.",
        per_core("gc_pause_us_total"),
    )
    family(
        "ringlog_gc_pause_us_max",
        "gauge",
        "The longest collection of the worker's cyclic garbage collector since it started, us.",
        per_core("gc_pause_us_max"),
    )
    for gauge in GAUGES:
        family(
            f"ringlog_{gauge}",
            "gauge",
            f"Current {gauge.replace('_', ' ')}.",
            [(f'core="{s["core"]}"', s.get("gauges", {}).get(gauge, 0)) for s in snaps],
        )
    rows: list[tuple[str, object]] = []
    for s in snaps:
        buckets = s.get("latency_us_log2", [])
        seen = 0
        for i, n in enumerate(buckets):
            seen += n
            rows.append((f'core="{s["core"]}",le="{(1 << i) - 1 if i else 0}"', seen))
        rows.append((f'core="{s["core"]}",le="+Inf"', seen))
    lines.append("# HELP ringlog_request_latency_us Request latency in microseconds (log2 buckets).")
    lines.append("# TYPE ringlog_request_latency_us histogram")
    lines.extend(f"ringlog_request_latency_us_bucket{{{labels}}} {value}" for labels, value in rows)
    lines.extend(
        f'ringlog_request_latency_us_count{{core="{s["core"]}"}} {sum(s.get("latency_us_log2", []))}'
        for s in snaps
    )
    return "\n".join(lines) + "\n"
