"""The TCP Fast Open sysctl that payload steering needs, changed only when asked and restored.

Rules this module keeps:
- `net.ipv4.tcp_fastopen` is per network namespace. Payload steering needs the server bit
  (`TFO_SERVER_ENABLE`, 0x2) in the broker's namespace; cookies are waived per socket
  (TCP_FASTOPEN_NO_COOKIE on the listeners and on the client's socket), so no other bit is touched.
- `enable_server()` returns the previous value for `restore()`; nothing here runs unless the
  operator passed `--tcp-fastopen-sysctl`.
- A SIGKILL skips `restore()`. So before changing the sysctl the broker records the old value, the
  new one and the network namespace in `<data_dir>/run/restore/tcp_fastopen.json` (`record()`),
  removes the record once it restored the value (`forget()`), and the next broker on that data
  dir restores what a killed one left (`restore_recorded()`). It restores only in the same
  namespace and only when the sysctl still holds the value the broker set: a value someone changed
  since is theirs. (`run/restore/` is a directory so that the start-up sweep of `run/`, which
  unlinks stale files, keeps it.)
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Final

SYSCTL_PATH: Final = "/proc/sys/net/ipv4/tcp_fastopen"
TFO_CLIENT_ENABLE: Final = 0x1
TFO_SERVER_ENABLE: Final = 0x2
RECORD_DIR: Final = os.path.join(
    "run", "restore"
)  # broker/storage/layout.py: restore_dir (tests/storage/test_layout.py)
RECORD_FILE: Final = "tcp_fastopen.json"


def read() -> int:
    with open(SYSCTL_PATH) as f:
        return int(f.read().strip(), 0)


def write(value: int) -> None:
    with open(SYSCTL_PATH, "w") as f:
        f.write(str(value))


def server_enabled() -> bool:
    """Whether a SYN's data can reach our listeners (and so the payload rule) in this netns."""
    try:
        return bool(read() & TFO_SERVER_ENABLE)
    except OSError:
        return False


def enable_server(data_dir: str) -> int | None:
    """Set the server bit, recorded first in `data_dir` (module rules); the previous value, or None
    if it was set already (nothing to restore)."""
    old = read()
    if old & TFO_SERVER_ENABLE:
        return None
    record(data_dir, old, old | TFO_SERVER_ENABLE)
    write(old | TFO_SERVER_ENABLE)
    return old


def restore(data_dir: str, old: int | None) -> None:
    if old is not None:
        write(old)
        forget(data_dir)


def record_path(data_dir: str) -> str:
    return os.path.join(data_dir, RECORD_DIR, RECORD_FILE)


def netns_id() -> int:
    """The inode of this process's network namespace (what `ip netns identify` compares)."""
    return os.stat("/proc/self/ns/net").st_ino


def record(data_dir: str, old: int, new: int) -> None:
    """Write down, before changing it, what the sysctl was and what we set it to (module rules)."""
    p = record_path(data_dir)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    doc = {"sysctl": SYSCTL_PATH, "original": old, "set_to": new, "netns": netns_id(), "pid": os.getpid()}
    tmp = f"{p}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def forget(data_dir: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(record_path(data_dir))


def restore_recorded(data_dir: str) -> str | None:
    """Undo the change a broker killed before its exit left in the sysctl (module rules); a line
    saying what was done, or None when there was no record. Never raises."""
    p = record_path(data_dir)
    try:
        with open(p, encoding="utf-8") as f:
            doc = json.load(f)
        old, new, ns, pid = int(doc["original"]), int(doc["set_to"]), int(doc["netns"]), doc.get("pid")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        forget(data_dir)
        return f"unreadable record of {SYSCTL_PATH} in {p} ({exc}): removed, nothing restored"
    prefix = f"a broker (pid {pid}) that did not exit cleanly set {SYSCTL_PATH} to {new} (was {old})"
    try:
        if ns != netns_id():
            msg = f"{prefix} in another network namespace: not restored here, do it there"
        elif (now := read()) != new:
            msg = f"{prefix}; it is {now} now, changed since: left as it is"
        else:
            write(old)
            msg = f"{prefix}: restored to {old}"
    except OSError as exc:
        return f"{prefix}: cannot restore it: {exc} (record kept in {p})"
    forget(data_dir)
    return msg
