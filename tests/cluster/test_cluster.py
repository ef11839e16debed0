"""A real three-node cluster on loopback: three `broker serve --etcd` processes, a real etcd, our
client and a stock Kafka client. Replicas byte for byte, failover after kill -9 with nothing
acknowledged lost, a returning node caught up and back in sync, NOT_OWNER from a follower.
(The nemesis suite, with namespaces, partitions and etcd failures, is test_nemesis.py and
test_nemesis_restarts.py.)"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from broker.client.admin import Admin
from broker.client.blocking_consumer import Consumer
from broker.client.blocking_producer import Producer
from broker.client.errors import DeliveryTimeoutError
from broker.client.producer import AsyncProducer
from labkit.brokerproc import BrokerProcess, Wire, free_udp_port, membership_key_file, wait_for
from labkit.clusterchecker import Ack, check, read_replica
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

_names = itertools.count()


class Cluster:
    def __init__(
        self, root: Path, etcd_endpoints: list[str], size: int = 3, extra: tuple[str, ...] = ()
    ) -> None:
        name = self.name = f"loop{next(_names)}"
        mports = [free_udp_port() for _ in range(size)]
        seeds = ",".join(f"127.0.0.1:{p}" for p in mports)
        self.nodes: dict[int, BrokerProcess] = {}
        for i in range(1, size + 1):
            flags = (
                "--node-id", str(i), "--etcd", ",".join(etcd_endpoints), "--cluster-name", name,
                "--membership-port", str(mports[i - 1]), "--join", seeds, "--ebpf", "off",
                "--membership-key-file", str(membership_key_file(root)),
                "--group-initial-rebalance-delay-ms", "100", *extra,
            )  # fmt: skip
            self.nodes[i] = BrokerProcess(root / f"node{i}", root / f"node{i}.log", flags)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values() if n.running())

    def start(self) -> Cluster:
        for n in self.nodes.values():
            n.start()
        return self

    def close(self) -> None:
        for n in self.nodes.values():
            if n.running():
                n.kill()

    def view(self, node: int) -> dict:
        return json.loads((self.nodes[node].data_dir / "run" / "cluster.json").read_text())

    def states(self, node: int, topic_id: int) -> dict[int, dict]:
        return {p["partition"]: p for p in self.view(node)["partitions"] if p["topic_id"] == topic_id}


@pytest.fixture(scope="module")
def cluster(etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"), etcd.endpoints)
    try:
        c.start()
        wait_for(lambda: all(sorted(c.view(i)["live"]) == [1, 2, 3] for i in (1, 2, 3)))
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def healed(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the shared cluster that kills a node restarts it at its end; when the test fails
    first, this does, so one failure does not turn every later test into a two-node one."""
    yield
    if "cluster" not in request.fixturenames:
        return
    c: Cluster = request.getfixturevalue("cluster")
    dead = [n for n in c.nodes.values() if not n.running()]
    for n in dead:
        n.start()
    if dead:
        wait_for(lambda: all(sorted(c.view(i)["live"]) == [1, 2, 3] for i in c.nodes), timeout=30)


def produce(bootstrap: str, topic: str, tag: str, n: int, partitions: int) -> list[Ack]:
    with Producer(bootstrap, acks=m.Acks.DURABLE, linger_ms=1) as p:
        futures = [(p.send(topic, f"{tag}-{i}".encode(), partition=i % partitions), i) for i in range(n)]
        return [
            Ack(topic, md.partition, md.offset, f"{tag}-{i}".encode())
            for f, i in futures
            for md in [f.result(timeout=60)]
        ]


