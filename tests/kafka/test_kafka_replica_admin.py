"""Replicas placed by hand, leader elections and reassignments on a single node (the cluster's
are tests/cluster/test_cluster_kafka_admin.py): CreateTopics and CreatePartitions with
assignments naming this node's brokers, Kafka's refusals of everything else with Kafka's codes
and messages; ElectLeaders never needed; a reassignment can only stay here; none is ever under
way. Kafka's wire through the adapter in process (every version, every refusal), then the
clients' own calls on a real `broker serve` (confluent-kafka, kafka-python 3)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Reply
from broker.kafka.adapter import KafkaAdapter
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess
from labkit.kafka_requests import frame, read_response, request_of

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ElectionType  # noqa: E402
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # noqa: E402


@pytest.fixture
def adapter(tmp_path: Path) -> KafkaAdapter:
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=2)  # brokers 0 and 1: node 0
    return KafkaAdapter(Core(config), config)


def call(adapter: KafkaAdapter, key: int, version: int, **fields: Any) -> Any:
    schema = request_schema(key, version)
    assert schema is not None
    outcome = adapter.handle(request_of(frame(key, version, 5, make(schema, **fields))))
    assert isinstance(outcome, Reply)
    return read_response(key, version, b"".join(outcome.buffers))[1]


def module_of(key: int, version: int) -> Any:
    schema = request_schema(key, version)
    assert schema is not None
    return sys.modules[schema.__module__]


def create(adapter: KafkaAdapter, name: str, assignment: list[tuple[int, list[int]]], **given: Any) -> Any:
    m = module_of(19, 4)
    topic = make(
        m.CreatableTopic,
        name=name,
        num_partitions=given.get("num_partitions", -1),
        replication_factor=given.get("replication_factor", -1),
        assignments=tuple(
            make(m.CreatableReplicaAssignment, partition_index=p, broker_ids=tuple(b)) for p, b in assignment
        ),
        configs=(),
    )
    resp = call(adapter, 19, 4, topics=(topic,), timeout=datetime.timedelta(0), validate_only=False)
    [result] = resp.topics
    return result.error_code, result.error_message


def test_create_topics_with_an_assignment_of_this_nodes_brokers(adapter: KafkaAdapter) -> None:
    assert create(adapter, "placed", [(0, [0]), (1, [1]), (2, [0])]) == (ErrorCode.none, None)
    assert adapter.core.registry.by_name["placed"].partitions == 3
    refusals = [
        (
            [(0, [0])],
            {"replication_factor": 1},
            ErrorCode.invalid_request,
            "replication factor was not set to -1",
        ),
        ([(0, [0])], {"num_partitions": 1}, ErrorCode.invalid_request, "numPartitions was not set to -1"),
        ([(0, [5])], {}, ErrorCode.invalid_replica_assignment, "broker 5, but no such broker is registered"),
        ([(0, [0, 0])], {}, ErrorCode.invalid_replica_assignment, "the broker 0 more than once"),
        ([(0, [0, 1])], {}, ErrorCode.invalid_replica_assignment, "both cores of node 0"),
        ([(0, [])], {}, ErrorCode.invalid_replica_assignment, "empty replica list"),
        ([(0, [0]), (2, [0])], {}, ErrorCode.invalid_replica_assignment, "consecutive 0-based"),
        (
            [(0, [0]), (0, [1])],
            {},
            ErrorCode.invalid_replica_assignment,
            "multiple manual partition assignments",
        ),
    ]
    for i, (assignment, given, code, message) in enumerate(refusals):
        got_code, got_message = create(adapter, f"refused{i}", assignment, **given)
        assert got_code == code and message in (got_message or ""), (assignment, given, got_message)
        assert f"refused{i}" not in adapter.core.registry.by_name


def test_create_partitions_with_an_assignment(adapter: KafkaAdapter) -> None:
    assert create(adapter, "grown", [(0, [0])]) == (ErrorCode.none, None)
    m = module_of(37, 3)

    def grow(count: int, assignment: list[list[int]] | None) -> tuple[ErrorCode, str | None]:
        given = (
            None
            if assignment is None
            else tuple(make(m.CreatePartitionsAssignment, broker_ids=tuple(b)) for b in assignment)
        )
        topic = make(m.CreatePartitionsTopic, name="grown", count=count, assignments=given)
        [result] = call(
            adapter, 37, 3, topics=(topic,), timeout=datetime.timedelta(0), validate_only=False
        ).results
        return result.error_code, result.error_message

    assert grow(3, [[1], [0]]) == (ErrorCode.none, None)
    code, message = grow(5, [[0]])
    assert code == ErrorCode.invalid_replica_assignment and "add 2 additional partition(s), but only 1" in (
        message or ""
    )
    code, message = grow(4, [[7]])
    assert code == ErrorCode.invalid_replica_assignment and "broker 7" in (message or "")
    assert adapter.core.registry.by_name["grown"].partitions == 3


def test_elect_leaders_is_never_needed_on_one_node(adapter: KafkaAdapter) -> None:
    assert create(adapter, "led", [(0, [0]), (1, [0])]) == (ErrorCode.none, None)
    for version in (0, 1, 2):
        m = module_of(43, version)
        asked = (
            make(m.TopicPartitions, topic="led", partitions=(0, 1)),
            make(m.TopicPartitions, topic="nope", partitions=(0,)),
        )
        extra = {"election_type": 0} if version else {}
        resp = call(adapter, 43, version, topic_partitions=asked, timeout=datetime.timedelta(0), **extra)
        got = {
            (r.topic, p.partition_id): p.error_code
            for r in resp.replica_election_results
            for p in r.partition_result
        }
        assert got == {
            ("led", 0): ErrorCode.election_not_needed,
            ("led", 1): ErrorCode.election_not_needed,
            ("nope", 0): ErrorCode.unknown_topic_or_partition,
        }
    # every partition (a null list): every topic listed, those not needed left out
    resp = call(adapter, 43, 2, election_type=1, topic_partitions=None, timeout=datetime.timedelta(0))
    assert [(r.topic, r.partition_result) for r in resp.replica_election_results] == [("led", ())]
    resp = call(adapter, 43, 2, election_type=2, topic_partitions=None, timeout=datetime.timedelta(0))
    assert resp.error_code == ErrorCode.invalid_request


def test_a_reassignment_can_only_stay_on_this_node(adapter: KafkaAdapter) -> None:
    assert create(adapter, "moved", [(0, [0])]) == (ErrorCode.none, None)
    m = module_of(45, 0)

    def alter(name: str, replicas: tuple[int, ...] | None) -> tuple[ErrorCode, str | None]:
        partition = make(m.ReassignablePartition, partition_index=0, replicas=replicas)
        topic = make(m.ReassignableTopic, name=name, partitions=(partition,))
        resp = call(adapter, 45, 0, topics=(topic,), timeout=datetime.timedelta(0))
        assert resp.error_code == ErrorCode.none
        [[result]] = [t.partitions for t in resp.responses]
        return result.error_code, result.error_message

    assert alter("moved", (1,)) == (ErrorCode.none, None)  # this node (another of its cores): nothing moves
    assert alter("moved", (1000,))[0] == ErrorCode.invalid_replica_assignment
    assert alter("moved", None)[0] == ErrorCode.no_reassignment_in_progress
    assert alter("nope", (0,))[0] == ErrorCode.unknown_topic_or_partition
    for topics in (
        None,
        (make(module_of(46, 0).ListPartitionReassignmentsTopics, name="moved", partition_indexes=(0,)),),
    ):
        resp = call(adapter, 46, 0, topics=topics, timeout=datetime.timedelta(0))
        assert (resp.error_code, resp.topics) == (ErrorCode.none, ())


def test_the_clients_own_calls_on_one_node(tmp_path: Path) -> None:
    """confluent-kafka creates a topic placed by hand and elects; kafka-python reassigns and
    lists; records go through."""
    from kafka import TopicPartition as KpTopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import InvalidReplicationAssignmentError

    server = BrokerProcess(tmp_path / "data", tmp_path / "broker.log").start()
    try:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        admin.create_topics([NewTopic("by-hand", 2, replica_assignment=[[0], [0]])])["by-hand"].result(15)
        topic = admin.list_topics("by-hand", timeout=10).topics["by-hand"]
        assert {p.id: p.replicas for p in topic.partitions.values()} == {0: [0], 1: [0]}
        with pytest.raises(confluent_kafka.KafkaException, match="INVALID_REPLICA_ASSIGNMENT"):
            admin.create_topics([NewTopic("elsewhere", 1, replica_assignment=[[3]])])["elsewhere"].result(15)
        assert (
            admin.create_partitions([NewPartitions("by-hand", 3, replica_assignment=[[0]])])[
                "by-hand"
            ].result(15)
            is None
        )
        tps = [confluent_kafka.TopicPartition("by-hand", p) for p in range(3)]
        elected = admin.elect_leaders(ElectionType.PREFERRED, tps).result(15)
        assert {tp.partition: e.name() for tp, e in elected.items()} == dict.fromkeys(
            range(3), "ELECTION_NOT_NEEDED"
        )
        kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
        try:
            got = kp.alter_partition_reassignments(
                {KpTopicPartition("by-hand", 0): [0], KpTopicPartition("by-hand", 1): [7]}
            )
            assert got[KpTopicPartition("by-hand", 0)] is None
            assert got[KpTopicPartition("by-hand", 1)] is InvalidReplicationAssignmentError
            assert kp.list_partition_reassignments() == {}
        finally:
            kp.close()
        producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap})
        for p in range(3):
            producer.produce("by-hand", value=b"v%d" % p, partition=p)
        assert producer.flush(15) == 0
        consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": "g"})
        try:
            consumer.assign([confluent_kafka.TopicPartition("by-hand", p, 0) for p in range(3)])
            seen = set()
            for _ in range(100):
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    seen.add((msg.partition(), msg.value()))
                if len(seen) == 3:
                    break
        finally:
            consumer.close()
        assert seen == {(p, b"v%d" % p) for p in range(3)}
    finally:
        server.stop()
