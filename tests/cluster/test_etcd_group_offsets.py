"""A cluster's group offsets in etcd (broker/cluster/group_offsets.py) keep transactional
offsets pending as the single-node file does: the same document, read and replaced whole, so a
new coordinator (another store on the same etcd) sees what the old one left pending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.cluster.group_offsets import StoreGroupOffsets
from broker.cluster.records import Keys
from broker.cluster.store import EtcdStore
from broker.core.groups import Committed, StaleProducerEpoch, doc_to_json
from labkit.etcdproc import EtcdCluster


def stores(etcd: EtcdCluster, tmp_path: Path, cluster: str) -> tuple[StoreGroupOffsets, StoreGroupOffsets]:
    keys = Keys(cluster)
    return (
        StoreGroupOffsets(EtcdStore(etcd.endpoints), keys, str(tmp_path / "a")),
        StoreGroupOffsets(EtcdStore(etcd.endpoints), keys, str(tmp_path / "b")),
    )


def test_pending_offsets_outlive_their_coordinator_and_complete_on_the_next(
    etcd: EtcdCluster, tmp_path: Path
) -> None:
    old, new = stores(etcd, tmp_path, "txn-go1")
    old.commit("g", {(1, 0): Committed(3, "")})
    old.commit_pending("g", 7, 0, {(1, 0): Committed(10, "t"), (1, 1): Committed(11, "")})
    old.commit_pending("g", 8, 1, {(1, 2): Committed(12, "")})
    assert new.offsets("g") == {(1, 0): (3, "")}
    assert new.pending_for("g", [(1, 0), (1, 1), (1, 2), (1, 3)]) == {(1, 0), (1, 1), (1, 2)}
    with pytest.raises(StaleProducerEpoch):
        new.commit_pending("g", 8, 0, {(1, 2): Committed(99, "")})
    new.commit("g", {(1, 1): Committed(50, "plain")})  # after the pending one: it stays
    assert new.complete_pending("g", 7, commit=True)
    assert new.complete_pending("g", 8, commit=False)
    assert not new.complete_pending("g", 8, commit=False)
    assert old.offsets("g") == {(1, 0): (10, "t"), (1, 1): (50, "plain")}
    assert old.pending_for("g", [(1, 0), (1, 1), (1, 2)]) == set()
    kv = old.store.get(Keys("txn-go1").group("g"))
    assert kv is not None
    assert json.loads(kv.value) == {"group": "g", "offsets": [[1, 0, 10, "t"], [1, 1, 50, "plain"]]}


def test_the_document_is_the_files_and_deletion_drops_pending_ones(etcd: EtcdCluster, tmp_path: Path) -> None:
    store, _ = stores(etcd, tmp_path, "txn-go2")
    store.commit_pending("g", 7, 2, {(1, 0): Committed(10, ""), (2, 0): Committed(20, "")})
    kv = store.store.get(Keys("txn-go2").group("g"))
    assert kv is not None
    assert json.loads(kv.value) == doc_to_json("g", store.load_doc("g"))
    assert store.has_offsets("g")  # pending offsets count, as Kafka's hasOffsets
    store.delete_offsets("g", [(1, 0)])
    assert store.pending_for("g", [(1, 0), (2, 0)]) == {(2, 0)}
    store.delete_offsets("g", [(2, 0)])
    assert store.store.get(Keys("txn-go2").group("g")) is None  # nothing left: the key goes
    store.commit_pending("g", 7, 2, {(1, 0): Committed(10, "")})
    assert store.delete_group("g")
    assert not store.has_offsets("g")
