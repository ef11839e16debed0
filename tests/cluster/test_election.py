"""The controller election on a real etcd: one winner, resign hands over at once, a leader cut off
from etcd steps down before the other wins, a killed leader is replaced within TTL + margin, and
the fencing token refuses a deposed leader's writes, its partition writes included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.cluster.admin import ClusterAdmin
from broker.cluster.election import DEFAULT_TTL, Election, Leader, NotLeader
from broker.cluster.records import Keys
from broker.cluster.store import EtcdStore, Put
from broker.core.cluster_view import PartitionState
from labkit.etcdproc import EtcdCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stores(etcd: EtcdCluster) -> Iterator[list[EtcdStore]]:
    made = [EtcdStore(etcd.endpoints) for _ in range(2)]
    yield made
    for s in made:
        s.close()


class Campaigner:
    """`election.campaign()` on a thread of its own; when it won, on the monotonic clock."""

    def __init__(self, election: Election) -> None:
        self.election = election
        self.won_at: float | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.election.campaign(timeout=10)
            self.won_at = time.monotonic()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float) -> float:
        self.thread.join(timeout)
        assert self.won_at is not None, self.error
        return self.won_at


def test_two_contenders_one_wins_and_resign_hands_over_at_once(stores: list[EtcdStore]) -> None:
    key = "/ringlog/t1/controller"
    a = Election(stores[0], key, "node-a", ttl=1)
    b = Election(stores[1], key, "node-b", ttl=1)
    seen: list[Leader | None] = []
    watch = b.observe(seen.append)
    token = a.campaign(timeout=5)
    assert a.leading() and a.token == token
    with pytest.raises(TimeoutError):
        b.campaign(timeout=0.3)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t_stop = time.monotonic()
    assert b.campaign(stop=stop) is None  # the agent's way out of a campaign: its stop event
    assert time.monotonic() - t_stop < 0.2 + 0.15
    assert not b.leading()
    with pytest.raises(NotLeader):
        b.fence()
    assert b.leader() == Leader("node-a", token, a._lease.id)
    time.sleep(1.5)  # past the TTL: keepalives hold the lead
    assert a.leading() and a.leader().token == token

    waiting = Campaigner(b)
    time.sleep(0.2)
    t0 = time.monotonic()
    a.resign()
    assert not a.leading()
    handover = waiting.join(3) - t0
    assert b.leading() and b.token > token
    assert handover < 0.3, handover  # the watch wakes it: no TTL, no poll interval
    print(f"resign: handed over in {handover * 1000:.1f} ms")
    deadline = time.monotonic() + 3
    while len(seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [x.node_id if x else None for x in seen] == [None, "node-a", None, "node-b"]
    watch.cancel()
    a.close()
    b.close()
    assert b.leader() is None


def test_fencing_token_refuses_a_deposed_leaders_write(stores: list[EtcdStore]) -> None:
    key = "/ringlog/t2/controller"
    a = Election(stores[0], key, "node-a", ttl=1)
    b = Election(stores[1], key, "node-b", ttl=1)
    a.campaign(timeout=5)
    fence_a = a.fence()
    assert stores[0].txn([fence_a], [Put("/ringlog/t2/topics/x", "by a")]).succeeded
    stores[1].delete(key)  # an operator removes the key: a loses it, b takes over
    b.campaign(timeout=3)
    assert not stores[0].txn([fence_a], [Put("/ringlog/t2/topics/x", "late write by a")]).succeeded
    # a learns of the delete from its own watch, on another connection: b's campaign may be
    # answered first (it was, once in a CI run); until then the fence is what refuses a's writes.
    deadline = time.monotonic() + 2
    while a.leading() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not a.leading(), "the delete reached a's watch"
    assert stores[1].txn([b.fence()], [Put("/ringlog/t2/topics/x", "by b")]).succeeded
    assert stores[1].get("/ringlog/t2/topics/x").value == b"by b"
    a.close()
    b.close()


def test_cut_off_leader_steps_down_before_the_other_wins(etcd_cluster) -> None:
    cluster = etcd_cluster(3)
    follower = next(i for i in range(3) if i != cluster.leader())
    rest = [cluster.endpoints[i] for i in range(3) if i != follower]
    # a knows one member only, so freezing it cuts a off from etcd while the cluster goes on
    store_a = EtcdStore([cluster.endpoints[follower]], request_timeout=0.3)
    store_b = EtcdStore(rest)
    lost_at: list[float] = []
    key = "/ringlog/t3/controller"
    a = Election(store_a, key, "node-a", ttl=1, on_lost=lambda: lost_at.append(time.monotonic()))
    b = Election(store_b, key, "node-b", ttl=1)
    token_a = a.campaign(timeout=5)
    fence_a = a.fence()
    waiting = Campaigner(b)
    time.sleep(0.5)
    t0 = time.monotonic()
    cluster.freeze(follower)
    won_at = waiting.join(5)
    assert lost_at, "a never noticed"
    assert lost_at[0] < won_at, (lost_at[0] - t0, won_at - t0)
    assert lost_at[0] - t0 <= 0.75 + 0.1  # STEP_DOWN_AT of the 1 s TTL after the last keepalive sent
    assert won_at - t0 <= 1 + 0.5 + 0.5  # TTL + etcd's 500 ms expiry sweep + margin
    assert not a.leading() and b.leading() and b.token > token_a
    assert not store_b.txn([fence_a], [Put("/ringlog/t3/x", "a, deposed")]).succeeded
    assert store_b.txn([b.fence()], [Put("/ringlog/t3/x", "b")]).succeeded
    print(f"cut off: a stepped down {lost_at[0] - t0:.3f} s, b won {won_at - t0:.3f} s after the freeze")
    cluster.thaw(follower)
    a.close()
    b.close()
    store_a.close()
    store_b.close()


CONTENDER = """
import sys, time
from broker.cluster.election import Election
from broker.cluster.store import EtcdStore
e = Election(EtcdStore(sys.argv[1].split(",")), sys.argv[2], "node-dead")
print("leader", e.campaign(timeout=10), flush=True)
time.sleep(60)
"""


def test_killed_leader_is_replaced_within_default_ttl(etcd: EtcdCluster) -> None:
    key = "/ringlog/t4/controller"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTENDER, ",".join(etcd.endpoints), key], stdout=subprocess.PIPE, env=env
    )
    store = EtcdStore(etcd.endpoints)
    try:
        line = proc.stdout.readline().decode()
        assert line.startswith("leader"), line
        b = Election(store, key, "node-b")  # the default TTL, as in production
        assert b.leader().node_id == "node-dead"
        waiting = Campaigner(b)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.kill()
        failover = waiting.join(6) - t0
        assert failover <= 3.0, failover  # the ≤ 3 s failover of DEFAULT_TTL
        assert failover >= DEFAULT_TTL * 0.75 - 0.6  # not before the dead leader's lease could lapse
        assert b.leader().node_id == "node-b"
        print(f"killed leader (TTL {DEFAULT_TTL} s): replaced {failover:.3f} s after kill -9")
        b.close()
    finally:
        proc.kill()
        proc.wait()
        store.close()


def test_a_deposed_controller_moves_no_leader(stores: list[EtcdStore]) -> None:
    """The controller's partition writes carry its election's fence beside the partition's
    revision: a controller deposed while it decided writes nothing, even where no newer
    controller has written that partition since it read it."""
    keys = Keys("t3")
    a = Election(stores[0], keys.controller, "node-a", ttl=1)
    b = Election(stores[1], keys.controller, "node-b", ttl=1)
    admin = ClusterAdmin(stores[0], keys)
    key = keys.partition(7, 0)
    first = PartitionState(replicas=(1, 2, 3), leader=1, leader_epoch=0, isr=(1, 2, 3))
    stores[0].put(key, json.dumps(first.to_json()))
    a.campaign(timeout=5)
    fence_a = a.fence()
    read = stores[0].get(key)
    assert read is not None
    moved = PartitionState(replicas=(1, 2, 3), leader=2, leader_epoch=1, isr=(2, 3))
    stores[1].delete(keys.controller)  # a loses its key; b wins and has not touched the partition
    b.campaign(timeout=3)
    assert admin.write_state(7, 0, read.mod_revision, moved, fence=fence_a) is None
    assert PartitionState.from_json(json.loads(stores[0].get(key).value)) == first
    assert admin.write_state(7, 0, read.mod_revision, moved, fence=b.fence()) is not None
    assert PartitionState.from_json(json.loads(stores[0].get(key).value)) == moved
    a.close()
    b.close()
