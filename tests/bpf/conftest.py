"""Fixtures for the root-required eBPF tests: a network namespace with a veth pair, and a
`broker serve` running inside it. Everything is torn down even when a test fails."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bpf import kernel, state

REASON = kernel.ebpf_unavailable()
READY_RE = re.compile(r"serving on [\d.]+:(\d+)")


class NsBroker:
    """`broker serve` inside a namespace, listening on its veth address."""

    def __init__(self, lab, data_dir: Path, log_path: Path, extra: tuple[str, ...], cores: int = 2) -> None:
        self.lab = lab
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra = extra
        self.cores = cores
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def host(self) -> str:
        return self.lab.ns_ip

    @property
    def bootstrap(self) -> str:
        return f"{self.lab.ns_ip}:{self.port}"

    def start(self) -> NsBroker:
        args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(self.data_dir)]
        args += ["--host", self.lab.ns_ip, "--port", "0", "--cores", str(self.cores), "--oversubscribe"]
        args += ["--backend", "uvloop", *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = self.lab.popen(args, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
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

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def bpf(self) -> dict | None:
        return state.read(str(self.data_dir))


@pytest.fixture
def lab():
    if REASON is not None:
        pytest.skip(f"eBPF tests need root and bcc: {REASON}")
    from bpf.netlab import Netns

    ns = Netns()
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture
def ns_broker(lab, tmp_path):
    """A factory: `ns_broker(*flags)` starts a broker in `lab`; all are stopped at teardown."""
    made: list[NsBroker] = []

    def start(*extra: str, cores: int = 2) -> NsBroker:
        b = NsBroker(lab, tmp_path / f"data{len(made)}", tmp_path / f"broker{len(made)}.log", extra, cores)
        made.append(b)
        return b.start()

    try:
        yield start
    finally:
        for b in made:
            if b.proc is not None:
                b.stop()
