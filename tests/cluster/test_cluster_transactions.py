"""Kafka transactions on a real three-node cluster (three `broker serve --etcd`, a real etcd; node 2
on io_uring, the others on uvloop, so markers cross both backends' links) with confluent-kafka's
transactional producer and read_committed consumers: commits and aborts over partitions led by
different nodes; kill -9 of the node coordinating the transactional id mid-transaction (the
state partition's new leader takes the id over, the open transaction is aborted by the next
producer's init and what was committed stays whole); kill -9 of a data partition's leader
mid-transaction (the commit's marker reaches the new leader). The internal topic cannot be
deleted through the cluster's delete either."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from labkit.brokerproc import wait_for
from labkit.clusterchecker import topic_ids
from ringlog_proto.routing import coordinator_node as group_node
from ringlog_proto.routing import txn_partition

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from test_cluster import Cluster, healed  # noqa: E402, F401  (tests/cluster; healed: autouse)

STATE_PARTITIONS = 3
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cluster(etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("txn-cluster"),
        etcd.endpoints,
        extra=("--transaction-state-partitions", str(STATE_PARTITIONS)),
    )
    c.nodes[2].backend = "io_uring"
    try:
        c.start()
        wait_for(lambda: all(sorted(c.view(i)["live"]) == [1, 2, 3] for i in (1, 2, 3)))
        yield c
    finally:
        c.close()


def data_topic(cluster: Cluster, name: str) -> dict[int, int]:
    """A new topic of three partitions on three replicas: partition -> leader node, once all led."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, 3, 3)])[name].result(20)
    node = next(i for i, n in cluster.nodes.items() if n.running())
    tid = wait_for(lambda: topic_ids(str(cluster.nodes[node].data_dir)).get(name))

    def led() -> dict[int, int] | None:
        states = cluster.states(node, tid)
        leaders = {p: s["leader"] for p, s in states.items()}
        return leaders if len(leaders) == 3 and all(v > 0 for v in leaders.values()) else None

    return wait_for(led, timeout=TIMEOUT_S)


def coordinator_node(cluster: Cluster, txn_id: str) -> int:
    """The node leading `txn_id`'s __transaction_state partition (its coordinator)."""
    node = next(i for i, n in cluster.nodes.items() if n.running())
    tid = wait_for(lambda: topic_ids(str(cluster.nodes[node].data_dir)).get("__transaction_state"))
    state = cluster.states(node, tid)[txn_partition(txn_id, STATE_PARTITIONS)]
    return int(state["leader"])


def coordinator_for_group(group: str) -> int:
    """The node coordinating `group` while all three are live."""
    return group_node(group, (1, 2, 3))


def producer(cluster: Cluster, txn_id: str) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id, "linger.ms": 1}
    )
    p.init_transactions(TIMEOUT_S)
    return p


def txn(p: confluent_kafka.Producer, topic: str, tag: str, commit: bool = True) -> list[tuple[int, bytes]]:
    """One transaction of a record to each of the topic's three partitions."""
    p.begin_transaction()
    records = [(i, f"{tag}-{i}".encode()) for i in range(3)]
    for i, value in records:
        p.produce(topic, value, partition=i)
    if commit:
        p.commit_transaction(TIMEOUT_S)
    else:
        assert p.flush(TIMEOUT_S) == 0  # librdkafka's abort drops what it has not sent
        p.abort_transaction(TIMEOUT_S)
    return records


def read_committed(cluster: Cluster, topic: str, expect: int) -> dict[int, list[bytes]]:
    """Every record read_committed shows, per partition in offset order."""
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.assign([confluent_kafka.TopicPartition(topic, i, confluent_kafka.OFFSET_BEGINNING) for i in range(3)])
    got: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    deadline = time.monotonic() + TIMEOUT_S
    idle = 0
    try:
        while idle < 3 and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                idle += 1 if sum(map(len, got.values())) >= expect else 0
            elif not msg.error():
                got[msg.partition()].append(msg.value())
    finally:
        c.close()
    return got


