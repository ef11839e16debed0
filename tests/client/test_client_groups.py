"""Our Consumer as a member of a consumer group, against a real `broker serve`: the group's
members share the partitions (range assignor), rebalance when one joins or leaves, commit with
their generation, and share a group with Kafka consumers on the same port (one coordinator)."""

from __future__ import annotations

import time

import pytest

from broker.client import Consumer, Producer, TopicPartition
from labkit.brokerproc import BrokerProcess

GROUP_CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]
MEMBER = {
    "auto_offset_reset": "earliest",
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 200,
    "rebalance_timeout_ms": 10_000,
}


def create(broker: BrokerProcess, name: str, partitions: int) -> None:
    from broker.client import Admin

    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name, partitions)


def produce(broker: BrokerProcess, topic: str, count: int, partitions: int, start: int = 0) -> None:
    with Producer(broker.bootstrap) as p:
        for i in range(start, start + count):
            p.send(topic, f"{i}".encode(), partition=i % partitions)
        p.flush()


def wait_for(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def drain(consumers: list[Consumer], want: int, timeout: float = 30.0) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} records arrived"
        for c in consumers:
            got.extend((r.partition, r.offset, r.value) for r in c.poll(100))
    return got


@pytest.mark.parametrize("broker", GROUP_CONFIGS, indirect=True)
def test_two_members_share_then_one_takes_over(broker: BrokerProcess) -> None:
    create(broker, "work", 4)
    all_four = {TopicPartition("work", p) for p in range(4)}
    a = Consumer(broker.bootstrap, group="g", **MEMBER)
    a.subscribe("work")
    assert set(a.assignment()) == all_four  # alone: everything
    b = Consumer(broker.bootstrap, group="g", **MEMBER)
    b.subscribe("work")  # returns once b has its share; a rebalances through its heartbeat
    wait_for(lambda: len(a.assignment()) == 2)
    assert set(a.assignment()) | set(b.assignment()) == all_four
    assert not set(a.assignment()) & set(b.assignment())
    produce(broker, "work", 40, 4)
    first = drain([a, b], 40)
    assert sorted(int(v) for _, _, v in first) == list(range(40))  # each once, none lost
    b.close()  # commits its positions, leaves: a takes all four at once (no session timeout)
    wait_for(lambda: set(a.assignment()) == all_four, timeout=10)
    produce(broker, "work", 8, 4, start=40)
    rest = drain([a], 8)
    # b committed what it had read: a resumes there, so nothing of the first 40 comes again
    assert sorted(int(v) for _, _, v in rest) == list(range(40, 48))
    a.close()
    with Consumer(broker.bootstrap, group="g", **MEMBER) as c:  # a committed on close
        assert {c.committed(("work", p)) for p in range(4)} == {12}


@pytest.mark.parametrize("broker", GROUP_CONFIGS[1:], indirect=True)
def test_our_consumer_and_a_kafka_consumer_share_one_group(broker: BrokerProcess) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    create(broker, "mixed", 4)
    ours = Consumer(broker.bootstrap, group="mix", **MEMBER)
    ours.subscribe("mixed")
    theirs = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "mix",
            "partition.assignment.strategy": "range",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 200,
        }
    )
    try:
        theirs.subscribe(["mixed"])
        deadline = time.monotonic() + 30
        while not (len(theirs.assignment()) == 2 and len(ours.assignment()) == 2):
            assert time.monotonic() < deadline, "the mixed group did not settle on 2 + 2"
            assert theirs.poll(0.1) is None
            ours.poll(10)
        produce(broker, "mixed", 40, 4)
        seen: list[int] = []
        while len(seen) < 40:
            assert time.monotonic() < deadline, f"only {len(seen)} of 40 records arrived"
            msg = theirs.poll(0.1)
            if msg is not None and msg.error() is None:
                seen.append(int(msg.value()))
            seen.extend(int(r.value) for r in ours.poll(50))
        theirs_now = {TopicPartition(tp.topic, tp.partition) for tp in theirs.assignment()}
        assert len(theirs_now) == 2 and len(ours.assignment()) == 2
        assert theirs_now.isdisjoint(ours.assignment())
        assert sorted(seen) == list(range(40))
    finally:
        theirs.close()
        ours.close()
