"""Our own client and every codec Kafka has, against a real `broker serve` (two cores, both
backends) and librdkafka:
- batches stored in gzip, snappy, lz4 and zstd, as librdkafka's producer sent them (snappy raw,
  lz4 frames) or as the broker rewrote them for a topic's compression.type (snappy in Java's
  xerial framing), are read back by our `Consumer` and `AsyncConsumer`, every field as sent;
- our `Producer` compresses with each codec (`compression=`): the broker stores the batches as
  sent, and confluent-kafka reads every record back; the lone-record lane of `send_and_wait`
  compresses too.
Each test first checks that the batches are stored in the codec it is about (read with our own
protocol), so a producer that silently stopped compressing would fail it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client import Admin, AsyncConsumer, AsyncProducer, Consumer, Producer, TopicPartition
from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import CODEC_NAMES, iter_batches

confluent_kafka = pytest.importorskip("confluent_kafka")

CODECS = ("gzip", "snappy", "lz4", "zstd")
T = 1_700_000_000_000
CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]
# (key, value, headers, timestamp): null keys and values, headers with a null value, text that
# compresses (librdkafka sends a batch its codec does not shrink uncompressed)
Row = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def cbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data", tmp / "broker.log", cores=request.param["cores"], backend=request.param["backend"]
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def rows(n: int, tag: str) -> list[Row]:
    return [
        (
            None if i % 9 == 8 else b"key-%d" % (i % 5),
            None if i % 11 == 10 else f"{tag} value {i}: ".encode() + b"compressible text " * (1 + i % 7),
            (("trace", b"t%d" % i), ("nil", None)) if i % 3 == 0 else (),
            T + 1000 * i,
        )
        for i in range(n)
    ]


def stored_codecs(broker: BrokerProcess, topic: str, partition: int) -> list[str]:
    """The codec of every batch of the partition, as stored (our own protocol's Fetch)."""
    wire = Wire(broker.port)
    try:
        meta = wire.rpc(m.MetadataRequest((topic,)))
        assert isinstance(meta, m.MetadataResponse)
        (tmeta,) = meta.topics
        out: list[str] = []
        offset = 0
        while True:
            resp = wire.rpc(m.FetchRequest(tmeta.topic_id, partition, offset, 1 << 22, 0))
            assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
            headers = [h for _, h in iter_batches(resp.records) if h.next_offset > offset]
            if not headers:
                return out
            out += [CODEC_NAMES[h.compression] for h in headers]
            offset = headers[-1].next_offset
    finally:
        wire.close()


def librdkafka_produce(bootstrap: str, topic: str, partition: int, codec: str, records: list[Row]) -> None:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})
    errors: list[Any] = []
    for key, value, headers, ts in records:
        p.produce(
            topic,
            value,
            key,
            partition=partition,
            headers=list(headers),
            timestamp=ts,
            on_delivery=lambda err, _msg: errors.append(err),
        )
    assert p.flush(30) == 0
    assert errors == [None] * len(records)


def read_ours(bootstrap: str, tps: list[tuple[str, int]], counts: dict[tuple[str, int], int]) -> dict:
    """Each partition from its beginning with our blocking Consumer: (offset, row) lists."""
    out: dict[tuple[str, int], list[tuple[int, Row]]] = {tp: [] for tp in tps}
    with Consumer(bootstrap, fetch_max_wait_ms=100) as c:
        c.assign([TopicPartition(*tp) for tp in tps])
        c.seek_to_beginning(*[TopicPartition(*tp) for tp in tps])
        deadline = time.monotonic() + 30
        while any(len(out[tp]) < counts[tp] for tp in tps) and time.monotonic() < deadline:
            for r in c.poll(timeout_ms=200):
                out[(r.topic, r.partition)].append(
                    (r.offset, (r.key, r.value, tuple(r.headers), r.timestamp))
                )
    return out


def read_ours_async(bootstrap: str, tps: list[tuple[str, int]], counts: dict[tuple[str, int], int]) -> dict:
    """`read_ours` with the AsyncConsumer."""

    async def run() -> dict:
        out: dict[tuple[str, int], list[tuple[int, Row]]] = {tp: [] for tp in tps}
        async with AsyncConsumer(bootstrap, fetch_max_wait_ms=100) as c:
            await c.assign([TopicPartition(*tp) for tp in tps])
            await c.seek_to_beginning(*[TopicPartition(*tp) for tp in tps])
            deadline = time.monotonic() + 30
            while any(len(out[tp]) < counts[tp] for tp in tps) and time.monotonic() < deadline:
                for r in await c.poll(timeout_ms=200):
                    row = (r.key, r.value, tuple(r.headers), r.timestamp)
                    out[(r.topic, r.partition)].append((r.offset, row))
        return out

    return asyncio.run(run())


