"""The XDP classifier on the broker's ingress interface (`broker serve --xdp-iface IFACE`).

Rules this module keeps:
- What the program does is in xdp.c's header: membership / partition / other, per-CPU counters,
  malformed membership packets dropped, everything else passed untouched.
- The membership header's facts the C checks (magic, version, their offsets, the smallest
  packet) come from their one owner, ringlog_proto/membership.py, as -D flags
  (`membership_defines`): xdp.c writes none of them, and does not compile without them.
- The ports it classifies by live in a map (`rl_xdp_ports`), filled before attaching: UDP to the
  membership port is membership, TCP to the public port and to every core's direct port is partition.
- Mode: `native` (driver XDP, e.g. veth), `generic` (SKB mode: any device, `lo` included) or `auto`
  (native, then generic when the driver refuses).
- Attached through a BPF link (BPF_LINK_CREATE, bpf/kernel.py), never by netlink: the link's fd is
  the only thing that keeps the program on the interface, the supervisor alone holds it (bpf(2)
  fds are close-on-exec and workers inherit only their listeners), so the kernel detaches the
  program when the supervisor dies, SIGKILL included. A link never replaces a program already on
  the interface: a second broker on one interface is a clear error (EBUSY).
- `close()` closes the link (which detaches) and releases the program; idempotent, never raises.
- `detach_stale()` removes what older brokers, which attached by netlink, left behind after a
  crash: XDP programs named `PROG_NAME` that no live process holds. It is called at every start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from collections.abc import Iterable
from typing import Any, Final

from bpf import kernel
from ringlog_proto import membership

log = logging.getLogger("bpf.xdp")

CLASSES: Final = ("membership", "partition", "other", "malformed_dropped")  # rl_xdp_stats slots
XDP_FLAGS_SKB_MODE: Final = 2
XDP_FLAGS_DRV_MODE: Final = 4
MODES: Final = ("auto", "native", "generic")
PROG_NAME: Final = "rl_xdp_classify"  # the C function's name, which bcc gives the program
_CLASS_MEMBERSHIP: Final = 0
_CLASS_PARTITION: Final = 1


def membership_defines() -> dict[str, int]:
    """The values of xdp.c's RL_MEMBERSHIP_* macros, taken from the membership codec."""
    if len(membership.MAGIC) != 4:
        raise ValueError(f"xdp.c compares the magic as one u32, not {len(membership.MAGIC)} bytes")
    return {
        "RL_MEMBERSHIP_MAGIC": int.from_bytes(membership.MAGIC, "big"),
        "RL_MEMBERSHIP_MAGIC_OFFSET": membership.MAGIC_OFFSET,
        "RL_MEMBERSHIP_VERSION": membership.VERSION,
        "RL_MEMBERSHIP_VERSION_OFFSET": membership.VERSION_OFFSET,
        "RL_MEMBERSHIP_PACKET_MIN": membership.PACKET_MIN,
    }


def cflags() -> list[str]:
    """What bcc compiles xdp.c with."""
    return [f"-D{name}={value:#x}" for name, value in membership_defines().items()]


