"""What differs between the backends: choosing one, falling back, and real I/O errors through each.

The rest of the integration suite runs against every backend and core count through the
parametrized `broker` fixture (conftest.py); these tests need a machine-level change (a sysctl, a
full file system), so they run as root and skip with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import Record, encode_batch

IO_URING_DISABLED = Path("/proc/sys/kernel/io_uring_disabled")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a sysctl or a tmpfs mount)")


@contextlib.contextmanager
def io_uring_disabled() -> Iterator[None]:
    """io_uring off for new rings (value 2: disabled for everyone), restored whatever happens."""
    if not IO_URING_DISABLED.exists():
        pytest.skip(f"{IO_URING_DISABLED} does not exist on this kernel")
    old = IO_URING_DISABLED.read_text().strip()
    IO_URING_DISABLED.write_text("2")
    try:
        yield
    finally:
        IO_URING_DISABLED.write_text(old)


@needs_root
@pytest.mark.exclusive
def test_auto_falls_back_to_uvloop_with_a_log_line_when_rings_are_refused(tmp_path: Path) -> None:
    with io_uring_disabled():
        broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", backend="auto").start()
        try:
            w = Wire(broker.port)
            tid = w.create_topic("t")
            resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([Record(b"v")])))
            assert resp.error == m.ErrorCode.NONE
            w.close()
        finally:
            assert broker.stop() == 0
    text = broker.log()
    assert "io_uring unavailable" in text and "io_uring_disabled" in text, text
    assert "backend uvloop" in text and "backend io_uring" not in text, text


@needs_root
@pytest.mark.exclusive
def test_asking_for_io_uring_when_it_is_refused_is_a_clear_error(tmp_path: Path) -> None:
    with io_uring_disabled():
        proc = subprocess.run(
            [
                *(sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d")),
                *("--port", "0", "--cores", "1", "--backend", "io_uring"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode != 0
    assert "io_uring" in proc.stderr and "io_uring_disabled" in proc.stderr, proc.stderr


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def grow(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


@needs_root
@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_full_disk_refuses_the_produce_keeps_acknowledged_data_and_recovers(
    tmp_path: Path, backend: str
) -> None:
    """ENOSPC from the real file system, through the backend's own write path (the ring's writev
    or a pwritev): the failed produce gets OUT_OF_SPACE and leaves no trace, every acknowledged
    record reads back, and once there is space again the same partition takes writes.
    (`--min-free-bytes 0`: no free-space floor, so the write itself meets ENOSPC.)"""
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        broker = BrokerProcess(
            fs / "data", tmp_path / "broker.log", backend=backend, extra=("--min-free-bytes", "0")
        ).start()
        try:
            w = Wire(broker.port)
            tid = w.create_topic("t")
            acked: list[bytes] = []
            refused = None
            for i in range(200):
                value = bytes([i % 251]) * 60_000
                resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([value])))
                if resp.error != m.ErrorCode.NONE:
                    refused = resp
                    break
                acked.append(value)
            assert refused is not None, "the 2 MiB file system never filled"
            assert refused.error == m.ErrorCode.OUT_OF_SPACE, refused
            assert acked, "nothing was stored before the disk filled"
            stored = [r.value for r in w.fetch_all(tid, 0)]
            assert stored == acked  # the failed write left no partial batch behind
            grow(fs, "8m")  # the operator adds space; the broker was not restarted
            more = b"after" * 1000
            deadline = time.monotonic() + 10  # the broker looks at the free space once a second
            while True:
                resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.DURABLE, 1000, encode_batch([more])))
                if resp.error != m.ErrorCode.OUT_OF_SPACE or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert resp.error == m.ErrorCode.NONE, resp
            assert isinstance(resp, m.ProduceResponse) and resp.base_offset == len(acked)
            w.close()
        finally:
            assert broker.stop() == 0, broker.log()
        broker.start()  # recovery after the full-disk episode finds exactly what was acknowledged
        try:
            w = Wire(broker.port)
            assert [r.value for r in w.fetch_all(tid, 0)] == [*acked, more]
            w.close()
        finally:
            assert broker.stop() == 0
    assert f"backend {backend}" in broker.log()  # the backend asked for is the one that served
