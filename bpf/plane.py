"""The eBPF control plane of one broker: load, keep, publish and release steering and XDP.

Rules this module keeps:
- `--ebpf off`: nothing is loaded. `auto`: loaded when `kernel.ebpf_unavailable()` says it can be,
  otherwise one log line names the reason and user-space forwarding serves (Metadata says
  `steering: false`); a program that fails to load in auto mode is reported the same way. `on`:
  any reason it cannot load is a start error (`kernel.BpfError`). An XDP interface that was asked
  for (`--xdp-iface`) and cannot be attached is a start error in both modes: it was named explicitly.
- `auto` with one core loads nothing either, unless `--xdp-iface` or `--tcp-fastopen-sysctl` asks
  for what rides on the steering program's load: the reuseport group has one listener, which every
  rule would choose, so the program (and TFO on that listener, which only its payload rule reads)
  would only count connections, while compiling it (bcc runs clang at every start) was a third of
  a one-core broker's start. The log line and the snapshot's reason say so; `--ebpf on` loads it
  at one core too (its counters then in `broker stats`).
- The TFO sysctl (bpf/tfo.py) is changed only with `set_tfo_sysctl`, and restored by `close()`.
- `close()` detaches XDP and steering, releases maps, restores the sysctl and publishes a final
  snapshot with `steering: false`; idempotent, never raises.
- A SIGKILL skips `close()`, and nothing is left behind in the kernel anyway: XDP hangs on a BPF
  link whose only fd the supervisor holds; the reuseport program hangs on the listeners' reuseport
  group, which dies with the last listener (the supervisor's and the workers', who die with it:
  PR_SET_PDEATHSIG); maps and programs are fds, released with their last holder; nothing is
  pinned. What a SIGKILL does leave, the next start undoes (`prepare()`, under the data dir's
  lock, whatever the --ebpf mode): the TFO sysctl (restored from the record bpf/tfo.py keeps in
  run/restore/), and XDP programs of ours that older brokers attached by netlink and left on an
  interface of this namespace (`xdp.detach_stale`, each named in a log line).
- The live set is the caller's decision (`set_live`); this module only writes it to the map.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from bpf import kernel, state, tfo

log = logging.getLogger("broker.ebpf")

EBPF_MODES: Final = ("auto", "on", "off")
ONE_CORE_REASON: Final = "one core: there is no other core to steer connections to"


class EbpfPlane:
    """What a broker loaded into the kernel (either part may be absent)."""

    def __init__(self, data_dir: str, mode: str) -> None:
        self.data_dir = data_dir
        self.mode = mode
        self.port = 0  # the broker's public port: `broker stats -b` matches the snapshot by it
        self.reason = ""  # why steering is off, when it is
        self.steering: Any = None  # bpf.steering.Steering
        self.xdp: Any = None  # bpf.xdp.XdpClassifier
        self._tfo_old: int | None = None
        self._tfo_set = False
        self._closed = False
        self.membership: dict[str, int] = {}

    # ------------------------------------------------------------------------- loading

    def prepare(self, cores: int, *, xdp_or_tfo: bool = False) -> None:
        """Decide per the mode and compile and load the steering program, before the listeners
        exist: attaching right after they are made leaves no window in which the kernel's hash
        alone places connections. First undoes what a killed broker left (module rules).
        `xdp_or_tfo`: `--xdp-iface` or `--tcp-fastopen-sysctl` was given, which need the program
        loaded whatever the core count. Raises kernel.BpfError when the broker must not start."""
        self.recover()
        if self.mode == "off":
            self.reason = "--ebpf off"
            log.info("eBPF off (--ebpf off): connections to the public port are forwarded in user space")
            return
        if self.mode == "auto" and cores == 1 and not xdp_or_tfo:
            self.reason = ONE_CORE_REASON
            log.info("eBPF steering not loaded: %s (--ebpf on loads it anyway)", ONE_CORE_REASON)
            return
        why = kernel.ebpf_unavailable()
        if why is not None:
            if self.mode == "on":
                raise kernel.BpfError(f"--ebpf on: {why}")
            self.reason = why
            log.info("eBPF not loaded: %s; connections to the public port are forwarded in user space", why)
            return
        from bpf.steering import Steering  # noqa: PLC0415 - imports bcc

        try:
            self.steering = Steering(cores)
        except Exception as exc:
            self._steering_failed(exc)

    def recover(self) -> None:
        """Undo what a broker killed without its `close()` left in this namespace (module rules).
        Never raises: a start is not refused for someone else's leftovers."""
        msg = tfo.restore_recorded(self.data_dir)
        if msg is not None:
            log.warning("%s", msg)
        if os.geteuid() != 0:
            return
        try:
            from bpf.xdp import detach_stale  # noqa: PLC0415 - imports pyroute2, not bcc

            for what in detach_stale():
                log.warning("detached stale ringlog %s, left by a broker that did not exit cleanly", what)
        except Exception as exc:  # pyroute2 missing, netlink refused, ...
            log.warning("cannot look for stale ringlog XDP programs: %s", exc)

    def _steering_failed(self, exc: Exception) -> None:
        if self.steering is not None:
            self.steering.close()
            self.steering = None
        if self.mode == "on":
            raise kernel.BpfError(f"--ebpf on: cannot load the steering program: {exc}") from exc
        self.reason = f"steering program failed to load: {exc}"
        log.warning("eBPF not loaded: %s; connections are forwarded in user space", self.reason)

    def load(
        self,
        public: Sequence[socket.socket],
        *,
        xdp_iface: str | None = None,
        xdp_mode: str = "auto",
        membership_port: int = 0,
        partition_ports: Iterable[int] = (),
        set_tfo_sysctl: bool = False,
    ) -> None:
        """Attach what `prepare` loaded to the listeners, set the sysctl if asked, attach XDP.
        Raises kernel.BpfError when the broker must not start (module rules)."""
        try:
            self._load(public, xdp_iface, xdp_mode, membership_port, tuple(partition_ports), set_tfo_sysctl)
        except BaseException:
            self.close()
            raise
        self.publish()

    def _load(
        self,
        public: Sequence[socket.socket],
        xdp_iface: str | None,
        xdp_mode: str,
        membership_port: int,
        partition_ports: tuple[int, ...],
        set_tfo_sysctl: bool,
    ) -> None:
        if self.steering is None:
            return
        try:
            self.steering.attach(public)
        except Exception as exc:
            self._steering_failed(exc)
            return
        if set_tfo_sysctl:
            try:
                self._tfo_old = tfo.enable_server(self.data_dir)
            except OSError as exc:  # not allowed, or the record cannot be written (full disk)
                raise kernel.BpfError(f"--tcp-fastopen-sysctl: {exc}") from exc
            self._tfo_set = True
            if self._tfo_old is not None:
                log.info(
                    "set %s to %d (was %d; restored at exit, or by the next start after a kill): SYNs carry "
                    "the first frame",
                    tfo.SYSCTL_PATH,
                    tfo.read(),
                    self._tfo_old,
                )
        if not tfo.server_enabled():
            log.info(
                "TCP Fast Open server side is off in this netns (%s lacks 0x2): connections are steered "
                "by source port, not by their first frame (--tcp-fastopen-sysctl sets it)",
                tfo.SYSCTL_PATH,
            )
        log.info("eBPF steering: listeners of %d cores in a sockmap, reuseport program attached", len(public))
        if xdp_iface:
            from bpf.xdp import XdpClassifier  # noqa: PLC0415 - imports bcc

            try:
                self.xdp = XdpClassifier(xdp_iface, membership_port, partition_ports)
                mode = self.xdp.attach(xdp_mode)
            except (OSError, kernel.BpfError, ImportError) as exc:
                raise kernel.BpfError(f"--xdp-iface {xdp_iface}: {exc}") from exc
            log.info("XDP classifier on %s (%s mode)", xdp_iface, mode)

    # ------------------------------------------------------------------------- running

    @property
    def steering_on(self) -> bool:
        return self.steering is not None and not self._closed

    def set_live(self, cores: Iterable[int]) -> None:
        if self.steering is not None and not self._closed:
            try:
                self.steering.set_live(cores)
            except kernel.BpfError as exc:
                log.error("updating the live cores map: %s", exc)

    def snapshot(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "time": time.time(),
            "pid": os.getpid(),
            "mode": self.mode,
            "port": self.port,
            "steering": self.steering_on,
            "reason": self.reason,
            "payload_steering": self.steering_on and tfo.server_enabled(),
            "tfo_sysctl_set_by_broker": self._tfo_set and self._tfo_old is not None,
            "membership": dict(self.membership),
        }
        if self.steering_on:
            with contextlib.suppress(Exception):
                doc["live_cores"] = self.steering.live()
                doc["steer"] = self.steering.counters()
        if self.xdp is not None and not self._closed:
            with contextlib.suppress(Exception):
                doc["xdp"] = {"iface": self.xdp.iface, "mode": self.xdp.mode, "classes": self.xdp.counters()}
        return doc

    def publish(self) -> None:
        try:
            state.publish(self.data_dir, self.snapshot())
        except OSError as exc:
            log.debug("publishing %s: %s", state.FILE_NAME, exc)

    def close(self) -> None:
        if self._closed:
            return
        final = self.snapshot() if self.steering is not None or self.xdp is not None else None
        self._closed = True
        if self.xdp is not None:
            self.xdp.close()
        if self.steering is not None:
            self.steering.close()
        if self._tfo_set:
            try:
                tfo.restore(self.data_dir, self._tfo_old)
                if self._tfo_old is not None:
                    log.info("restored %s to %d", tfo.SYSCTL_PATH, self._tfo_old)
            except OSError as exc:
                log.error("restoring %s: %s", tfo.SYSCTL_PATH, exc)
        if final is not None:
            final.update(steering=False, payload_steering=False, reason="stopped")
            with contextlib.suppress(OSError):
                state.publish(self.data_dir, final)
