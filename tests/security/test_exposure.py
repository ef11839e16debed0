"""Safe defaults off loopback: `broker serve --host` with an address other machines can reach,
without TLS or SASL, refuses to start and says why, unless `--allow-plaintext` (then it warns at
start, as it does about PLAIN without TLS there); a wildcard address needs `--advertised-host`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.security.exposure import is_loopback_only
from labkit.brokerproc import BrokerProcess, Wire


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


EXPOSED = ("--host", "0.0.0.0", "--advertised-host", "127.0.0.1")


def test_allow_plaintext_serves_beyond_loopback_and_warns(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "d", tmp_path / "broker.log", extra=(*EXPOSED, "--allow-plaintext")
    ).start()
    try:
        w = Wire(broker.port)  # 127.0.0.1 is one of "every interface"
        assert w.create_topic("t", 1) >= 1
        w.close()
        assert "level=warning" in broker.log() and "in plaintext with no authentication" in broker.log()
    finally:
        broker.stop()


def test_plain_without_tls_beyond_loopback_is_warned_about(tmp_path: Path) -> None:
    plain = ("--sasl-mechanisms", "PLAIN", "--sasl-plain-without-tls")
    broker = BrokerProcess(tmp_path / "d", tmp_path / "broker.log", extra=(*EXPOSED, *plain)).start()
    try:
        assert "level=warning" in broker.log() and "passwords cross the network in the clear" in broker.log()
    finally:
        broker.stop()


def test_wildcard_host_needs_an_advertised_host(tmp_path: Path) -> None:
    """Metadata would send clients to 0.0.0.0: refused at start, as Kafka refuses it in
    advertised.listeners."""
    for host in ("0.0.0.0", "::"):
        argv = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d")]
        argv += ["--host", host, "--allow-plaintext", "--port", "0", "--cores", "1"]
        try:
            done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired as exc:  # it served (its workers stop with it)
            raise AssertionError(f"--host {host} without --advertised-host was served") from exc
        assert done.returncode == 2 and "--advertised-host" in done.stderr, done.stderr
        assert not (tmp_path / "d").exists()  # refused before touching anything


@pytest.mark.parametrize(
    ("extra", "env", "says"),
    [
        (("--etcd", "127.0.0.1:1", "--sasl-mechanisms", "SCRAM-SHA-512"), {}, "give --inter-broker-user"),
        (("--inter-broker-user", "broker"), {}, "--inter-broker-user is for a cluster (--etcd) with SASL"),
        (
            ("--etcd", "127.0.0.1:1", "--sasl-mechanisms", "SCRAM-SHA-512", "--inter-broker-user", "broker"),
            {"RINGLOG_INTER_BROKER_PASSWORD": ""},
            "--inter-broker-user needs its password",
        ),
        (
            ("--etcd", "127.0.0.1:1", "--sasl-mechanisms", "PLAIN", "--inter-broker-user", "broker"),
            {"RINGLOG_INTER_BROKER_PASSWORD": "pw"},
            "offers none of them here",  # PLAIN without TLS is not offered: nothing to log in with
        ),
    ],
    ids=["no inter-broker user", "not a cluster", "no password", "no mechanism to log in with"],
)
def test_a_cluster_with_sasl_needs_an_inter_broker_login(
    tmp_path: Path, extra: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    """Refused at start, before anything is reached: a node that could not log in to its peers
    would replicate nothing."""
    argv = [
        sys.executable,
        "-m",
        "broker.cli",
        "serve",
        "--data-dir",
        str(tmp_path / "d"),
        "--node-id",
        "1",
        *extra,
    ]
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert done.returncode == 2 and says in done.stderr, done.stderr
