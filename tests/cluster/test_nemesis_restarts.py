"""The nemesis suite's other half (test_nemesis.py describes the workload, the checker and the
faults): isolation of a leader from the network then heal, etcd's only member killed for 5 s then
started, a rolling restart, and kill -9 of etcd's raft leader (3 members) while producing; on a lab
of its own, so that pytest-xdist's two workers share the suite. Run with `pytest -s` to see each
fault's summary line.

Root-required (CI is root); skipped, with the reason, otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from nemesis_kit import (
    ETCD_AFTER_S,
    ETCD_DOWN_S,
    ETCD_GAP_MAX_S,
    ETCD_WATCH_S,
    FAILOVER_MAX_S,
    ISOLATE_S,
    finish,
    interrupt_leaders,
    open_lab,
    restore,
    topic,
)

from labkit.clusterchecker import report, spread
from labkit.clusterlab import ClusterLab, lab_unavailable, wait_until
from labkit.nemesisload import (
    Workload,
    describe,
    leader_of,
    node_id,
    start_cluster,
    wait_whole,
)

REASON = lab_unavailable()
# One scenario on one lab: its faults run in the order written here, whatever order pytest-randomly
# gives the rest of the suite (tests/conftest.py). Each fault still starts from a whole cluster.
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"{REASON}"), pytest.mark.written_order]


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterLab]:
    """Three clustered nodes and one etcd member, shared by this module's tests of one-node faults
    (each leaves every node running, resumed and healed)."""
    with open_lab(tmp_path_factory.mktemp("nemesis")) as lab:
        yield lab


@pytest.fixture
def lab(shared_lab: ClusterLab) -> Iterator[ClusterLab]:
    """The shared lab, made whole again after a test that failed midway (`restore`)."""
    yield shared_lab
    restore(shared_lab)


def test_isolate_the_leader_then_heal(lab: ClusterLab) -> None:
    w, failovers, elections = interrupt_leaders(lab, "isolate", (2, 0), lab.isolate, lab.heal, ISOLATE_S)
    finish(w, f"isolate leader {ISOLATE_S:.0f} s x2", failovers, f"; new leader {spread(elections)}")


def test_restart_etcd(lab: ClusterLab) -> None:
    """The only etcd member killed and started again `ETCD_DOWN_S` later: no leader, no ISR change
    and no group commit can happen meanwhile, and nothing needs one: every partition keeps
    acknowledging (CLUSTER.md, "While etcd is away"), and the group consumers' commits are
    answered retriably until etcd is back."""
    name = topic(lab)
    with Workload(lab, name, tag="etcdrestart") as w:
        w.wait_acked(200)
        lab.kill_etcd(0)
        fault_at = lab.last_fault()
        time.sleep(ETCD_DOWN_S)
        lab.restart_etcd(0)
        back_s = time.monotonic() - fault_at
        time.sleep(ETCD_AFTER_S)
        gap = w.longest_gap(fault_at, time.monotonic())
        wait_whole(lab, name)
        w.wait_acked(50)
    finish(
        w,
        f"etcd down {ETCD_DOWN_S:.0f} s (its only member killed, then started)",
        [gap],
        f"; longest ack gap {gap:.3f} s from the kill to {ETCD_AFTER_S:.0f} s after etcd was back "
        f"(back after {back_s:.2f} s)",
    )
    assert gap < ETCD_GAP_MAX_S, f"nothing acknowledged for {gap:.2f} s while etcd was away"


def test_rolling_restart(lab: ClusterLab) -> None:
    """Every node stopped gracefully (SIGTERM) and started again, one after the other, each back
    in every in-sync set before the next: an upgrade."""
    name = topic(lab)
    rejoins: list[float] = []
    with Workload(lab, name, tag="rolling") as w:
        w.wait_acked(200)
        started = time.monotonic()
        for i in range(len(lab.nodes)):
            lab.restart(i, graceful=True)
            rejoins.append(wait_whole(lab, name))
            w.wait_acked(50)
        gap = w.longest_gap(started, time.monotonic())
    assert gap < FAILOVER_MAX_S, f"nothing acknowledged for {gap:.2f} s during the rolling restart"
    finish(
        w,
        f"rolling restart of {len(lab.nodes)} nodes",
        [gap],
        f"; longest ack gap {gap:.2f} s; started to whole ISR {spread(rejoins)}",
    )


def test_kill_the_etcd_leader(cluster_lab) -> None:
    lab = cluster_lab(nodes=3, etcd_members=3)
    start_cluster(lab)
    name = topic(lab)
    with Workload(lab, name, tag="etcd") as w:
        w.wait_acked(200)
        etcd_leader = lab.wait_etcd_leader()
        lab.kill_etcd(etcd_leader)
        fault_at = lab.last_fault()
        # the data path does not need etcd: every partition keeps acknowledging
        resumed = w.wait_failover(fault_at, range(3))
        new = lab.wait_etcd_leader(10)
        elected_s = time.monotonic() - fault_at
        assert new != etcd_leader
        time.sleep(max(0.0, fault_at + ETCD_WATCH_S - time.monotonic()))
        gap = w.longest_gap(fault_at, fault_at + ETCD_WATCH_S)
        assert gap < FAILOVER_MAX_S, f"nothing acknowledged for {gap:.2f} s after the etcd leader died"
        # the control plane works on the new etcd leader: a topic is created, placed and served
        started = time.monotonic()
        later = topic(lab)
        created_s = time.monotonic() - started
        with Workload(lab, later, tag="after") as w2:
            w2.wait_acked(100)
        v2 = w2.verdict()
        assert v2.violations == [], report(v2.violations)
        # and a broker failover still happens through it
        victim, _ = leader_of(lab, name, 0)
        hit = [p.partition for p in describe(lab, name).partitions if p.leader_node == node_id(victim)]
        lab.kill(victim)
        broker_failover = w.wait_failover(lab.last_fault(), hit)
        lab.restart(victim)
        wait_until(lambda: lab.etcd_leader() is not None, 10, "etcd leader")
        wait_whole(lab, name)
        w.wait_acked(50)
    finish(
        w,
        "kill -9 etcd leader (3 members)",
        [resumed],
        f"; longest ack gap {gap:.3f} s in the {ETCD_WATCH_S:.0f} s after; "
        f"etcd leader again in {elected_s:.2f} s; "
        f"topic created after in {created_s:.2f} s; broker failover after {broker_failover:.2f} s",
    )