def test_our_consumers_read_every_codec_as_librdkafka_and_the_broker_store_it(
    cbroker: BrokerProcess,
) -> None:
    """Partition i of "cc-sent" holds librdkafka's batches in CODECS[i] (compression.type
    producer: stored as sent); "cc-<codec>" holds batches librdkafka sent uncompressed and in
    gzip, stored in the topic's codec (the broker's own framings)."""
    sent: dict[tuple[str, int], list[Row]] = {}
    with Admin(cbroker.bootstrap) as admin:
        admin.create_topic("cc-sent", partitions=len(CODECS))
        for codec in CODECS:
            admin.create_topic(f"cc-{codec}", partitions=1, configs={"compression.type": codec})
    for i, codec in enumerate(CODECS):
        sent[("cc-sent", i)] = rows(120, codec)
        librdkafka_produce(cbroker.bootstrap, "cc-sent", i, codec, sent[("cc-sent", i)])
        assert set(stored_codecs(cbroker, "cc-sent", i)) == {codec}
        topic = f"cc-{codec}"
        first, second = rows(60, f"{topic} plain"), rows(60, f"{topic} gzip")
        librdkafka_produce(cbroker.bootstrap, topic, 0, "none", first)
        librdkafka_produce(cbroker.bootstrap, topic, 0, "gzip", second)
        sent[(topic, 0)] = first + second
        assert set(stored_codecs(cbroker, topic, 0)) == {codec}
    tps = list(sent)
    counts = {tp: len(records) for tp, records in sent.items()}
    want = {tp: list(enumerate(records)) for tp, records in sent.items()}
    assert read_ours(cbroker.bootstrap, tps, counts) == want
    assert read_ours_async(cbroker.bootstrap, tps, counts) == want


def test_our_producer_compresses_with_each_codec_and_librdkafka_reads_it(cbroker: BrokerProcess) -> None:
    with Admin(cbroker.bootstrap) as admin:
        admin.create_topic("cc-ours", partitions=len(CODECS))
    sent: dict[int, list[Row]] = {}
    for i, codec in enumerate(CODECS):
        sent[i] = rows(150, f"ours {codec}")
        with Producer(cbroker.bootstrap, compression=codec, linger_ms=20) as p:
            futures = [
                p.send("cc-ours", value, key=key, headers=list(headers), partition=i, timestamp=ts)
                for key, value, headers, ts in sent[i]
            ]
            p.flush()
            assert [f.result(10).offset for f in futures] == list(range(len(futures)))
        assert set(stored_codecs(cbroker, "cc-ours", i)) == {codec}, "stored as our producer sent it"
    c = confluent_kafka.Consumer(
        {"bootstrap.servers": cbroker.bootstrap, "group.id": "cc-check", "enable.auto.commit": False}
    )
    got: dict[int, list[tuple[int, Row]]] = {i: [] for i in sent}
    try:
        c.assign(
            [confluent_kafka.TopicPartition("cc-ours", i, confluent_kafka.OFFSET_BEGINNING) for i in sent]
        )
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < sum(map(len, sent.values())) and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            headers = tuple((k, v) for k, v in msg.headers() or ())
            got[msg.partition()].append((msg.offset(), (msg.key(), msg.value(), headers, msg.timestamp()[1])))
    finally:
        c.close()
    assert got == {i: list(enumerate(records)) for i, records in sent.items()}


def test_send_and_wait_compresses_too(cbroker: BrokerProcess) -> None:
    """The lone-record lane (a frame made in one call, uncompressed) is left to the general path
    when the producer compresses: each record's batch is in the producer's codec."""

    async def run() -> list[int]:
        async with AsyncProducer(cbroker.bootstrap, compression="zstd") as p:
            return [
                (await p.send_and_wait("cc-lone", b"lone record %d " % i * 10, partition=0)).offset
                for i in range(3)
            ]

    with Admin(cbroker.bootstrap) as admin:
        admin.create_topic("cc-lone", partitions=1)
    assert asyncio.run(run()) == [0, 1, 2]
    assert stored_codecs(cbroker, "cc-lone", 0) == ["zstd"] * 3
    got = read_ours(cbroker.bootstrap, [("cc-lone", 0)], {("cc-lone", 0): 3})[("cc-lone", 0)]
    assert [row[1] for _, row in got] == [b"lone record %d " % i * 10 for i in range(3)]
