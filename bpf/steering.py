"""Steering new connections to the core that owns their partition: sk_reuseport + SOCKMAP.

Rules this module keeps:
- One `Steering` per broker, made by the supervisor, which owns the public SO_REUSEPORT listeners.
  Each core's public listener sits in a SOCKMAP at index = core; `reuseport.c`, attached to the
  group with SO_ATTACH_REUSEPORT_EBPF, picks the listener of every SYN (payload rule, then source
  port rule, then the kernel's hash: the rules are in reuseport.c's header).
- The live set (`set_live`) is the program's only view of the workers: a core not in it is never
  chosen by a rule. The supervisor decides who is live (broker/node/supervisor.py says how).
- The listeners get TCP_FASTOPEN (a queue of `TFO_QUEUE`) and TCP_FASTOPEN_NO_COOKIE, so that a SYN
  with data is accepted with its data once the netns allows server TFO (bpf/tfo.py): that data is
  what the payload rule reads.
- `close()` detaches the program from the group (the kernel's hash takes over at once), empties
  and closes the SOCKMAP and releases the program; it is idempotent and never raises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Final

from bpf import kernel

log = logging.getLogger("bpf.steering")

COUNTERS: Final = ("by_payload", "by_port", "fallback", "errors")  # rl_steer_stats slots, in order
# Connections the kernel keeps in a listener's TFO queue (accepted with data, not yet accept()ed);
# the listen backlog (1024) bounds the total anyway.
TFO_QUEUE: Final = 1024
_LIVE = struct.Struct("<QII")  # struct rl_live: mask, cores, generation


class Steering:
    """The loaded reuseport program and its maps, for `cores` listeners."""

    def __init__(self, cores: int) -> None:
        if not 1 <= cores <= kernel.MAX_CORES:
            raise kernel.BpfError(f"steering supports 1 to {kernel.MAX_CORES} cores, not {cores}")
        self.cores = cores
        self._generation = 0
        self._attached_to: socket.socket | None = None
        self._closed = False
        self.sockmap_fd = kernel.create_map(kernel.BPF_MAP_TYPE_SOCKMAP, "rl_core_socks", 4, 8, cores)
        try:
            bcc = kernel.load_bcc()
            self._bpf: Any = bcc.BPF(
                text=kernel.source("rendezvous.h", "steer_rules.h", "reuseport.c"),
                # the loop over cores as long as this broker's (rendezvous.h says why)
                cflags=[f"-DRL_SOCKMAP_FD={self.sockmap_fd}", f"-DRL_MAX_CORES={cores}"],
            )
            self._fn = self._bpf.load_func(b"rl_reuseport_select", kernel.BPF_PROG_TYPE_SK_REUSEPORT)
        except BaseException:
            os.close(self.sockmap_fd)
            raise
        self._live_fd = kernel.table_fd(self._bpf, "rl_live_cores")

    @property
    def prog_fd(self) -> int:
        return int(self._fn.fd)

    def attach(self, public: Sequence[socket.socket]) -> None:
        """Put listener k at index k, enable TFO on each, and attach to their reuseport group."""
        if len(public) != self.cores:
            raise kernel.BpfError(f"{len(public)} listeners for {self.cores} cores")
        for core, sock in enumerate(public):
            sock.setsockopt(socket.IPPROTO_TCP, kernel.TCP_FASTOPEN, TFO_QUEUE)
            sock.setsockopt(socket.IPPROTO_TCP, kernel.TCP_FASTOPEN_NO_COOKIE, 1)
            kernel.map_update(
                self.sockmap_fd,
                struct.pack("<I", core),
                struct.pack("<Q", sock.fileno()),
                f"sockmap[{core}] = listener of core {core}",
            )
        self.set_live(range(self.cores))
        public[0].setsockopt(socket.SOL_SOCKET, kernel.SO_ATTACH_REUSEPORT_EBPF, self.prog_fd)
        self._attached_to = public[0]

    def set_live(self, cores: Iterable[int]) -> int:
        """Make `cores` the live set; returns its bitmask."""
        mask = 0
        for c in cores:
            if 0 <= c < self.cores:
                mask |= 1 << c
        self._generation = (self._generation + 1) & 0xFFFFFFFF
        kernel.map_update(
            self._live_fd, struct.pack("<I", 0), _LIVE.pack(mask, self.cores, self._generation), "live cores"
        )
        return mask

    def live(self) -> list[int]:
        """The live set as the program sees it."""
        table = self._bpf[b"rl_live_cores"]
        mask = int(table[table.Key(0)].mask)
        return [c for c in range(self.cores) if mask >> c & 1]

    def counters(self) -> dict[str, int]:
        """Connections steered by payload, by port, left to the kernel, failed selections."""
        return dict(
            zip(COUNTERS, kernel.percpu_sums(self._bpf, "rl_steer_stats", len(COUNTERS)), strict=True)
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._attached_to is not None and self._attached_to.fileno() >= 0:
            with contextlib.suppress(OSError):
                self._attached_to.setsockopt(socket.SOL_SOCKET, kernel.SO_DETACH_REUSEPORT_BPF, 0)
        self._attached_to = None
        for core in range(self.cores):
            kernel.map_delete(self.sockmap_fd, struct.pack("<I", core))
        with contextlib.suppress(OSError):
            os.close(self.sockmap_fd)
        with contextlib.suppress(Exception):
            self._bpf.cleanup()
