"""Kafka's admin APIs on a real three-node cluster (three `broker serve --etcd`, a real etcd), with
confluent-kafka's AdminClient: CreatePartitions grows a topic in the store, the new partitions
placed over the live nodes as a new topic's are, led and served at once and seen alike by every
node's Metadata; DeleteRecords moves the leader's log start, every follower takes it, and a new
leader elected after a kill -9 of the old one starts there too; DeleteGroups and OffsetDelete
delete the offsets in etcd, which no node answers any more."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator

import pytest

from broker.storage import layout, log_start
from labkit.brokerproc import wait_for
from labkit.clusterchecker import topic_ids

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402
from test_cluster import Cluster  # noqa: E402  (tests/cluster)


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
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "trim"})
    try:
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=3)
    except confluent_kafka.KafkaException:
        return None
    finally:
        consumer.close()
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


def _base64_id(topic_id: object) -> str:
    """A topic id as librdkafka prints it (base64 without padding)."""
    return base64.b64encode(uuid.UUID(str(topic_id)).bytes).decode().rstrip("=")
