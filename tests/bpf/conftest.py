"""Fixtures for the root-required eBPF tests: a network namespace with a veth pair, and a
`broker serve` running inside it. Everything is torn down even when a test fails."""

from __future__ import annotations

import pytest

from bpf import kernel
from labkit.netlab import NsBroker

REASON = kernel.ebpf_unavailable()


@pytest.fixture
def lab():
    if REASON is not None:
        pytest.skip(f"eBPF tests need root and bcc: {REASON}")
    from labkit.netlab import Netns

    ns = Netns()
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture
def ns_broker(lab, tmp_path):
    """A factory: `ns_broker(*flags)` starts a broker in `lab`; all are stopped at teardown."""
    made: list[NsBroker] = []

    def start(*extra: str, cores: int = 2) -> NsBroker:
        b = NsBroker(lab, tmp_path / f"data{len(made)}", tmp_path / f"broker{len(made)}.log", extra, cores)
        made.append(b)
        return b.start()

    try:
        yield start
    finally:
        for b in made:
            if b.proc is not None:
                b.stop()
