"""Every bound the broker puts on what clients can make it hold: one place, one flag each.

A limit is a field of `Limits` whose metadata names its `broker serve` flag and what it bounds;
the command line, the supervisor (which hands the limits to every worker as JSON) and the workers
all read this dataclass, so a new limit is one field here and its use where it is enforced.
docs/LIMITS.md lists every limit with its default and what a client sees when it is hit: keep
the two in step.

Apart from broker/core/core.py for the same reason as broker/backends/uring_options.py: the command line
names them without importing the server.

The relations between the fixed bounds below and the sizes they must fit are checked at import
(`relation_errors`), as native/constants.py checks its own: a change that breaks one fails at
start, not in production.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from broker.storage.log import LogConfig
from ringlog_proto.frames import FRAME_BYTES_MAX_DEFAULT

# Fixed bounds of a single request, not flags. A fetch answer (at most this, or one batch if the
# first is larger) must fit the frame limit of whoever reads it: clients and the links between
# cores and brokers read answers with FRAME_BYTES_MAX_DEFAULT (8 MiB), which leaves room for the
# answer's header. A long poll is bounded so a lost client frees its slot.
FETCH_MAX_BYTES_MAX = 4 * 1024 * 1024
FETCH_WAIT_MS_MAX = 60_000  # a long poll longer than a minute is a client bug, not a wish
# A TCP link to another broker's core (broker/core/remote.py) that is not connected after this long
# fails what it carries (done(exc)) and is retried after a back-off: a broker on the same network
# answers a SYN in well under a millisecond, so 3 s is a host that is gone or a network that drops
# packets (the kernel alone would retry SYNs for over two minutes).
REMOTE_CONNECT_TIMEOUT_S = 3.0

MiB = 1024 * 1024

# `--max-partitions auto` (the field's 0): derived at start from the host (`derive_partition_limit`).
MAX_PARTITIONS_AUTO = 0
# What auto allows a partition of the memory: headroom over the ~10 KB an idle partition is meant
# to cost, within a quarter of MemTotal (the rest is for the page cache, buffers in flight and
# the client connections). 24 GB -> ~390 000.
PARTITION_MEMORY_BYTES = 16 * 1024
PARTITION_MEMORY_SHARE = 4
# Auto's ceiling whatever the memory: past it per-partition passes and the registry (one JSON
# file) have not been measured here.
PARTITIONS_AUTO_MAX = 1_000_000
# Auto where the memory cannot be read (no /proc/meminfo): the fixed default it replaced.
PARTITIONS_MEMORY_UNKNOWN = 4000


def limit(default: int, flag: str, help: str) -> Any:
    """A `Limits` field: its default, its `broker serve` flag and the one line `--help` shows."""
    return field(default=default, metadata={"flag": flag, "help": help})


@dataclass(frozen=True, slots=True)
class Limits:
    """What one broker (and each of its cores) accepts before it refuses or pushes back."""

    max_request_bytes: int = limit(
        FRAME_BYTES_MAX_DEFAULT,
        "--max-request-bytes",
        "largest request frame a client may send (larger: connection closed)",
    )
    # Workers and forwarding
    forward_timeout_ms: int = limit(
        10_000,
        "--forward-timeout-ms",
        "a request forwarded to the owning core and not answered within this (plus max_wait for a "
        "long poll) is answered REQUEST_TIMED_OUT; 0: no deadline",
    )
    # Disk: broker/storage/diskspace.py
    min_free_bytes: int = limit(
        64 * MiB,
        "--min-free-bytes",
        "free bytes the data dir's file system must keep: below it writes get OUT_OF_SPACE (retriable)",
    )

    # Topics, partitions and descriptors (docs/LIMITS.md explains the defaults)
    min_segment_bytes: int = limit(
        1 * MiB, "--min-segment-bytes", "smallest segment_bytes of a topic (below: INVALID_CONFIG)"
    )
    min_segment_ms: int = limit(
        10 * 60 * 1000, "--min-segment-ms", "shortest segment_ms (time-based roll) of a topic, in ms"
    )
    max_partitions: int = limit(
        MAX_PARTITIONS_AUTO,
        "--max-partitions",
        "partitions of all topics of the broker (more: LIMIT_EXCEEDED); auto: a quarter of the "
        "memory at 16 KiB a partition, at most 1 000 000; they hold no descriptor of their own "
        "(--segment-fd-cache bounds them)",
    )
    max_partitions_per_topic: int = limit(
        1000, "--max-partitions-per-topic", "partitions of one topic (more: LIMIT_EXCEEDED)"
    )
    segment_fd_cache: int = limit(
        0,
        "--segment-fd-cache",
        "descriptors of segment files each core keeps open (LRU; every partition's, the active "
        "segment's too while idle); 0: half of what the open-file limit leaves",
    )

    # Requests, connections and memory (broker/backends/admission.py enforces them).
    connection_memory_bytes: int = limit(
        32 * MiB,
        "--connection-memory-bytes",
        "bytes in flight per connection (requests read and unanswered, a fetch counted by its max_bytes, "
        "plus replies unsent) before that connection is no longer read",
    )
    core_memory_bytes: int = limit(
        256 * MiB,
        "--core-memory-bytes",
        "bytes in flight over all client connections of one core before none of them is read",
    )
    connection_idle_ms: int = limit(
        600_000, "--connection-idle-ms", "close a client connection with no traffic for this long (0: never)"
    )
    frame_timeout_ms: int = limit(
        30_000,
        "--frame-timeout-ms",
        "close a client connection that started a frame and did not finish it within this time (0: never)",
    )
    max_connections_per_core: int = limit(
        10_000,
        "--max-connections-per-core",
        "client connections per core; beyond it a new one is closed at once (0: what the open-file "
        "limit leaves; a value above that is lowered to it at start)",
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{f.metadata['flag']} must be a non-negative integer, not {value!r}")

    def to_spec(self) -> dict[str, int]:
        """The JSON-able form the supervisor passes to its workers."""
        return asdict(self)

    @classmethod
    def from_spec(cls, spec: dict[str, int] | None) -> Limits:
        return cls(**(spec or {}))


def relation_errors(
    fetch_max_bytes_max: int = FETCH_MAX_BYTES_MAX,
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
    batch_bytes_default: int = LogConfig().max_batch_bytes,
) -> list[str]:
    """What is wrong between these bounds (the module's own by default), one line each, naming both
    values: checked at import; tests pass other values."""
    errors = []
    if not 0 < fetch_max_bytes_max < frame_bytes_max:
        errors.append(
            f"FETCH_MAX_BYTES_MAX ({fetch_max_bytes_max}) must be below FRAME_BYTES_MAX_DEFAULT "
            f"({frame_bytes_max}): a fetch answer must fit the frame limit its reader has"
        )
    if not 0 < batch_bytes_default < frame_bytes_max:
        errors.append(
            f"LogConfig's default max_batch_bytes ({batch_bytes_default}) must be below "
            f"FRAME_BYTES_MAX_DEFAULT ({frame_bytes_max}): a produce of the largest batch and a fetch "
            "of it must each fit a frame"
        )
    return errors


if _errors := relation_errors():  # a plain `if`, not an assert: it holds under -O too
    raise AssertionError("broker/core/limits.py: " + "; ".join(_errors))


# Descriptors a worker holds whatever its limits: listeners, the ring, pipes, logs, the registry
# lock, directory syncs, peer links, the splice pipes of io_uring fetches.
FIXED_FDS_PER_WORKER = 64
# Descriptors left free beyond every limit: a connection is accepted before the cap can refuse it
# (and closed at once), appends, flushes and reads in flight pin their segments' descriptors
# past the cache's bound, the recovery at restart opens a segment at a time.
FD_RESERVE_MIN = 64
# The descriptor cache when the open-file limit is unlimited (nothing to fit it to).
SEGMENT_FD_CACHE_UNLIMITED = 1 << 16


def fit_to_descriptors(limits: Limits, nofile: int) -> tuple[Limits, list[str]]:
    """`limits` with every descriptor-consuming one lowered to what one worker can hold under an
    open-file limit of `nofile` (RLIMIT_NOFILE, after the supervisor raised it to the hard
    limit), and one line per limit lowered, for the log (`--max-partitions auto` is derived
    first: `derive_partition_limit`).

    Partitions cost no descriptor of their own: every segment's files, the active segment's
    too, are the descriptor cache's while no operation is in flight on them
    (broker/storage/fdcache.py), so the cache bounds them however many partitions a core has.
    A worker needs at most `segment_fd_cache` for segments and one per client connection,
    besides FIXED_FDS_PER_WORKER, and keeps a reserve (a thirty-second of the limit, at least
    FD_RESERVE_MIN) for accepts, operations in flight and restarts. Of what is left, the cache
    gets at most a half (all of it, 0, asks for that half), connections the rest: a client
    that creates and uses every partition it may still leaves room for others' connections and
    for a restart at the same limit (at 1024, 3000 partitions once bricked the broker)."""
    reserve = max(FD_RESERVE_MIN, nofile // 32)
    room = nofile - FIXED_FDS_PER_WORKER - reserve
    if room < 64:
        raise ValueError(
            f"the open-file limit (RLIMIT_NOFILE) is {nofile}: a broker needs at least "
            f"{FIXED_FDS_PER_WORKER + reserve + 64} descriptors; raise it (ulimit -n, LimitNOFILE=)"
        )
    half = max(8, room // 2)
    cache = min(limits.segment_fd_cache, half) if limits.segment_fd_cache else half
    connections = room - cache
    if limits.max_connections_per_core:
        connections = min(limits.max_connections_per_core, connections)
    fitted = replace(
        limits,
        segment_fd_cache=cache,
        max_connections_per_core=connections,
    )
    lowered = [
        f"{f.metadata['flag']} {getattr(limits, f.name) or 'unlimited'} lowered to {getattr(fitted, f.name)}"
        for f in fields(Limits)
        if getattr(fitted, f.name) != getattr(limits, f.name)
        and not (f.name == "segment_fd_cache" and not limits.segment_fd_cache)  # 0 asked for it
    ]
    return fitted, lowered


def memory_total_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemTotal of `meminfo` in bytes, or None when it cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    value, unit = line.split()[1:3]
                    return int(value) * (1024 if unit.lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def derive_partition_limit(limits: Limits, meminfo: str = "/proc/meminfo") -> tuple[Limits, str]:
    """`limits` with `--max-partitions auto` made a number, and what bound it, for the log: a
    quarter of MemTotal at `PARTITION_MEMORY_BYTES` a partition, at most `PARTITIONS_AUTO_MAX`.
    An explicit number is kept. The open-file limit may lower either afterwards
    (`fit_to_descriptors`)."""
    if limits.max_partitions != MAX_PARTITIONS_AUTO:
        return limits, f"--max-partitions {limits.max_partitions}"
    total = memory_total_bytes(meminfo)
    if total is None:
        return replace(limits, max_partitions=PARTITIONS_MEMORY_UNKNOWN), (
            f"--max-partitions auto: {meminfo} unreadable, the fixed {PARTITIONS_MEMORY_UNKNOWN}"
        )
    by_memory = max(1, total // PARTITION_MEMORY_SHARE // PARTITION_MEMORY_BYTES)
    if by_memory >= PARTITIONS_AUTO_MAX:
        return replace(limits, max_partitions=PARTITIONS_AUTO_MAX), (
            f"--max-partitions auto: the {PARTITIONS_AUTO_MAX} ceiling (memory would allow {by_memory})"
        )
    return replace(limits, max_partitions=by_memory), (
        f"--max-partitions auto: memory, a quarter of MemTotal {total // MiB} MiB at "
        f"{PARTITION_MEMORY_BYTES // 1024} KiB a partition"
    )


def partition_limit(limits: Limits) -> int:
    """The partition limit `limits` set: `--max-partitions auto` not yet derived (a core made
    without the supervisor: tests, tools) is derived here, from this host's memory."""
    if limits.max_partitions != MAX_PARTITIONS_AUTO:
        return limits.max_partitions
    return derive_partition_limit(limits)[0].max_partitions


def _partitions_arg(text: str) -> int:
    if text == "auto":
        return MAX_PARTITIONS_AUTO
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("a positive number of partitions, or auto")
    return value


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--flag N` per limit, defaulting to the field's default (`--max-partitions` takes
    auto too, its default)."""
    group = parser.add_argument_group("limits (docs/LIMITS.md)")
    for f in fields(Limits):
        assert f.default is not MISSING
        auto = f.name == "max_partitions"
        group.add_argument(
            f.metadata["flag"],
            dest=f"limit_{f.name}",
            type=_partitions_arg if auto else int,
            default=f.default,
            metavar="N|auto" if auto else "N",
            help=f"{f.metadata['help']} (default {'auto' if auto else f.default})",
        )


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The `Limits` a parsed `broker serve` command line asks for (ValueError names a bad flag)."""
    return Limits(**{f.name: getattr(args, f"limit_{f.name}") for f in fields(Limits)})