def test_replicas_are_identical_and_failover_loses_nothing(cluster: Cluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        topic_id = admin.create_topic("orders", 3, replication=3)
    wait_for(lambda: len(cluster.states(1, topic_id)) == 3)
    acks = produce(cluster.bootstrap, "orders", "a", 600, 3)

    def replicas() -> list:
        return [read_replica(n.data_dir, "orders", p, i) for i, n in cluster.nodes.items() for p in range(3)]

    wait_for(lambda: all(r.end == 200 for r in replicas()))  # followers caught up
    assert check(acks, [], replicas()) == []

    # kill -9 the leader of partition 0: its partitions fail over to in-sync replicas
    states = cluster.states(1, topic_id)
    victim = states[0]["leader"]
    epoch = states[0]["epoch"]
    cluster.nodes[victim].kill()
    t0 = time.monotonic()
    acks += produce(cluster.bootstrap, "orders", "b", 300, 3)
    failover = time.monotonic() - t0
    survivor = next(i for i in cluster.nodes if i != victim)
    after = cluster.states(survivor, topic_id)
    assert after[0]["leader"] != victim and after[0]["epoch"] > epoch
    assert all(victim not in s["isr"] for s in after.values())
    assert failover < 10, failover

    # it comes back: caught up, in sync again, and every replica holds every acked record
    cluster.nodes[victim].start()
    wait_for(lambda: all(victim in s["isr"] for s in cluster.states(survivor, topic_id).values()), timeout=30)
    acks += produce(cluster.bootstrap, "orders", "c", 300, 3)
    wait_for(lambda: all(r.end == 400 for r in replicas()))
    assert check(acks, [], replicas()) == []

    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("orders", p) for p in range(3)])
        seen: set[bytes] = set()
        deadline = time.monotonic() + 20
        while len(seen) < 1200 and time.monotonic() < deadline:
            seen.update(r.value for r in consumer.poll(0.5))
    assert seen == {a.payload for a in acks}
    print(f"\nfailover after kill -9 of node {victim}: first acked produce batch in {failover:.2f} s")


def test_swim_moves_a_killed_nodes_partitions_before_its_lease_expires(etcd, tmp_path: Path) -> None:
    """SWIM's verdicts never reached the cluster agent (the supervisor compared the
    states with strings of another case), so failover waited for the dead node's etcd lease. With
    a 10 s lease, only SWIM's DEAD (about 1.5 s, then the controller revokes the lease) can move
    the partitions of a node killed with -9 within 6 s. Then the controller is killed: the
    survivor deposes it (revokes its election lease) on the same signal, becomes the controller
    and leads everything, again well before either lease could expire."""
    c = Cluster(tmp_path, etcd.endpoints, extra=("--session-timeout-s", "10"))
    try:
        c.start()
        wait_for(lambda: all(sorted(c.view(i)["live"]) == [1, 2, 3] for i in (1, 2, 3)))
        with Admin(c.bootstrap) as admin:
            topic_id = admin.create_topic("swim", 6, replication=3)
        wait_for(
            lambda: (
                len(c.states(1, topic_id)) == 6
                and all(s["leader"] > 0 for s in c.states(1, topic_id).values())
            )
        )
        controller = int(wait_for(lambda: c.view(1)["controller"] > 0 and c.view(1)["controller"]))
        leaders = {s["leader"] for s in c.states(1, topic_id).values()}
        victim = next(i for i in sorted(leaders) if i != controller)
        led = [p for p, s in c.states(1, topic_id).items() if s["leader"] == victim]
        c.nodes[victim].kill()
        t0 = time.monotonic()
        survivor = next(i for i in c.nodes if i != victim)
        wait_for(
            lambda: all(c.states(survivor, topic_id)[p]["leader"] not in (victim, -1) for p in led), timeout=6
        )
        took = time.monotonic() - t0
        assert f"membership confirms node {victim} dead" in c.nodes[controller].log()
        print(f"\nkill -9 of node {victim}: its {len(led)} partitions moved in {took:.2f} s (lease 10 s)")

        last = next(i for i in c.nodes if i not in (victim, controller))
        wait_for(lambda: all(victim not in s["isr"] for s in c.states(last, topic_id).values()))
        c.nodes[controller].kill()
        t0 = time.monotonic()
        wait_for(
            lambda: (
                c.view(last)["controller"] == last
                and all(s["leader"] == last for s in c.states(last, topic_id).values())
            ),
            timeout=6,
        )
        took = time.monotonic() - t0
        assert f"membership confirms the controller (node {controller}) dead" in c.nodes[last].log()
        print(f"kill -9 of the controller {controller}: node {last} leads all in {took:.2f} s")
    finally:
        c.close()


