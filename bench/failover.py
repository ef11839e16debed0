"""Failover after kill -9, in the namespace lab: how long until a killed leader's partitions take
acknowledged produces again, and whether SWIM or the etcd lease declared the node dead.

Run (root, etcd installed): `.venv/bin/python bench/failover.py [--kills N] [--session-timeout-s S]`

What runs: labkit/clusterlab.py's three nodes (one core each, their own network namespaces and
addresses, the tests' cluster key) and one etcd member, the nemesis suite's workload
(labkit/nemesisload.py: a producer with acks=all sending every 2 ms to 3 partitions of 3 replicas,
and a consumer). Each round kills (SIGKILL, the whole process group) a node that leads a partition
(each such node in turn, and every other round the controller when it leads one), measures from
the kill:
- elected: until a live node describes another leader of that partition;
- failover: until the first acknowledged produce sent after the kill, on the slowest partition
  the victim led (what a client sees; clusterchecker.failover_time);
- by: "swim" when the controller logged that membership confirmed the victim dead (it then revoked
  the victim's lease), else "lease" (the lease expired first, or the victim was the controller,
  whose own role waits for its election lease).
then restarts the victim and waits until every in-sync set is whole again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from labkit.clusterlab import ClusterLab, lab_unavailable
from labkit.nemesisload import (
    Workload,
    cluster_args,
    create_topic,
    describe,
    node_id,
    wait_new_leader,
    wait_whole,
)

TOPIC = "failover"


def controller(lab: ClusterLab) -> int:
    """The controller's node id, as a live node's published view names it (0: none known)."""
    for node in lab.nodes:
        if node.running():
            try:
                return int(json.loads((node.data_dir / "run" / "cluster.json").read_text())["controller"])
            except (OSError, ValueError, KeyError):
                continue
    return 0


def confirmations(lab: ClusterLab, nid: int) -> int:
    return sum(node.log().count(f"membership confirms node {nid} dead") for node in lab.nodes)


def pct(xs: list[float]) -> str:
    if not xs:
        return "none"
    return f"p50 {statistics.median(xs):.2f} s, min {min(xs):.2f}, max {max(xs):.2f} (n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--session-timeout-s", type=int, default=2, help="the nodes' etcd lease TTL")
    args = ap.parse_args()
    reason = lab_unavailable()
    if reason is not None:
        print(f"failover: {reason}", file=sys.stderr)
        return 2
    rows: list[tuple[int, bool, str, float, float]] = []
    with ClusterLab(nodes=3, etcd_members=1) as lab:
        extra = ["--session-timeout-s", str(args.session_timeout_s)]
        lab.start_nodes(lambda i: [*cluster_args(lab, i), *extra])
        create_topic(lab, TOPIC)
        wait_whole(lab, TOPIC)
        with Workload(lab, TOPIC, tag="failover") as w:
            w.wait_acked(200)
            for k in range(args.kills):
                partitions = describe(lab, TOPIC).partitions
                leaders = sorted({p.leader_node for p in partitions})  # each node leading something in turn
                victim = leaders[k % len(leaders)] - 1
                if k % 2 == 0 and controller(lab) in leaders:  # every other round: the controller
                    victim = controller(lab) - 1
                hit = [p.partition for p in partitions if p.leader_node == node_id(victim)]
                was_controller = controller(lab) == node_id(victim)
                before = confirmations(lab, node_id(victim))
                lab.kill(victim)
                fault_at = lab.last_fault()
                elected = wait_new_leader(lab, TOPIC, hit[0], victim, fault_at)
                took = w.wait_failover(fault_at, hit)
                by = "swim" if confirmations(lab, node_id(victim)) > before else "lease"
                rows.append((node_id(victim), was_controller, by, elected, took))
                print(
                    f"kill {k + 1}: node {node_id(victim)}{' (controller)' if was_controller else ''}, "
                    f"partitions {hit}: elected {elected:.2f} s, failover {took:.2f} s, dead by {by}",
                    flush=True,
                )
                lab.restart(victim)
                wait_whole(lab, TOPIC)
                w.wait_acked(100)
        verdict = w.verdict()  # once the workload has stopped (the end of the with block)
    print(f"session lease {args.session_timeout_s} s; {len(rows)} kills")
    print(f"  checker: {len(verdict.violations)} violations")
    print(f"  failover, all kills:          {pct([r[4] for r in rows])}")
    print(f"  failover, not the controller: {pct([r[4] for r in rows if not r[1]])}")
    print(f"  failover, the controller:     {pct([r[4] for r in rows if r[1]])}")
    print(f"  new leader elected, all:      {pct([r[3] for r in rows])}")
    print(f"  declared dead by SWIM: {sum(r[2] == 'swim' for r in rows)} of {len(rows)}")
    return 0 if not verdict.violations else 1


if __name__ == "__main__":
    sys.exit(main())
