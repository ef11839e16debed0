"""Cluster benchmark: three replicas with acks=all against one node with acks=1, in the same run,
the failover time from kill -9 of a leader to the first acknowledged produce after it, and the
produce gap when a leader is stopped gracefully (SIGTERM).

Run: `.venv/bin/python bench/cluster.py [--records N] [--rounds R] [--failovers F] [--stops S]`
(`--stops-only`: only the SIGTERM rounds, for comparing the shutdown path between checkouts)

What runs (all on this machine: the three nodes share its CPUs with the client, which is the
point of the goal of >= 0.5 on a 2-CPU machine):
- etcd (one member, labkit/etcdproc.py), three `broker serve --etcd` nodes of one core each
  on loopback, and one plain single node (no etcd) of one core; all uvloop, eBPF off.
- Throughput: the blocking `Producer`, 1 KiB values, 3 partitions round robin, 64 KiB batches;
  single node acks=1 against the cluster with replication 3 and acks=2 (on a replicated
  partition: acks=all, every in-sync replica has it, min.insync 2). Variants alternate, `rounds`
  times; the table shows median (min..max) and the ratio of medians.
- Latency: one record at a time (send, wait), 1 KiB, p50/p99 over 1000 sends after 100 warm-up.
- Failover: a producer sends one record at a time to partition 0 (acks=all); its leader node is
  killed with SIGKILL; the time from the kill to the first acknowledged send after it. The node
  is restarted and waited back into every in-sync set before the next round.
- SIGTERM: a producer (acks=all, idempotent) sends one record every 2 ms, partitions in turn,
  never waiting; the leader of partition 0 gets SIGTERM. The gap of a stop is the longest time
  between two consecutive acknowledgements on the partitions it led, from the SIGTERM to 2 s
  after the node exited (the slowest of those partitions); also how long the node took to exit.
  Then it is restarted and waited back as above.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from broker.client.admin import Admin
from broker.client.blocking_producer import Producer
from labkit.brokerproc import BrokerProcess, membership_key_file
from labkit.etcdproc import EtcdCluster
from ringlog_proto import messages as m

VALUE = b"x" * 1024


def free_udp() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(
    root: Path, etcd: EtcdCluster, backend: str, started: list[BrokerProcess] | None = None
) -> dict[int, BrokerProcess]:
    """Three nodes; each is appended to `started` before it starts, so a caller interrupted
    meanwhile can stop those already running."""
    ports = [free_udp() for _ in range(3)]
    seeds = ",".join(f"127.0.0.1:{p}" for p in ports)
    nodes = {}
    for i in (1, 2, 3):
        extra = (
            "--node-id", str(i), "--etcd", ",".join(etcd.endpoints), "--membership-port", str(ports[i - 1]),
            "--join", seeds, "--ebpf", "off", "--membership-key-file", str(membership_key_file(root)),
        )  # fmt: skip
        nodes[i] = BrokerProcess(root / f"n{i}", root / f"n{i}.log", extra, backend=backend)
        if started is not None:
            started.append(nodes[i])
        nodes[i].start()
    return nodes


def states(node: BrokerProcess, topic_id: int) -> dict[int, dict]:
    doc = json.loads((node.data_dir / "run" / "cluster.json").read_text())
    return {p["partition"]: p for p in doc["partitions"] if p["topic_id"] == topic_id}


def wait_for(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = what()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(0.05)
    raise RuntimeError("timed out")


def throughput(bootstrap: str, topic: str, acks: int, records: int) -> float:
    with Producer(bootstrap, acks=acks, batch_bytes=64 * 1024, linger_ms=5) as p:
        t0 = time.perf_counter()
        for i in range(records):
            p.send(topic, VALUE, partition=i % 3)
        p.flush()
        return records * len(VALUE) / (time.perf_counter() - t0) / 1e6


def latency(bootstrap: str, topic: str, acks: int, n: int = 1000) -> tuple[float, float]:
    with Producer(bootstrap, acks=acks, linger_ms=0) as p:
        for _ in range(100):
            p.send(topic, VALUE, partition=0).result(10)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            p.send(topic, VALUE, partition=0).result(10)
            samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return samples[len(samples) // 2] / 1e3, samples[int(len(samples) * 0.99)] / 1e3


def failover(nodes: dict[int, BrokerProcess], topic: str, topic_id: int) -> float:
    bootstrap = ",".join(n.bootstrap for n in nodes.values())
    victim = states(nodes[1], topic_id)[0]["leader"]
    survivor = next(i for i in nodes if i != victim)
    with Producer(bootstrap, acks=m.Acks.DURABLE, linger_ms=0, delivery_timeout_ms=60_000) as p:
        for _ in range(20):
            p.send(topic, b"warm", partition=0).result(10)
        nodes[victim].kill()
        killed = time.perf_counter()
        p.send(topic, b"after", partition=0).result(60)
        took = time.perf_counter() - killed
    nodes[victim].start()
    wait_for(lambda: all(victim in s["isr"] for s in states(nodes[survivor], topic_id).values()), 60)
    wait_for(lambda: states(nodes[survivor], topic_id)[0]["leader"] == victim, 30)  # preferred leader back
    return took


STOP_WATCH_S = 2.0  # the gap is measured until this long after the stopped node exited


def sigterm_gap(nodes: dict[int, BrokerProcess], topic: str, topic_id: int) -> tuple[float, float]:
    """One graceful stop of partition 0's leader under a steady producer: (the longest gap
    between acknowledgements on the partitions it led, seconds from the SIGTERM to its exit)."""
    bootstrap = ",".join(n.bootstrap for n in nodes.values())
    before = states(nodes[1], topic_id)
    victim = before[0]["leader"]
    survivor = next(i for i in nodes if i != victim)
    hit = [p for p, s in before.items() if s["leader"] == victim]
    acked: dict[int, list[float]] = {p: [] for p in before}
    lock = threading.Lock()
    stop = threading.Event()
    window = threading.Semaphore(3000)

    def answered(partition: int, fut) -> None:
        window.release()
        if fut.exception() is None:
            with lock:
                acked[partition].append(time.monotonic())

    def produce() -> None:
        with Producer(
            bootstrap, acks=m.Acks.DURABLE, linger_ms=1, enable_idempotence=True, request_timeout_ms=3000
        ) as p:
            for n in itertools.count():
                if stop.is_set():
                    break
                if not window.acquire(timeout=0.1):
                    continue
                partition = n % len(before)
                fut = p.send(topic, b"term-%d" % n, partition=partition)
                fut.add_done_callback(lambda f, pa=partition: answered(pa, f))
                time.sleep(0.002)
            p.flush(60)

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    wait_for(lambda: all(len(acked[p]) > 50 for p in hit), 30)
    signalled = time.monotonic()
    rc = nodes[victim].stop()
    exited = time.monotonic()
    if rc != 0:
        raise RuntimeError(f"node {victim} exited {rc} after SIGTERM")
    time.sleep(STOP_WATCH_S)
    until = exited + STOP_WATCH_S
    stop.set()
    sender.join(90)
    gaps = []
    for p in hit:
        with lock:
            times = [signalled, *(t for t in acked[p] if signalled < t < until), until]
        gaps.append(max(b - a for a, b in itertools.pairwise(times)))
    nodes[victim].start()
    wait_for(lambda: all(victim in s["isr"] for s in states(nodes[survivor], topic_id).values()), 60)
    wait_for(lambda: states(nodes[survivor], topic_id)[0]["leader"] == victim, 30)  # preferred leader back
    return max(gaps), exited - signalled


def spread(xs: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}..{fmt.format(max(xs))}, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--failovers", type=int, default=5)
    ap.add_argument("--stops", type=int, default=5)
    ap.add_argument("--stops-only", action="store_true", help="only the SIGTERM rounds")
    ap.add_argument("--backend", default="uvloop", choices=("uvloop", "io_uring"))
    args = ap.parse_args()
    if args.stops_only:
        stops_only(args)
        return
    with tempfile.TemporaryDirectory(prefix="ringlog-cluster-bench-") as tmp:
        root = Path(tmp)
        etcd = EtcdCluster(root / "etcd", 1).start()
        single = BrokerProcess(root / "single", root / "single.log", ("--ebpf", "off"), backend=args.backend)
        nodes: dict[int, BrokerProcess] = {}
        try:
            single.start()
            nodes = start_cluster(root, etcd, args.backend)
            cluster_boot = ",".join(n.bootstrap for n in nodes.values())
            with Admin(single.bootstrap) as a:
                a.create_topic("bench", 3)
            with Admin(cluster_boot) as a:
                topic_id = a.create_topic("bench", 3, replication=3)
            wait_for(
                lambda: (
                    len(states(nodes[1], topic_id)) == 3
                    and all(len(s["isr"]) == 3 for s in states(nodes[1], topic_id).values())
                )
            )
            one, three = [], []
            for _ in range(args.rounds):
                one.append(throughput(single.bootstrap, "bench", m.Acks.WRITTEN, args.records))
                three.append(throughput(cluster_boot, "bench", m.Acks.DURABLE, args.records))
            lat1 = latency(single.bootstrap, "bench", m.Acks.WRITTEN)
            lat3 = latency(cluster_boot, "bench", m.Acks.DURABLE)
            lat1b = latency(single.bootstrap, "bench", m.Acks.WRITTEN)
            lat3b = latency(cluster_boot, "bench", m.Acks.DURABLE)
            fails = [failover(nodes, "bench", topic_id) for _ in range(args.failovers)]
            stops = [sigterm_gap(nodes, "bench", topic_id) for _ in range(args.stops)]
        finally:
            for n in [single, *nodes.values()]:
                if n.running():
                    n.stop()
            etcd.close()
    ratio = statistics.median(three) / statistics.median(one)
    print(f"backend {args.backend}; produce 1 KiB, 3 partitions, {args.records} records per run")
    print(f"{args.rounds} alternations of the two variants")
    print(f"  one node, acks=1            MB/s {spread(one)}")
    print(f"  3 replicas, acks=all        MB/s {spread(three)}")
    print(f"  ratio (goal >= 0.5)         {ratio:.2f}")
    print("acked latency, one record at a time (p50 / p99 us; two runs each, alternated)")
    print(f"  one node, acks=1            {lat1[0]:.0f} / {lat1[1]:.0f}; {lat1b[0]:.0f} / {lat1b[1]:.0f}")
    print(f"  3 replicas, acks=all        {lat3[0]:.0f} / {lat3[1]:.0f}; {lat3b[0]:.0f} / {lat3b[1]:.0f}")
    print(
        f"failover, kill -9 of the leader -> first acked produce (goal <= 3 s): {spread(fails, '{:.2f}')} s"
    )
    if stops:
        print_stops(args.backend, stops)


def stops_only(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ringlog-cluster-bench-") as tmp:
        root = Path(tmp)
        etcd = EtcdCluster(root / "etcd", 1).start()
        nodes: dict[int, BrokerProcess] = {}
        try:
            nodes = start_cluster(root, etcd, args.backend)
            with Admin(",".join(n.bootstrap for n in nodes.values())) as a:
                topic_id = a.create_topic("bench", 3, replication=3)
            wait_for(
                lambda: (
                    all(len(states(n, topic_id)) == 3 for n in nodes.values())
                    and all(len(s["isr"]) == 3 for s in states(nodes[1], topic_id).values())
                )
            )
            stops = [sigterm_gap(nodes, "bench", topic_id) for _ in range(args.stops)]
        finally:
            for n in nodes.values():
                if n.running():
                    n.stop()
            etcd.close()
    print_stops(args.backend, stops)


def print_stops(backend: str, stops: list[tuple[float, float]]) -> None:
    gaps = sorted(g for g, _ in stops)
    exits = sorted(e for _, e in stops)
    print(f"backend {backend}; SIGTERM to the leader of partition 0, a producer sending every 2 ms")
    print(
        f"  produce gap on the partitions it led: p50 {statistics.median(gaps):.3f} s, max {gaps[-1]:.3f} s "
        f"(min {gaps[0]:.3f}, n={len(gaps)})"
    )
    print(f"  SIGTERM to exit: p50 {statistics.median(exits):.2f} s, max {exits[-1]:.2f} s")


if __name__ == "__main__":
    main()
