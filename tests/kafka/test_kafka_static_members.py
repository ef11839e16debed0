"""Static group membership (KIP-345, `group.instance.id`) against a real `broker serve`: a static
member restarted within its session timeout takes its place back without a rebalance, its
partitions kept and the other member undisturbed (each restart cost a rebalance, and librdkafka's
test suite ~9 s, while such members were treated as dynamic ones); a second process claiming the
same instance id fences the first (FENCED_INSTANCE_ID, which the clients take as fatal). The
coordinator's rules are broker/core/coordinator.py's; tests/core/test_coordinator.py drives them
under a fake clock.

confluent-kafka and aiokafka (both send no LeaveGroup for a static member on close, as Kafka's
clients do not), on uvloop with one core and io_uring with two."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
PARTITIONS = 4
# Kafka's smallest (group.min.session.timeout.ms): each restart test then waits 7 s past the old
# incarnation's session, not 11, and a restart asserted to take under 5 s still lands within it.
SESSION_MS = 6_000
DELAY = ("--group-initial-rebalance-delay-ms", "100")


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


def rebalances(broker: BrokerProcess, group: str) -> int:
    return broker.log().count(f"group {group}: rebalancing")


class CkMember:
    """A confluent-kafka consumer polled on its own thread, its assignments recorded."""

    def __init__(self, broker: BrokerProcess, topic: str, group: str, instance: str) -> None:
        self.events: list[tuple[str, frozenset[int]]] = []
        self.errors: list[str] = []
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "group.instance.id": instance,
                "session.timeout.ms": SESSION_MS,
                "heartbeat.interval.ms": 300,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe(
            [topic],
            on_assign=lambda _c, ps: self.events.append(("assign", frozenset(p.partition for p in ps))),
            on_revoke=lambda _c, ps: self.events.append(("revoke", frozenset(p.partition for p in ps))),
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            msg = self.consumer.poll(0.1)
            if msg is not None and msg.error() is not None:
                self.errors.append(f"{msg.error().name()}: {msg.error().str()}")

    def assigned(self) -> frozenset[int]:
        held: frozenset[int] = frozenset()
        for kind, parts in self.events:
            held = parts if kind == "assign" else frozenset()
        return held

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.consumer.close()


def wait_until(what: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_confluent_static_member_restarts_without_a_rebalance(sbroker: BrokerProcess) -> None:
    Wire(sbroker.port).create_topic("static", PARTITIONS)
    a = CkMember(sbroker, "static", "statics", "member-a")
    b = CkMember(sbroker, "static", "statics", "member-b")
    try:
        wait_until(lambda: a.assigned() and b.assigned() and len(a.assigned() | b.assigned()) == PARTITIONS)
        held_a, held_b = a.assigned(), b.assigned()
        a_events, before = len(a.events), rebalances(sbroker, "statics")
        b.close()  # a static member sends no LeaveGroup: the group keeps its place
        started = time.monotonic()
        b = CkMember(sbroker, "static", "statics", "member-b")
        wait_until(b.assigned, timeout=SESSION_MS / 1000)
        took = time.monotonic() - started
        assert b.assigned() == held_b, "the restarted member got other partitions"
        assert took < 5, f"{took:.1f} s to get its partitions back"
        # past the old incarnation's session timeout: still no rebalance
        time.sleep(SESSION_MS / 1000 + 1)
        assert a.assigned() == held_a and len(a.events) == a_events, a.events
        assert b.events == [("assign", held_b)]
        assert rebalances(sbroker, "statics") == before
        assert not a.errors and not b.errors, (a.errors, b.errors)
    finally:
        a.close()
        b.close()


def test_confluent_a_second_process_with_the_same_instance_id_fences_the_first(
    sbroker: BrokerProcess,
) -> None:
    Wire(sbroker.port).create_topic("twins", PARTITIONS)
    first = CkMember(sbroker, "twins", "twins", "only-one")
    second = None
    try:
        wait_until(lambda: first.assigned() == frozenset(range(PARTITIONS)))
        second = CkMember(sbroker, "twins", "twins", "only-one")
        wait_until(lambda: second.assigned() == frozenset(range(PARTITIONS)), timeout=10)
        # the first one's next heartbeat names its old member id with the instance id: fenced,
        # which librdkafka takes as fatal ("Static consumer fenced by other consumer ...")
        wait_until(lambda: any("fenced" in e for e in first.errors), timeout=10)
        assert any(e.startswith("_FATAL") for e in first.errors), first.errors
        assert not second.errors, second.errors
    finally:
        first.close()
        if second is not None:
            second.close()


def test_aiokafka_static_member_restarts_without_a_rebalance(sbroker: BrokerProcess) -> None:
    Wire(sbroker.port).create_topic("aio-static", PARTITIONS)

    async def scenario() -> None:
        def member(instance: str) -> aiokafka.AIOKafkaConsumer:
            return aiokafka.AIOKafkaConsumer(
                "aio-static",
                bootstrap_servers=sbroker.bootstrap,
                group_id="aio-statics",
                group_instance_id=instance,
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=300,
            )

        a, b = member("aio-a"), member("aio-b")
        await a.start()
        await b.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                held_a, held_b = a.assignment(), b.assignment()
                if held_a and held_b and len(held_a | held_b) == PARTITIONS:
                    break
            assert held_a and held_b and len(held_a | held_b) == PARTITIONS
            before = rebalances(sbroker, "aio-statics")
            await b.stop()
            b = member("aio-b")
            await b.start()
            deadline = time.monotonic() + 10
            while not b.assignment() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert b.assignment() == held_b
            await asyncio.sleep(SESSION_MS / 1000 + 1)
            assert a.assignment() == held_a and b.assignment() == held_b
            assert rebalances(sbroker, "aio-statics") == before
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(scenario())
