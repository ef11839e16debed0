"""Fixtures shared by the integration tests: a real `broker serve` subprocess per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire

# Every integration test runs against each backend with one core and with two: the backends must
# pass the same suite, and two cores put forwarding and the shared topic registry under all of it.
# (With two cores a raw `Wire` to the public port lands on either core: the kernel's reuseport
# hash picks, and the broker forwards what the other core owns.)
CONFIGURATIONS = [
    pytest.param({"cores": cores, "backend": backend}, id=f"{backend}-{cores}core")
    for backend in ("uvloop", "io_uring")
    for cores in (1, 2)
]


@pytest.fixture(params=CONFIGURATIONS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    """Started on a free port; stopped with SIGTERM at teardown, which must exit 0.

    Runs each test once per entry of CONFIGURATIONS, unless the test parametrizes it indirectly,
    e.g. `@pytest.mark.parametrize("broker", [{"cores": 2, "backend": "uvloop"}], indirect=True)`
    (an "extra" entry adds `broker serve` arguments).
    """
    options = getattr(request, "param", {})
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        cores=options.get("cores", 1),
        backend=options.get("backend", "uvloop"),
        # a group's first join waits this long for more members (Kafka's default is 3 s)
        extra=("--group-initial-rebalance-delay-ms", "100", *options.get("extra", ())),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


@pytest.fixture
def wire(broker: BrokerProcess) -> Iterator[Wire]:
    w = Wire(broker.port)
    yield w
    w.close()
