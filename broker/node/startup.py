"""What the supervisor checks and takes before any worker starts: the open-file limit and the data dir.

Rules this module keeps:
- One broker per data directory: the supervisor holds an exclusive flock on `<data_dir>/broker.lock`
  and every worker inherits that same open file, so the lock is free only once the supervisor and
  all its workers have exited, io_uring writes still in flight in a dying worker included (the
  kernel completes or cancels a task's ring requests before it closes its files). A broker started
  right after a kill -9 waits up to `DATA_DIR_LOCK_WAIT_S` for that, instead of opening partitions
  that a dying worker may still write to; a second broker on a data dir in use is a clear error.
- A broker starts on a full disk: nothing here writes file data (`prepare_data_dir`).
- Whatever stops the start is a `StartError` whose message says why, printed as one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import resource
import time
from dataclasses import fields

from broker.core.groups import migrate_partition_offsets
from broker.core.limits import (
    FIXED_FDS_PER_WORKER,
    Limits,
    derive_partition_limit,
    fit_to_descriptors,
)
from broker.core.topics import TopicRegistry
from broker.storage import clean_marker, layout
from broker.storage.dataformat import check_data_format
from broker.storage.diskspace import NO_SPACE_ERRNOS, RESERVE_BYTES, ensure_reserve
from broker.storage.errors import LegacyFormatError
from broker.storage.log import LogConfig

log = logging.getLogger("broker.node.supervisor")  # the supervisor's lines, wherever they are written

DATA_DIR_LOCK_WAIT_S = 5.0  # a killed broker's workers release it well within this (PDEATHSIG, ring drain)


class StartError(Exception):
    """The broker cannot start; the message says why (printed as one line, exit status 1)."""


def unusable_data_dir(data_dir: str, exc: OSError) -> StartError:
    """Why the broker cannot start on `data_dir`. A full disk is said plainly: an existing data
    dir starts on one (nothing it needs is written), but a new one (missing, or empty: a mount
    point) needs blocks for its directories, and no broker can serve without them (as
    Kafka, which cannot write its meta.properties, the start fails: exit status 1)."""
    path = os.path.abspath(data_dir)
    if exc.errno in NO_SPACE_ERRNOS:
        return StartError(
            f"data dir {path} cannot be set up: the disk is full ({exc.strerror}); a new data dir "
            "needs a few KiB free for its directories (an existing one starts on a full disk): "
            "free some space and start again"
        )
    return StartError(f"data dir {path} is unusable: {exc}")


def lock_data_dir(d: str) -> int:
    """Take the data dir's lock (module rules), waiting for a killed broker's workers to go; the
    locked descriptor, which the workers inherit."""
    path = layout.broker_lock_path(d)
    try:
        os.makedirs(d, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise unusable_data_dir(d, exc) from exc
    deadline = time.monotonic() + DATA_DIR_LOCK_WAIT_S
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise StartError(
                    f"data dir {os.path.abspath(d)} is in use by another broker (pid {holder}); "
                    f"waited {DATA_DIR_LOCK_WAIT_S:.0f}s for it to exit"
                ) from None
            if not said:
                log.info("waiting for the previous broker's processes to leave %s", os.path.abspath(d))
                said = True
            time.sleep(0.05)
    # The holder's pid, for the "in use" message only. Written over the old one in place
    # (blocks already allocated) and then cut, so that it needs no free space; a full disk
    # that refuses it anyway costs only that message's pid.
    pid = f"{os.getpid()}\n".encode()
    try:
        os.pwrite(fd, pid, 0)
        os.ftruncate(fd, len(pid))
    except OSError as exc:
        log.warning("cannot write the pid into %s: %s", path, exc)
    return fd


def check_partitions_fit(data_dir: str, log_defaults: LogConfig, limits: Limits) -> None:
    """Say so when the data dir holds more partitions than `--max-partitions` now allows (made
    under a higher one): they are all served, but no new one can be made until some are deleted."""
    try:
        registry = TopicRegistry(data_dir, log_defaults, remove_orphans=False, limits=limits)
    except (OSError, ValueError):
        return  # the workers say what is wrong with it
    held = registry.partition_count()
    if held > limits.max_partitions:
        log.error(
            "the data dir holds %d partitions, more than --max-partitions %d (docs/LIMITS.md): "
            "they are served, but CreateTopic is refused until some are deleted or the limit raised",
            held,
            limits.max_partitions,
        )


def prepare_data_dir(data_dir: str, log_defaults: LogConfig, limits: Limits) -> int:
    """Lock and check the data dir. Needs no free space: a broker must start on a full disk
    (it serves reads and deletes and refuses writes until space is back: broker/storage/diskspace.py),
    so nothing here writes file data, and a directory that is missing and cannot be made
    (the only writes) fails the start only because the broker cannot work without it. Returns
    the data dir's lock (`lock_data_dir`)."""
    d = data_dir
    lock_fd = lock_data_dir(d)
    try:
        os.makedirs(layout.topics_dir(d), exist_ok=True)
        run = layout.run_dir(d)
        os.makedirs(run, exist_ok=True)
        for name in os.listdir(run):  # snapshots of an earlier run (or core count)
            if clean_marker.is_marker(name):
                continue  # for the cores to take (broker/storage/clean_marker.py)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(run, name))
        if not os.access(d, os.R_OK | os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable (permissions, or a read-only file system)")
    except OSError as exc:
        raise unusable_data_dir(d, exc) from exc
    try:
        check_data_format(d)  # before any worker opens (and would try to recover) a segment
    except LegacyFormatError as exc:
        raise StartError(f"data dir {os.path.abspath(d)}: {exc}") from exc
    try:  # the old per-partition group offsets, into the coordinators' per-group store
        migrate_partition_offsets(d)
    except (OSError, ValueError) as exc:  # a full disk: the old files stay, tried again next start
        log.error("cannot move group offsets into %s yet: %s", layout.groups_dir(d), exc)
    check_partitions_fit(d, log_defaults, limits)
    if not ensure_reserve(d):
        log.warning(
            "no room for the %d-byte reserve file in %s: a DeleteTopic on a disk filled to "
            "the last byte may fail until space is freed",
            RESERVE_BYTES,
            os.path.abspath(d),
        )
    return lock_fd


def raise_nofile_limit(limits: Limits) -> Limits:
    """Raise RLIMIT_NOFILE's soft limit to its hard limit, as Kafka's and Redpanda's packaging do
    (the default soft limit, often 1024, is far below what a broker holds); workers inherit it.
    Then size every limit that costs descriptors to what one worker can hold under it
    (`fit_to_descriptors`: the descriptor cache, which holds every partition's segment files, and
    its client connections, with a reserve), so that no client can exhaust them; `--max-partitions
    auto` is derived before (`derive_partition_limit`: the host's memory; partitions cost no
    descriptor of their own). Logs both and what bound the partition limit, warns for each limit
    lowered; returns the limits to serve with. ValueError: a limit too low to run."""
    limits, bound = derive_partition_limit(limits)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    was = soft
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    fitted, lowered = (limits, []) if soft == resource.RLIM_INFINITY else fit_to_descriptors(limits, soft)
    log.info(
        "open-file limit (RLIMIT_NOFILE) %s%s; the segment fd cache (%d) and connections need up to %d",
        "unlimited" if soft == resource.RLIM_INFINITY else str(soft),
        f" (raised from {was})" if was != soft else "",
        fitted.segment_fd_cache,
        fitted.segment_fd_cache + fitted.max_connections_per_core + FIXED_FDS_PER_WORKER,
    )
    log.info("partition limit %d (%s)", fitted.max_partitions, bound)
    defaults = {f.metadata["flag"]: getattr(Limits(), f.name) for f in fields(Limits)}
    asked = {f.metadata["flag"]: getattr(limits, f.name) for f in fields(Limits)}
    for line in lowered:
        flag = line.split(" ", 1)[0]
        # A default lowered is the sizing working as meant (this machine's 20 000 gives 9656
        # connections a core, not 10 000): said, not warned; a flag the operator set is warned.
        level = logging.INFO if asked.get(flag) == defaults.get(flag) else logging.WARNING
        log.log(
            level,
            "%s to fit the open-file limit %d (raise the hard limit: ulimit -Hn, LimitNOFILE=)",
            line,
            soft,
        )
    return fitted
