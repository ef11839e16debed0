"""What the benchmarks share: table printing and the facts every run prints about itself.

Imported by the scripts of bench/, which run as scripts from the repository root
(`python bench/x.py` puts bench/ on sys.path): see bench/README.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

KIB = 1024
MIB = 1024 * KIB
REPO = Path(__file__).resolve().parent.parent


def size_label(n: int) -> str:
    if n >= MIB and n % MIB == 0:
        return f"{n // MIB} MiB"
    if n >= KIB and n % KIB == 0:
        return f"{n // KIB} KiB"
    return f"{n} B"


def table(header: list[str], rows: list[list[str]], labels: int = 2) -> None:
    """Print rows under a header; the first `labels` columns left-aligned, numbers right-aligned."""
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]
    fmt = [(str.ljust if i < labels else str.rjust) for i in range(len(header))]
    print("  " + "  ".join(fmt[i](h, widths[i]) for i, h in enumerate(header)))
    print("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        print("  " + "  ".join(fmt[i](c, widths[i]) for i, c in enumerate(r)))


def code_version() -> str:
    """The commit measured, and whether the broker's or client's files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "broker", "ringlog_proto"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes in broker/ or ringlog_proto/" if dirty else "")


def fs_of(path: str) -> str:
    """'type (device on mount point)' of the file system holding `path`, from /proc/self/mounts."""
    real = os.path.realpath(path)
    best = ("", "unknown", "?")
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    return f"{best[1]} ({best[2]} on {best[0] or '?'})"


CLK_TCK = os.sysconf("SC_CLK_TCK")


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def proc_cpu(pid: int) -> float:
    """CPU seconds of `pid` (all its threads, those that exited too); 0 if it is gone.

    Read from the process's CPU-time clock (`clock_getcpuclockid`: the scheduler's nanoseconds),
    not from /proc/<pid>/stat's utime + stime, which count 10 ms ticks: a quick ingest round is
    ~0.2 s of a broker's CPU, so ticks put +-5% on each figure and +-10% on a ratio of two."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
        try:
            return time.clock_gettime(clock.value)
        except OSError:  # gone meanwhile
            return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0.0
    fields = data[data.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and its live children: a broker's supervisor and its workers."""
    return sum(proc_cpu(p) for p in (pid, *children_of(pid)))


def tree_waited(pid: int) -> float:
    """Seconds the threads of `pid` and its live children have spent runnable but waiting for a
    CPU (schedstat's run-queue wait; 0 on a kernel without it). On the 2-CPU VM the nodes of a
    cluster share the CPUs with the client: what a node waits there is CPU a neighbour took,
    which its own CPU time does not show."""
    waited = 0
    for p in (pid, *children_of(pid)):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    waited += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):  # a thread that exited, or no schedstat
                pass
    return waited / 1e9


def children_of(pid: int) -> list[int]:
    """The live child processes of `pid`: /proc/<pid>/task/<tid>/children of each of its threads,
    or, on a kernel without that file, every /proc/<n>/stat whose parent is `pid`."""
    kids: list[int] = []
    if os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(k) for k in f.read().split())
            except FileNotFoundError:  # a thread that just exited
                pass
        return kids
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if int(data[data.rindex(b")") + 2 :].split()[1]) == pid:  # field 4: ppid
                kids.append(int(name))
    return kids


# This VM's balloon reports free guest memory to the host ("Free page reporting enabled" at boot,
# the virtio-balloon REPORTING feature), which discards it: the next touch of such a page is a
# host fault, paid by whoever touches it. A page-cache write into it is ~20x dearer: a bare loop
# of pwritev into new files ran at 7-11 GB/s while recently freed pages lasted and at ~440 MB/s,
# 2.3 CPU-s per GB, once it needed more, whatever the write size; a broker whose ingest meets
# such pages shows it as a run of rounds at a fraction of its MB/s (the page-cache copy,
# `copy_folio_from_iter_atomic`, near the top of its profile). Which broker meets them in a run is
# the timing of frees and reports. `--page-reporting-min-free-ms MS` (where the guest kernel has
# the parameter) keeps a freed page from being reported for MS, so that the rounds reuse what the
# rounds before them freed; restored at exit. bench/perf.py and bench/scale.py print the setting
# first and, at the end, how much was reported during the run.
PAGE_REPORTING = Path("/sys/module/page_reporting/parameters")


def page_reporting() -> tuple[str, int | None]:
    """(a description of free page reporting here, KiB reported so far or None)."""
    try:
        reported = int((PAGE_REPORTING / "reported_kib").read_text())
    except (OSError, ValueError):
        reported = None
    try:
        order = (PAGE_REPORTING / "page_reporting_order").read_text().strip()
    except OSError:
        return "off (no page_reporting)", reported
    try:
        delay = f", min_free_ms {(PAGE_REPORTING / 'min_free_ms').read_text().strip()}"
    except OSError:
        delay = ""
    return f"order {order}{delay}", reported


@contextlib.contextmanager
def knob_for_the_run(knob: Path, value: int) -> Iterator[None]:
    """`value` in the kernel parameter file `knob` for the run, the old value put back at exit."""
    old = knob.read_text().strip()
    knob.write_text(str(value))
    try:
        yield
    finally:
        knob.write_text(old)