def test_a_follower_answers_not_owner(cluster: Cluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        topic_id = admin.create_topic("plain", 1, replication=3)
    state = wait_for(lambda: cluster.states(1, topic_id).get(0))
    follower = next(i for i in state["replicas"] if i != state["leader"])
    # a client that does not route: straight to the follower's node, once that node has taken
    # the new topic's state from etcd (before, it knows no such partition yet: a busy CI machine
    # got UNKNOWN_TOPIC_OR_PARTITION between the controller's write and the follower's watch)
    wire = Wire(cluster.nodes[follower].port)
    try:
        resp = wait_for(
            lambda: (
                (r := wire.rpc(m.ProduceRequest(topic_id=topic_id, partition=0, acks=1, records=b""))).error
                != m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                and r
            )
        )
    finally:
        wire.close()
    assert resp.error == m.ErrorCode.NOT_OWNER, resp


def test_the_nodes_of_one_machine_spread_over_its_cpus(cluster: Cluster) -> None:
    """A node pins its first worker at its node id's place among the CPUs it may use
    (supervisor.worker_cpus): three nodes on this machine do not all sit on its first CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    pinned = {}
    for i, node in cluster.nodes.items():
        assert node.proc is not None
        *_, (pid, cpu) = re.findall(r"core 0: pid (\d+), cpu (\d+)", node.log())
        assert int(cpu) == cpus[(i - 1) % len(cpus)], node.log_tail()
        assert os.sched_getaffinity(int(pid)) == {int(cpu)}
        pinned[i] = int(cpu)
    assert len(set(pinned.values())) == min(len(cpus), len(pinned)), pinned


def test_kafka_client_on_the_cluster(cluster: Cluster) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    boot = cluster.nodes[1].bootstrap
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic("kt", 3, 3)])["kt"].result(20)
    md = wait_for(
        lambda: (
            (t := admin.list_topics("kt", timeout=5).topics["kt"]).partitions
            and all(p.leader >= 0 for p in t.partitions.values())
            and t
        )
    )
    for p in md.partitions.values():
        assert len(p.replicas) == 3 and sorted(p.isrs) == sorted(p.replicas)
        assert p.leader // 1000 in (1, 2, 3)  # Kafka broker id = node * 1000 + core
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True}
    )
    errors: list[object] = []
    for i in range(500):
        producer.produce(
            "kt", f"v{i}".encode(), key=str(i).encode(), on_delivery=lambda e, _m: e and errors.append(e)
        )
    assert producer.flush(30) == 0 and errors == []
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": "kg",
            "auto.offset.reset": "earliest",
            "fetch.queue.backoff.ms": 10,
        }
    )
    consumer.subscribe(["kt"])
    got = set()
    deadline = time.monotonic() + 30
    while len(got) < 500 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got.add(msg.value())
    consumer.close()
    assert got == {f"v{i}".encode() for i in range(500)}


def test_a_producer_creates_its_topic_on_the_cluster(cluster: Cluster) -> None:
    """Auto topic creation through any node: one topic in the store, the cluster's default
    replication (3), its records acknowledged by every replica (acks=all)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient

    boot = cluster.nodes[2].bootstrap
    producer = confluent_kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    errors: list[object] = []
    for i in range(20):
        producer.produce("auto-made", b"a%d" % i, on_delivery=lambda e, _m: e and errors.append(e))
    assert producer.flush(30) == 0 and errors == []
    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10).topics["auto-made"]
    assert [len(p.replicas) for p in md.partitions.values()] == [3]
    for node in cluster.nodes.values():  # every node serves it (our Metadata never creates)
        wire = Wire(node.port)
        try:
            resp = wire.rpc(m.MetadataRequest(("auto-made",)))
            assert isinstance(resp, m.MetadataResponse)
            assert [t.error for t in resp.topics] == [m.ErrorCode.NONE], resp
        finally:
            wire.close()


def test_our_producers_create_their_topics_on_the_cluster(cluster: Cluster) -> None:
    """Auto topic creation through our protocol on any node: our producers' first records create
    the topic, once in the store, with the cluster's default replication (3) and the default
    partitions (1); durable records (acks 2: every in-sync replica) stored, and every node serves it."""
    with Producer(cluster.nodes[2].bootstrap, acks=m.Acks.DURABLE) as producer:
        assert [producer.send("ours-made", b"o%d" % i).result(30).offset for i in range(5)] == list(range(5))

    async def send_async() -> int:
        async with AsyncProducer(cluster.nodes[3].bootstrap, acks=m.Acks.DURABLE) as p:
            return (await p.send_and_wait("ours-made-async", b"a")).offset

    assert asyncio.run(asyncio.wait_for(send_async(), 60)) == 0
    for name in ("ours-made", "ours-made-async"):
        for node in cluster.nodes.values():
            with Admin(node.bootstrap) as admin:
                (partition,) = admin.describe_topic(name).partitions
                assert len(partition.replicas) == 3, (name, partition)