def by_partition(records: list[tuple[int, bytes]]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for i, value in records:
        out[i].append(value)
    return out


def test_commits_and_aborts_across_nodes(cluster: Cluster) -> None:
    leaders = data_topic(cluster, "txc")
    assert len(set(leaders.values())) > 1, leaders  # markers go to more than one node
    p = producer(cluster, "txc-id")
    committed: list[tuple[int, bytes]] = []
    for n in range(6):
        records = txn(p, "txc", f"t{n}", commit=n % 3 != 2)
        if n % 3 != 2:
            committed += records
    assert read_committed(cluster, "txc", len(committed)) == by_partition(committed)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    with pytest.raises(confluent_kafka.KafkaException):  # the coordinators' state stays
        admin.delete_topics(["__transaction_state"])["__transaction_state"].result(20)
    assert "__transaction_state" in admin.list_topics(timeout=10).topics


def test_coordinator_node_killed_mid_transaction(cluster: Cluster) -> None:
    data_topic(cluster, "txk")
    old = producer(cluster, "txk-id")
    before = txn(old, "txk", "before")
    old.begin_transaction()
    for i in range(3):
        old.produce("txk", b"open", partition=i)
    assert old.flush(TIMEOUT_S) == 0
    victim = coordinator_node(cluster, "txk-id")
    cluster.nodes[victim].kill()
    killed = time.monotonic()
    new = producer(cluster, "txk-id")  # the new coordinator loads the id and aborts the open txn
    after = txn(new, "txk", "after")
    failover = time.monotonic() - killed
    assert coordinator_node(cluster, "txk-id") != victim
    assert read_committed(cluster, "txk", 6) == by_partition(before + after)
    with pytest.raises(confluent_kafka.KafkaException):  # the zombie is fenced
        old.commit_transaction(TIMEOUT_S)
    print(f"\ncoordinator failover after kill -9 of node {victim}: first commit in {failover:.2f} s")


def test_data_leader_killed_mid_transaction(cluster: Cluster) -> None:
    leaders = data_topic(cluster, "txd")
    p = producer(cluster, "txd-id")
    coordinator = coordinator_node(cluster, "txd-id")
    victim = next((n for n in leaders.values() if n != coordinator), None)
    assert victim is not None, (leaders, coordinator)
    before = txn(p, "txd", "before")
    p.begin_transaction()
    records = [(i, f"mid-{i}".encode()) for i in range(3)]
    for i, value in records:
        p.produce("txd", value, partition=i)
    assert p.flush(TIMEOUT_S) == 0  # acks=all: on the in-sync followers too
    cluster.nodes[victim].kill()
    killed = time.monotonic()
    p.commit_transaction(TIMEOUT_S)  # its marker goes to the new leader
    after = txn(p, "txd", "after")
    took = time.monotonic() - killed
    assert read_committed(cluster, "txd", 9) == by_partition(before + records + after)
    print(f"\ndata leader node {victim} killed mid-transaction: commit and the next txn in {took:.2f} s")


def test_consume_transform_produce_with_the_group_on_another_node(cluster: Cluster) -> None:
    """KIP-447's loop (read_committed input, transactional output, the group's offsets sent to the
    transaction) with the group coordinated on another node than the transaction: the commit's
    group marker crosses nodes and makes the pending offsets (kept in etcd) the group's; an aborted
    round leaves neither output nor offsets, and the loop takes it again from the committed ones."""
    data_topic(cluster, "ctp-in")
    data_topic(cluster, "ctp-out")
    feed = producer(cluster, "ctp-feed")
    txn(feed, "ctp-in", "in0")
    txn(feed, "ctp-in", "in1")
    txn_id = "ctp-id"
    p = producer(cluster, txn_id)
    here = coordinator_node(cluster, txn_id)
    group = next(g for g in (f"ctp-g{k}" for k in range(100)) if coordinator_for_group(g) != here)
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    c.subscribe(["ctp-in"])
    out: list[tuple[int, bytes]] = []
    sent: dict[int, int] = {}
    rounds = 0
    try:
        while len(out) < 6:
            assert rounds < 10, out
            batch = [msg for msg in c.consume(3, 5) if not msg.error()]
            if not batch:
                continue
            rounds += 1
            p.begin_transaction()
            for msg in batch:
                p.produce("ctp-out", msg.value().upper(), partition=msg.partition())
            positions = c.position(c.assignment())
            p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), TIMEOUT_S)
            if rounds == 1:  # the first round aborted: its input is taken again
                assert p.flush(TIMEOUT_S) == 0
                p.abort_transaction(TIMEOUT_S)
                committed = c.committed(c.assignment(), TIMEOUT_S)
                for tp in committed:
                    c.seek(
                        confluent_kafka.TopicPartition(
                            tp.topic,
                            tp.partition,
                            tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING,
                        )
                    )
                continue
            p.commit_transaction(TIMEOUT_S)
            sent.update({tp.partition: tp.offset for tp in positions if tp.offset >= 0})
            out += [(msg.partition(), msg.value().upper()) for msg in batch]
        committed = {tp.partition: tp.offset for tp in c.committed(c.assignment(), TIMEOUT_S)}
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        described = admin.describe_consumer_groups([group])[group].result(TIMEOUT_S)
        assert described.coordinator.id != here, (described.coordinator, here)
    finally:
        c.close()
    # the positions the last committed round sent: past in1 (at 2; librdkafka's position may also
    # be past the marker after it, at 3, when the fetch brought the marker)
    assert committed == sent and all(o in (3, 4) for o in committed.values()), (committed, sent)
    got = read_committed(cluster, "ctp-out", 6)
    assert sorted(v for vs in got.values() for v in vs) == sorted(v for _, v in out)
    assert sorted(v for _, v in out) == sorted(f"IN{t}-{i}".encode() for t in (0, 1) for i in range(3))


def test_no_coordinator_while_too_few_nodes_live(cluster: Cluster) -> None:
    """With one node of three live, a transaction coordinator cannot keep its state (min.insync.replicas
    2 on __transaction_state, or the topic not made at all): a producer's init waits (librdkafka
    retries COORDINATOR_NOT_AVAILABLE and NOT_ENOUGH_REPLICAS) and times out retriably, and
    succeeds once the nodes are back."""
    data_topic(cluster, "txq")
    for i in (2, 3):
        cluster.nodes[i].kill()
    wait_for(lambda: sorted(cluster.view(1)["live"]) == [1], timeout=TIMEOUT_S)
    p = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.nodes[1].bootstrap, "transactional.id": "txq-id", "linger.ms": 1}
    )
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        p.init_transactions(3)
    err = raised.value.args[0]
    assert err.retriable() and not err.fatal(), err
    for i in (2, 3):
        cluster.nodes[i].start()
    p.init_transactions(TIMEOUT_S)  # librdkafka lets a timed-out init be called again
    p.begin_transaction()
    for i in range(3):
        p.produce("txq", b"back", partition=i)
    p.commit_transaction(TIMEOUT_S)
    assert read_committed(cluster, "txq", 3) == {i: [b"back"] for i in range(3)}
