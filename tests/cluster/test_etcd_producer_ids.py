"""Producer id blocks claimed from etcd: disjoint under concurrent claimers (the cores of several
nodes), and a late txn held by a frozen member never sets the counter back."""

from __future__ import annotations

import itertools
import json
import threading
import time

from broker.cluster.producer_ids import EtcdBlockSource
from broker.cluster.store import EtcdStore, Put, StoreUncertain, mod_revision_is
from broker.core.producer_ids import ProducerIds
from labkit.etcdproc import EtcdCluster


def test_concurrent_claimers_get_disjoint_blocks(etcd: EtcdCluster) -> None:
    key = "/ringlog/pid1/producer-ids"
    claimed: list[list[int]] = [[] for _ in range(4)]

    def claimer(i: int) -> None:
        store = EtcdStore(etcd.endpoints)
        source = EtcdBlockSource(store, key)
        for _ in range(15):
            claimed[i].append(source.claim_block(100))
        store.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    firsts = sorted(f for c in claimed for f in c)
    assert firsts == list(range(0, 6000, 100))  # every block once, none skipped without a failure
    ids = ProducerIds(EtcdBlockSource(EtcdStore(etcd.endpoints), key), block_size=10)
    assert [ids.new() for _ in range(12)] == [*range(6000, 6010), 6010, 6011]


def test_a_late_claim_held_by_a_frozen_member_never_sets_the_counter_back(etcd_cluster) -> None:
    cluster = etcd_cluster(3)
    follower = next(i for i in range(3) if i != cluster.leader())
    others = [cluster.endpoints[i] for i in range(3) if i != follower]
    key = "/ringlog/pid2/producer-ids"
    source = EtcdBlockSource(EtcdStore(others), key)
    assert source.claim_block(1000) == 0
    kv = source.store.get(key)
    # the claim's own txn, sent to a member that holds it (frozen) while the others go on
    cut_off = EtcdStore([cluster.endpoints[follower]], request_timeout=5)
    cluster.freeze(follower)
    late = json.dumps({"version": 1, "next_producer_id": 2000})
    outcome: list[object] = []

    def send_late() -> None:
        try:
            outcome.append(cut_off.txn([mod_revision_is(key, kv.mod_revision)], [Put(key, late)]))
        except StoreUncertain as exc:  # the member may drop the connection when it wakes: no answer
            outcome.append(exc)

    sender = threading.Thread(target=send_late)
    sender.start()
    time.sleep(0.2)
    claims = [source.claim_block(1000) for _ in range(3)]
    # A claim whose own txn went unanswered (a slow quorum on a busy machine) reads the counter
    # again and takes the next block: it may skip one, never reuse or go back.
    assert claims[0] >= 1000 and all(b - a >= 1000 for a, b in itertools.pairwise(claims)), claims
    cluster.thaw(follower)  # the member now reads the txn it held and applies it: its compare fails
    sender.join(10)
    [result] = outcome
    # Held past the claims (the case this test is for), the late txn changed nothing. It was
    # applied before them about once in 60 runs on a loaded machine (CI), its answer coming only
    # after the thaw; how it reached the leader first is not understood (freeze now waits for
    # every thread to stop). Its block is then its own: the claims start past it.
    if not isinstance(result, StoreUncertain) and result.succeeded:
        assert claims[0] >= 2000, (result, claims)
    assert json.loads(source.store.get(key).value)["next_producer_id"] == claims[-1] + 1000
    cut_off.close()
    source.store.close()
