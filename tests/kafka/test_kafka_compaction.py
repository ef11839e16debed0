"""Log compaction against a real `broker serve` and stock Kafka clients (the issue's figure test,
at CI size: bench/compaction.py runs the full 1M updates over 10k keys).

An idempotent librdkafka producer writes many updates over fewer keys, the last update of some
keys a tombstone; once the cleaner has run, confluent-kafka, aiokafka, kafka-python and our own
client each read back from the start exactly the last record of each key at its offset
(tombstones included, within delete.retention.ms), gaps in the offsets and empty batches
notwithstanding. A topic's own cleanup.policy (CreateTopics) compacts it on a broker whose
default is delete. Then the same with the broker killed (SIGKILL) while it cleans, under an I/O
cap that makes the clean last: every record is still served after the restart, and the next
clean ends the same."""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from broker.client import Consumer
from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
confluent_admin = pytest.importorskip("confluent_kafka.admin")

aiokafka = pytest.importorskip("aiokafka")
kafka = pytest.importorskip("kafka")

TOPIC = "changelog"
UPDATES = 100_000
KEYS = 1_000
SENTINEL = b"sentinel"

Served = dict[int, tuple[bytes | None, bytes | None]]  # offset -> (key, value)

COMPACTING = (
    "--log-cleanup-policy",
    "compact",
    "--segment-bytes",
    str(1 << 20),
    "--log-cleaner-backoff-ms",
    "200",
    "--log-cleaner-max-compaction-lag-ms",
    "1000",  # the active segment rolls a second after its first record: all of it gets cleanable
)


def start(tmp_path: Path, backend: str, *extra: str) -> BrokerProcess:
    broker = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", backend=backend, extra=(*COMPACTING, *extra)
    )
    broker.start()
    broker.skip_if_fell_back()
    return broker


def produce_updates(broker: BrokerProcess, create: bool = True) -> Served:
    """The updates, then (a second later, so that everything before is in closed segments) the
    sentinel; what a full clean must leave: each key's last record at its offset."""
    if create:
        wire = Wire(broker.port)
        wire.create_topic(TOPIC, 1)
        wire.close()
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "queue.buffering.max.messages": UPDATES + 10,
        }
    )
    last: dict[bytes, tuple[int, bytes | None]] = {}
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
            return
        key = msg.key()
        if key not in last or last[key][0] < msg.offset():
            last[key] = (msg.offset(), msg.value())

    rng = random.Random(7)
    for i in range(UPDATES):
        k = rng.randrange(KEYS)
        tombstone = k % 10 == 3 and i > UPDATES - 4 * KEYS
        value = None if tombstone else b"value-%d-" % i + b"x" * rng.randrange(10, 60)
        producer.produce(TOPIC, key=b"key-%d" % k, value=value, on_delivery=delivered)
        if i % 5000 == 0:
            producer.poll(0)
    producer.flush(60)
    time.sleep(1.1)
    producer.produce(TOPIC, key=SENTINEL, value=b"end", on_delivery=delivered)
    producer.flush(30)
    assert not failed, failed[:3]
    assert sum(1 for _, v in last.values() if v is None) > 10, "some keys end in a tombstone"
    return {offset: (key, value) for key, (offset, value) in last.items()}


def read_confluent(broker: BrokerProcess) -> Served:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "reader", "enable.auto.commit": False}
    )
    try:
        tp = confluent_kafka.TopicPartition(TOPIC, 0, 0)
        _, end = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        out: Served = {}
        deadline = time.monotonic() + 30
        position = 0
        while position < end and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                assert msg.error() is None, msg.error()
                assert msg.offset() not in out and msg.offset() >= position
                out[msg.offset()] = (msg.key(), msg.value())
                position = msg.offset() + 1
        assert position >= end, f"read to {position} of {end}"
        return out
    finally:
        consumer.close()


