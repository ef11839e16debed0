"""The XDP classifier on the broker's ingress interface (`broker serve --xdp-iface IFACE`).

Rules this module keeps:
- What the program does is in xdp.c's header: membership / partition / other, per-CPU counters,
  malformed membership packets dropped, everything else passed untouched.
- The ports it classifies by live in a map (`rl_xdp_ports`), filled before attaching: UDP to the
  membership port is membership, TCP to the public port and to every core's direct port is partition.
- Mode: `native` (driver XDP, e.g. veth), `generic` (SKB mode: any device, `lo` included) or `auto`
  (native, then generic when the driver refuses). Attaching never replaces another program on the
  interface (XDP_FLAGS_UPDATE_IF_NOEXIST): a second broker on one interface is a clear error.
- `close()` detaches (in the mode it attached with) and releases the program; idempotent, never
  raises: a broker that exits leaves the interface as it found it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from collections.abc import Iterable
from typing import Any, Final

from bpf import kernel

log = logging.getLogger("bpf.xdp")

CLASSES: Final = ("membership", "partition", "other", "malformed_dropped")  # rl_xdp_stats slots
XDP_FLAGS_UPDATE_IF_NOEXIST: Final = 1
XDP_FLAGS_SKB_MODE: Final = 2
XDP_FLAGS_DRV_MODE: Final = 4
MODES: Final = ("auto", "native", "generic")
_CLASS_MEMBERSHIP: Final = 0
_CLASS_PARTITION: Final = 1


class XdpClassifier:
    """The loaded classifier, attached to `iface` by `attach()`."""

    def __init__(self, iface: str, membership_port: int, partition_ports: Iterable[int]) -> None:
        self.iface = iface
        self.mode = ""  # "native" or "generic" once attached
        self._flags = 0
        self._ifindex = socket.if_nametoindex(iface)  # OSError for an unknown interface
        self._closed = False
        bcc = kernel.load_bcc()
        self._bpf: Any = bcc.BPF(text=kernel.source("xdp.c"))
        self._fn = self._bpf.load_func(b"rl_xdp_classify", kernel.BPF_PROG_TYPE_XDP)
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
        """Attach in `mode`; returns the mode used. Raises BpfError with the kernel's reason."""
        from pyroute2 import IPRoute  # noqa: PLC0415 - optional dependency (the bpf extra)

        tries = {"auto": ("native", "generic"), "native": ("native",), "generic": ("generic",)}[mode]
        errors = []
        with IPRoute() as ipr:
            for m in tries:
                flags = XDP_FLAGS_UPDATE_IF_NOEXIST | (
                    XDP_FLAGS_DRV_MODE if m == "native" else XDP_FLAGS_SKB_MODE
                )
                try:
                    ipr.link(
                        "set",
                        index=self._ifindex,
                        xdp={"attrs": [("IFLA_XDP_FD", self.prog_fd), ("IFLA_XDP_FLAGS", flags)]},
                    )
                except Exception as exc:  # pyroute2's NetlinkError carries the errno text
                    errors.append(f"{m}: {exc}")
                    continue
                self.mode, self._flags = m, flags
                return m
        raise kernel.BpfError(f"cannot attach XDP to {self.iface}: " + "; ".join(errors))

    def counters(self) -> dict[str, int]:
        """Packets per class since load, summed over CPUs."""
        return dict(zip(CLASSES, kernel.percpu_sums(self._bpf, "rl_xdp_stats", len(CLASSES)), strict=True))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.mode:
            try:
                from pyroute2 import IPRoute  # noqa: PLC0415

                with IPRoute() as ipr:
                    flags = self._flags & ~XDP_FLAGS_UPDATE_IF_NOEXIST
                    ipr.link(
                        "set",
                        index=self._ifindex,
                        xdp={"attrs": [("IFLA_XDP_FD", -1), ("IFLA_XDP_FLAGS", flags)]},
                    )
            except Exception as exc:  # the interface may be gone with its namespace
                log.warning("detaching XDP from %s: %s", self.iface, exc)
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
