"""A Kafka Fetch's response holds at most the request's max_bytes of records (fetch.max.bytes,
KIP-74), as Kafka's `ReplicaManager.readFromLog` fills it: partitions in request order, each up to
its partition_max_bytes, the first batch of the first partition with records whole whatever its
size, the partitions left without room answered with their bounds and no records. librdkafka's
own test 0082 found ringlog answering many times the 1 MB its consumer asked for (its
receive.message.max.bytes then refuses the response, and the consumer never progresses).
A librdkafka consumer with a small fetch.max.bytes, and raw Fetch requests whose answers are
measured, one request at a time and long-polled; both backends, two cores."""

from __future__ import annotations

import datetime
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.client import Admin
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess
from labkit.kafka_requests import rpc
from ringlog_proto.batch import read_header
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]
VALUE_BYTES = 10_000  # one record a batch: a batch is this and its header and framing
FETCH = 1
FETCH_VERSION = 11


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def kbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data",
        tmp / "broker.log",
        # a group's first join waits this long for more members (Kafka's default is 3 s), as in
        # tests/conftest.py's brokers
        ("--group-initial-rebalance-delay-ms", "100"),
        cores=request.param["cores"],
        backend=request.param["backend"],
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def create(kbroker: BrokerProcess, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": kbroker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce(
    kbroker: BrokerProcess, topic: str, counts: dict[int, int], value_bytes: int = VALUE_BYTES
) -> None:
    """`counts[p]` records of `value_bytes` to partition p, one record a batch."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kbroker.bootstrap, "linger.ms": 0, "batch.num.messages": 1}
    )
    for p, n in counts.items():
        for i in range(n):
            producer.produce(topic, bytes([i % 251]) * value_bytes, partition=p)
    assert producer.flush(30) == 0


def same_core_partitions(
    kbroker: BrokerProcess, topic: str, partitions: int, want: int
) -> tuple[int, list[int]]:
    """(core, `want` of the topic's partitions that core owns): one raw Fetch reads them all."""
    with Admin(kbroker.bootstrap) as ours:
        topic_id = ours.describe_topic(topic).topic_id
    by_core: dict[int, list[int]] = {}
    for p in range(partitions):
        by_core.setdefault(shard_for(topic_id, p, kbroker.cores), []).append(p)
    core, owned = max(by_core.items(), key=lambda item: len(item[1]))
    assert len(owned) >= want, by_core
    return core, owned[:want]


def raw_fetch(
    kbroker: BrokerProcess,
    core: int,
    topic: str,
    offsets: list[tuple[int, int]],
    max_bytes: int,
    partition_max_bytes: int = 1 << 20,
    min_bytes: int = 1,
    max_wait_ms: int = 0,
) -> list[Any]:
    """A Fetch v11 of `offsets` ((partition, fetch offset), in that order) asked of `core`: each
    partition's answer, in the order asked."""
    schema = request_schema(FETCH, FETCH_VERSION)
    assert schema is not None
    module = sys.modules[schema.__module__]
    body = make(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            make(
                module.FetchTopic,
                topic=topic,
                partitions=tuple(
                    make(
                        module.FetchPartition,
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=partition_max_bytes,
                    )
                    for p, offset in offsets
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    resp = rpc(kbroker.core_ports[core], FETCH, FETCH_VERSION, body, timeout=30)
    assert resp.error_code == ErrorCode.none
    (topic_answer,) = resp.responses
    return list(topic_answer.partitions)


def batches(records: bytes | None) -> list[int]:
    """The sizes of the whole batches in `records`."""
    data = records or b""
    sizes = []
    while data:
        size = read_header(data).size
        assert size <= len(data), "a fetch answers whole batches"
        sizes.append(size)
        data = data[size:]
    return sizes


def record_bytes(answers: list[Any]) -> int:
    return sum(len(a.records or b"") for a in answers)


# ------------------------------------------------------------------------------ a real consumer


def test_a_consumer_with_a_small_fetch_max_bytes_receives_everything(kbroker: BrokerProcess) -> None:
    """librdkafka's test 0082, scaled down: records near the response cap in three partitions,
    a partition limit far above it, and receive.message.max.bytes just above fetch.max.bytes (a
    larger response is refused by the client, which then never progresses)."""
    create(kbroker, "capped", 3)
    value_bytes = 90 * 1024
    produce(kbroker, "capped", {p: 10 for p in range(3)}, value_bytes)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": kbroker.bootstrap,
            "group.id": "capped",
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 20_000_000,
            "fetch.max.bytes": 100_000,
            "message.max.bytes": 100_000,  # librdkafka: at most fetch.max.bytes
            "receive.message.max.bytes": 100_512,
        }
    )
    got: dict[int, list[int]] = {p: [] for p in range(3)}
    try:
        consumer.subscribe(["capped"])
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 30 and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            assert len(msg.value()) == value_bytes
            got[msg.partition()].append(msg.offset())
    finally:
        consumer.close()
    assert got == {p: list(range(10)) for p in range(3)}
    assert "Invalid response size" not in kbroker.log()


# ------------------------------------------------------------------------------ raw Fetch requests


def test_partitions_are_filled_in_request_order_up_to_max_bytes(kbroker: BrokerProcess) -> None:
    create(kbroker, "ordered", 8)
    core, (a, b, c) = same_core_partitions(kbroker, "ordered", 8, 3)
    produce(kbroker, "ordered", {a: 5, b: 5, c: 5})
    one = batches(raw_fetch(kbroker, core, "ordered", [(a, 0)], 1 << 20)[0].records)
    assert len(one) == 5 and len(set(one)) == 1, one
    size = one[0]  # every batch's size

    # room for two batches and a half: two from the first partition asked, none from the others
    answers = raw_fetch(kbroker, core, "ordered", [(b, 0), (a, 0), (c, 0)], int(size * 2.5))
    assert [x.partition_index for x in answers] == [b, a, c]
    assert [len(batches(x.records)) for x in answers] == [2, 0, 0]
    for x in answers:  # the ones left out answer their bounds, no error
        assert (x.error_code, x.high_watermark, x.log_start_offset) == (ErrorCode.none, 5, 0)
    assert record_bytes(answers) <= size * 2.5

    # room for six and a half: the first partition whole, one from the next, none from the last
    answers = raw_fetch(kbroker, core, "ordered", [(c, 0), (a, 3), (b, 0)], int(size * 6.5))
    assert [len(batches(x.records)) for x in answers] == [5, 1, 0]
    assert record_bytes(answers) <= size * 6.5

    # each partition up to its own limit too: two of each then fit
    answers = raw_fetch(kbroker, core, "ordered", [(a, 0), (b, 0), (c, 0)], 100 * size, int(size * 2.5))
    assert [len(batches(x.records)) for x in answers] == [2, 2, 2]

    # a partition at its end gives nothing, so the next one's first batch is the first taken
    answers = raw_fetch(kbroker, core, "ordered", [(a, 5), (b, 4), (c, 0)], size * 2)
    assert [len(batches(x.records)) for x in answers] == [0, 1, 1]


def test_the_first_batch_goes_whole_above_both_limits_and_alone(kbroker: BrokerProcess) -> None:
    """A batch larger than max_bytes and partition_max_bytes is answered whole when it is the
    first with records (a consumer always progresses); none after it."""
    create(kbroker, "oversized", 8)
    core, (a, b) = same_core_partitions(kbroker, "oversized", 8, 2)
    produce(kbroker, "oversized", {a: 2, b: 2})
    answers = raw_fetch(kbroker, core, "oversized", [(a, 0), (b, 0)], 1000, partition_max_bytes=500)
    sizes = [batches(x.records) for x in answers]
    assert len(sizes[0]) == 1 and sizes[0][0] > VALUE_BYTES and sizes[1] == [], sizes
    assert answers[1].high_watermark == 2
    # the same batch second in line: not taken, the partition answers no records
    answers = raw_fetch(
        kbroker, core, "oversized", [(b, 1), (a, 1)], VALUE_BYTES * 3, partition_max_bytes=500
    )
    assert [len(batches(x.records)) for x in answers] == [1, 0]


def test_a_long_poll_answered_later_keeps_the_cap(kbroker: BrokerProcess) -> None:
    """A fetch waiting at the end of three partitions for far more than max_bytes answers as soon
    as a batch is left out for lack of room (the response can hold no more), with no more than
    max_bytes; one that stays short answers at its deadline, within the cap too."""
    create(kbroker, "polled", 8)
    core, (a, b, c) = same_core_partitions(kbroker, "polled", 8, 3)

    def later(counts: dict[int, int]) -> threading.Thread:
        def run() -> None:
            time.sleep(0.5)
            for p, n in counts.items():  # one partition after another: each wakes the fetch
                produce(kbroker, "polled", {p: n})
                time.sleep(0.2)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    thread = later({a: 1, b: 1, c: 1})
    started = time.monotonic()
    answers = raw_fetch(
        kbroker,
        core,
        "polled",
        [(a, 0), (b, 0), (c, 0)],
        int(VALUE_BYTES * 1.5),
        min_bytes=10 << 20,
        max_wait_ms=20_000,
    )
    elapsed = time.monotonic() - started
    thread.join()
    assert elapsed < 15, f"answered at the deadline ({elapsed:.1f} s), not when the response was full"
    assert [len(batches(x.records)) for x in answers] == [1, 0, 0]
    assert record_bytes(answers) <= VALUE_BYTES * 1.5

    thread = later({a: 1, b: 1})
    started = time.monotonic()
    answers = raw_fetch(
        kbroker,
        core,
        "polled",
        [(a, 1), (b, 1), (c, 1)],
        VALUE_BYTES * 3,
        min_bytes=10 << 20,
        max_wait_ms=3_000,
    )
    elapsed = time.monotonic() - started
    thread.join()
    assert 2.5 < elapsed < 15, elapsed
    assert [len(batches(x.records)) for x in answers] == [1, 1, 0]
    assert record_bytes(answers) <= VALUE_BYTES * 3
