"""A cluster in the namespace lab with the XDP classifier on each node's veth: SWIM's packets are
classified as membership, replication and client traffic as partition frames, nothing malformed;
and the cluster works across real links (each node its own address, etcd in its own namespace)."""

from __future__ import annotations

import time

from broker.client.admin import Admin
from broker.client.blocking_producer import Producer
from broker.client.errors import UnknownTopicError
from labkit.clusterlab import MEMBERSHIP_PORT
from ringlog_proto import messages as m


def cluster_args(lab, i: int) -> list[str]:
    seeds = ",".join(f"{n.ip}:{MEMBERSHIP_PORT}" for n in lab.nodes if n.index != i)
    return ["--node-id", str(i + 1), "--etcd", lab.etcd_endpoints, "--join", seeds]


def test_xdp_classifies_a_clusters_traffic(cluster_lab) -> None:
    lab = cluster_lab(nodes=3, etcd_members=1)
    lab.start_nodes(lambda i: cluster_args(lab, i), xdp=True)
    bootstrap = ",".join(n.bootstrap for n in lab.nodes)
    with Admin(bootstrap) as admin:
        admin.create_topic("wire", 3, replication=3)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:  # another node's copy of the topic may be a few milliseconds behind the creator's
                parts = admin.describe_topic("wire").partitions
            except UnknownTopicError:
                parts = ()
            if parts and all(len(p.isr) == 3 for p in parts):
                break
            time.sleep(0.1)
    start = time.time()
    with Producer(bootstrap, acks=m.Acks.DURABLE, linger_ms=1) as producer:
        for f in [producer.send("wire", b"x" * 100, partition=i % 3) for i in range(300)]:
            f.result(30)
    for node in lab.nodes:
        counters = lab.xdp_counters(node.index, after=start + 1.5)
        assert counters is not None, node.log()[-2000:]
        assert counters["membership"] > 0, counters  # SWIM probes and acks from the other nodes
        assert counters["partition"] > 0, counters  # client and replication frames
        assert counters["malformed_dropped"] == 0, counters
