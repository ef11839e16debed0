"""Safe defaults off loopback: `broker serve --host` with an address other machines can reach,
without TLS or SASL, refuses to start and says why, unless `--allow-plaintext`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire

from broker.security.exposure import is_loopback_only


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("192.0.2.7", False),
        ("no-such-host.invalid", False),
    ],
)
def test_loopback_only(host: str, loopback: bool) -> None:
    assert is_loopback_only(host) is loopback


def test_plaintext_beyond_loopback_is_refused(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d")]
    argv += ["--host", "0.0.0.0", "--port", "0", "--cores", "1"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--host 0.0.0.0 can be reached from other machines" in done.stderr
    assert "--allow-plaintext" in done.stderr
    assert not (tmp_path / "d").exists()  # refused before touching anything


def test_allow_plaintext_serves_beyond_loopback(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "d", tmp_path / "broker.log", extra=("--host", "0.0.0.0", "--allow-plaintext")
    ).start()
    try:
        w = Wire(broker.port)  # 127.0.0.1 is one of "every interface"
        assert w.create_topic("t", 1) >= 1
        w.close()
    finally:
        broker.stop()
