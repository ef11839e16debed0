"""Kafka's admin APIs on a real three-node cluster (three `broker serve --etcd`, a real etcd), with
confluent-kafka's AdminClient: CreatePartitions grows a topic in the store, the new partitions
placed over the live nodes as a new topic's are, led and served at once and seen alike by every
node's Metadata; DeleteRecords moves the leader's log start, every follower takes it, and a new
leader elected after a kill -9 of the old one starts there too; DeleteGroups and OffsetDelete
delete the offsets in etcd, which no node answers any more; replicas placed by hand (by our own
client too), elections (preferred and unclean) and reassignments (listed, cancelled, across a
controller's failover); our producer's transactions refused with the reason (our protocol has no
find-coordinator; Kafka clients' are served, test_cluster_transactions.py)."""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode

from broker.client.admin import Admin
from broker.client.errors import InvalidRequestError
from broker.cluster.records import Keys
from broker.cluster.store import EtcdStore
from broker.kafka.codec import make, request_schema
from broker.storage import layout, log_start
from labkit.brokerproc import BrokerProcess, wait_for
from labkit.clusterchecker import topic_ids
from labkit.kafka_requests import rpc
from ringlog_proto.batch import encode_batch

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ElectionType  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402
from test_cluster import Cluster, healed  # noqa: E402, F401  (tests/cluster; healed: autouse)


@pytest.fixture(scope="module")
def cluster(etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("admin-cluster"), etcd.endpoints)
    try:
        c.start()
        wait_for(lambda: all(sorted(c.view(i)["live"]) == [1, 2, 3] for i in (1, 2, 3)))
        yield c
    finally:
        c.close()


def led(admin: AdminClient, topic: str, partitions: int) -> object:
    """The topic's metadata once it has `partitions` partitions, every one led."""

    def ready() -> object:
        t = admin.list_topics(topic, timeout=5).topics[topic]
        return len(t.partitions) == partitions and all(p.leader >= 0 for p in t.partitions.values()) and t

    return wait_for(ready, timeout=30)


def test_create_partitions_in_a_cluster(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    admin.create_topics([NewTopic("grown", 2, 3)])["grown"].result(20)
    led(admin, "grown", 2)
    assert admin.create_partitions([NewPartitions("grown", 6)])["grown"].result(20) is None
    for node in cluster.nodes.values():  # every node's view: 6 partitions, each led, 3 replicas
        each = AdminClient({"bootstrap.servers": node.bootstrap})
        t = led(each, "grown", 6)
        assert all(len(p.replicas) == 3 for p in t.partitions.values())  # type: ignore[attr-defined]
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([NewPartitions("grown", 6)])["grown"].result(20)
    assert (
        admin.create_partitions([NewPartitions("grown", 9)], validate_only=True)["grown"].result(20) is None
    )
    assert len(admin.list_topics("grown", timeout=5).topics["grown"].partitions) == 6
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(6):
        producer.produce("grown", value=b"v%d" % i, partition=i)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": "grown-reader", "enable.auto.commit": False}
    )
    got: dict[int, bytes] = {}
    try:
        consumer.assign([confluent_kafka.TopicPartition("grown", i, 0) for i in range(6)])
        deadline = time.monotonic() + 30
        while len(got) < 6 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got[msg.partition()] = msg.value()
    finally:
        consumer.close()
    assert got == {i: b"v%d" % i for i in range(6)}


def test_delete_topics_removes_the_files_on_every_node(cluster: Cluster) -> None:
    """Every replica's files go with the topic, not at the node's next start: they held its disk
    and page cache meanwhile. A topic made again under the name is a new one, empty."""
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    admin.create_topics([NewTopic("doomed", 3, 3)])["doomed"].result(20)
    led(admin, "doomed", 3)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(3):
        producer.produce("doomed", value=b"old", partition=i)
    assert producer.flush(30) == 0
    topic_id = topic_ids(cluster.nodes[1].data_dir)["doomed"]
    dirs = [layout.topic_dir(str(n.data_dir), topic_id) for n in cluster.nodes.values()]
    assert all(sorted(os.listdir(d)) == ["0", "1", "2"] for d in dirs)  # a replica of each on each
    admin.delete_topics(["doomed"])["doomed"].result(20)
    wait_for(lambda: not any(os.path.exists(d) for d in dirs), timeout=20)
    admin.create_topics([NewTopic("doomed", 1, 3)])["doomed"].result(20)
    led(admin, "doomed", 1)
    assert wait_for(lambda: topic_ids(cluster.nodes[1].data_dir).get("doomed"), timeout=20) != topic_id
    low, high = _watermarks(cluster.bootstrap, "doomed")
    assert (low, high) == (0, 0)


