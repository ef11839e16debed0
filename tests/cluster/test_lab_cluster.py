"""A cluster in the namespace lab with the XDP classifier on each node's veth: SWIM's packets are
classified as membership, replication and client traffic as partition frames, nothing malformed;
and the cluster works across real links (each node its own address, etcd in its own namespace)."""

from __future__ import annotations

import os
import signal
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


def test_a_new_topic_takes_records_at_once_from_leaders_spread_over_the_nodes(cluster_lab) -> None:
    """Records sent right after CreateTopics reach every partition. A leader that has not copied
    the topic from the store yet answers UNKNOWN_TOPIC_OR_PARTITION, which a cluster's producer
    retries after a fresh Metadata, as Kafka's do. Node 2's supervisor (whose agent copies topics
    into the registry its workers read) is stopped while each topic is created and its records
    sent, and let go 0.5 s later: its worker, serving still, does not know the topic until then.
    Each topic's three leaders are the three nodes (placement spreads them)."""
    lab = cluster_lab(nodes=3, etcd_members=1)
    lab.start_nodes(lambda i: cluster_args(lab, i))
    bootstrap = ",".join(n.bootstrap for n in lab.nodes)
    late = lab.nodes[1].proc
    assert late is not None
    with Admin(bootstrap) as admin, Producer(bootstrap, acks=m.Acks.DURABLE, linger_ms=0) as producer:
        for t in range(3):
            os.kill(late.pid, signal.SIGSTOP)
            try:
                admin.create_topic(f"new{t}", 3, replication=3)
                futures = [producer.send(f"new{t}", b"first", partition=p) for p in range(3)]
                time.sleep(0.5)
            finally:
                os.kill(late.pid, signal.SIGCONT)
            assert [f.result(30).offset for f in futures] == [0, 0, 0]
            leaders = sorted(p.leader_node for p in admin.describe_topic(f"new{t}").partitions)
            assert leaders == [1, 2, 3]
