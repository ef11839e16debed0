"""The TCP Fast Open sysctl that payload steering needs, changed only when asked and restored.

Rules this module keeps:
- `net.ipv4.tcp_fastopen` is per network namespace. Payload steering needs the server bit
  (`TFO_SERVER_ENABLE`, 0x2) in the broker's namespace; cookies are waived per socket
  (TCP_FASTOPEN_NO_COOKIE on the listeners and on the client's socket), so no other bit is touched.
- `enable_server()` returns the previous value for `restore()`; nothing here runs unless the
  operator passed `--tcp-fastopen-sysctl`.
"""

from __future__ import annotations

from typing import Final

SYSCTL_PATH: Final = "/proc/sys/net/ipv4/tcp_fastopen"
TFO_CLIENT_ENABLE: Final = 0x1
TFO_SERVER_ENABLE: Final = 0x2


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


def enable_server() -> int | None:
    """Set the server bit; the previous value, or None if it was set already (nothing to restore)."""
    old = read()
    if old & TFO_SERVER_ENABLE:
        return None
    write(old | TFO_SERVER_ENABLE)
    return old


def restore(old: int | None) -> None:
    if old is not None:
        write(old)
