"""Real etcd members for the cluster tests and bench/cluster.py: Debian's /usr/bin/etcd, started
by pid on free 127.0.0.1 ports in a temporary directory, one member or a cluster of three.

Rules this module keeps:
- Fast settings for tests: heartbeat 50 ms, election timeout 500 ms (etcd's minimum lease TTL is
  then 1 s: 1.5 election timeouts, rounded up to whole seconds), a progress notification on idle
  watches every second.
- A member is killed with SIGKILL, stopped with SIGTERM, frozen with SIGSTOP (a black hole: its
  sockets stay open and answer nothing) and restarted on the same ports and data dir; `close()`
  kills every member this object started, frozen ones included, whatever state the test left.
- `start()` returns only when every running member answers /health with a leader elected.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
HEARTBEAT_MS = 50
ELECTION_MS = 500


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_threads_stopped(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks]
    except OSError:
        return True  # gone: nothing of it runs
    return all(state in ("T", "t", "Z") for state in states)


def _post(url: str, body: dict, timeout: float = 1.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class Member:
    name: str
    data_dir: Path
    log_path: Path
    client_port: int
    peer_port: int
    proc: subprocess.Popen[bytes] | None = None
    frozen: bool = False
    args: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 0.5) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=timeout) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def status(self) -> dict:
        """/v3/maintenance/status: `header.member_id` is this member, `leader` the one it follows."""
        return _post(self.endpoint + "/v3/maintenance/status", {})


class EtcdCluster:
    """`size` members (1 or 3) under `root`; `endpoints` in member order."""

    def __init__(self, root: Path, size: int = 1) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.members = [Member(f"m{i}", root / f"m{i}.etcd", root / f"m{i}.log", 0, 0) for i in range(size)]
        self._choose_ports()

    def _choose_ports(self) -> None:
        """Fresh free ports for every member, and the command lines that name them: the ports are
        in each member's flags and in the initial cluster, so a new port means new flags for all."""
        for m in self.members:
            m.client_port, m.peer_port = free_port(), free_port()
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.args = [
                ETCD,
                "--name", m.name,
                "--data-dir", str(m.data_dir),
                "--listen-client-urls", m.endpoint,
                "--advertise-client-urls", m.endpoint,
                "--listen-peer-urls", m.peer_url,
                "--initial-advertise-peer-urls", m.peer_url,
                "--initial-cluster", initial,
                "--initial-cluster-token", f"ringlog-test-{self.root.name}",
                "--initial-cluster-state", "new",
                "--heartbeat-interval", str(HEARTBEAT_MS),
                "--election-timeout", str(ELECTION_MS),
                "--experimental-watch-progress-notify-interval", "1s",
                "--logger", "zap",
                "--log-outputs", "stderr",
                "--log-level", "warn",
            ]  # fmt: skip

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self, attempts: int = 5) -> EtcdCluster:
        """Start every member on its ports. A free port is only free when it is picked: another
        process (a parallel test worker) can bind it before etcd does, and etcd then exits with
        "address already in use". The cluster is new, so it is started again from nothing on
        fresh ports; any other failure is raised at once."""
        for attempt in range(attempts):
            for m in self.members:
                self._spawn(m)
            try:
                self.wait_healthy()
                return self
            except RuntimeError:
                if attempt == attempts - 1 or not self._lost_a_port():
                    raise
            self.close()
            for m in self.members:
                shutil.rmtree(m.data_dir, ignore_errors=True)
                m.log_path.unlink(missing_ok=True)
            self._choose_ports()
        raise AssertionError("unreachable")

    def _lost_a_port(self) -> bool:
        return any(
            m.log_path.exists() and "address already in use" in m.log_path.read_text(errors="replace")
            for m in self.members
        )

    def _spawn(self, m: Member) -> None:
        with open(m.log_path, "ab") as log:
            m.proc = subprocess.Popen(m.args, stdout=log, stderr=log, cwd=self.root)
        m.frozen = False

    def wait_healthy(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [m for m in self.members if m.running() and not m.frozen]
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None and m.proc.returncode not in (0, -9, -15):
                    raise RuntimeError(f"etcd {m.name} exited with {m.proc.returncode}:\n{self.logs()}")
            if live and all(m.healthy() for m in live):
                return
            time.sleep(0.05)
        raise RuntimeError(f"etcd not healthy within {timeout} s:\n{self.logs()}")

    def leader(self) -> int:
        """The index of the member that leads raft now, from a live member's status."""
        for m in self.members:
            if m.running() and not m.frozen:
                with contextlib.suppress(OSError, ValueError):
                    lead = m.status()["leader"]
                    for i, other in enumerate(self.members):
                        if other.running() and other.status()["header"]["member_id"] == lead:
                            return i
        raise RuntimeError("no member knows a leader")

    def kill(self, i: int) -> None:
        m = self.members[i]
        assert m.proc is not None
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait(10)
        m.frozen = False

    def stop(self, i: int) -> None:
        m = self.members[i]
        assert m.proc is not None
        m.proc.send_signal(signal.SIGTERM)
        try:
            m.proc.wait(10)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait()

    def freeze(self, i: int) -> None:
        m = self.members[i]
        assert m.proc is not None
        m.proc.send_signal(signal.SIGSTOP)
        m.frozen = True
        # SIGSTOP returns before every thread has stopped: wait until each one has, so nothing a
        # test sends after this is read by a thread still running
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _all_threads_stopped(m.proc.pid):
            time.sleep(0.001)

    def thaw(self, i: int) -> None:
        m = self.members[i]
        assert m.proc is not None
        m.proc.send_signal(signal.SIGCONT)
        m.frozen = False

    def restart(self, i: int, healthy: bool = True) -> None:
        """Start member `i` again on its ports and data dir (it must not be running)."""
        assert not self.members[i].running()
        self._spawn(self.members[i])
        if healthy:
            self.wait_healthy()

    def close(self) -> None:
        for m in self.members:
            if m.running():
                assert m.proc is not None
                m.proc.send_signal(signal.SIGKILL)  # a frozen process dies of SIGKILL too
                m.proc.wait(10)

    def logs(self) -> str:
        return "\n".join(
            f"--- {m.name}\n{m.log_path.read_text(errors='replace')[-3000:]}"
            for m in self.members
            if m.log_path.exists()
        )