def test_five_nodes_spread_replicas_and_survive_two_deaths(etcd, tmp_path: Path) -> None:
    """Five nodes: replicas of 10 partitions spread over all of them; two nodes killed: every
    partition is led from its in-sync set; those with two copies left take acks=all writes, those
    with one refuse them (min.insync 2), and nothing acknowledged is lost."""
    c = Cluster(tmp_path, etcd.endpoints, size=5)
    try:
        c.start()
        wait_for(lambda: sorted(c.view(1)["live"]) == [1, 2, 3, 4, 5])
        with Admin(c.bootstrap) as admin:
            topic_id = admin.create_topic("wide", 10, replication=3)
        states = wait_for(lambda: len(s := c.states(1, topic_id)) == 10 and s)
        holders = {n for s in states.values() for n in s["replicas"]}
        assert holders == {1, 2, 3, 4, 5}
        leaders = {s["leader"] for s in states.values()}
        assert len(leaders) >= 3
        acks = produce(c.bootstrap, "wide", "x", 200, 10)
        for victim in (4, 5):
            c.nodes[victim].kill()

        def settled() -> bool:
            s = c.states(1, topic_id)
            return all(p["leader"] in (1, 2, 3) and not {4, 5} & set(p["isr"]) for p in s.values())

        wait_for(settled, timeout=20)
        after = c.states(1, topic_id)
        writable = [p for p in range(10) if len(after[p]["isr"]) >= 2]
        short = [p for p in range(10) if len(after[p]["isr"]) < 2]  # two of its three replicas died
        assert writable
        with Producer(c.bootstrap, acks=m.Acks.DURABLE, linger_ms=1) as producer:
            futures = [
                (p, i, producer.send("wide", f"y-{i}".encode(), partition=p))
                for i, p in enumerate(writable * 20)
            ]
            acks += [Ack("wide", p, f.result(60).offset, f"y-{i}".encode()) for p, i, f in futures]
        with Producer(c.bootstrap, acks=m.Acks.DURABLE, delivery_timeout_ms=2000) as producer:
            for p in short:  # never a silent downgrade to fewer copies
                with pytest.raises(DeliveryTimeoutError, match="NOT_ENOUGH_REPLICAS"):
                    producer.send("wide", b"refused", partition=p).result(30)
        # an operator moves a one-copy partition onto the live nodes: the new replicas catch up,
        # join the in-sync set, the dead ones are dropped, and acks=all works there again
        p0 = short[0] if short else writable[0]
        survivor = next(r for r in after[p0]["isr"])
        target = [survivor, *[n for n in (1, 2, 3) if n != survivor]]
        out = subprocess.run(
            [sys.executable, "-m", "broker.cli", "reassign", "--etcd", ",".join(etcd.endpoints),
             "--cluster-name", c.name, "wide", str(p0), "--replicas", ",".join(map(str, target))],
            check=False, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        moved = wait_for(
            lambda: (s := c.states(1, topic_id)[p0])["replicas"] == target and len(s["isr"]) == 3 and s
        )
        assert not moved.get("target") and moved["leader"] in target
        with Producer(c.bootstrap, acks=m.Acks.DURABLE, linger_ms=1) as producer:
            md = producer.send("wide", b"z-after-move", partition=p0).result(30)
        acks.append(Ack("wide", p0, md.offset, b"z-after-move"))
        final = c.states(1, topic_id)
        replicas = [
            read_replica(n.data_dir, "wide", p, i, in_sync=i in final[p]["isr"])
            for i, n in c.nodes.items()
            for p in range(10)
        ]
        assert check(acks, [], replicas) == []
    finally:
        c.close()


def test_kafka_producer_rides_a_failover(cluster: Cluster) -> None:
    """confluent-kafka, idempotent, acks=all, through kill -9 of a leader: every record delivered,
    once each, at the offsets it was told."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka.admin import AdminClient, NewTopic

    boot = ",".join(n.bootstrap for n in cluster.nodes.values())
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic("kf", 2, 3)])["kf"].result(20)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True, "linger.ms": 2,
         "message.timeout.ms": 60000}
    )  # fmt: skip
    delivered: list[tuple[int, int, bytes]] = []
    errors: list[object] = []

    def report(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.partition(), msg.offset(), msg.value()))  # type: ignore[attr-defined]

    victim = 0
    for i in range(3000):
        producer.produce("kf", f"k{i}".encode(), partition=i % 2, on_delivery=report)
        if i == 1000:
            producer.flush(30)
            md = admin.list_topics("kf", timeout=10)
            victim = md.topics["kf"].partitions[0].leader // 1000
            cluster.nodes[victim].kill()
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []
    assert sorted(v for _, _, v in delivered) == sorted(f"k{i}".encode() for i in range(3000))
    offsets = [(p, o) for p, o, _ in delivered]
    assert len(set(offsets)) == len(offsets)  # no two records told the same offset
    cluster.nodes[victim].start()
    wait_for(lambda: all(len(p["isr"]) == 3 for p in cluster.view(victim)["partitions"]), timeout=30)


def test_committed_offsets_survive_the_coordinators_death(cluster: Cluster) -> None:
    """A group's commits live in the store: when its coordinator node dies, the next coordinator
    (another live node) answers the same offsets."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from ringlog_proto.routing import coordinator_node

    boot = ",".join(n.bootstrap for n in cluster.nodes.values())
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic("og", 2, 3)])["og"].result(20)
    wait_for(
        lambda: all(
            p.leader >= 0 for p in admin.list_topics("og", timeout=5).topics["og"].partitions.values()
        )
    )

    def consumer() -> object:
        return confluent_kafka.Consumer(
            {"bootstrap.servers": boot, "group.id": "keeper", "enable.auto.commit": False}
        )

    producer = confluent_kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    for partition, n in ((0, 50), (1, 10)):  # commits past a partition's end are refused
        for i in range(n):
            producer.produce("og", f"v{i}".encode(), partition=partition)
    assert producer.flush(30) == 0
    c = consumer()
    c.commit(offsets=[TopicPartition("og", 0, 42), TopicPartition("og", 1, 7)], asynchronous=False)
    c.close()
    victim = coordinator_node("keeper", [1, 2, 3])
    cluster.nodes[victim].kill()
    try:
        survivor = next(i for i in cluster.nodes if i != victim)
        wait_for(lambda: victim not in cluster.view(survivor)["live"], timeout=15)
        c = consumer()
        got = wait_for(lambda: c.committed([TopicPartition("og", 0), TopicPartition("og", 1)], timeout=10))
        c.close()
        assert {(tp.partition, tp.offset) for tp in got} == {(0, 42), (1, 7)}
    finally:
        cluster.nodes[victim].start()
        wait_for(lambda: all(len(p["isr"]) == 3 for p in cluster.view(victim)["partitions"]), timeout=30)


