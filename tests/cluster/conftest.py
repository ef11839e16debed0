"""Fixtures for the cluster lab (tests/clusterlab.py): namespaces on a bridge, etcd and brokers in
them. Root-required (CI is root): skipped, with the reason, without root, etcd or iproute2's
`bridge`. Everything a lab made is removed at teardown even when the test fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from clusterlab import lab_unavailable

LAB_REASON = lab_unavailable()


@pytest.fixture
def cluster_lab(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """A factory: `cluster_lab(nodes=3, etcd_members=1, cores=1)` makes a ClusterLab whose
    broker data and logs live under tmp_path; every lab made is closed at teardown."""
    if LAB_REASON is not None:
        pytest.skip(LAB_REASON)
    from clusterlab import ClusterLab

    made: list[ClusterLab] = []

    def make(nodes: int = 3, etcd_members: int = 1, **kw: object) -> ClusterLab:
        base = tmp_path / f"lab{len(made)}"
        base.mkdir()
        lab = ClusterLab(nodes, etcd_members, base_dir=base, **kw)  # type: ignore[arg-type]
        made.append(lab)
        return lab

    try:
        yield make
    finally:
        for lab in made:
            lab.close()