class XdpClassifier:
    """The loaded classifier, attached to `iface` by `attach()`."""

    def __init__(self, iface: str, membership_port: int, partition_ports: Iterable[int]) -> None:
        self.iface = iface
        self.mode = ""  # "native" or "generic" once attached
        self._link_fd = -1
        self._ifindex = socket.if_nametoindex(iface)  # OSError for an unknown interface
        self._closed = False
        bcc = kernel.load_bcc()
        self._bpf: Any = bcc.BPF(text=kernel.source("xdp.c"), cflags=cflags())
        self._fn = self._bpf.load_func(PROG_NAME.encode(), kernel.BPF_PROG_TYPE_XDP)
        ports_fd = kernel.table_fd(self._bpf, "rl_xdp_ports")
        entries = [(socket.IPPROTO_UDP, membership_port, _CLASS_MEMBERSHIP)]
        entries += [(socket.IPPROTO_TCP, p, _CLASS_PARTITION) for p in partition_ports]
        for proto, port, cls in entries:
            kernel.map_update(
                ports_fd, struct.pack("<I", proto << 16 | port), struct.pack("<I", cls), "xdp ports"
            )

    @property
    def prog_fd(self) -> int:
        return int(self._fn.fd)

    def attach(self, mode: str = "auto") -> str:
        """Attach in `mode` through a BPF link; returns the mode used. Raises BpfError with the
        kernel's reason."""
        tries = {"auto": ("native", "generic"), "native": ("native",), "generic": ("generic",)}[mode]
        errors = []
        for m in tries:
            flags = XDP_FLAGS_DRV_MODE if m == "native" else XDP_FLAGS_SKB_MODE
            try:
                self._link_fd = kernel.xdp_link_create(self.prog_fd, self._ifindex, flags)
            except kernel.BpfError as exc:
                errors.append(f"{m}: {exc}")
                continue
            self.mode = m
            return m
        busy = attached_prog_id(self.iface)
        if busy:
            errors.append(f"program {busy} ({kernel.prog_name(busy) or '?'}) is attached to it already")
        raise kernel.BpfError(f"cannot attach XDP to {self.iface}: " + "; ".join(errors))

    def counters(self) -> dict[str, int]:
        """Packets per class since load, summed over CPUs."""
        return dict(zip(CLASSES, kernel.percpu_sums(self._bpf, "rl_xdp_stats", len(CLASSES)), strict=True))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._link_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._link_fd)  # the last holder of the link: the kernel detaches now
            self._link_fd = -1
            self.mode = ""
        with contextlib.suppress(Exception):
            self._bpf.cleanup()


def attached_prog_id(iface: str) -> int:
    """The id of the XDP program attached to `iface` (0: none), for checks and tests."""
    from pyroute2 import IPRoute  # noqa: PLC0415

    with IPRoute() as ipr:
        (link,) = ipr.get_links(socket.if_nametoindex(iface))
        xdp = link.get_attr("IFLA_XDP")
        if xdp is None:
            return 0
        return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0)


def detach_stale() -> list[str]:
    """Detach every XDP program named `PROG_NAME` in this network namespace that no live process
    holds: one an older broker attached by netlink and left behind when it was killed. Programs
    that a running process holds (another broker, through its link or by netlink) are left alone
    and named in a warning. Returns one description per program detached. Needs root and pyroute2."""
    if not any(kernel.prog_name(i) == PROG_NAME for i in kernel.prog_ids()):
        return []  # the common case, in microseconds: no program of that name loaded at all
    from pyroute2 import IPRoute  # noqa: PLC0415

    detached: list[str] = []
    with IPRoute() as ipr:
        for link in ipr.get_links():
            xdp = link.get_attr("IFLA_XDP")
            if xdp is None:
                continue
            iface = link.get_attr("IFLA_IFNAME")
            for prog_id, mode in _attached(xdp):
                what = f"XDP program {PROG_NAME} (id {prog_id}, {mode} mode) on {iface}"
                if kernel.prog_name(prog_id) == PROG_NAME and _detach_stale(
                    ipr, link["index"], prog_id, mode, what
                ):
                    detached.append(what)
    return detached


def _attached(xdp: Any) -> list[tuple[int, str]]:
    """(program id, mode) of each XDP program in an IFLA_XDP attribute."""
    per_mode = [
        (int(xdp.get_attr(attr) or 0), mode)
        for attr, mode in (("IFLA_XDP_DRV_PROG_ID", "native"), ("IFLA_XDP_SKB_PROG_ID", "generic"))
    ]
    found = [(i, mode) for i, mode in per_mode if i]
    if not found and (prog_id := int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0)):
        attached = xdp.get_attr("IFLA_XDP_ATTACHED")  # pyroute2 maps it to a name: 1 "xdp", 2 "xdpgeneric"
        found = [(prog_id, "generic" if attached in (2, "xdpgeneric") else "native")]
    return found


def _detach_stale(ipr: Any, index: int, prog_id: int, mode: str, what: str) -> bool:
    """Detach `prog_id` (described by `what`) by netlink unless a live process holds it."""
    holders = [pid for pid in kernel.prog_holders(prog_id) if pid != os.getpid()]
    if holders:
        log.info("%s belongs to running process(es) %s: not stale, left attached", what, holders)
        return False
    flags = XDP_FLAGS_SKB_MODE if mode == "generic" else XDP_FLAGS_DRV_MODE
    try:
        ipr.link("set", index=index, xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", flags)]})
    except Exception as exc:  # e.g. EBUSY: attached through a link after all
        log.warning("cannot detach stale %s: %s", what, exc)
        return False
    return True
