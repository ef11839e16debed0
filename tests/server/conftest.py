"""Fixtures: a real `broker serve` subprocess per test, and a wire connection to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", tmp_path / "broker.log").start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        assert proc.stop() == 0, proc.log()


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    w = Wire(broker.port)
    yield w
    w.close()
