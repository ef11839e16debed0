"""A topic's compression.type against real clients and a real `broker serve` (two cores, both
backends): topics stored in zstd, uncompressed and gzip take librdkafka's batches in none, gzip,
lz4 and snappy, and confluent-kafka, kafka-python and aiokafka read every record back as sent
(key, value, headers, timestamp, offset) while a raw Kafka Fetch shows every stored batch in the
topic's codec; an idempotent producer's retries and sequences hold across the rewrite (raw
Produce, and librdkafka's idempotent producer); AlterConfigs changes the codec live on every
core; max.message.bytes applies to the batch as stored; and our own protocol's client writes and
reads such topics (it sends uncompressed unless asked to compress, and decodes every codec)."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from broker.client import Admin, Consumer, Producer, TopicPartition
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, wait_for
from labkit.kafka_requests import rpc
from ringlog_proto.batch import (
    CODEC_NAMES,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    encode_batch,
    iter_batches,
    read_header,
    seal_batch,
)
from ringlog_proto.compression import compress
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from confluent_kafka import KafkaError  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic  # noqa: E402

CODECS = {name: number for number, name in CODEC_NAMES.items()} | {"uncompressed": 0}
T = 1_700_000_000_000
CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]
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


@pytest.fixture(scope="module")
def admin(cbroker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": cbroker.bootstrap})


def create(admin: AdminClient, name: str, partitions: int = 1, **configs: str) -> None:
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(15)


def rows(n: int, start: int = 0) -> list[Row]:
    """Records of every shape: null keys and values, headers (a null header value too), each its
    own timestamp; text that compresses."""
    return [
        (
            None if i % 9 == 8 else b"key-%d" % (i % 5),
            None if i % 11 == 10 else b"value %d: " % i + b"compressible text " * (1 + i % 7),
            (("trace", b"t%d" % i), ("empty", None)) if i % 3 == 0 else (),
            T + 1000 * i,
        )
        for i in range(start, start + n)
    ]


def produce(
    bootstrap: str, topic: str, codec: str, records: list[Row], partition: int = 0, **conf: Any
) -> list:
    """`records` from one librdkafka producer of `codec`, flushed: each delivery's error."""
    p = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "compression.codec": codec, "linger.ms": 20, **conf}
    )
    errors: list = []
    for key, value, headers, ts in records:
        p.produce(
            topic,
            value,
            key,
            partition=partition,
            headers=list(headers),
            timestamp=ts,
            on_delivery=lambda err, _m: errors.append(err),
        )
    assert p.flush(30) == 0
    return errors


def as_read(key: Any, value: Any, headers: Any, ts: int) -> Row:
    return key, value, tuple((k, v) for k, v in headers or ()), ts


def read_confluent(bootstrap: str, topic: str, count: int, partition: int = 0) -> list[tuple[int, Row]]:
    c = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "rc-check", "enable.auto.commit": False}
    )
    try:
        c.assign([confluent_kafka.TopicPartition(topic, partition, confluent_kafka.OFFSET_BEGINNING)])
        out: list[tuple[int, Row]] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.offset(), as_read(msg.key(), msg.value(), msg.headers(), msg.timestamp()[1])))
        return out
    finally:
        c.close()


def read_kafka_python(bootstrap: str, topic: str, count: int) -> list[tuple[int, Row]]:
    c = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = kafka.TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        out: list[tuple[int, Row]] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for msgs in c.poll(timeout_ms=200).values():
                out += [(m.offset, as_read(m.key, m.value, m.headers, m.timestamp)) for m in msgs]
        return out
    finally:
        c.close()


def read_aiokafka(bootstrap: str, topic: str, count: int) -> list[tuple[int, Row]]:
    async def run() -> list[tuple[int, Row]]:
        c = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            out: list[tuple[int, Row]] = []
            deadline = time.monotonic() + 30
            while len(out) < count and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=200)).values():
                    out += [(m.offset, as_read(m.key, m.value, m.headers, m.timestamp)) for m in msgs]
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


def owner_port(cbroker: BrokerProcess, topic: str, partition: int) -> int:
    with Admin(cbroker.bootstrap) as ours:
        topic_id = ours.describe_topic(topic).topic_id
    return cbroker.core_ports[shard_for(topic_id, partition, cbroker.cores)]