def read_aiokafka(broker: BrokerProcess, end: int) -> Served:
    async def run() -> Served:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(TOPIC, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            out: Served = {}
            deadline = time.monotonic() + 30
            while await consumer.position(tp) < end and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    for r in records:
                        out[r.offset] = (r.key, r.value)
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


def read_kafka_python(broker: BrokerProcess, end: int) -> Served:
    consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        out: Served = {}
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                for r in records:
                    out[r.offset] = (r.key, r.value)
        return out
    finally:
        consumer.close()


def read_ours(broker: BrokerProcess, end: int) -> Served:
    """What our own client (`broker.client.Consumer`, our protocol) reads of the topic."""
    out: Served = {}
    with Consumer(broker.bootstrap) as consumer:
        consumer.assign([(TOPIC, 0)])
        consumer.seek_to_beginning((TOPIC, 0))
        deadline = time.monotonic() + 30
        while (max(out, default=-1) < end - 1) and time.monotonic() < deadline:
            for r in consumer.poll(timeout_ms=1000):
                out[r.offset] = (r.key, r.value)
    return out


def fold(served: Served) -> dict[bytes | None, bytes | None]:
    """Each key's value as a consumer restoring a table from the log ends up with."""
    table: dict[bytes | None, bytes | None] = {}
    for _, (key, value) in sorted(served.items()):
        table[key] = value
    return table


CLEANED_TO = re.compile(r"cleaned \(.*?\) to offset (\d+)")


def wait_cleaned(broker: BrokerProcess, want: Served, timeout_s: float = 40) -> Served:
    """What the broker serves once a clean has reached the sentinel (everything before it is
    cleaned), which must be `want`."""
    sentinel = max(want)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if max(map(int, CLEANED_TO.findall(broker.log())), default=-1) >= sentinel:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no clean reached offset {sentinel} in {timeout_s} s\n{broker.log_tail(15)}")
    served = read_confluent(broker)
    extra, missing = sorted(set(served) - set(want)), sorted(set(want) - set(served))
    assert served == want, (
        f"{len(served)} served, {len(want)} wanted: extra {extra[:5]} missing {missing[:5]}"
    )
    return served


def cleaning_now(broker: BrokerProcess) -> bool:
    """Whether a clean has started and not ended (nor been discarded or failed) yet."""
    text = broker.log()
    ended = text.count("cleaned (") + text.count("clean discarded") + text.count("clean failed")
    return text.count("cleaning (") > ended


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_the_last_record_of_each_key_is_what_every_client_reads_back(tmp_path: Path, backend: str) -> None:
    broker = start(tmp_path, backend)
    try:
        want = produce_updates(broker)
        assert len(want) == KEYS + 1
        wait_cleaned(broker, want)
        end = max(want) + 1
        assert read_aiokafka(broker, end) == want
        assert read_kafka_python(broker, end) == want
        assert read_ours(broker, end) == want
        assert "cleaned (" in broker.log()
        closed = sorted((tmp_path / "data" / "topics" / "1" / "0").glob("*.log"))[:-1]  # not the active one
        size = sum(p.stat().st_size for p in closed)
        assert 0 < size < 200_000, f"{size} bytes left of about 5 MB produced"
    finally:
        assert broker.stop() == 0


def test_a_topics_own_cleanup_policy_compacts_it_on_a_broker_that_deletes(tmp_path: Path) -> None:
    broker = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", extra=("--log-cleaner-backoff-ms", "200")
    ).start()
    try:
        admin = confluent_admin.AdminClient({"bootstrap.servers": broker.bootstrap})
        configs = {
            "cleanup.policy": "compact",
            "segment.bytes": str(1 << 20),
            "max.compaction.lag.ms": "1000",
        }
        admin.create_topics([confluent_admin.NewTopic(TOPIC, 1, 1, config=configs)])[TOPIC].result(10)
        want = produce_updates(broker, create=False)
        wait_cleaned(broker, want)
    finally:
        assert broker.stop() == 0


@pytest.mark.slow
def test_a_broker_killed_while_it_cleans_serves_every_record_and_cleans_again(tmp_path: Path) -> None:
    # the cap makes the clean of ~10 MB (read twice, written once) last several seconds
    broker = start(tmp_path, "uvloop", "--log-cleaner-io-max-bytes-per-second", "2000000")
    try:
        want = produce_updates(broker)
        deadline = time.monotonic() + 20
        while not (cleaning_now(broker) and "to offset" in broker.log()) and time.monotonic() < deadline:
            time.sleep(0.02)  # the clean of everything, after those that ran while producing
        time.sleep(random.Random(3).uniform(0.2, 1.5))
        assert cleaning_now(broker), "the clean ended before the kill: lower the cap"
        broker.kill()
        broker.extra = COMPACTING  # restarted without the cap
        broker.start()
        first = read_confluent(broker)
        assert fold(first) == fold(want), "nothing lost, whatever the kill interrupted"
        assert set(want) <= set(first)
        wait_cleaned(broker, want)
        assert not [
            n
            for n in os.listdir(tmp_path / "data" / "topics" / "1" / "0")
            if n.endswith((".cleaned", ".swap"))
        ]
    finally:
        broker.stop()
