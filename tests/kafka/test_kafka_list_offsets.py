"""ListOffsets by timestamp against a real `broker serve`, as Kafka answers it: the offset of the
first record at or after the time and that record's own timestamp (the Java client's
`offsetsForTimes` threw on the timestamp -1 answered before: tests/kafka/test_java_client.py);
-1 and -1 when no record is that late; latest and earliest with timestamp -1.

confluent-kafka's `offsets_for_times` shows only offsets; kafka-python's and aiokafka's return the
timestamp too."""

from __future__ import annotations

import asyncio

import pytest

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
BASE_TS = 1_714_564_800_000
PARTITIONS = 2
PER_PARTITION = 10
STEP_MS = 1000  # record i of a partition is at BASE_TS + i * STEP_MS + partition


def fill(broker: BrokerProcess, topic: str) -> None:
    Wire(broker.port).create_topic(topic, PARTITIONS)
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
    for i in range(PER_PARTITION):
        for part in range(PARTITIONS):
            p.produce(topic, b"v%d" % i, partition=part, timestamp=BASE_TS + i * STEP_MS + part)
    assert p.flush(20) == 0


def asked_and_found() -> list[tuple[int, int, tuple[int, int]]]:
    """(partition, time asked, (offset, timestamp) expected)."""
    cases = []
    for part in range(PARTITIONS):
        cases += [
            (part, BASE_TS, (0, BASE_TS + part)),
            (part, BASE_TS + 2500, (3, BASE_TS + 3 * STEP_MS + part)),  # between records
            (part, BASE_TS + 4 * STEP_MS + part, (4, BASE_TS + 4 * STEP_MS + part)),  # exactly
            (part, BASE_TS + 60 * STEP_MS, (-1, -1)),  # later than every record
        ]
    return cases


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_kafka_python_offsets_for_times_has_the_records_timestamps(broker: BrokerProcess) -> None:
    fill(broker, "by-time")
    c = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        for part, ts, want in asked_and_found():
            tp = kafka.TopicPartition("by-time", part)
            found = c.offsets_for_times({tp: ts})[tp]
            got = (-1, -1) if found is None else (found.offset, found.timestamp)
            assert got == want, (part, ts)
        tps = [kafka.TopicPartition("by-time", p) for p in range(PARTITIONS)]
        assert c.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        assert c.end_offsets(tps) == dict.fromkeys(tps, PER_PARTITION)
    finally:
        c.close()


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_aiokafka_offsets_for_times_has_the_records_timestamps(broker: BrokerProcess) -> None:
    fill(broker, "by-time")

    async def ask() -> None:
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await c.start()
        try:
            for part, ts, want in asked_and_found():
                tp = aiokafka.TopicPartition("by-time", part)
                found = (await c.offsets_for_times({tp: ts}))[tp]
                got = (-1, -1) if found is None else (found.offset, found.timestamp)
                assert got == want, (part, ts)
        finally:
            await c.stop()

    asyncio.run(ask())


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_confluent_kafka_offsets_for_times(broker: BrokerProcess) -> None:
    fill(broker, "by-time")
    c = confluent_kafka.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "by-time"})
    try:
        for part, ts, (offset, _) in asked_and_found():
            [found] = c.offsets_for_times([confluent_kafka.TopicPartition("by-time", part, ts)], timeout=10)
            assert found.error is None and found.offset == offset, (part, ts, found)
    finally:
        c.close()
