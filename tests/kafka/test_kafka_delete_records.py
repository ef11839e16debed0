"""DeleteRecords (api 21) against a real `broker serve`, with the clients' own admin calls:
confluent-kafka, kafka-python 3 and aiokafka move a partition's log start (Kafka's low
watermark) inside a segment and to the high watermark (-1); consumers and kcat read from the new
start, ListOffsets earliest answers it, an offset past the high watermark is OFFSET_OUT_OF_RANGE,
and a kill -9 and restart keeps it; a topic whose cleanup.policy does not delete refuses it
(POLICY_VIOLATION), as Kafka's does. With two cores each partition is answered by the core that
owns it (the clients send it to its leader)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

KCAT = shutil.which("kcat")
CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
RECORDS = 10


@pytest.fixture(params=CONFIGS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    options = request.param
    proc = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", cores=options["cores"], backend=options["backend"]
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, proc.log()


def filled(server: BrokerProcess, topic: str, partitions: int) -> None:
    Wire(server.port).create_topic(topic, partitions)
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0})
    for p in range(partitions):
        for i in range(RECORDS):
            producer.produce(topic, value=b"%d-%d" % (p, i), partition=p)
            if i % 3 == 2:
                producer.flush(10)  # several batches: a start inside a segment, between batches
    assert producer.flush(20) == 0


def watermarks(server: BrokerProcess, topic: str, partitions: int) -> list[tuple[int, int]]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": "wm"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)
        ]
    finally:
        consumer.close()


def first_read(server: BrokerProcess, topic: str, partition: int) -> tuple[int, bytes]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": server.bootstrap, "group.id": "first", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([TopicPartition(topic, partition, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                return msg.offset(), msg.value()
    finally:
        consumer.close()
    raise AssertionError("nothing read")


def test_confluent_admin_deletes_records(server: BrokerProcess) -> None:
    filled(server, "dr", 3)
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    done = admin.delete_records(
        [TopicPartition("dr", 0, 4), TopicPartition("dr", 1, confluent_kafka.OFFSET_END)]
    )
    lows = {tp.partition: f.result(15).low_watermark for tp, f in done.items()}
    assert lows == {0: 4, 1: RECORDS}
    assert watermarks(server, "dr", 3) == [(4, RECORDS), (RECORDS, RECORDS), (0, RECORDS)]
    assert first_read(server, "dr", 0) == (4, b"0-4")
    if KCAT:
        out = subprocess.run(
            [
                KCAT,
                "-b",
                server.bootstrap,
                "-C",
                "-t",
                "dr",
                "-p",
                "0",
                "-o",
                "beginning",
                "-e",
                "-f",
                "%o %s\n",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split("\n")
        assert out[0] == "4 0-4"
    # not an increase: nothing changes, no error; past the high watermark: OFFSET_OUT_OF_RANGE
    [same] = admin.delete_records([TopicPartition("dr", 0, 2)]).values()
    assert same.result(15).low_watermark == 4
    [past] = admin.delete_records([TopicPartition("dr", 2, RECORDS + 1)]).values()
    with pytest.raises(confluent_kafka.KafkaException, match="OFFSET_OUT_OF_RANGE"):
        past.result(15)
    [unknown] = admin.delete_records([TopicPartition("dr", 7, 1)]).values()
    with pytest.raises(confluent_kafka.KafkaException):
        unknown.result(15)
    server.kill()  # kill -9: the start was durable when answered
    server.start()
    assert watermarks(server, "dr", 3) == [(4, RECORDS), (RECORDS, RECORDS), (0, RECORDS)]
    assert first_read(server, "dr", 0) == (4, b"0-4")
    assert "level=error" not in server.log()


def test_a_compacted_topic_refuses_it(server: BrokerProcess) -> None:
    """Kafka's leader refuses DeleteRecords where cleanup.policy does not delete."""
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    topics = [
        NewTopic("kept", 1, config={"cleanup.policy": "compact"}),
        NewTopic("both", 1, config={"cleanup.policy": "compact,delete"}),
    ]
    for future in admin.create_topics(topics).values():
        future.result(15)
    producer = confluent_kafka.Producer({"bootstrap.servers": server.bootstrap})
    for topic in ("kept", "both"):
        for i in range(3):
            producer.produce(topic, key=b"k%d" % i, value=b"v")
    assert producer.flush(20) == 0
    [refused] = admin.delete_records([TopicPartition("kept", 0, 1)]).values()
    with pytest.raises(confluent_kafka.KafkaException, match="POLICY_VIOLATION"):
        refused.result(15)
    [done] = admin.delete_records([TopicPartition("both", 0, 1)]).values()
    assert done.result(15).low_watermark == 1
    assert watermarks(server, "kept", 1) == [(0, 3)]


def test_kafka_python_and_aiokafka_delete_records(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition as KpTopicPartition

    filled(server, "drk", 2)
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        result = kp.delete_records({KpTopicPartition("drk", 0): 3})
        assert {tp.partition: v["low_watermark"] for tp, v in result.items()} == {0: 3}
    finally:
        kp.close()

    async def delete() -> dict[int, int]:
        from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
        from aiokafka.structs import TopicPartition as AioTopicPartition

        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap)
        await client.start()
        try:
            got = await client.delete_records({AioTopicPartition("drk", 1): RecordsToDelete(before_offset=6)})
            return {tp.partition: low for tp, low in got.items()}
        finally:
            await client.close()

    assert asyncio.run(delete()) == {1: 6}
    assert watermarks(server, "drk", 2) == [(3, RECORDS), (6, RECORDS)]
