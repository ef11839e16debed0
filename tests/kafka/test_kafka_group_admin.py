"""DeleteGroups (api 42) and OffsetDelete (api 47) against a real `broker serve`, with the clients'
own admin calls (confluent-kafka `delete_consumer_groups`, kafka-python 3 `delete_groups` and
`delete_group_offsets`): Kafka's rules, NON_EMPTY_GROUP for a group with members,
GROUP_ID_NOT_FOUND for one that neither has members nor offsets, GROUP_SUBSCRIBED_TO_TOPIC for a
topic a member subscribes to while the others' offsets go, UNKNOWN_TOPIC_OR_PARTITION for what
does not exist; a deleted group is gone from ListGroups and its offsets from OffsetFetch, also
after a restart. With two cores the groups are chosen on each core (each answered by its
coordinator core only)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto.routing import coordinator_for

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

kafka = pytest.importorskip("kafka")

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]


@pytest.fixture(params=CONFIGS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    options = request.param
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        cores=options["cores"],
        backend=options["backend"],
        extra=("--group-initial-rebalance-delay-ms", "100"),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, proc.log()


def group_on(core: int, cores: int, prefix: str) -> str:
    return next(g for i in range(1000) if coordinator_for(g := f"{prefix}-{i}", cores) == core)


def commit(server: BrokerProcess, group: str, offsets: dict[tuple[str, int], int]) -> None:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
        )
    finally:
        consumer.close()


def committed(server: BrokerProcess, group: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got}


def listed(admin: AdminClient) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(15).valid}


def delete_error(admin: AdminClient, group: str) -> str | None:
    [future] = admin.delete_consumer_groups([group], request_timeout=10).values()
    try:
        future.result(15)
    except confluent_kafka.KafkaException as exc:
        return str(exc.args[0].name())
    return None


def test_delete_groups_with_confluent_kafka(server: BrokerProcess) -> None:
    Wire(server.port).create_topic("dg", 2)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for core in range(server.cores):
        gone = group_on(core, server.cores, "gone")
        busy = group_on(core, server.cores, "busy")
        commit(server, gone, {("dg", 0): 5, ("dg", 1): 7})
        assert gone in listed(admin)
        member = confluent_kafka.Consumer(
            {"bootstrap.servers": server.bootstrap, "group.id": busy, "session.timeout.ms": 6000}
        )
        try:
            member.subscribe(["dg"])
            deadline = time.monotonic() + 30
            while not member.assignment() and time.monotonic() < deadline:
                member.poll(0.1)
            assert delete_error(admin, busy) == "NON_EMPTY_GROUP"
        finally:
            member.close()  # it leaves: now deletable (it committed nothing, but it exists)
        assert delete_error(admin, gone) is None
        assert gone not in listed(admin)
        assert committed(server, gone, [("dg", 0), ("dg", 1)]) == {("dg", 0): -1001, ("dg", 1): -1001}
        assert delete_error(admin, gone) == "GROUP_ID_NOT_FOUND"
        assert delete_error(admin, group_on(core, server.cores, "never")) == "GROUP_ID_NOT_FOUND"
    # and after a restart nothing comes back
    keep = group_on(0, server.cores, "keep")
    drop = group_on(server.cores - 1, server.cores, "drop")
    commit(server, keep, {("dg", 0): 3})
    commit(server, drop, {("dg", 0): 4})
    assert delete_error(admin, drop) is None
    assert server.stop() == 0
    server.start()
    assert committed(server, keep, [("dg", 0)]) == {("dg", 0): 3}
    assert committed(server, drop, [("dg", 0)]) == {("dg", 0): -1001}
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert delete_error(admin, drop) == "GROUP_ID_NOT_FOUND"


def test_kafka_python_deletes_groups_and_offsets(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KpTopicPartition

    wire = Wire(server.port)
    wire.create_topic("od", 2)
    wire.create_topic("other", 1)
    wire.close()
    group = group_on(server.cores - 1, server.cores, "offsets")
    commit(server, group, {("od", 0): 5, ("od", 1): 6, ("other", 0): 7})
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        result = kp.delete_group_offsets(group, [KpTopicPartition("od", 1), KpTopicPartition("od", 9)])
        assert {tp.partition: err.__name__ for tp, err in result.items()} == {
            1: "NoError",
            9: "UnknownTopicOrPartitionError",
        }
        assert committed(server, group, [("od", 0), ("od", 1), ("other", 0)]) == {
            ("od", 0): 5,
            ("od", 1): -1001,
            ("other", 0): 7,
        }
        assert dict(kp.delete_groups([group])) == {group: "OK"}
        assert dict(kp.delete_groups([group])) == {group: "GroupIdNotFoundError"}
    finally:
        kp.close()


def test_offset_delete_refuses_the_topics_members_subscribe_to(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import GroupIdNotFoundError
    from kafka.structs import TopicPartition as KpTopicPartition

    wire = Wire(server.port)
    wire.create_topic("read", 1)
    wire.create_topic("old", 1)
    wire.close()
    group = group_on(0, server.cores, "live")
    commit(server, group, {("read", 0): 1, ("old", 0): 2})
    member = confluent_kafka.Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        member.subscribe(["read"])
        deadline = time.monotonic() + 30
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.1)
        result = kp.delete_group_offsets(group, [KpTopicPartition("read", 0), KpTopicPartition("old", 0)])
        assert {tp.topic: err.__name__ for tp, err in result.items()} == {
            "read": "GroupSubscribedToTopicError",
            "old": "NoError",
        }
        with pytest.raises(GroupIdNotFoundError):
            kp.delete_group_offsets(group_on(0, server.cores, "nobody"), [KpTopicPartition("old", 0)])
    finally:
        kp.close()
        member.close()
    assert committed(server, group, [("read", 0), ("old", 0)]) == {("read", 0): 1, ("old", 0): -1001}


def test_a_confluent_admin_alter_then_delete(server: BrokerProcess) -> None:
    """The offsets an admin set (AlterConsumerGroupOffsets: an OffsetCommit) are what the group's
    deletion removes."""
    Wire(server.port).create_topic("alt", 1)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    group = group_on(0, server.cores, "altered")
    [done] = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition("alt", 0, 9)])]
    ).values()
    done.result(15)
    assert committed(server, group, [("alt", 0)]) == {("alt", 0): 9}
    assert delete_error(admin, group) is None
    assert committed(server, group, [("alt", 0)]) == {("alt", 0): -1001}
