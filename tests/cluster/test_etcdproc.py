"""The etcd the cluster tests run on: a port taken between its pick and etcd's bind (another test
worker's socket) costs a retry on fresh ports, not the test that asked for etcd."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from labkit import etcdproc
from labkit.etcdproc import ETCD, EtcdCluster


@pytest.mark.parametrize("size", [1, 3])
def test_a_port_taken_before_etcd_binds_it_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    if shutil.which(ETCD) is None:
        pytest.skip("no etcd binary (scripts/setup.sh installs Debian's etcd-server)")
    thief = socket.socket()
    thief.bind(("127.0.0.1", 0))
    thief.listen()
    taken = thief.getsockname()[1]
    picks = iter([taken])
    real = etcdproc.free_port
    # the first pick is the port another process has just bound; every later one is really free
    monkeypatch.setattr(etcdproc, "free_port", lambda: next(picks, None) or real())
    cluster = EtcdCluster(tmp_path / "etcd", size)
    try:
        assert cluster.members[0].client_port == taken
        cluster.start()
        assert all(m.client_port != taken for m in cluster.members)
        assert all(m.healthy() for m in cluster.members)
        assert "address already in use" not in cluster.logs()  # the failed try's logs are gone
    finally:
        cluster.close()
        thief.close()


def test_a_member_that_fails_for_another_reason_is_not_retried(tmp_path: Path) -> None:
    if shutil.which(ETCD) is None:
        pytest.skip("no etcd binary (scripts/setup.sh installs Debian's etcd-server)")
    cluster = EtcdCluster(tmp_path / "etcd", 1)
    cluster.members[0].args.append("--no-such-flag")
    first_port = cluster.members[0].client_port
    try:
        with pytest.raises(RuntimeError, match="exited with"):
            cluster.start()
        assert cluster.members[0].client_port == first_port
    finally:
        cluster.close()
