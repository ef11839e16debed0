"""Throwaway networks for tests and benchmarks: a network namespace joined to the host by a veth pair,
and `broker serve` started inside it.

Test and bench harness, not broker code (tests/bpf, bench/steering.py): bpf/ keeps only what the
broker loads.

Rules this module keeps:
- Everything made here is removed by `close()` (also on `__exit__`, so a failing test cleans up):
  processes started in the namespace are killed by pid, the veth pair is deleted, the namespace
  is removed. Names carry this process's pid, so concurrent runs and leftovers never collide.
- IPv6 is disabled on both ends before they come up: its neighbour discovery would put packets
  of its own on the link, and tests count packets.
- Uses pyroute2 for links and addresses and `ip netns exec` (iproute2) to run commands inside,
  which also gives the command the namespace's own /sys and sysctls.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from bpf import state
from labkit.brokerproc import BrokerProcess, membership_key_file

PREFIX_LEN: Final = 24
READY_RE: Final = re.compile(r"serving on [\d.]+:(\d+)")
NS_MEMBERSHIP_PORT: Final = 7946  # the namespace's own port space: always free there
BROKER_START_S: Final = 30.0  # bcc compiles the programs at start (about a second) and workers boot
_counter = itertools.count()


class Netns:
    """A namespace `name` with `ns_if` (address `ns_ip`) whose veth peer `host_if` has `host_ip`."""

    def __init__(self) -> None:
        from pyroute2 import IPRoute, NetNS, netns

        n = next(_counter)
        pid = os.getpid()
        self.name = f"ringlog-{pid}-{n}"
        self.host_if = f"rlh{pid % 100000}x{n}"[:15]
        self.ns_if = f"rln{pid % 100000}x{n}"[:15]
        net = (pid * 7 + n) % 250 + 1
        self.host_ip = f"10.213.{net}.1"
        self.ns_ip = f"10.213.{net}.2"
        self.procs: list[subprocess.Popen[bytes]] = []
        self._closed = False
        netns.create(self.name)
        try:
            self.run(
                ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
            )
            with IPRoute() as ipr:
                ipr.link("add", ifname=self.host_if, kind="veth", peer=self.ns_if)
                host_idx = ipr.link_lookup(ifname=self.host_if)[0]
                with (
                    contextlib.suppress(OSError),
                    open(f"/proc/sys/net/ipv6/conf/{self.host_if}/disable_ipv6", "w") as f,
                ):
                    f.write("1")
                ns_idx = ipr.link_lookup(ifname=self.ns_if)[0]
                ipr.link("set", index=ns_idx, net_ns_fd=self.name)
                ipr.addr("add", index=host_idx, address=self.host_ip, prefixlen=PREFIX_LEN)
                ipr.link("set", index=host_idx, state="up")
            with NetNS(self.name) as ns:
                idx = ns.link_lookup(ifname=self.ns_if)[0]
                ns.addr("add", index=idx, address=self.ns_ip, prefixlen=PREFIX_LEN)
                ns.link("set", index=idx, state="up")
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        except BaseException:
            self.close()
            raise

    def command(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def run(self, args: Sequence[str]) -> str:
        return subprocess.run(self.command(args), check=True, capture_output=True, text=True).stdout

    def popen(self, args: Sequence[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.command(args), **kw)
        self.procs.append(proc)
        return proc

    def sysctl(self, key: str) -> str:
        return self.run(["sysctl", "-n", key]).strip()

    def xdp_prog_id(self) -> int:
        """The id of the XDP program on `ns_if` (0: none)."""
        from pyroute2 import NetNS

        with NetNS(self.name) as ns:
            (link,) = ns.get_links(ns.link_lookup(ifname=self.ns_if)[0])
            xdp = link.get_attr("IFLA_XDP")
            return int(xdp.get_attr("IFLA_XDP_PROG_ID") or 0) if xdp is not None else 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        from pyroute2 import IPRoute, netns

        with IPRoute() as ipr, contextlib.suppress(Exception):
            for idx in ipr.link_lookup(ifname=self.host_if):
                ipr.link("del", index=idx)
        with contextlib.suppress(Exception):
            netns.remove(self.name)

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NsBroker(BrokerProcess):
    """`broker serve` inside a namespace, listening on its veth address (stopping, killing and the
    log as `BrokerProcess` does them; only where it runs differs)."""

    def __init__(
        self,
        lab: Netns,
        data_dir: Path,
        log_path: Path,
        extra: tuple[str, ...],
        cores: int = 2,
        membership_port: int = NS_MEMBERSHIP_PORT,
    ) -> None:
        """`membership_port`: another one for each further broker in the same namespace."""
        super().__init__(data_dir, log_path, extra, cores)
        self.lab = lab
        self.membership_port = membership_port

    @property
    def host(self) -> str:
        return self.lab.ns_ip

    @property
    def bootstrap(self) -> str:
        return f"{self.lab.ns_ip}:{self.port}"

    def start(self) -> NsBroker:
        args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(self.data_dir)]
        args += ["--allow-plaintext"]
        args += ["--host", self.lab.ns_ip, "--port", "0", "--cores", str(self.cores), "--oversubscribe"]
        args += ["--backend", "uvloop"]
        key = membership_key_file(self.data_dir.parent)  # the XDP tests ping the membership endpoint
        args += ["--membership-port", str(self.membership_port), "--membership-key-file", str(key)]
        args += self.extra
        with open(self.log_path, "ab") as log:
            self.proc = self.lab.popen(args, stdout=log, stderr=log)
        deadline = time.monotonic() + BROKER_START_S
        while time.monotonic() < deadline:
            found = READY_RE.findall(self.log())
            if found:
                self.port = int(found[-1])
                with socket.create_connection((self.host, self.port), timeout=2):
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError(f"broker did not start:\n{self.log()}")

    def bpf(self) -> dict[str, Any] | None:
        return state.read(str(self.data_dir))


def exists(name: str) -> bool:
    return os.path.exists(os.path.join("/var/run/netns", name))


# ----------------------------------------------------------------------------- a client that does not route

MSG_FASTOPEN: Final = 0x20000000
TCP_FASTOPEN_NO_COOKIE: Final = 34


def fastopen_connect(host: str, port: int, first: bytes, timeout: float = 5.0) -> socket.socket:
    """A blocking connection to host:port whose SYN carries `first` (TCP Fast Open, no cookie);
    what a client that does not route itself does to let the broker steer it."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN_NO_COOKIE, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(timeout)
        sent = s.sendto(first, MSG_FASTOPEN, (host, port))
        if sent < len(first):
            s.sendall(first[sent:])
    except BaseException:
        s.close()
        raise
    return s


def wait_fresh(read: Any, after: float, timeout: float = 5.0) -> dict[str, Any]:
    """Poll `read()` (a bpf.json reader) until it returns a snapshot taken after `after` (time.time())."""
    deadline = time.monotonic() + timeout
    while True:
        doc = read()
        if doc and float(doc.get("time", 0)) > after:
            return doc
        if time.monotonic() > deadline:
            raise TimeoutError("no fresh bpf.json snapshot")
        time.sleep(0.05)


def be32(value: int) -> bytes:
    return struct.pack(">I", value)