def fetch_body(topic: str, partition: int, offset: int) -> Any:
    schema = request_schema(1, 11)
    assert schema is not None
    module = sys.modules[schema.__module__]
    part = make(
        module.FetchPartition,
        partition=i32(partition),
        current_leader_epoch=i32(-1),
        fetch_offset=i64(offset),
        log_start_offset=i64(-1),
        partition_max_bytes=i32(1 << 20),
    )
    return make(
        schema,
        replica_id=i32(-1),
        max_wait=datetime.timedelta(0),
        min_bytes=i32(0),
        max_bytes=i32(1 << 24),
        isolation_level=0,
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(make(module.FetchTopic, topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def stored(cbroker: BrokerProcess, topic: str, partition: int = 0) -> list[tuple[int, int, int]]:
    """(base offset, codec, record count) of every batch of the partition, as a raw Kafka Fetch
    v11 from its leader's core answers them."""
    port = owner_port(cbroker, topic, partition)
    out: list[tuple[int, int, int]] = []
    offset = 0
    while True:
        resp = rpc(port, 1, 11, fetch_body(topic, partition, offset))
        (part,) = resp.responses[0].partitions
        assert part.error_code == ErrorCode.none, part.error_code
        data = part.records or b""
        found = [
            (h.base_offset, h.attributes & COMPRESSION_MASK, h.record_count) for _, h in iter_batches(data)
        ]
        out += found
        if not found or found[-1][0] + found[-1][2] >= part.high_watermark:
            return out
        offset = found[-1][0] + found[-1][2]


@pytest.mark.parametrize("topic_codec", ["zstd", "uncompressed", "gzip"])
def test_every_codec_sent_is_stored_in_the_topics_and_read_back(
    cbroker: BrokerProcess, admin: AdminClient, topic_codec: str
) -> None:
    topic = f"rc-{topic_codec}"
    create(admin, topic, 1, **{"compression.type": topic_codec})
    sent: list[Row] = []
    for i, codec in enumerate(("none", "gzip", "lz4", "snappy")):
        batch = rows(150, 150 * i)
        assert produce(cbroker.bootstrap, topic, codec, batch) == [None] * len(batch)
        sent += batch
    want = list(enumerate(sent))
    assert read_confluent(cbroker.bootstrap, topic, len(sent)) == want
    assert read_kafka_python(cbroker.bootstrap, topic, len(sent)) == want
    assert read_aiokafka(cbroker.bootstrap, topic, len(sent)) == want
    batches = stored(cbroker, topic)
    assert {codec for _, codec, _ in batches} == {CODECS[topic_codec]}, batches
    assert sum(n for _, _, n in batches) == len(sent)
    assert [base for base, _, _ in batches] == [0, *itertools.accumulate(n for _, _, n in batches[:-1])], (
        "one batch in, one batch out: offsets follow on"
    )


# ------------------------------------------------------------------------------ idempotence


def init_producer_id(port: int) -> tuple[int, int]:
    schema = request_schema(22, 4)
    assert schema is not None
    resp = rpc(
        port,
        22,
        4,
        make(
            schema,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(-1),
            producer_epoch=i16(-1),
        ),
    )
    assert resp.error_code == ErrorCode.none
    return int(resp.producer_id), int(resp.producer_epoch)


def raw_produce(port: int, topic: str, records: bytes) -> tuple[ErrorCode, int]:
    """(error, base offset) of one Produce v8 of `records` to partition 0, acks=all."""
    schema = request_schema(0, 8)
    assert schema is not None
    module = sys.modules[schema.__module__]
    body = make(
        schema,
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            make(
                module.TopicProduceData,
                name=topic,
                partition_data=(make(module.PartitionProduceData, index=i32(0), records=records),),
            ),
        ),
    )
    part = rpc(port, 0, 8, body).responses[0].partition_responses[0]
    return part.error_code, int(part.base_offset)


def idempotent(codec: int, pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    plain = encode_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    h = read_header(plain)
    return seal_batch(
        compress(plain[61:], codec),
        h.record_count,
        h.base_timestamp,
        h.max_timestamp,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        attributes=codec,
    )


def test_idempotent_sequences_hold_across_the_rewrite(cbroker: BrokerProcess, admin: AdminClient) -> None:
    """A gzip batch to a zstd topic, then its retry: the original offsets, nothing stored twice;
    the next sequence in lz4 goes in; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER."""
    create(admin, "rc-idem", 1, **{"compression.type": "zstd"})
    port = owner_port(cbroker, "rc-idem", 0)
    pid, epoch = init_producer_id(port)
    first = idempotent(COMPRESSION_GZIP, pid, epoch, 0, b"a", b"b", b"c")
    assert raw_produce(port, "rc-idem", first) == (ErrorCode.none, 0)
    assert raw_produce(port, "rc-idem", first) == (ErrorCode.none, 0), "a retry: its original offsets"
    assert raw_produce(port, "rc-idem", idempotent(COMPRESSION_LZ4, pid, epoch, 3, b"d", b"e")) == (
        ErrorCode.none,
        3,
    )
    gap = idempotent(COMPRESSION_GZIP, pid, epoch, 9, b"gap")
    assert raw_produce(port, "rc-idem", gap)[0] == ErrorCode.out_of_order_sequence_number
    assert stored(cbroker, "rc-idem") == [(0, CODECS["zstd"], 3), (3, CODECS["zstd"], 2)]
    values = [row[1] for _, row in read_kafka_python(cbroker.bootstrap, "rc-idem", 5)]
    assert values == [b"a", b"b", b"c", b"d", b"e"]


def test_librdkafkas_idempotent_producer_writes_each_record_once(
    cbroker: BrokerProcess, admin: AdminClient
) -> None:
    create(admin, "rc-idem-ck", 4, **{"compression.type": "zstd"})
    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": cbroker.bootstrap,
            "enable.idempotence": True,
            "compression.codec": "gzip",
            "linger.ms": 5,
            "batch.num.messages": 50,
        }
    )
    errors: list = []
    n = 800
    for i in range(n):
        p.produce(
            "rc-idem-ck", b"ck-%d " % i * 4, partition=i % 4, on_delivery=lambda e, _m: errors.append(e)
        )
    assert p.flush(30) == 0
    assert errors == [None] * n, [e for e in errors if e is not None][:3]
    got: Counter = Counter()
    for partition in range(4):
        got.update(row[1] for _, row in read_confluent(cbroker.bootstrap, "rc-idem-ck", n // 4, partition))
        assert {codec for _, codec, _ in stored(cbroker, "rc-idem-ck", partition)} == {CODECS["zstd"]}
    assert got == Counter(b"ck-%d " % i * 4 for i in range(n)), "every record once, none twice"


# ------------------------------------------------------------------------------ live, limits


def test_compression_type_altered_live_on_every_core(cbroker: BrokerProcess, admin: AdminClient) -> None:
    """IncrementalAlterConfigs of compression.type reaches the partitions of both cores (each
    reloads the registry within about a second): later batches are stored in the new codec, those
    before keep theirs; deleting the override stores batches as the producer sent them again."""
    partitions = 4
    create(admin, "rc-live", partitions)
    with Admin(cbroker.bootstrap) as ours:
        topic_id = ours.describe_topic("rc-live").topic_id
    assert {shard_for(topic_id, p, cbroker.cores) for p in range(partitions)} == set(range(cbroker.cores))
    sent: dict[int, list[Row]] = {p: [] for p in range(partitions)}

    def one_each() -> None:
        """A batch to each partition that librdkafka compresses (it sends a batch its codec does
        not shrink uncompressed)."""
        for p in range(partitions):
            n = len(sent[p])
            batch: list[Row] = [
                (b"k", b"live %d-%d " % (p, n + i) + b"compressible text " * 20, (), T + n + i)
                for i in range(3)
            ]
            assert produce(cbroker.bootstrap, "rc-live", "gzip", batch, partition=p) == [None] * 3
            sent[p] += batch

    def last_codecs() -> set[int]:
        return {stored(cbroker, "rc-live", p)[-1][1] for p in range(partitions)}

    def alter(op: Any, value: str | None) -> None:
        r = ConfigResource(
            "topic",
            "rc-live",
            incremental_configs=[ConfigEntry("compression.type", value, incremental_operation=op)],
        )
        admin.incremental_alter_configs([r])[r].result(15)

    one_each()
    assert last_codecs() == {COMPRESSION_GZIP}
    alter(AlterConfigOpType.SET, "lz4")

    def lz4_everywhere() -> bool:
        one_each()
        return last_codecs() == {COMPRESSION_LZ4}

    wait_for(lz4_everywhere, timeout=10, step=0.3)
    alter(AlterConfigOpType.DELETE, None)

    def as_sent_again() -> bool:
        one_each()
        return last_codecs() == {COMPRESSION_GZIP}

    wait_for(as_sent_again, timeout=10, step=0.3)
    for p in range(partitions):
        codecs = [codec for _, codec, _ in stored(cbroker, "rc-live", p)]
        assert codecs[0] == COMPRESSION_GZIP and COMPRESSION_LZ4 in codecs, codecs
        assert read_confluent(cbroker.bootstrap, "rc-live", len(sent[p]), p) == list(enumerate(sent[p]))


def test_max_message_bytes_applies_to_the_batch_as_stored(cbroker: BrokerProcess, admin: AdminClient) -> None:
    """A gzip batch of a few hundred bytes whose record is 100 kB, to an uncompressed topic of
    max.message.bytes 20000: MESSAGE_TOO_LARGE (Kafka's second check, on the rebuilt batch),
    nothing stored; a small one goes in."""
    create(admin, "rc-big", 1, **{"compression.type": "uncompressed", "max.message.bytes": "20000"})
    big: list[Row] = [(None, b"a" * 100_000, (), T)]
    (err,) = produce(cbroker.bootstrap, "rc-big", "gzip", big, retries=0)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert stored(cbroker, "rc-big") == []
    assert produce(cbroker.bootstrap, "rc-big", "gzip", rows(3)) == [None] * 3
    # stored uncompressed, 3 records from offset 0 (in as many batches as librdkafka made of them)
    batches = stored(cbroker, "rc-big")
    assert [codec for _, codec, _ in batches] == [0] * len(batches)
    assert [(base, n) for base, _, n in batches] == [
        (sum(m for _, _, m in batches[:i]), n) for i, (_, _, n) in enumerate(batches)
    ]
    assert sum(n for _, _, n in batches) == 3


# ------------------------------------------------------------------------------ our own protocol


def test_our_client_writes_and_reads_a_topic_with_a_codec(cbroker: BrokerProcess) -> None:
    """Our Producer sends uncompressed: a gzip topic stores its batches in gzip, which our
    Consumer decodes; altered through our Admin to uncompressed, a librdkafka gzip batch is
    stored plain and our Consumer reads both."""
    with Admin(cbroker.bootstrap) as ours:
        ours.create_topic("rc-ours", 1, configs={"compression.type": "gzip"})
        with Producer(cbroker.bootstrap, linger_ms=20) as producer:
            futures = [
                producer.send("rc-ours", value, key=key, headers=list(headers), partition=0, timestamp=ts)
                for key, value, headers, ts in rows(50)
            ]
            producer.flush()
            for f in futures:
                f.result(10)
        assert {codec for _, codec, _ in stored(cbroker, "rc-ours")} == {COMPRESSION_GZIP}
        ours.alter_configs("rc-ours", set={"compression.type": "uncompressed"})
        assert (
            ours.describe_configs("rc-ours", ["compression.type"])["compression.type"].value == "uncompressed"
        )

    compressible: list[Row] = [(b"k", b"compressible text " * 20, (), T)]

    def stored_plain() -> bool:
        assert produce(cbroker.bootstrap, "rc-ours", "gzip", compressible) == [None]
        return stored(cbroker, "rc-ours")[-1][1] == 0

    wait_for(stored_plain, timeout=10, step=0.3)
    total = stored(cbroker, "rc-ours")[-1][0] + 1
    with Consumer(cbroker.bootstrap, fetch_max_wait_ms=100) as consumer:
        consumer.assign([TopicPartition("rc-ours", 0)])
        consumer.seek_to_beginning(TopicPartition("rc-ours", 0))
        got: list[tuple[int, Row]] = []
        deadline = time.monotonic() + 30
        while len(got) < total and time.monotonic() < deadline:
            got += [
                (r.offset, as_read(r.key, r.value, r.headers, r.timestamp))
                for r in consumer.poll(timeout_ms=200)
            ]
    assert got[:50] == list(enumerate(rows(50)))
    assert [row for _, row in got[50:]] == compressible * (total - 50)
