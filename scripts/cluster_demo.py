"""`make cluster-demo`: a three-node ringlog cluster in network namespaces (labkit/clusterlab.py:
a bridge, one namespace per node, one etcd member), a producer (acks=all, idempotent) and a
consumer running on a topic of 3 partitions with 3 replicas each; the leader of partition 0 is
killed with SIGKILL, both clients carry on, the node is restarted and rejoins. It prints what
happened: leaders before and after, the failover time, records produced and consumed, and the
checker's verdict over every replica (labkit/clusterchecker.py).

Needs root (network namespaces), like the lab's tests. Everything it makes is removed at exit.
"""

from __future__ import annotations

import sys
import time

from labkit.clusterchecker import report
from labkit.clusterlab import ClusterLab, lab_unavailable
from labkit.nemesisload import (
    Workload,
    create_topic,
    describe,
    node_id,
    start_cluster,
    wait_new_leader,
    wait_whole,
)

TOPIC = "demo"
RUN_S = 3.0  # the clients run this long before the kill and after the failover


def leaders(lab: ClusterLab) -> str:
    d = describe(lab, TOPIC)
    return ", ".join(
        f"p{p.partition}: node {p.leader_node} (epoch {p.leader_epoch}, isr {[n for n, _ in p.isr]})"
        for p in d.partitions
    )


def main() -> int:
    reason = lab_unavailable()
    if reason is not None:
        print(f"cluster-demo: {reason}", file=sys.stderr)
        return 2
    started = time.monotonic()

    def say(what: str) -> None:
        print(f"[{time.monotonic() - started:6.2f} s] {what}", flush=True)

    with ClusterLab(nodes=3, etcd_members=1) as lab:
        say(f"lab: bridge {lab.bridge}, nodes {[n.ip for n in lab.nodes]}, etcd {lab.etcd_endpoints}")
        start_cluster(lab)
        say("three nodes serving")
        create_topic(lab, TOPIC)
        say(f"topic {TOPIC}: 3 partitions, 3 replicas each; leaders {leaders(lab)}")
        with Workload(lab, TOPIC, tag="demo") as w:
            time.sleep(RUN_S)
            victim = describe(lab, TOPIC).partitions[0].leader_node - 1
            hit = [p.partition for p in describe(lab, TOPIC).partitions if p.leader_node == node_id(victim)]
            say(f"producer and consumer running: {w.acked_count()} acknowledged, {len(w.reads)} read")
            lab.kill(victim)
            fault_at = lab.last_fault()
            say(f"kill -9 node {node_id(victim)} (leader of partitions {hit})")
            elected = wait_new_leader(lab, TOPIC, 0, victim, fault_at)
            failover = w.wait_failover(fault_at, hit)
            say(f"new leader elected {elected:.2f} s after the kill; leaders {leaders(lab)}")
            say(f"first acknowledged produce on those partitions {failover:.2f} s after the kill")
            time.sleep(RUN_S)
            lab.restart(victim)
            say(f"node {node_id(victim)} restarted")
            rejoin = wait_whole(lab, TOPIC)
            say(f"node {node_id(victim)} back in every in-sync set {rejoin:.2f} s after it served")
            time.sleep(1.0)
            say(f"leaders {leaders(lab)}")
        verdict = w.verdict()
        unread = sum(w.unread().values())
        say(
            f"stopped: {w.sent} sent, {verdict.acks} acknowledged, {verdict.reads} read "
            f"({unread} acknowledged never read), {len(w.errors)} client errors"
        )
        say(f"high watermarks {verdict.high_watermarks}")
        say(f"checker over {3 * 3} replicas: {report(verdict.violations)}")
        ok = not verdict.violations and unread == 0
    print("cluster-demo: OK" if ok else "cluster-demo: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
