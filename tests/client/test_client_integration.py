"""The client against a real `broker serve` process (see conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from broker.client import (
    Admin,
    AsyncAdmin,
    AsyncConnection,
    AsyncConsumer,
    AsyncProducer,
    ConfigSource,
    Consumer,
    ConsumerRecord,
    InvalidConfigError,
    InvalidTopicError,
    MessageTooLargeError,
    Producer,
    TopicExistsError,
    UnknownTopicError,
)
from labkit.brokerproc import BrokerProcess
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch

T = TypeVar("T")
TS0 = 1_700_000_000_000


def arun(coro_fn: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro_fn(), timeout)

    return asyncio.run(main())


def create(broker: BrokerProcess, name: str, partitions: int = 1) -> int:
    with Admin(broker.bootstrap) as admin:
        return admin.create_topic(name, partitions)


def consume_all(broker: BrokerProcess, topic: str, expected: int, **config: object) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", **config) as c:  # type: ignore[arg-type]
        c.subscribe(topic)
        deadline = time.monotonic() + 20
        while len(out) < expected and time.monotonic() < deadline:
            out.extend(c.poll(500))
    return out


# ----------------------------------------------------------------------------------- round trips


def test_round_trip_in_order_with_keys_headers_timestamps(broker: BrokerProcess) -> None:
    create(broker, "orders", 4)
    sent = []
    with Producer(broker.bootstrap, linger_ms=2) as p:
        futs = []
        for i in range(400):
            key = f"customer-{i % 13}".encode()
            headers = [("trace", f"t{i}".encode()), ("empty", None)]
            futs.append(p.send("orders", f"order-{i}".encode(), key=key, headers=headers, timestamp=TS0 + i))
            sent.append((key, f"order-{i}".encode(), TS0 + i))
        p.flush()
        mds = [f.result(10) for f in futs]
    assert len({md.partition for md in mds}) > 1
    for part in range(4):
        offsets = [md.offset for md in mds if md.partition == part]
        assert offsets == list(range(len(offsets)))  # dense and in send order
    assert all(md.timestamp == TS0 + i for i, md in enumerate(mds))

    got = consume_all(broker, "orders", 400)
    assert len(got) == 400
    by_key: dict[bytes, list[ConsumerRecord]] = {}
    for r in got:
        assert r.key is not None
        by_key.setdefault(r.key, []).append(r)
    for key, recs in by_key.items():
        expect = [(k, v, ts) for k, v, ts in sent if k == key]
        assert [(r.key, r.value, r.timestamp) for r in recs] == expect  # per-key order
        assert len({r.partition for r in recs}) == 1
    first = next(r for r in got if r.value == b"order-0")
    assert list(first.headers) == [("trace", b"t0"), ("empty", None)]


def test_async_round_trip_and_async_iteration(broker: BrokerProcess) -> None:
    async def body() -> None:
        async with AsyncAdmin(broker.bootstrap) as admin:
            await admin.create_topic("events", 3)
        async with AsyncProducer(broker.bootstrap) as p:
            futs = [await p.send("events", f"{i}".encode(), partition=i % 3) for i in range(300)]
            await p.flush()
            assert all(f.done() and not f.exception() for f in futs)
        seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
        async with AsyncConsumer(broker.bootstrap, auto_offset_reset="earliest", iter_timeout_ms=1000) as c:
            await c.subscribe("events")
            async for rec in c:
                assert rec.value is not None
                seen[rec.partition].append(int(rec.value))
        for part, values in seen.items():
            assert values == list(range(part, 300, 3))

    arun(body)


@pytest.mark.parametrize("acks", [0, 1, 2])
def test_acks(broker: BrokerProcess, acks: int) -> None:
    create(broker, "acks")
    with Producer(broker.bootstrap, acks=acks) as p:
        futs = [p.send("acks", f"{i}".encode()) for i in range(50)]
        p.flush()
        mds = [f.result(10) for f in futs]
    if acks == 0:
        assert all(md.offset == -1 for md in mds)  # the broker says nothing
    else:
        assert [md.offset for md in mds] == list(range(50))
    got = consume_all(broker, "acks", 50)
    assert [r.value for r in got] == [f"{i}".encode() for i in range(50)]


# ----------------------------------------------------------------------------------- seeking


def test_seek_to_beginning_end_and_timestamp(broker: BrokerProcess) -> None:
    create(broker, "seek")
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for i in range(10):
            p.send("seek", f"{i}".encode(), timestamp=TS0 + i * 1000).result(10)
    tp = ("seek", 0)
    with Consumer(broker.bootstrap, auto_offset_reset="latest") as c:
        c.assign([tp])
        assert c.position(tp) == 10  # latest
        assert c.poll(200) == []
        assert c.seek_to_beginning() == {tp: 0}
        assert [r.offset for r in c.poll(2000, max_records=3)] == [0, 1, 2]
        assert c.position(tp) == 3
        assert c.seek_to_timestamp(TS0 + 6500) == {tp: 7}  # first record at or after it
        assert [r.value for r in c.poll(2000)] == [b"7", b"8", b"9"]
        assert c.seek_to_timestamp(TS0) == {tp: 0}
        assert c.seek_to_timestamp(TS0 + 10**9) == {tp: 10}  # none that late: the end
        c.seek(tp, 4)
        assert [r.offset for r in c.poll(2000, max_records=2)] == [4, 5]
        assert c.seek_to_end() == {tp: 10}
        assert c.poll(200) == []


def test_offset_out_of_range_resets_per_policy(broker: BrokerProcess) -> None:
    create(broker, "oor")
    with Producer(broker.bootstrap) as p:
        for i in range(5):
            p.send("oor", f"{i}".encode())
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([("oor", 0)])
        c.seek(("oor", 0), 1000)  # past the end: the broker answers OFFSET_OUT_OF_RANGE
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            got.extend(c.poll(500))
        assert [r.offset for r in got] == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------------- groups


def test_group_commit_then_a_new_consumer_resumes(broker: BrokerProcess) -> None:
    create(broker, "jobs", 2)
    with Producer(broker.bootstrap) as p:
        for i in range(20):
            p.send("jobs", f"{i}".encode(), partition=i % 2)
    config = {"group": "workers", "auto_offset_reset": "earliest", "enable_auto_commit": False}
    with Consumer(broker.bootstrap, **config) as c:
        c.subscribe("jobs")
        assert c.committed(("jobs", 0)) is None
        first = []
        while len(first) < 6:
            first.extend(c.poll(2000, max_records=6 - len(first)))
        c.commit()
        positions = {tp: c.position(tp) for tp in c.assignment()}
        assert sum(positions.values()) == 6  # type: ignore[arg-type]
        assert {tp: c.committed(tp) for tp in c.assignment()} == positions
    with Consumer(broker.bootstrap, group="workers", auto_offset_reset="earliest") as c2:
        c2.subscribe("jobs")
        assert {tp: c2.position(tp) for tp in c2.assignment()} == positions  # resumed
        rest = []
        while len(rest) < 14:
            got = c2.poll(2000)
            assert got, "no records"
            rest.extend(got)
    seen = {(r.partition, r.offset) for r in first} | {(r.partition, r.offset) for r in rest}
    assert len(seen) == 20 and len(first) + len(rest) == 20  # nothing twice, nothing lost
    with Consumer(broker.bootstrap, group="workers") as c3:  # c2 auto-committed on close
        c3.subscribe("jobs")
        assert {tp: c3.committed(tp) for tp in c3.assignment()} == {("jobs", 0): 10, ("jobs", 1): 10}


def test_new_group_without_commit_starts_per_reset_policy(broker: BrokerProcess) -> None:
    create(broker, "fresh")
    with Producer(broker.bootstrap) as p:
        p.send("fresh", b"old").result(10)
    with Consumer(broker.bootstrap, group="late", auto_offset_reset="latest") as c:
        c.assign([("fresh", 0)])
        assert c.position(("fresh", 0)) == 1
    with Consumer(broker.bootstrap, group="early", auto_offset_reset="earliest") as c:
        c.assign([("fresh", 0)])
        assert [r.value for r in c.poll(2000)] == [b"old"]


# ----------------------------------------------------------------------------------- long poll


def test_long_poll_wakes_on_data_not_the_deadline(broker: BrokerProcess) -> None:
    create(broker, "quiet")
    consumer = Consumer(broker.bootstrap, fetch_max_wait_ms=5000)
    with consumer as c, Producer(broker.bootstrap, linger_ms=0) as p:
        c.assign([("quiet", 0)])
        assert c.poll(300) == []  # nothing there: a fetch is now parked on the broker
        sent_at: list[float] = []

        def send_later() -> None:
            time.sleep(0.3)
            sent_at.append(time.monotonic())
            p.send("quiet", b"wake up").result(5)

        t = threading.Thread(target=send_later)
        t.start()
        t0 = time.monotonic()
        got = c.poll(2000)
        returned = time.monotonic()
        t.join()
    assert [r.value for r in got] == [b"wake up"]
    assert returned - t0 < 1.5
    assert returned - sent_at[0] < 0.5, "the poll slept instead of waking on the new record"


def test_idle_partition_does_not_delay_a_busy_one(broker: BrokerProcess) -> None:
    """The broker answers a connection's requests in order, so a long-polling fetch for an idle
    partition would hold back a busy partition's answer on the same connection: the consumer
    fetches each partition on a connection of its own."""
    create(broker, "mixed", 2)
    consumer = Consumer(broker.bootstrap, fetch_max_wait_ms=5000)
    with consumer as c, Producer(broker.bootstrap, linger_ms=0) as p:
        c.assign([("mixed", 0), ("mixed", 1)])
        assert c.poll(300) == []  # both fetches parked
        p.send("mixed", b"busy", partition=1).result(5)
        t0 = time.monotonic()
        got = c.poll(3000)
        assert [r.value for r in got] == [b"busy"]
        assert time.monotonic() - t0 < 1.0


def test_partitions_sharing_a_fetch_connection_do_not_long_poll(broker: BrokerProcess) -> None:
    """With fewer fetch connections than partitions, the partitions sharing one poll it every
    fetch_idle_ms instead of parking a long poll there; new data still arrives promptly."""
    create(broker, "shared", 3)
    consumer = Consumer(broker.bootstrap, fetch_max_wait_ms=5000, fetch_idle_ms=50, max_fetch_connections=1)
    with consumer as c, Producer(broker.bootstrap, linger_ms=0) as p:
        c.assign([("shared", 0), ("shared", 1), ("shared", 2)])
        assert c.poll(300) == []
        for part in (2, 0):
            p.send("shared", f"to {part}".encode(), partition=part).result(5)
            t0 = time.monotonic()
            got = c.poll(3000)
            assert [r.value for r in got] == [f"to {part}".encode()]
            assert time.monotonic() - t0 < 1.0


# ----------------------------------------------------------------------------------- idempotence


def test_same_batch_sent_twice_is_stored_once(broker: BrokerProcess) -> None:
    topic_id = create(broker, "idem")

    async def body() -> None:
        conn = await AsyncConnection.connect("127.0.0.1", broker.port)
        batch = encode_batch([b"a", b"b"], producer_id=4242, producer_epoch=0, base_sequence=0)
        req = m.ProduceRequest(topic_id, 0, m.Acks.WRITTEN, 5000, batch)
        first = await conn.request(req)
        again = await conn.request(req)  # a retry: same producer id, epoch and sequence
        assert isinstance(first, m.ProduceResponse) and isinstance(again, m.ProduceResponse)
        assert (first.base_offset, first.end_offset) == (0, 2)
        assert (again.base_offset, again.end_offset) == (0, 2)  # the original offsets
        nxt = encode_batch([b"c"], producer_id=4242, producer_epoch=0, base_sequence=2)
        third = await conn.request(m.ProduceRequest(topic_id, 0, m.Acks.WRITTEN, 5000, nxt))
        assert isinstance(third, m.ProduceResponse) and third.base_offset == 2
        fetched = await conn.request(m.FetchRequest(topic_id, 0, 0, 1 << 20, 0))
        assert isinstance(fetched, m.FetchResponse)
        assert [r.value for r in decode_batches(fetched.records)] == [b"a", b"b", b"c"]
        assert fetched.high_watermark == 3
        await conn.close()

    arun(body)


@pytest.mark.parametrize(
    "broker",
    [
        pytest.param({"backend": backend, "extra": ("--producer-id-expiration-ms", "1000")}, id=backend)
        for backend in ("uvloop", "io_uring")
    ],
    indirect=True,
)
def test_a_producer_idle_past_the_expiration_delivers_every_record_once(broker: BrokerProcess) -> None:
    """The partition forgets a producer idle past --producer-id-expiration-ms; its next batch is
    UNKNOWN_PRODUCER_ID, on which the producer starts a new epoch and resends: no record fails,
    none is written twice."""
    create(broker, "idle")
    with Producer(broker.bootstrap) as p:
        first = [p.send("idle", b"a%d" % i).result(10).offset for i in range(3)]
        assert broker.wait_for_log("forgot 1 idle producer", timeout=20)
        then = [p.send("idle", b"b%d" % i).result(10).offset for i in range(3)]
    assert first + then == list(range(6))
    got = [r.value for r in consume_all(broker, "idle", 6)]
    assert got == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]


def test_producer_survives_a_broker_restart_without_duplicates(broker: BrokerProcess) -> None:
    """Kill -9 the broker under a producer that is sending (acks=1: what was acknowledged is in
    the page cache), restart it: the producer retries the batches that were in flight with the
    same bytes, and the log holds every record exactly once, in order per key."""
    create(broker, "restart", 2)
    futs = []
    stop = threading.Event()
    with Producer(broker.bootstrap, retry_backoff_ms=50, linger_ms=1, batch_bytes=2048) as p:

        def send_all() -> None:
            # A steady stream until told to stop (after the restart), so that whenever the kill
            # comes the sender is still sending: batches are in flight at the kill.
            i = 0
            while not stop.is_set():
                futs.append(p.send("restart", f"{i}".encode(), key=f"k{i % 5}".encode()))
                i += 1
                if i % 20 == 0:
                    time.sleep(0.001)

        sender = threading.Thread(target=send_all)
        sender.start()
        while len(futs) < 2000:
            time.sleep(0.001)
        futs[1500].result(10)
        # Kill while something is unacknowledged: the workers are frozen first, so that what is
        # unanswered then stays so (a worker outlived its killed supervisor by long enough to
        # answer everything sent before the kill, and the test had nothing in flight to judge).
        workers = list(broker.worker_pids.values())
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while all(f.done() for f in list(futs)) and time.monotonic() < deadline:
            time.sleep(0.0005)
        at_kill = list(futs)
        in_flight_at_kill = sum(not f.done() for f in at_kill)
        broker.kill()
        for pid in workers:  # kill -9 of the whole node: a stopped process dies of SIGKILL too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        broker.start()
        while len(futs) < len(at_kill) + 2000:  # records sent after the restart too
            time.sleep(0.001)
        stop.set()
        sender.join()
        n = len(futs)
        p.flush(60)
        mds = [f.result(1) for f in futs]
    assert in_flight_at_kill > 0
    got = consume_all(broker, "restart", n)
    assert sorted(int(r.value or b"-1") for r in got) == list(range(n))  # each record exactly once
    by_key: dict[bytes | None, list[int]] = {}
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        by_key.setdefault(r.key, []).append(int(r.value or b"-1"))
    disorder = {k: v for k, v in by_key.items() if v != sorted(v)}
    assert not disorder, f"per-key order broken across the restart: {_first_disorder(got, disorder)}"
    assert len({(md.partition, md.offset) for md in mds}) == n


def _first_disorder(got, disorder) -> str:
    """Where the first out-of-order record of a key sits, with its neighbours (for diagnosis)."""
    key = next(iter(disorder))
    recs = sorted((r for r in got if r.key == key), key=lambda r: (r.partition, r.offset))
    for a, b in itertools.pairwise(recs):
        if int(b.value or b"-1") < int(a.value or b"-1"):
            return f"key {key!r}: {int(a.value or b'-1')} at offset {a.offset}, then {int(b.value or b'-1')}"
    return f"key {key!r}"


# ----------------------------------------------------------------------------------- admin


def test_admin(broker: BrokerProcess) -> None:
    with Admin(broker.bootstrap) as admin:
        versions = admin.api_versions()
        assert versions.cores >= 1
        assert {a.api_key for a in versions.apis} >= {int(k) for k in m.ApiKey}
        tid = admin.create_topic("a-topic", 3, retention_ms=3_600_000, retention_bytes=-2)
        assert tid > 0
        with pytest.raises(TopicExistsError):
            admin.create_topic("a-topic", 1)
        with pytest.raises(InvalidTopicError):
            admin.create_topic("bad name!", 1)
        assert "a-topic" in admin.list_topics()
    with Producer(broker.bootstrap) as p:
        for i in range(7):
            p.send("a-topic", b"x", partition=i % 2)
    with Admin(broker.bootstrap) as admin:
        d = admin.describe_topic("a-topic")
        assert (d.name, d.topic_id, d.retention_ms, d.retention_bytes) == ("a-topic", tid, 3_600_000, -2)
        offsets = [(p.partition, p.start_offset, p.end_offset) for p in d.partitions]
        assert offsets == [(0, 0, 4), (1, 0, 3), (2, 0, 0)]
        assert all(0 <= p.owner_core < d.cores for p in d.partitions)
        admin.delete_topic("a-topic")
        assert "a-topic" not in admin.list_topics()
        with pytest.raises(UnknownTopicError):
            admin.describe_topic("a-topic")
        with pytest.raises(UnknownTopicError):
            admin.delete_topic("a-topic")


def test_admin_topic_configs(broker: BrokerProcess) -> None:
    """Our Admin creates, describes and alters a topic's configs through our protocol, over the
    config model Kafka's APIs share; a changed max.message.bytes refuses a larger batch on the
    partitions of every core within moments."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("cfg", 4, retention_ms=3_600_000, configs={"cleanup.policy": "compact, delete"})
        configs = admin.describe_configs("cfg")
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
            "3600000",
            ConfigSource.TOPIC,
        )
        assert configs["cleanup.policy"].value == "compact,delete"
        assert configs["segment.bytes"].source == ConfigSource.DEFAULT and configs["segment.bytes"].doc
        assert set(admin.describe_configs("cfg", ["segment.ms", "nope"])) == {"segment.ms"}
        admin.alter_configs(
            "cfg",
            set={"max.message.bytes": "2048"},
            delete=["retention.ms"],
            subtract={"cleanup.policy": "compact"},
        )
        own = {n: c.value for n, c in admin.describe_configs("cfg").items() if c.source == ConfigSource.TOPIC}
        assert own == {"max.message.bytes": "2048", "cleanup.policy": "delete"}
        with pytest.raises(InvalidConfigError, match=r"retention\.ms"):
            admin.alter_configs("cfg", set={"retention.ms": "later"})
        with pytest.raises(InvalidConfigError, match="unknown topic config name"):
            admin.create_topic("cfg-bad", 1, configs={"retention": "1"})
        with pytest.raises(UnknownTopicError):
            admin.describe_configs("no-such-topic")
        admin.alter_configs("cfg", set={"retention.ms": "5"}, validate_only=True)
        assert admin.describe_configs("cfg", ["retention.ms"])["retention.ms"].source == ConfigSource.DEFAULT
        admin.replace_configs("cfg", {"segment.ms": "3600000", "max.message.bytes": "2048"})
        own = {n: c.value for n, c in admin.describe_configs("cfg").items() if c.source == ConfigSource.TOPIC}
        assert own == {"segment.ms": "3600000", "max.message.bytes": "2048"}

    def refused(partition: int) -> bool:
        with Producer(broker.bootstrap, retries=0) as p:
            try:
                p.send("cfg", b"x" * 4000, partition=partition).result(30)
            except MessageTooLargeError:
                return True
        return False

    deadline = time.monotonic() + 10  # every core reloads the registry about once a second
    while not all(refused(p) for p in range(4)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(refused(p) for p in range(4))


@pytest.mark.parametrize(
    "broker",
    [
        pytest.param({"backend": backend, "extra": ("--no-auto-create-topics",)}, id=backend)
        for backend in ("uvloop", "io_uring")
    ],
    indirect=True,
)
def test_send_to_unknown_topic_fails_the_future(broker: BrokerProcess) -> None:
    """A broker that does not auto-create topics: the producer is told the topic is unknown."""
    with Producer(broker.bootstrap) as p:
        fut = p.send("nope", b"x")
        with pytest.raises(UnknownTopicError):
            fut.result(10)

    async def body() -> None:
        async with AsyncProducer(broker.bootstrap) as p:
            with pytest.raises(UnknownTopicError):
                await p.send_and_wait("nope", b"x")

    arun(body)
    with Admin(broker.bootstrap) as admin:
        assert "nope" not in admin.list_topics()


AUTO_CREATING = [
    pytest.param(
        {"cores": cores, "backend": backend, "extra": ("--default-partitions", "3")},
        id=f"{backend}-{cores}core",
    )
    for backend, cores in (("uvloop", 1), ("io_uring", 2))
]


@pytest.mark.parametrize("broker", AUTO_CREATING, indirect=True)
def test_producers_create_a_missing_topic_with_the_default_partitions(broker: BrokerProcess) -> None:
    """As a Kafka producer's Metadata does on a broker with auto.create.topics.enable
    (`--auto-create-topics`, the default): the first record for a topic nobody created creates
    it, with `--default-partitions` partitions, and is stored; an admin's or a consumer's lookup
    of a missing topic creates nothing."""
    with Admin(broker.bootstrap) as admin, pytest.raises(UnknownTopicError):
        admin.describe_topic("made-by-blocking")
    with Consumer(broker.bootstrap, group="g") as c, pytest.raises(UnknownTopicError):
        c.subscribe("made-by-nobody")
    with Producer(broker.bootstrap) as p:
        futs = [p.send("made-by-blocking", b"%d" % i, partition=i % 3) for i in range(6)]
        assert [f.result(20).offset for f in futs] == [0, 0, 0, 1, 1, 1]

    async def body() -> int:
        async with AsyncProducer(broker.bootstrap) as p:
            return (await p.send_and_wait("made-by-async", b"a", partition=2)).offset

    assert arun(body) == 0
    with Admin(broker.bootstrap) as admin:
        for name in ("made-by-blocking", "made-by-async"):
            assert len(admin.describe_topic(name).partitions) == 3
        assert "made-by-nobody" not in admin.list_topics()
    assert sorted(r.value for r in consume_all(broker, "made-by-blocking", 6)) == [
        b"%d" % i for i in range(6)
    ]


def test_prefetch_hands_out_every_record_once_in_order(broker: BrokerProcess) -> None:
    """Small fetches of several batches each, the next one sent before the last is decoded (see
    AsyncConsumer._fetched), from a position inside a batch: every record once, in order, by
    poll lists, by iteration and by the async consumer."""
    create(broker, "prefetch")
    n = 1200
    with Producer(broker.bootstrap, batch_bytes=2048, linger_ms=50) as p:
        for i in range(n):
            p.send("prefetch", f"value-{i:05d}".encode() * 7, partition=0)
        p.flush()
    tp = ("prefetch", 0)
    start = 534  # inside a batch: 2 KiB batches hold ~25 of these records
    want = [f"value-{i:05d}".encode() * 7 for i in range(start, n)]
    config = {"fetch_max_bytes": 5000, "max_poll_records": 97, "fetch_max_wait_ms": 100}
    with Consumer(broker.bootstrap, **config) as c:  # type: ignore[arg-type]
        c.assign([tp])
        c.seek(tp, start)
        got: list[ConsumerRecord] = []
        deadline = time.monotonic() + 30
        while len(got) < len(want) and time.monotonic() < deadline:
            got.extend(c.poll(1000))
        assert [r.offset for r in got] == list(range(start, n))
        assert [r.value for r in got] == want
        assert c.position(tp) == n
        c.seek(tp, start)
        it = iter(c)
        assert [next(it).value for _ in range(len(want))] == want

    async def async_side() -> list[bytes | None]:
        # the iteration ends on a quiet spell; a loaded machine's fetch may take seconds, so the
        # spell is long and the test takes what it wants rather than waiting it out
        async with AsyncConsumer(broker.bootstrap, iter_timeout_ms=10_000, **config) as ac:  # type: ignore[arg-type]
            await ac.assign([tp])
            ac.seek(tp, start)
            values: list[bytes | None] = []
            async for r in ac:
                values.append(r.value)
                if len(values) == len(want):
                    break
            return values

    assert arun(async_side) == want


def test_auto_commit_runs_while_polls_find_records_buffered(broker: BrokerProcess) -> None:
    """The blocking Consumer takes buffered records without the loop (`poll_buffered`), but a due
    auto-commit still runs, committing only what earlier polls returned."""
    create(broker, "autocommit")
    with Producer(broker.bootstrap, linger_ms=20) as p:
        for i in range(500):
            p.send("autocommit", f"{i}".encode(), partition=0)
        p.flush()
    tp = ("autocommit", 0)
    config = {"group": "ac", "auto_offset_reset": "earliest", "auto_commit_interval_ms": 100}
    with Consumer(broker.bootstrap, max_poll_records=1, **config) as c:  # type: ignore[arg-type]
        c.assign([tp])
        got: list[int] = []
        committed = None
        deadline = time.monotonic() + 20
        # (a commit of 0, due before the first fetch came back on a loaded machine, commits
        # nothing returned: wait for one that does)
        while not committed and len(got) < 500 and time.monotonic() < deadline:
            got.extend(r.offset for r in c.poll(1000))
            time.sleep(0.01)
            committed = c.committed(tp)
        # 500 records of a few bytes come in a fetch or two: polls found them buffered.
        assert committed is not None and len(got) < 400, "no auto-commit while records were buffered"
        assert 0 < committed <= len(got) == c.position(tp)
        assert got == list(range(len(got)))
