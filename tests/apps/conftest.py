"""The broker each app test runs against: a real `broker serve`, one core, on each backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess

# A group's first join waits this long for more members (Kafka's default is 3 s), as in
# tests/conftest.py's brokers: each app's group is one member, which would wait the 3 s for nobody.
GROUP_DELAY = ("--group-initial-rebalance-delay-ms", "100")


@pytest.fixture(params=["uvloop", "io_uring"])
def app_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", GROUP_DELAY, backend=request.param
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


@pytest.fixture(params=["uvloop", "io_uring"])
def eos_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """`app_broker` whose coordinator looks for timed-out transactions every 0.5 s, not Kafka's
    10 s: a killed exactly-once app's open transaction is aborted soon after its timeout."""
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        ("--transaction-abort-interval-ms", "500", *GROUP_DELAY),
        backend=request.param,
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"
