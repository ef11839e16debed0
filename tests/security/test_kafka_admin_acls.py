"""ACLs on Kafka's admin APIs, as Kafka checks them, against real clients over SASL: alter on a
topic for CreatePartitions, delete on a topic for DeleteRecords, delete on a group for
DeleteGroups and OffsetDelete (read on each topic too), describe on the cluster for
DescribeLogDirs and ListPartitionReassignments, alter on it for ElectLeaders and
AlterPartitionReassignments, read on a topic for DescribeProducers; DescribeCluster needs
nothing, its authorized operations (and a topic's, in Metadata) being what the principal has. A
refusal changes nothing; the grant, added while the broker runs, lets the same call through."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.brokerproc import BrokerProcess
from labkit.securitylab import (
    broker_cli,
    create_topic,
    produce,
    sasl_conf,
    scram_broker,
)

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions  # noqa: E402

kafka = pytest.importorskip("kafka")

PW = {"admin": "admin pw", "alice": "alice pw"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    grants = [("User:alice", "describe", "topic:orders"), ("User:alice", "describe", "group:team")]
    b = scram_broker(tmp_path, "uvloop", PW, grants)
    yield b
    b.stop()


def conf(b: BrokerProcess, user: str) -> dict[str, Any]:
    return sasl_conf(b, user, PW[user])


def kafka_python_admin(b: BrokerProcess, user: str) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=b.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=user,
        sasl_plain_password=PW[user],
        request_timeout_ms=15_000,
    )


def code_of(future: Any) -> str | None:
    try:
        future.result(15)
    except KafkaException as exc:
        return str(exc.args[0].name())
    return None


def grant(b: BrokerProcess, *args: str) -> None:
    broker_cli(b.data_dir, "acls", "add", "User:alice", *args)


def test_admin_apis_need_what_kafka_asks(broker: BrokerProcess) -> None:
    from kafka.structs import TopicPartition as KpTopicPartition

    create_topic(conf(broker, "admin"), "orders", 1)
    assert produce(conf(broker, "admin"), "orders", [b"a", b"b", b"c"]) == [None] * 3
    alice = AdminClient(conf(broker, "alice"))  # held: a collected client cancels its futures
    admin = AdminClient(conf(broker, "admin"))

    # CreatePartitions: alter on the topic
    assert (
        code_of(alice.create_partitions([NewPartitions("orders", 2)])["orders"])
        == "TOPIC_AUTHORIZATION_FAILED"
    )
    assert len(admin.list_topics("orders", timeout=10).topics["orders"].partitions) == 1
    grant(broker, "alter", "topic:orders")
    assert code_of(alice.create_partitions([NewPartitions("orders", 2)])["orders"]) is None

    # DeleteRecords: delete on the topic
    [refused] = alice.delete_records([TopicPartition("orders", 0, 1)]).values()
    assert code_of(refused) == "TOPIC_AUTHORIZATION_FAILED"
    grant(broker, "delete", "topic:orders")
    [done] = alice.delete_records([TopicPartition("orders", 0, 1)]).values()
    assert done.result(15).low_watermark == 1

    # DeleteGroups and OffsetDelete: delete on the group; OffsetDelete read on each topic too
    committer = confluent_kafka.Consumer({**conf(broker, "admin"), "group.id": "team"})
    committer.commit(
        offsets=[TopicPartition("orders", 0, 2), TopicPartition("orders", 1, 0)], asynchronous=False
    )
    committer.close()
    [group_refused] = alice.delete_consumer_groups(["team"]).values()
    assert code_of(group_refused) == "GROUP_AUTHORIZATION_FAILED"
    kp = kafka_python_admin(broker, "alice")
    try:
        with pytest.raises(kafka.errors.GroupAuthorizationFailedError):
            kp.delete_group_offsets("team", [KpTopicPartition("orders", 1)])
        grant(broker, "delete", "group:team")
        result = kp.delete_group_offsets("team", [KpTopicPartition("orders", 1)])
        assert [err.__name__ for err in result.values()] == ["TopicAuthorizationFailedError"]
        grant(broker, "read", "topic:orders")
        result = kp.delete_group_offsets("team", [KpTopicPartition("orders", 1)])
        assert [err.__name__ for err in result.values()] == ["NoError"]

        # DescribeProducers: read on the topic (granted above); DescribeLogDirs: describe on
        # the cluster; DescribeCluster: nothing, its operations what alice has
        assert kp.describe_producers([KpTopicPartition("orders", 0)])
        assert kp.describe_cluster()["authorized_operations"] == []
        assert _log_dirs(kp) == []  # CLUSTER_AUTHORIZATION_FAILED, no results (kafka-python shows none)
        # ListPartitionReassignments: describe on the cluster; ElectLeaders and
        # AlterPartitionReassignments: alter on it
        with pytest.raises(kafka.errors.ClusterAuthorizationFailedError):
            kp.list_partition_reassignments()
        grant(broker, "describe", "cluster:kafka-cluster")
        assert kp.describe_cluster()["authorized_operations"] == ["DESCRIBE"]
        [log_dir] = _log_dirs(kp)
        assert any(t["name"] == "orders" for t in log_dir["topics"])
        assert kp.list_partition_reassignments() == {}
        orders_0 = KpTopicPartition("orders", 0)
        with pytest.raises(kafka.errors.ClusterAuthorizationFailedError):
            kp.alter_partition_reassignments({orders_0: [0]})
        elect = alice.elect_leaders(confluent_kafka.ElectionType.PREFERRED, [TopicPartition("orders", 0)])
        assert code_of(elect) == "CLUSTER_AUTHORIZATION_FAILED"
        grant(broker, "alter", "cluster:kafka-cluster")
        assert kp.alter_partition_reassignments({orders_0: [0]}) == {orders_0: None}  # stays here
        elect = alice.elect_leaders(confluent_kafka.ElectionType.PREFERRED, [TopicPartition("orders", 0)])
        [(_, not_needed)] = elect.result(15).items()
        assert not_needed.name() == "ELECTION_NOT_NEEDED"
    finally:
        kp.close()
    assert code_of(alice.delete_consumer_groups(["team"])["team"]) is None
    # Metadata's authorized operations (librdkafka's describe_topics asks for them): alice's
    [described] = alice.describe_topics(
        confluent_kafka.TopicCollection(["orders"]), include_authorized_operations=True
    ).values()
    operations = {op.name for op in described.result(15).authorized_operations}
    assert operations == {"READ", "DELETE", "ALTER", "DESCRIBE"}


def _log_dirs(kp: Any) -> list[dict[str, Any]]:
    return [log_dir for broker in kp.describe_log_dirs() for log_dir in broker["log_dirs"]]
