"""Kafka transactions on a real three-node cluster (three `broker serve --etcd`, a real etcd; node 2
on io_uring, the others on uvloop, so markers cross both backends' links) with confluent-kafka's
transactional producer and read_committed consumers: commits and aborts over partitions led by
different nodes; kill -9 of the node coordinating the transactional id mid-transaction (the
state partition's new leader takes the id over, the open transaction is aborted by the next
producer's init and what was committed stays whole); kill -9 of a data partition's leader
mid-transaction (the commit's marker reaches the new leader); a hanging transaction (no
coordinator of any node holds it) aborted by the sweep while one held by a coordinator on another
node stays open. The internal topic cannot be deleted through the cluster's delete either."""

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
# short enough for the hanging-transaction sweep's test (a transaction idle past max timeout + 2
# abort intervals is looked at every check interval), long enough for the failovers elsewhere
MAX_TIMEOUT_MS = 10_000
ABORT_INTERVAL_MS = 500
HANG_THRESHOLD_S = (MAX_TIMEOUT_MS + 2 * ABORT_INTERVAL_MS) / 1000


@pytest.fixture(scope="module")
def cluster(etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("txn-cluster"),
        etcd.endpoints,
        extra=(
            "--transaction-state-partitions",
            str(STATE_PARTITIONS),
            "--transaction-max-timeout-ms",
            str(MAX_TIMEOUT_MS),
            "--transaction-abort-interval-ms",
            str(ABORT_INTERVAL_MS),
            "--transaction-hang-check-interval-ms",
            "300",
        ),
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
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": txn_id,
            "linger.ms": 1,
            "transaction.timeout.ms": MAX_TIMEOUT_MS,
        }
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
        {
            "bootstrap.servers": cluster.nodes[1].bootstrap,
            "transactional.id": "txq-id",
            "linger.ms": 1,
            "transaction.timeout.ms": MAX_TIMEOUT_MS,
        }
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


def test_a_hanging_transaction_is_aborted_by_the_sweep(cluster: Cluster) -> None:
    """A transactional batch no coordinator of any node knows of (a raw Produce naming a
    transactional id that never asked its coordinator, with an idempotent producer id) holds
    read_committed back on its partition until the sweep of the partition's leader, having asked
    every core of every live node (FIND_HELD_TXNS over the nodes' links), aborts it. A
    transaction open meanwhile in another partition, held by its coordinator on another node
    than that partition's leader, is answered held by that node and stays open: it commits whole."""
    import datetime
    import struct
    import sys
    from typing import Any

    from crc32c import crc32c
    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i8, i16, i32, i64

    from broker.kafka.codec import make, request_schema
    from labkit.brokerproc import Wire
    from labkit.kafka_requests import build, rpc
    from ringlog_proto import messages as m
    from ringlog_proto.batch import CRC_START, encode_batch
    from ringlog_proto.batch_header import TRANSACTIONAL_BIT

    def kafka(node: int, api_key: int, version: int, **values: object) -> Any:
        body = build(request_schema(api_key, version), **values)
        return rpc(cluster.nodes[node].port, api_key, version, body)

    def last_stable_offset(node: int, partition: int) -> int:
        module = sys.modules[request_schema(2, 5).__module__]
        latest = make(
            module.ListOffsetsPartition,
            partition_index=i32(partition),
            current_leader_epoch=i32(-1),
            timestamp=i64(-1),
        )
        topic = make(module.ListOffsetsTopic, name="txh", partitions=(latest,))
        resp = kafka(node, 2, 5, replica_id=i32(-1), isolation_level=i8(1), topics=(topic,))
        (p,) = resp.topics[0].partitions
        assert p.error_code == ErrorCode.none
        return int(p.offset)

    leaders = data_topic(cluster, "txh")
    node = next(i for i, n in cluster.nodes.items() if n.running())
    tid = topic_ids(str(cluster.nodes[node].data_dir))["txh"]
    live = producer(cluster, "txh-live")  # the state topic exists from here on
    held_by = coordinator_node(cluster, "txh-live")
    mine = next((i for i in range(3) if leaders[i] != held_by), None)
    assert mine is not None, (leaders, held_by)  # the live transaction's partition: led elsewhere
    ghost = next(i for i in range(3) if i != mine)
    at = leaders[ghost]
    init = kafka(
        at,
        22,
        4,
        transactional_id=None,
        transaction_timeout=datetime.timedelta(seconds=60),
        producer_id=i64(-1),
        producer_epoch=i16(-1),
    )
    assert init.error_code == ErrorCode.none
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    encoded = time.monotonic()  # the batch's timestamp: its producer's last write, at the latest
    batch = bytearray(encode_batch([b"ghost"], producer_id=pid, producer_epoch=epoch, base_sequence=0))
    struct.pack_into(">h", batch, 21, TRANSACTIONAL_BIT)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[CRC_START:])))
    module = sys.modules[request_schema(0, 8).__module__]
    data = make(
        module.TopicProduceData,
        name="txh",
        partition_data=(make(module.PartitionProduceData, index=i32(ghost), records=bytes(batch)),),
    )

    def produced() -> bool:
        resp = kafka(
            at,
            0,
            8,
            transactional_id="txh-ghost",
            acks=i16(-1),
            timeout=datetime.timedelta(seconds=10),
            topic_data=(data,),
        )
        code = resp.responses[0].partition_responses[0].error_code
        assert code in (ErrorCode.none, ErrorCode.not_leader_or_follower), code
        return code == ErrorCode.none

    def asked(node: int, live_pid: int) -> m.FindHeldTxnsResponse:
        """The question a sweep asks another node's core, here from outside."""
        wire = Wire(cluster.nodes[node].port)
        try:
            resp = wire.rpc(m.FindHeldTxnsRequest(((live_pid, tid, mine), (pid, tid, ghost))))
        finally:
            wire.close()
        assert isinstance(resp, m.FindHeldTxnsResponse) and resp.error == m.ErrorCode.NONE, resp
        return resp

    wait_for(produced, timeout=TIMEOUT_S)  # the view can name the leader before it acts on it
    assert last_stable_offset(at, ghost) == 0
    # the live transaction opens late enough to end before its own timeout
    time.sleep(HANG_THRESHOLD_S / 2)
    live.begin_transaction()
    live.produce("txh", b"live", partition=mine)
    assert live.flush(TIMEOUT_S) == 0
    (state,) = kafka(held_by, 65, 0, transactional_ids=("txh-live",)).transaction_states
    assert state.transaction_state == "Ongoing", state
    live_pid = int(state.producer_id)
    answers = {i: asked(i, live_pid) for i in cluster.nodes}
    assert {i: a.held for i, a in answers.items()} == {i: (i == held_by, False) for i in cluster.nodes}
    assert set().union(*(a.loaded for a in answers.values())) == set(range(STATE_PARTITIONS))
    deadline = time.monotonic() + HANG_THRESHOLD_S + TIMEOUT_S
    while last_stable_offset(at, ghost) != 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # the batch, then the sweep's marker
    assert last_stable_offset(at, ghost) == 2
    took = time.monotonic() - encoded
    assert took >= HANG_THRESHOLD_S, took  # not before it was idle past the threshold
    assert asked(held_by, live_pid).held == (True, False)  # the live one is still open, untouched
    live.commit_transaction(TIMEOUT_S)
    assert read_committed(cluster, "txh", 1) == {i: [b"live"] if i == mine else [] for i in range(3)}
    assert "hanging transaction aborted" in cluster.nodes[leaders[ghost]].log()
    print(f"\nhanging transaction aborted by the sweep {took:.2f} s after its write")
