"""Real etcd for the cluster tests (tests/cluster/etcdproc.py): one member shared by a module, and
a factory for clusters a test may break. Every member started is killed at teardown, pass or fail."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from etcdproc import ETCD, EtcdCluster


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
