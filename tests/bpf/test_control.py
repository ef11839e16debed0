"""`broker serve --ebpf` on the host: auto as root, auto and on where bcc cannot be imported, the TFO sysctl
left alone unless asked, programs released at exit, and `broker stats` showing the counters."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bpf import kernel, plane, state, tfo
from broker.client.client import AsyncClient
from labkit.brokerproc import BrokerProcess

REASON = kernel.ebpf_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"eBPF tests need root and bcc: {REASON}")


def without_bcc(tmp_path: Path) -> dict[str, str]:
    """An environment in which `import bcc` fails, as on a machine without python3-bpfcc: a package
    named bcc that raises ImportError comes first on the path."""
    shadow = tmp_path / "shadow" / "bcc"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no python3-bpfcc here')\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}


def serve_args(data_dir: Path, *flags: str) -> list[str]:
    args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(data_dir), "--port", "0"]
    return [*args, "--cores", "2", "--oversubscribe", "--backend", "uvloop", *flags]


def test_ebpf_on_without_bcc_fails_fast_with_the_reason(tmp_path: Path) -> None:
    proc = subprocess.run(
        serve_args(tmp_path / "data", "--ebpf", "on"),
        env=without_bcc(tmp_path),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 1
    assert "--ebpf on: bcc is not importable (no python3-bpfcc here)" in proc.stderr


def test_ebpf_auto_without_bcc_says_why_once_and_forwards(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            serve_args(tmp_path / "data"), env=without_bcc(tmp_path), stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 20
        while "serving on" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        text = log.read_text()
        assert "serving on" in text, text
        assert text.count("eBPF not loaded: bcc is not importable") == 1
        assert not state.steering_on(str(tmp_path / "data"))
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0


def test_auto_as_root_steers_leaves_the_sysctl_and_releases_at_exit(tmp_path: Path) -> None:
    before = tfo.read()
    b = BrokerProcess(tmp_path / "data", tmp_path / "log", cores=2).start()
    try:
        doc = state.read(str(b.data_dir))
        assert doc is not None and doc["steering"] and doc["live_cores"] == [0, 1]
        assert doc["payload_steering"] == bool(before & tfo.TFO_SERVER_ENABLE)
        assert tfo.read() == before

        import asyncio

        async def meta() -> bool:
            async with AsyncClient(b.bootstrap) as c:
                return (await c.refresh_metadata()).steering

        assert asyncio.run(meta())
        out = subprocess.run(
            [sys.executable, "-m", "broker.cli", "stats", "-b", b.bootstrap, "--data-dir", str(b.data_dir)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "ebpf steering: on" in out and "by_port" in out, out
    finally:
        assert b.stop() == 0
    assert tfo.read() == before
    final = state.read(str(b.data_dir))
    assert final is not None and final["steering"] is False


def broker_stats(b: BrokerProcess) -> str:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "stats", "-b", b.bootstrap],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_auto_with_one_core_loads_nothing_and_says_why(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", tmp_path / "log", cores=1).start()
    try:
        doc = state.read(str(b.data_dir))
        assert doc is not None and not doc["steering"] and doc["reason"] == plane.ONE_CORE_REASON
        assert kernel.bpf_fd_ids(b.pid)["prog_id"] == set()  # nothing compiled, nothing held
        assert f"eBPF steering not loaded: {plane.ONE_CORE_REASON} (--ebpf on loads it anyway)" in b.log()
        assert f"ebpf steering: off ({plane.ONE_CORE_REASON})" in broker_stats(b)
    finally:
        assert b.stop() == 0


def test_ebpf_on_with_one_core_loads_the_program_and_counts(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", tmp_path / "log", ("--ebpf", "on"), cores=1).start()
    try:
        doc = state.read(str(b.data_dir))
        assert doc is not None and doc["steering"] and doc["live_cores"] == [0]
        assert kernel.bpf_fd_ids(b.pid)["prog_id"]
        assert "ebpf steering: on" in broker_stats(b)
    finally:
        assert b.stop() == 0


def test_tfo_sysctl_flag_sets_and_restores_in_a_namespace(lab, ns_broker) -> None:
    lab.run(["sysctl", "-qw", "net.ipv4.tcp_fastopen=1"])
    b = ns_broker("--tcp-fastopen-sysctl", cores=1)
    assert lab.sysctl("net.ipv4.tcp_fastopen") == "3"
    assert "restored at exit" in b.log()
    assert b.stop() == 0
    assert lab.sysctl("net.ipv4.tcp_fastopen") == "1"


XDP_ON_LO = """
import socket, sys
import pytest
from bpf import kernel
from bpf.xdp import XdpClassifier, attached_prog_id
from ringlog_proto import membership as wire

KEYRING = wire.Keyring([bytes(16)])
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    x = XdpClassifier("lo", port, [])
    try:
        assert x.attach("auto") == "generic"  # lo has no driver XDP
        assert attached_prog_id("lo") != 0
        second = XdpClassifier("lo", port, [])
        try:
            with pytest.raises(kernel.BpfError, match="cannot attach XDP to lo"):
                second.attach("generic")  # never replaces the program already there
        finally:
            second.close()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.sendto(wire.encode(wire.Packet(wire.PING, 1), KEYRING), ("127.0.0.1", port))
            c.sendto(b"RLMB\\x02" + bytes(34), ("127.0.0.1", port))  # 39 bytes: no room for the tag
        server.settimeout(2)
        assert wire.decode(server.recv(100), KEYRING).kind == wire.PING
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.recv(100)  # the malformed one never reached the socket
        counts = x.counters()
        assert counts["membership"] == 1 and counts["malformed_dropped"] == 1, counts
    finally:
        x.close()
    assert attached_prog_id("lo") == 0
print("ok")
"""


def test_xdp_generic_on_lo_counts_drops_and_detaches(lab) -> None:
    """On the `lo` of a throwaway namespace (never the host's: a test killed mid-way must not leave
    the machine's loopback behind XDP), run in that namespace."""
    assert lab.run([sys.executable, "-c", XDP_ON_LO]).strip().endswith("ok")
