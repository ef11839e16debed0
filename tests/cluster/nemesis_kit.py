"""What the two files of the nemesis suite share (test_nemesis.py, test_nemesis_restarts.py): the
bounds, the three-node lab their one-node faults run on, a fresh topic per fault, the judging of a
workload and the interruption of leaders. Two files, each on a lab of its own, so that pytest-xdist's
two workers (`--dist loadfile`) share the suite rather than one worker running all of it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit.clusterchecker import report, spread
from labkit.clusterlab import ClusterLab
from labkit.nemesisload import (
    Workload,
    create_topic,
    describe,
    leader_of,
    node_id,
    start_cluster,
    wait_new_leader,
    wait_whole,
)

# 20 for the figures; each round is a kill, a failover, a restart and a rejoin (~7 s here)
# 6 rounds in the suite (each partition's leader killed twice: ~45 s); the figures of
# docs/CLUSTER.md are NEMESIS_KILL_ROUNDS=20 runs
KILL_ROUNDS = int(os.environ.get("NEMESIS_KILL_ROUNDS", "6"))
PAUSE_S = 5.0  # past the 2 s session TTL
ISOLATE_S = 5.0
ETCD_WATCH_S = 5.0  # the produce gap is measured over this long after the etcd leader dies
ETCD_DOWN_S = 5.0  # an etcd outage shorter than the session lease
ETCD_AFTER_S = 3.0  # acks watched this long after etcd is back
# Leaders keep serving while etcd is away: the gap is a stall, not a failover. Quiet runs show
# 0.14-0.16 s and a node that fences itself 4.1-6.2 s; a machine loaded seven deep once showed
# 1.01 s, so the bound sits between the two, not at the quiet figure.
ETCD_GAP_MAX_S = 2.0
# A bound that catches a stuck failover, not the goal (3 s, see CLUSTER.md). An isolation of 5 s
# takes 8.1 s (docs/CLUSTER.md says why); a loaded CI run once gave 12.1 s for one of its two
# partitions (the other 8.1), about one more client request timeout (3 s), not reproduced alone,
# with two CPUs kept busy beside it, or in the file's order of that run (8.1 s each time).
FAILOVER_MAX_S = 14.0
# A graceful stop's produce gap on the partitions it led: a bound that catches a stop that does not
# move leaderships first (8-10 s before), not the goal (~0.1 s, docs/CLUSTER.md); a loaded 2-CPU
# machine running the suite's other worker beside it gave 1.3 s once.
STOP_GAP_MAX_S = 2.0
STOP_WATCH_S = 2.0
# rounds of the four transaction faults: 1 in the suite (~30 s), more to hunt (NEMESIS_TXN_ROUNDS)
TXN_ROUNDS = int(
    os.environ.get("NEMESIS_TXN_ROUNDS", "1")
)  # the gap is measured from the SIGTERM to this long after the node exited
_topics = itertools.count()


@contextmanager
def open_lab(base_dir: Path) -> Iterator[ClusterLab]:
    """Three clustered nodes and one etcd member, for a module's tests of one-node faults (each
    leaves every node running, resumed and healed)."""
    lab = ClusterLab(nodes=3, etcd_members=1, base_dir=base_dir)
    try:
        start_cluster(lab)
        yield lab
    finally:
        lab.close()


def restore(lab: ClusterLab) -> None:
    """Every node running, resumed and reachable again: what each test of a shared lab leaves,
    made so after one that failed midway (a node it killed, paused or cut off), so that the
    module's next test meets a whole cluster instead of failing for this one's fault."""
    lab.heal_all()
    for j, member in enumerate(lab.etcd):
        if not member.running():
            lab.restart_etcd(j)
    for i, node in enumerate(lab.nodes):
        if node.proc is not None and node.proc.paused and node.running():
            lab.resume(i)
        if not node.running():
            lab.restart(i)


def topic(lab: ClusterLab) -> str:
    name = f"nemesis{next(_topics)}"
    create_topic(lab, name)
    return name


def led_by(lab: ClusterLab, name: str, index: int) -> list[int]:
    """The partitions node `index` leads."""
    return [p.partition for p in describe(lab, name).partitions if p.leader_node == node_id(index)]


def finish(w: Workload, what: str, failovers: list[float], extra: str = "") -> None:
    """Stop the workload, judge the run, print its summary line."""
    w.stop()
    verdict = w.verdict()
    unread = w.unread()
    kinds = Counter(v.kind for v in verdict.violations)
    kafka_acks = sum(a.producer == "kafka" for a in w.acks) + len(w.offsetless)
    print(
        f"\nNEMESIS {what}: failover {spread(failovers)}; {verdict.acks} acked ({kafka_acks} by the "
        f"Kafka producer, {len(w.offsetless)} of them without an offset), {verdict.reads} read, "
        f"{len(verdict.violations)} violations "
        f"({kinds['lost']} lost, {kinds['duplicated']} duplicated, {kinds['reordered']} reordered)"
        f"{extra}; consumer restarts {len(w.consumer_failures)}"
    )
    assert verdict.violations == [], report(verdict.violations)
    assert not any(unread.values()), (
        f"acknowledged records never read, per consumer: {unread}; "
        f"consumer failures {w.consumer_failures[:3]}"
    )
    assert not [e for e in w.errors if not isinstance(e, TimeoutError)], w.errors[:5]


def interrupt_leaders(
    lab: ClusterLab,
    tag: str,
    partitions: tuple[int, ...],
    fault: Callable[[int], None],
    undo: Callable[[int], None],
    seconds: float,
) -> tuple[Workload, list[float], list[float]]:
    """Take the leader of each partition away with `fault` for `seconds`, then `undo` it: a new
    leader is elected meanwhile, and the node comes back as a follower (truncating what diverged,
    catching up, rejoining every ISR). Returns the workload, the failovers and the elections."""
    name = topic(lab)
    failovers: list[float] = []
    elections: list[float] = []
    with Workload(lab, name, tag=tag) as w:
        w.wait_acked(200)
        for partition in partitions:
            victim, epoch = leader_of(lab, name, partition)
            hit = led_by(lab, name, victim)
            fault(victim)
            fault_at = lab.last_fault()
            try:
                elections.append(wait_new_leader(lab, name, partition, victim, fault_at))
                failovers.append(w.wait_failover(fault_at, hit))
                new, new_epoch = leader_of(lab, name, partition)
                assert new != victim and new_epoch > epoch
                time.sleep(max(0.0, fault_at + seconds - time.monotonic()))
            finally:
                undo(victim)
            wait_whole(lab, name)
            w.wait_acked(50)
    assert max(failovers) < FAILOVER_MAX_S, failovers
    return w, failovers, elections
