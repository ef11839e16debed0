"""Fixtures of the cluster tests, all on real things: etcd (labkit/etcdproc.py: one member
shared by a module, and a factory for clusters a test may break) and the cluster lab
(labkit/clusterlab.py: namespaces on a bridge, etcd and brokers in them; root-required, CI is root,
skipped with the reason without root, etcd or iproute2's `bridge`). Everything started is killed
and removed at teardown, pass or fail."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from labkit.clusterlab import lab_unavailable
from labkit.etcdproc import ETCD, EtcdCluster

LAB_REASON = lab_unavailable()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd member for the whole module: tests keep to keys of their own."""
    if shutil.which(ETCD) is None:
        pytest.skip("no etcd binary (scripts/setup.sh installs Debian's etcd-server)")
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"), 1)
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[Callable[[int], EtcdCluster]]:
    """`etcd_cluster(3)`: a fresh cluster of that many members, for a test that kills some."""
    if shutil.which(ETCD) is None:
        pytest.skip("no etcd binary (scripts/setup.sh installs Debian's etcd-server)")
    made: list[EtcdCluster] = []

    def make(size: int) -> EtcdCluster:
        cluster = EtcdCluster(tmp_path / f"etcd{len(made)}", size)
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()


@pytest.fixture
def cluster_lab(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """A factory: `cluster_lab(nodes=3, etcd_members=1, cores=1)` makes a ClusterLab whose
    broker data and logs live under tmp_path; every lab made is closed at teardown."""
    if LAB_REASON is not None:
        pytest.skip(LAB_REASON)
    from labkit.clusterlab import ClusterLab

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
