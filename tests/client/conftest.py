"""Fixtures: a real `broker serve` subprocess per test (stopped with SIGTERM, exit status 0)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clientbroker import Broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "data", tmp_path / "broker.log").start()
    yield b
    assert b.proc is not None
    if b.proc.poll() is None:
        assert b.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{b.log()}"
