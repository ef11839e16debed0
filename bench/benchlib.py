"""What the benchmarks share: table printing and the facts every run prints about itself.

Imported by the scripts of bench/, which run as scripts from the repository root
(`python bench/x.py` puts bench/ on sys.path): see bench/README.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import time
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
