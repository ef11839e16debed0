"""Fixtures shared by the integration tests: a real `broker serve` subprocess per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """Started on a free port; stopped with SIGTERM at teardown, which must exit 0.

    One uvloop core unless parametrized indirectly, e.g.
    `@pytest.mark.parametrize("broker", [{"cores": 2, "backend": "uvloop"}], indirect=True)`.
    """
    options = getattr(request, "param", {})
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        cores=options.get("cores", 1),
        backend=options.get("backend", "uvloop"),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    w = Wire(broker.port)
    yield w
    w.close()