def test_a_long_polling_kafka_consumer_costs_the_producer_nothing(cluster: Cluster) -> None:
    """A Kafka consumer parked on a replicated partition is woken by each append of its leader,
    before the high watermark passes it: it finds nothing to return and must park again. Each
    acks=all produce meanwhile is answered as stored, exactly once (the re-park
    failed an assertion inside the append's completion, the stored produce was answered
    UNKNOWN_SERVER_ERROR, the idempotent producer bumped its epoch and resent it: a duplicate)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    boot = ",".join(n.bootstrap for n in cluster.nodes.values())
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic("lp", 1, 3)])["lp"].result(20)
    md = wait_for(
        lambda: (t := admin.list_topics("lp", timeout=5).topics["lp"]).partitions[0].leader >= 0 and t
    )
    leader = cluster.nodes[md.partitions[0].leader // 1000]
    logged = len(leader.log())
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "lp", "auto.offset.reset": "earliest",
         "fetch.wait.max.ms": 500}
    )  # fmt: skip
    consumer.assign([TopicPartition("lp", 0, 0)])
    got: list[bytes] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            msg = consumer.poll(0.1)
            if msg is not None and not msg.error():
                got.append(msg.value())

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True, "linger.ms": 0}
    )
    errors: list[object] = []
    n = 150
    try:
        time.sleep(1.0)  # the consumer is parked
        for i in range(n):
            producer.produce("lp", f"p{i}".encode(), on_delivery=lambda e, _m: e and errors.append(e))
            producer.flush(30)
            time.sleep(0.01)
        deadline = time.monotonic() + 15
        while len(got) < n and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(5)
        consumer.close()
    assert errors == []
    failed = [line for line in leader.log()[logged:].splitlines() if "kafka request failed" in line]
    assert failed == []
    assert got == [f"p{i}".encode() for i in range(n)]  # each once, in order, to the parked consumer


def test_group_offsets_while_etcd_is_down(etcd_cluster, tmp_path: Path) -> None:
    """With etcd down, OffsetFetch and OffsetCommit (Kafka's and ours) and a Kafka InitProducerId
    that must claim a block of ids get a retriable error answer (Kafka: COORDINATOR_NOT_AVAILABLE,
    as when its offsets topic is unavailable; ours:
    REQUEST_TIMED_OUT) once the store's deadline passes, on a thread: meanwhile the core goes on
    serving, and a produce to a partition whose in-sync set does not change is acknowledged
    (OffsetFetch died on StoreUnavailable, the client got no answer)."""
    from broker.kafka.codec import request_schema
    from labkit.kafka_requests import build, frame, read_response

    etcd = etcd_cluster(1)
    c = Cluster(tmp_path, etcd.endpoints, size=1).start()
    try:
        wait_for(lambda: c.view(1)["live"] == [1])
        with Admin(c.bootstrap) as admin:
            topic_id = admin.create_topic("gx", 1, replication=1)
        wait_for(lambda: len(c.states(1, topic_id)) == 1)
        port = c.nodes[1].port

        def kafka_rpc(key: int, version: int, body: object) -> tuple[object, float]:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(frame(key, version, 7, body))
                data = b""
                while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
                    more = s.recv(65536)
                    if not more:
                        return "closed", time.monotonic() - started
                    data += more
            return read_response(key, version, data)[1], time.monotonic() - started

        fetch_schema = request_schema(9, 5)
        fmod = sys.modules[fetch_schema.__module__]
        fetch_body = build(
            fetch_schema,
            group_id="gx",
            topics=(build(fmod.OffsetFetchRequestTopic, name="gx", partition_indexes=(0,)),),
        )
        commit_schema = request_schema(8, 2)
        cmod = sys.modules[commit_schema.__module__]
        part = build(cmod.OffsetCommitRequestPartition, partition_index=0, committed_offset=0)
        commit_body = build(
            commit_schema,
            group_id="gx",
            generation_id_or_member_epoch=-1,
            member_id="",
            retention_time_ms=-1,
            topics=(build(cmod.OffsetCommitRequestTopic, name="gx", partitions=(part,)),),
        )
        init_schema = request_schema(22, 4)
        init_body = build(init_schema, transactional_id=None, producer_id=-1, producer_epoch=-1)
        etcd.stop(0)
        answers: dict[str, object] = {}

        def ask(name: str, call: Callable[[], object]) -> threading.Thread:
            t = threading.Thread(target=lambda: answers.__setitem__(name, call()), daemon=True)
            t.start()
            return t

        def ours(req: m.Request) -> tuple[object, float]:
            started = time.monotonic()
            wire = Wire(port)
            wire.sock.settimeout(30)  # the worker runs 4 store calls at once, each up to 5 s
            try:
                return wire.rpc(req), time.monotonic() - started
            except OSError as exc:  # no answer in the socket's timeout
                return exc, time.monotonic() - started
            finally:
                wire.close()

        threads = [
            ask("kafka fetch", lambda: kafka_rpc(9, 5, fetch_body)),
            ask("kafka commit", lambda: kafka_rpc(8, 2, commit_body)),
            ask("kafka init producer id", lambda: kafka_rpc(22, 4, init_body)),
            ask("our fetch", lambda: ours(m.OffsetFetchRequest(topic_id=topic_id, partition=0, group="gx"))),
            ask(
                "our commit", lambda: ours(m.OffsetCommitRequest(topic_id=topic_id, partition=0, group="gx"))
            ),
        ]
        time.sleep(0.5)  # the four wait on the store
        produced = ours(
            m.ProduceRequest(topic_id=topic_id, partition=0, acks=1, records=encode_batch([b"x"]))
        )
        for t in threads:
            t.join(30)
    finally:
        c.close()
    kafka_fetch, _ = answers["kafka fetch"]
    kafka_commit, _ = answers["kafka commit"]
    assert kafka_fetch != "closed", "the OffsetFetch connection closed without an answer"
    assert kafka_fetch.error_code == ErrorCode.coordinator_not_available, kafka_fetch
    codes = [p.error_code for t in kafka_commit.topics for p in t.partitions]
    assert codes == [ErrorCode.coordinator_not_available], kafka_commit
    init, _ = answers["kafka init producer id"]  # its core's first: a block of ids to claim
    assert init.error_code == ErrorCode.coordinator_not_available, init
    for name in ("our fetch", "our commit"):
        resp, _ = answers[name]
        assert resp.error == m.ErrorCode.REQUEST_TIMED_OUT and resp.error.retriable, (name, resp)
    resp, took = produced
    assert resp.error == m.ErrorCode.NONE, resp
    assert took < 1.0, f"a produce waited {took:.2f} s behind the group calls"


def test_any_node_answers_a_groups_committed_offsets(cluster: Cluster) -> None:
    """A cluster's group offsets live in etcd, read linearizably: every node answers a Kafka
    OffsetFetch with them, not only the group's coordinator (which moves with the live set while
    the nodes' views of it differ; a librdkafka consumer answered NOT_COORDINATOR a few times in a
    row gives up fetching its partitions until the next rebalance: the nemesis's pause test)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.kafka.codec import request_schema
    from labkit.kafka_requests import build, frame, read_response

    boot = ",".join(n.bootstrap for n in cluster.nodes.values())
    admin = AdminClient({"bootstrap.servers": boot})
    admin.create_topics([NewTopic("anyc", 1, 3)])["anyc"].result(20)
    wait_for(lambda: admin.list_topics("anyc", timeout=5).topics["anyc"].partitions[0].leader >= 0)
    producer = confluent_kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    for i in range(10):
        producer.produce("anyc", f"v{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    c = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "anyc", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("anyc", 0, 6)], asynchronous=False)
    c.close()
    schema = request_schema(9, 5)
    mod = sys.modules[schema.__module__]
    topic = build(mod.OffsetFetchRequestTopic, name="anyc", partition_indexes=(0,))
    body = build(schema, group_id="anyc", topics=(topic,))
    answers = {}
    for i, node in cluster.nodes.items():
        with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
            s.sendall(frame(9, 5, 1, body))
            data = b""
            while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
                data += s.recv(65536)
        resp = read_response(9, 5, data)[1]
        answers[i] = (resp.error_code, resp.topics[0].partitions[0].committed_offset)
    assert answers == {i: (ErrorCode.none, 6) for i in cluster.nodes}


def test_a_new_leader_answers_a_sequence_gap_retriably(cluster: Cluster) -> None:
    """On real processes: an idempotent producer's s1 is refused NOT_OWNER by
    a follower, whose leader is then killed; s2 reaches the new leader right after it began to
    lead. Kafka's answer to that gap, OUT_OF_ORDER_SEQUENCE, makes librdkafka bump its epoch and
    resend everything unacknowledged (duplicating what the new leader already held); ours is
    retriable, and s1 and s2 resent are stored once each, after s0."""
    with Admin(cluster.bootstrap) as admin:
        topic_id = admin.create_topic("gapped", 1, replication=3)
    state = wait_for(lambda: cluster.states(1, topic_id).get(0))
    wait_for(lambda: len(cluster.states(1, topic_id)[0]["isr"]) == 3)
    leader = state["leader"]
    # Node 1's view can name the placement before the other nodes' cores act on it: until then a
    # replica refuses (NOT_OWNER, "holds no replica"; nothing stored), so s0 is sent until taken.
    for node in state["replicas"]:
        wait_for(lambda node=node: (cluster.states(node, topic_id).get(0) or {}).get("leader") == leader)
    pid = 2**41 + 37
    s = [encode_batch([b"s%d" % i], producer_id=pid, producer_epoch=0, base_sequence=i) for i in range(3)]

    def send(node: int, records: bytes) -> m.ProduceResponse:
        wire = Wire(cluster.nodes[node].port)
        try:
            resp = wire.rpc(m.ProduceRequest(topic_id, 0, m.Acks.ALL, 5000, records))
        finally:
            wire.close()
        assert isinstance(resp, m.ProduceResponse), resp
        return resp

    first = wait_for(lambda: (r := send(leader, s[0])).error != m.ErrorCode.NOT_OWNER and r)
    assert isinstance(first, m.ProduceResponse) and first.error == m.ErrorCode.NONE, first
    follower = next(i for i in state["replicas"] if i != leader)
    assert send(follower, s[1]).error == m.ErrorCode.NOT_OWNER
    cluster.nodes[leader].kill()
    survivor = next(i for i in cluster.nodes if i != leader)
    new = wait_for(
        lambda: (p := cluster.states(survivor, topic_id)[0])["leader"] not in (leader, -1) and p["leader"]
    )
    assert isinstance(new, int)
    wait_for(lambda: cluster.states(new, topic_id)[0]["leader"] == new)
    # The view file names the new leader up to one poll before the node's core acts on it: until
    # then s2 is refused NOT_OWNER (not stored), and a client resends it, as here.
    gap = wait_for(lambda: (r := send(new, s[2])).error != m.ErrorCode.NOT_OWNER and r)
    assert isinstance(gap, m.ProduceResponse)
    assert gap.error == m.ErrorCode.REQUEST_TIMED_OUT, gap
    assert [send(new, s[i]).error for i in (1, 2)] == [m.ErrorCode.NONE] * 2
    wire = Wire(cluster.nodes[new].port)
    try:
        assert [r.value for r in wire.fetch_all(topic_id, 0)] == [b"s0", b"s1", b"s2"]
    finally:
        wire.close()
    cluster.nodes[leader].start()
    wait_for(lambda: all(len(p["isr"]) == 3 for p in cluster.view(leader)["partitions"]), timeout=30)


def test_topic_configs_altered_live_on_every_node(cluster: Cluster) -> None:
    """A topic's configs live in its etcd record: created with them, altered through one node,
    described alike by every node's cores within moments, and in effect on the leaders: a batch
    above max.message.bytes refused; with a node down, acks=all refused (NOT_ENOUGH_REPLICAS) by
    a topic whose min.insync.replicas is 3 and served by one that keeps the cluster's 2."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

    from labkit.kafka_requests import describe_configs

    boot = cluster.nodes[1].bootstrap
    admin = AdminClient({"bootstrap.servers": boot})
    for name, configs in (("kcfg", {"retention.ms": "600000"}), ("kplain", {})):
        admin.create_topics([NewTopic(name, 3, 3, config=configs)])[name].result(20)
        wait_for(
            lambda n=name: all(
                p.leader >= 0 for p in admin.list_topics(n, timeout=5).topics[n].partitions.values()
            )
        )

    def everywhere(name: str, value: str) -> bool:
        return all(
            describe_configs(node.core_ports[0], [(2, "kcfg")], (name,))[0].configs[0].value == value
            for node in cluster.nodes.values()
            if node.running()
        )

    wait_for(lambda: everywhere("retention.ms", "600000"), timeout=10)

    def codes(topic: str, size: int) -> set[object]:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": cluster.bootstrap, "acks": "all", "retries": 0, "message.timeout.ms": 5000}
        )
        errors: list[object] = []
        for p in range(3):
            producer.produce(topic, b"x" * size, partition=p, on_delivery=lambda e, _m: errors.append(e))
        assert producer.flush(30) == 0
        return {e.code() if e is not None else None for e in errors}  # type: ignore[attr-defined]

    assert codes("kcfg", 10_000) == {None}
    entries = [
        ConfigEntry("max.message.bytes", "4096", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("min.insync.replicas", "3", incremental_operation=AlterConfigOpType.SET),
    ]
    change = ConfigResource("topic", "kcfg", incremental_configs=entries)
    admin.incremental_alter_configs([change])[change].result(20)
    wait_for(
        lambda: everywhere("max.message.bytes", "4096") and everywhere("min.insync.replicas", "3"), timeout=10
    )
    wait_for(lambda: codes("kcfg", 10_000) == {KafkaError.MSG_SIZE_TOO_LARGE}, timeout=10, step=0.5)
    assert codes("kcfg", 100) == {None}, "three in sync: enough"
    for node in cluster.nodes.values():
        registry = json.loads((node.data_dir / "topics.json").read_text())
        (topic,) = [t for t in registry["topics"] if t["name"] == "kcfg"]
        assert topic["configs"] == {
            "max.message.bytes": "4096",
            "min.insync.replicas": "3",
            "retention.ms": "600000",
        }
    cluster.nodes[3].kill()  # restarted by the `healed` fixture
    wait_for(lambda: codes("kcfg", 100) == {KafkaError.NOT_ENOUGH_REPLICAS}, timeout=20, step=0.5)
    assert codes("kplain", 100) == {None}, "the cluster's min.insync.replicas (2) is met"