def _watermarks(bootstrap: str, topic: str, timeout: float = 10) -> tuple[int, int]:
    """Partition 0's (low, high) watermarks, as its leader answers them."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=timeout)
    finally:
        consumer.close()


def test_delete_records_reaches_the_followers_and_outlives_the_leader(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    admin.create_topics([NewTopic("trimmed", 1, 3)])["trimmed"].result(20)
    t = led(admin, "trimmed", 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce("trimmed", value=b"v%d" % i, partition=0)
        producer.flush(10)  # a batch each: the start lands inside the segment, between batches
    assert producer.flush(30) == 0
    [done] = admin.delete_records([confluent_kafka.TopicPartition("trimmed", 0, 4)]).values()
    assert done.result(20).low_watermark == 4
    topic_id = topic_ids(cluster.nodes[1].data_dir)["trimmed"]

    def start_of(node: int) -> int:
        directory = layout.partition_dir(str(cluster.nodes[node].data_dir), topic_id, 0)
        return log_start.read(directory)

    wait_for(lambda: all(start_of(n) == 4 for n in cluster.nodes), timeout=20)  # every replica's
    leader = t.partitions[0].leader // 1000  # type: ignore[attr-defined]
    cluster.nodes[leader].kill()
    try:
        others = ",".join(n.bootstrap for i, n in cluster.nodes.items() if i != leader)
        # the new leader's log starts where the old one's did
        assert wait_for(lambda: _low(others, "trimmed"), timeout=60) == 4
    finally:
        cluster.nodes[leader].start()


def _low(bootstrap: str, topic: str) -> int | None:
    """The partition's low watermark once its leader answers with every record, else None."""
    try:
        low, high = _watermarks(bootstrap, topic, timeout=3)
    except confluent_kafka.KafkaException:
        return None
    return low if high == 10 else None


def test_group_offsets_are_deleted_in_the_store(cluster: Cluster) -> None:
    """The offsets live in etcd: deleted through the group's coordinator, no node answers them."""
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KpTopicPartition

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("gd", 2, 3)])["gd"].result(20)
    led(admin, "gd", 2)
    tps = [confluent_kafka.TopicPartition("gd", p, 10 + p) for p in range(2)]
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "gdel"})
    consumer.commit(offsets=tps, asynchronous=False)
    consumer.close()

    def committed(node: int) -> list[int]:
        c = confluent_kafka.Consumer({"bootstrap.servers": cluster.nodes[node].bootstrap, "group.id": "gdel"})
        try:
            return [
                tp.offset for tp in c.committed([confluent_kafka.TopicPartition("gd", p) for p in range(2)])
            ]
        finally:
            c.close()

    assert all(committed(n) == [10, 11] for n in cluster.nodes)
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=15_000)
    try:
        result = kp.delete_group_offsets("gdel", [KpTopicPartition("gd", 0)])
        assert [err.__name__ for err in result.values()] == ["NoError"]
        assert all(committed(n) == [-1001, 11] for n in cluster.nodes)
        assert dict(kp.delete_groups(["gdel"])) == {"gdel": "OK"}
        assert all(committed(n) == [-1001, -1001] for n in cluster.nodes)
        assert dict(kp.delete_groups(["gdel"])) == {"gdel": "GroupIdNotFoundError"}
    finally:
        kp.close()


