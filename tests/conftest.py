"""Fixtures shared by the integration tests: a real `broker serve` subprocess per test."""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire

# `make test` runs two pytest-xdist workers, which share one kernel. A test marked `exclusive`
# changes something machine-wide that the other worker's tests would meet (io_uring_disabled=2
# refused the rings of a broker another test was starting: a failure of the other test, not of
# this one), so it runs while no other test does. Every test holds a shared flock on LOCK for
# its whole protocol (setup, call, teardown, so module fixtures made in its setup too); an
# exclusive one holds it exclusively. TURNSTILE keeps a stream of shared holders from starving
# an exclusive one: it is passed through before taking LOCK, and held by an exclusive test while
# it waits.
LOCK = Path(tempfile.gettempdir()) / "ringlog-tests.lock"
TURNSTILE = Path(tempfile.gettempdir()) / "ringlog-tests.turnstile"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    exclusive = item.get_closest_marker("exclusive") is not None
    with open(LOCK, "a") as lock, open(TURNSTILE, "a") as turnstile:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` shuffles the suite (pytest-randomly, before every other implementation of this
    hook): the tests of a module marked `written_order` go back to the order they are written in,
    in the places the shuffle gave them. Such a module is one scenario on one fixture (the nemesis:
    faults in turn on one cluster), not a set of independent tests."""
    places = [i for i, item in enumerate(items) if item.get_closest_marker("written_order") is not None]
    written = sorted((items[i] for i in places), key=lambda item: (item.location[0], item.location[1] or 0))
    for i, item in zip(places, written, strict=True):
        items[i] = item


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
