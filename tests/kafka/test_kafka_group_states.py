"""A consumer group's state as admin clients and lag monitors see it, against a real `broker
serve`: a group whose last member left stays in ListGroups and DescribeGroups says Empty while its
committed offsets are kept (Kafka's answer; it said Dead and the group vanished from the list),
also after a broker restart; a group that never committed is forgotten when it empties (Dead).
Seen through kafka-python 3's and confluent-kafka's admin clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")
kafka = pytest.importorskip("kafka")

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
DELAY = ("--group-initial-rebalance-delay-ms", "100")
FAST = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 300}


@pytest.fixture(params=CONFIGS)
def sbroker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    options = request.param
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        cores=options["cores"],
        backend=options["backend"],
        extra=DELAY,
    ).start()
    proc.skip_if_fell_back()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log_tail()}"


def consume_and_leave(broker: BrokerProcess, topic: str, group: str, commit: bool) -> None:
    """One confluent-kafka member reads the topic's record, commits it or not, and leaves."""
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **FAST,
        }
    )
    try:
        c.subscribe([topic])
        msg = None
        for _ in range(60):
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None, msg
        if commit:
            c.commit(msg, asynchronous=False)
    finally:
        c.close()  # LeaveGroup: the group has no members left


def kafka_python_view(broker: BrokerProcess, group: str) -> tuple[bool, str, str]:
    """(listed by ListGroups, its protocol type there, DescribeGroups' state)."""
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        listed = {g["group_id"]: g["protocol_type"] for g in admin.list_groups()}
        state = admin.describe_groups([group])[group]["group_state"]
    finally:
        admin.close()
    return group in listed, listed.get(group, ""), state


def confluent_state(broker: BrokerProcess, group: str) -> tuple[bool, object, int]:
    """(listed, DescribeGroups' state, members) through confluent-kafka's AdminClient."""
    admin = ck_admin.AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = admin.list_consumer_groups(request_timeout=10).result(timeout=20)
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=20)
    return group in {g.group_id for g in listed.valid}, described.state, len(described.members)


def test_a_group_that_committed_stays_empty_after_its_last_member_leaves(sbroker: BrokerProcess) -> None:
    Wire(sbroker.port).create_topic("states", 1)
    p = confluent_kafka.Producer({"bootstrap.servers": sbroker.bootstrap})
    p.produce("states", b"one")
    assert p.flush(20) == 0

    consume_and_leave(sbroker, "states", "kept", commit=True)
    assert kafka_python_view(sbroker, "kept") == (True, "consumer", "Empty")
    assert confluent_state(sbroker, "kept") == (True, confluent_kafka.ConsumerGroupState.EMPTY, 0)

    consume_and_leave(sbroker, "states", "passing", commit=False)  # nothing committed: forgotten
    assert kafka_python_view(sbroker, "passing") == (False, "", "Dead")

    # Restarted, the broker knows the group from its offsets: described Empty, then listed.
    assert sbroker.stop() == 0
    sbroker.start()
    assert kafka_python_view(sbroker, "kept")[2] == "Empty"
    assert kafka_python_view(sbroker, "kept")[0]


def test_simple_commits_make_an_empty_group(sbroker: BrokerProcess) -> None:
    """assign() and commit, no membership: Kafka's group exists, Empty, with no protocol type."""
    Wire(sbroker.port).create_topic("simple", 1)
    c = confluent_kafka.Consumer({"bootstrap.servers": sbroker.bootstrap, "group.id": "simple-commits"})
    try:
        c.commit(offsets=[confluent_kafka.TopicPartition("simple", 0, 0)], asynchronous=False)
    finally:
        c.close()
    assert kafka_python_view(sbroker, "simple-commits") == (True, "", "Empty")