def test_describe_cluster_and_log_dirs_in_a_cluster(cluster: Cluster) -> None:
    """Every core of every live node is a broker; each partition's log dir is listed by the core
    holding its replica on each of its three nodes, followers included."""
    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic("dirs", 2, 3)])["dirs"].result(20)
    led(admin, "dirs", 2)
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=15_000)
    try:
        described = kp.describe_cluster()
        assert sorted(b["broker_id"] // 1000 for b in described["brokers"]) == [1, 2, 3]
        holders: dict[int, set[int]] = {0: set(), 1: set()}
        for broker in kp.describe_log_dirs(topic_partitions=["dirs"]):
            for t in broker["log_dirs"][0]["topics"]:
                for p in t["partitions"]:
                    holders[p["partition_index"]].add(broker["broker"] // 1000)
        assert holders == {0: {1, 2, 3}, 1: {1, 2, 3}}
    finally:
        kp.close()


def test_create_topics_v7_in_a_cluster(cluster: Cluster) -> None:
    """kafka-python 3 asks CreateTopics v7: the answer carries the partition count, the replication
    factor (the one asked, or the cluster's default: the first partition's replicas as this node's
    view has them), every config and the topic id every node's Metadata gives."""
    kafka = pytest.importorskip("kafka")
    client = kafka.KafkaAdminClient(bootstrap_servers=cluster.nodes[2].bootstrap)
    try:
        result = client.create_topics(
            {
                "made3": {"num_partitions": 2, "replication_factor": 3, "configs": {"retention.ms": "90000"}},
                "made-default": {"num_partitions": 1},
            }
        )
    finally:
        client.close()
    topics = {t["name"]: t for t in result["topics"]}
    made = topics["made3"]
    assert (made["error_code"], made["num_partitions"], made["replication_factor"]) == (0, 2, 3)
    assert made["configs"]["retention.ms"]["value"] == "90000"
    default = topics["made-default"]
    assert (default["error_code"], default["replication_factor"]) == (0, 3), "the cluster's default"
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    led(admin, "made3", 2)
    described = admin.describe_topics(confluent_kafka.TopicCollection(["made3"]))["made3"].result(20)
    assert str(described.topic_id) == _base64_id(made["topic_id"])


def test_our_protocol_refuses_transactions_in_a_cluster(cluster: Cluster) -> None:
    """Our protocol has no find-coordinator, so a clustered node refuses our producer's
    transactions at once with the reason (Kafka clients' are served: test_cluster_transactions.py);
    our idempotent producer on the same node still produces."""
    from broker.client import Producer
    from broker.client.errors import TransactionalIdAuthorizationError, TransactionError

    with Admin(cluster.nodes[1].bootstrap) as admin:
        admin.create_topic("ours-in-cluster", 1)
    with (
        Producer(cluster.nodes[1].bootstrap, transactional_id="ours-refused") as producer,
        pytest.raises(TransactionError, match="single node") as refused,
    ):
        producer.init_transactions()
    assert isinstance(refused.value.__cause__, TransactionalIdAuthorizationError)
    assert refused.value.fatal
    with Producer(cluster.nodes[1].bootstrap) as plain:
        assert plain.send("ours-in-cluster", b"v", partition=0).result(30).offset == 0


def _base64_id(topic_id: object) -> str:
    """A topic id as librdkafka prints it (base64 without padding)."""
    return base64.b64encode(uuid.UUID(str(topic_id)).bytes).decode().rstrip("=")


def _controller_lease(cluster: Cluster, endpoints: list[str]) -> tuple[int, int]:
    """(node, lease) of the cluster's controller, read from etcd."""
    store = EtcdStore(endpoints)
    try:
        kv = store.get(Keys(cluster.name).controller)
        assert kv is not None
        return int(json.loads(kv.value)["node_id"]), kv.lease
    finally:
        store.close()


def _depose_controller(cluster: Cluster, endpoints: list[str]) -> int:
    """Revoke the controller's election lease until a node other than the one holding it now
    wins the next election (as SWIM's verdict on a dead controller does): the new one's."""
    first, _ = _controller_lease(cluster, endpoints)

    def moved() -> int | None:
        node, lease = _controller_lease(cluster, endpoints)
        if node != first:
            return node
        store = EtcdStore(endpoints)
        try:
            store.lease_revoke(lease)
        finally:
            store.close()
        time.sleep(0.3)
        return None

    return int(wait_for(moved, timeout=30))  # type: ignore[arg-type]


def _produce_to_node(node: BrokerProcess, topic: str, partition: int, value: bytes) -> ErrorCode:
    """A Kafka Produce (acks=1) sent to `node` itself, as a client whose metadata is stale does."""
    schema = request_schema(0, 8)
    assert schema is not None
    module = sys.modules[schema.__module__]
    data = make(module.PartitionProduceData, index=partition, records=encode_batch([value]))
    body = make(
        schema,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(make(module.TopicProduceData, name=topic, partition_data=(data,)),),
    )
    resp = rpc(node.port, 0, 8, body)
    return resp.responses[0].partition_responses[0].error_code


def _read(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Every record of the topic's partitions up to their high watermarks, by partition, in
    offset order."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "enable.auto.commit": False}
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    try:
        ends = {p: _high_watermark(consumer, topic, p) for p in range(partitions)}
        reached = dict.fromkeys(ends, 0)
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while any(reached[p] < ends[p] for p in ends) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got[msg.partition()].append(msg.value())
                reached[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return got


def _high_watermark(consumer: confluent_kafka.Consumer, topic: str, partition: int) -> int:
    """The partition's high watermark, asked again on a retriable error, as a client does: right
    after an election the new leader may not have taken its role yet when asked (NOT_LEADER,
    seen once in CI)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            tp = confluent_kafka.TopicPartition(topic, partition)
            return consumer.get_watermark_offsets(tp, timeout=10)[1]
        except confluent_kafka.KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _elected(
    admin: AdminClient, election: object, topic: str, partitions: list[int]
) -> dict[int, str | None]:
    tps = [confluent_kafka.TopicPartition(topic, p) for p in partitions]
    done = admin.elect_leaders(election, tps).result(20)
    return {tp.partition: (None if e is None else e.name()) for tp, e in done.items()}


def test_placement_by_hand_elections_and_a_reassignment_across_a_controller_failover(
    cluster: Cluster, etcd
) -> None:
    """Replicas placed by hand (CreateTopics, then CreatePartitions) are the store's placement;
    a reassignment onto a dead node waits, is listed (replicas, adding, removing), cancelled and
    started again, outlives the controller, and completes once the node is back: the removed
    replica answers NOT_LEADER_OR_FOLLOWER, and every acknowledged record is still there."""
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    admin.create_topics([NewTopic("placed", 2, replica_assignment=[[1000, 2000], [2000, 3000]])])[
        "placed"
    ].result(20)
    led(admin, "placed", 2)
    assert (
        admin.create_partitions([NewPartitions("placed", 3, replica_assignment=[[3000, 1000]])])[
            "placed"
        ].result(20)
        is None
    )
    t = led(admin, "placed", 3)
    placed = {p.id: (p.replicas, p.leader) for p in t.partitions.values()}  # type: ignore[attr-defined]
    assert placed == {0: ([1000, 2000], 1000), 1: ([2000, 3000], 2000), 2: ([3000, 1000], 3000)}
    topic_id = topic_ids(cluster.nodes[1].data_dir)["placed"]
    assert [s["replicas"] for _, s in sorted(cluster.states(1, topic_id).items())] == [[1, 2], [2, 3], [3, 1]]
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_REPLICA_ASSIGNMENT"):
        admin.create_topics([NewTopic("nowhere", 1, replica_assignment=[[9000]])])["nowhere"].result(20)
    with Admin(cluster.bootstrap) as ours:  # our protocol: node ids
        ours_id = ours.create_topic("ours-placed", 2, assignment=[[2, 3], [3, 1]])
        with pytest.raises(InvalidRequestError, match="node 9, but no such node is registered"):
            ours.create_topic("ours-nowhere", 1, assignment=[[9]])
    states = wait_for(lambda: len(s := cluster.states(1, ours_id)) == 2 and s)
    assert [s["replicas"] for _, s in sorted(states.items())] == [[2, 3], [3, 1]]  # type: ignore[attr-defined]

    # Idempotent, as "nothing else read" below needs: leaders move under this producer, and a plain
    # producer's retry may write a batch twice, in Kafka as here. Its metadata is stale, so a first
    # try reaches the old leader; if that node's cores have not yet read the new view (up to one
    # poll), the batch is written there and may be copied by the new leader, still following,
    # before the old one answers NOT_LEADER_OR_FOLLOWER; the retry then writes it again (CI once
    # read the 20 "moving" records twice). Idempotent, the retry's sequence is already in the new
    # leader's producer state (a follower learns it from what it copies) and is not written again.
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True}
    )
    acked: dict[int, list[bytes]] = {0: [], 1: [], 2: []}

    def send(partition: int, values: list[bytes]) -> None:
        def delivered(err: object, msg: object) -> None:
            if err is None:
                acked[msg.partition()].append(msg.value())  # type: ignore[attr-defined]

        for v in values:
            producer.produce("placed", value=v, partition=partition, on_delivery=delivered)
        assert producer.flush(30) == 0

    for p in range(3):
        send(p, [b"before-%d-%d" % (p, i) for i in range(20)])
    assert _elected(admin, ElectionType.PREFERRED, "placed", [0, 1, 2]) == dict.fromkeys(
        range(3), "ELECTION_NOT_NEEDED"
    )

    cluster.nodes[3].kill()
    wait_for(lambda: 3 not in cluster.view(1)["live"], timeout=20)
    assert _elected(admin, ElectionType.PREFERRED, "placed", [2]) == {2: "PREFERRED_LEADER_NOT_AVAILABLE"}
    kp = KafkaAdminClient(bootstrap_servers=cluster.nodes[1].bootstrap, request_timeout_ms=15_000)
    try:
        p0 = KpTopicPartition("placed", 0)
        assert kp.alter_partition_reassignments({p0: [2000, 3000]}) == {p0: None}
        # node 3 is down: the reassignment waits for it, Kafka's order (target, then removing)
        moving = {"replicas": [2000, 3000, 1000], "adding_replicas": [3000], "removing_replicas": [1000]}
        assert kp.list_partition_reassignments() == {p0: moving}
        assert kp.alter_partition_reassignments({p0: None}) == {p0: None}  # cancelled
        assert kp.list_partition_reassignments() == {}
        # Kafka's revert keeps the reassignment's order: node 2 is now preferred, and leads
        wait_for(lambda: cluster.states(1, topic_id)[0]["leader"] == 2, timeout=10)
        assert cluster.states(1, topic_id)[0]["replicas"] == [2, 1]
        # again, now moving the lead off node 2
        assert kp.alter_partition_reassignments({p0: [3000, 1000]}) == {p0: None}
        moving = {"replicas": [3000, 1000, 2000], "adding_replicas": [3000], "removing_replicas": [2000]}
        send(0, [b"moving-0-%d" % i for i in range(20)])  # in sync: nodes 1 and 2
        controller = _depose_controller(cluster, etcd.endpoints)
        assert controller in (1, 2)
        assert kp.list_partition_reassignments() == {p0: moving}  # in etcd, not in a controller
    finally:
        kp.close()

    cluster.nodes[3].start()
    done = wait_for(lambda: not (s := cluster.states(1, topic_id)[0]).get("target") and s, timeout=30)
    assert done["replicas"] == [3, 1] and sorted(done["isr"]) == [1, 3]  # type: ignore[index]
    assert done["leader"] == 3  # type: ignore[index]
    # the old leader, removed, refuses a client whose metadata is stale
    wait_for(lambda: cluster.states(2, topic_id)[0]["leader"] == 3, timeout=10)
    # the node's cores read its view up to one poll after the file changes: until then an acks=1
    # write is still taken (acks=1's limit); after, it must be refused, and stay refused
    stale_taken = 0

    def stale_refused() -> bool:
        nonlocal stale_taken
        code = _produce_to_node(cluster.nodes[2], "placed", 0, b"stale")
        stale_taken += code == ErrorCode.none
        return code == ErrorCode.not_leader_or_follower

    wait_for(stale_refused, timeout=10)
    assert _produce_to_node(cluster.nodes[2], "placed", 0, b"stale") == ErrorCode.not_leader_or_follower
    wait_for(lambda: cluster.states(1, topic_id)[2]["leader"] == 3, timeout=30)  # preferred, back in sync
    assert _elected(admin, ElectionType.PREFERRED, "placed", [2]) == {2: "ELECTION_NOT_NEEDED"}
    cancel = subprocess.run(
        [sys.executable, "-m", "broker.cli", "reassign", "--etcd", ",".join(etcd.endpoints),
         "--cluster-name", cluster.name, "placed", "0", "--cancel"],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert cancel.returncode == 1 and "No partition reassignment is in progress" in cancel.stderr
    for p in range(3):
        send(p, [b"after-%d-%d" % (p, i) for i in range(20)])
    got = _read(cluster.bootstrap, "placed", 3)
    # A stale write node 2's cores took may be kept: node 3's cores, until they too read the view
    # (up to one poll), still followed node 2 and may have copied it. Kept or lost, it was taken
    # at acks=1 by a leader on its way out, as Kafka's may be; never more of them than were taken.
    kept_stale = got[0].count(b"stale")
    got[0] = [v for v in got[0] if v != b"stale"]
    assert kept_stale <= stale_taken
    assert got == acked  # nothing acknowledged lost, nothing else read, in order


def test_a_replica_moved_off_a_node_takes_its_files_with_it(cluster: Cluster) -> None:
    """A reassignment that completes without a node removes its replica's files there, as Kafka's
    StopReplica does: at once on a live node, at its next start on one that was down meanwhile.
    The replicas kept and the one added hold every acknowledged record."""
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient

    # the node that loses its replicas is not the controller, which the admin client talks to
    controller = cluster.view(1)["controller"]
    gone = next(n for n in (1, 2, 3) if n != controller)
    kept, added = controller, next(n for n in (1, 2, 3) if n not in (controller, gone))
    admin = AdminClient({"bootstrap.servers": cluster.nodes[kept].bootstrap})
    assignment = [[kept * 1000, gone * 1000]] * 2
    admin.create_topics([NewTopic("moving", 2, replica_assignment=assignment)])["moving"].result(20)
    led(admin, "moving", 2)
    topic_id = topic_ids(cluster.nodes[kept].data_dir)["moving"]
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    sent = {p: [b"v-%d-%d" % (p, i) for i in range(10)] for p in range(2)}
    for p, values in sent.items():
        for v in values:
            producer.produce("moving", value=v, partition=p)
    assert producer.flush(30) == 0
    on_gone = layout.topic_dir(str(cluster.nodes[gone].data_dir), topic_id)
    assert sorted(os.listdir(on_gone)) == ["0", "1"]

    def moved(p: int) -> bool:
        state = cluster.states(kept, topic_id)[p]
        return not state.get("target") and state["replicas"] == [kept, added]

    kp = KafkaAdminClient(bootstrap_servers=cluster.nodes[kept].bootstrap, request_timeout_ms=15_000)
    try:
        p0, p1 = KpTopicPartition("moving", 0), KpTopicPartition("moving", 1)
        assert kp.alter_partition_reassignments({p0: [kept * 1000, added * 1000]}) == {p0: None}
        wait_for(lambda: moved(0), timeout=30)
        wait_for(lambda: os.listdir(on_gone) == ["1"], timeout=10)  # nothing set aside left either
        cluster.nodes[gone].kill()  # SIGKILL: partition 1 moves while the node is down
        assert kp.alter_partition_reassignments({p1: [kept * 1000, added * 1000]}) == {p1: None}
        wait_for(lambda: moved(1), timeout=30)
    finally:
        kp.close()
    assert os.listdir(on_gone) == ["1"]
    cluster.nodes[gone].start()
    wait_for(lambda: os.listdir(on_gone) == [], timeout=10)
    on_added = layout.topic_dir(str(cluster.nodes[added].data_dir), topic_id)
    assert sorted(os.listdir(on_added)) == ["0", "1"]
    assert _read(cluster.bootstrap, "moving", 2) == sent


def test_an_unclean_election_brings_an_offline_partition_back(cluster: Cluster) -> None:
    """Both replicas die, the in-sync one last; the other returns: offline (unclean election is
    off) until ElectLeaders asks for an unclean one, which elects it with what it holds."""
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    admin.create_topics([NewTopic("unclean", 1, replica_assignment=[[2000, 3000]])])["unclean"].result(20)
    led(admin, "unclean", 1)
    topic_id = topic_ids(cluster.nodes[1].data_dir)["unclean"]
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce("unclean", value=b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    wait_for(lambda: sorted(cluster.states(1, topic_id)[0]["isr"]) == [2, 3], timeout=20)
    cluster.nodes[3].kill()
    wait_for(lambda: cluster.states(1, topic_id)[0]["isr"] == [2], timeout=20)
    cluster.nodes[2].kill()
    wait_for(lambda: cluster.states(1, topic_id)[0]["leader"] == -1, timeout=20)
    cluster.nodes[3].start()
    wait_for(lambda: 3 in cluster.view(1)["live"], timeout=20)
    time.sleep(1.5)  # a controller pass or more: it stays offline on its own
    assert cluster.states(1, topic_id)[0]["leader"] == -1
    # a new client: librdkafka sends ElectLeaders to the controller it last heard of, and does not
    # ask again while that broker is merely down (node 2 may have held the role)
    admin = AdminClient({"bootstrap.servers": cluster.nodes[1].bootstrap})
    assert _elected(admin, ElectionType.PREFERRED, "unclean", [0]) == {0: "PREFERRED_LEADER_NOT_AVAILABLE"}
    assert _elected(admin, ElectionType.UNCLEAN, "unclean", [0]) == {0: None}
    state = cluster.states(1, topic_id)[0]
    assert (state["leader"], state["isr"]) == (3, [3])
    assert _elected(admin, ElectionType.UNCLEAN, "unclean", [0]) == {0: "ELECTION_NOT_NEEDED"}
    assert _read(cluster.nodes[1].bootstrap, "unclean", 1) == {0: [b"v%d" % i for i in range(10)]}
    cluster.nodes[2].start()
    wait_for(lambda: cluster.states(1, topic_id)[0]["leader"] == 2, timeout=30)  # back in sync, preferred
