"""The stream processors of tests/apps on a three-node cluster (three `broker serve --etcd` on
loopback, a real etcd): the same apps and checks as on one node, the bootstrap naming every node,
so the frameworks' topics, groups and changelogs are spread over nodes whose leaders they must
find (Metadata), and the auto-created topics get the cluster's replication."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_bytewax import check_bytewax_copy
from test_faust import check_faust_table
from test_quixstreams import check_quix_counter

from labkit.brokerproc import BrokerProcess, free_udp_port, membership_key_file, wait_for
from labkit.etcdproc import ETCD, EtcdCluster


class ThreeNodes:
    def __init__(self, root: Path, etcd_endpoints: list[str]) -> None:
        ports = [free_udp_port() for _ in range(3)]
        seeds = ",".join(f"127.0.0.1:{p}" for p in ports)
        self.nodes = [
            BrokerProcess(
                root / f"node{i}",
                root / f"node{i}.log",
                (
                    "--node-id",
                    str(i),
                    "--etcd",
                    ",".join(etcd_endpoints),
                    "--cluster-name",
                    "apps",
                    "--membership-port",
                    str(ports[i - 1]),
                    "--join",
                    seeds,
                    "--ebpf",
                    "off",
                    "--membership-key-file",
                    str(membership_key_file(root)),
                ),
            )
            for i in (1, 2, 3)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def logs(self) -> str:
        return "\n".join(f"node{i}:\n{n.log_tail(20)}" for i, n in enumerate(self.nodes, 1))

    def live(self) -> bool:
        views = [json.loads((n.data_dir / "run" / "cluster.json").read_text()) for n in self.nodes]
        return all(sorted(v["live"]) == [1, 2, 3] for v in views)


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[ThreeNodes]:
    if shutil.which(ETCD) is None:
        pytest.skip("no etcd binary (scripts/setup.sh installs Debian's etcd-server)")
    etcd = EtcdCluster(tmp_path / "etcd", 1).start()
    cluster = ThreeNodes(tmp_path / "cluster", etcd.endpoints)
    try:
        for node in cluster.nodes:
            node.start()
        wait_for(cluster.live)
        yield cluster
    finally:
        for node in cluster.nodes:
            if node.running():
                node.kill()
        etcd.close()


@pytest.mark.parametrize("check", [check_quix_counter, check_faust_table, check_bytewax_copy])
def test_app_on_three_nodes(check, three_nodes: ThreeNodes, tmp_path: Path) -> None:
    check(three_nodes.bootstrap, tmp_path / "app", three_nodes.logs)
