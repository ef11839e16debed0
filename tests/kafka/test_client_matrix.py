"""The Kafka client matrix: kcat, confluent-kafka (librdkafka), aiokafka, kafka-python 2.x and 3.x
against a real `broker serve`, each one writing and each one reading what every other wrote.

Every client, on each broker configuration of MATRIX (both backends; two cores):
- creates its topic with its own admin API (kcat has none: ours makes it);
- produces keys, headers (repeated names, empty and null values), null keys, null values, binary
  bytes and a 1 MiB record, one group of records per compression codec it has, explicit
  timestamps where it can set them (kcat cannot: its records are checked against the wall clock);
- reads every client's topic from earliest and by timestamp, and each field (offset, timestamp,
  key, value, headers) must be what the writer sent, byte for byte.
The batches as stored (read back with our own protocol) must carry the codec the writer was asked
for: the broker keeps a client's batch as it came, and a client that silently stopped compressing
would otherwise pass.

Cost: one broker per configuration for the whole module (tmp data dir, --max-batch-bytes raised for
1 MiB records, as Kafka's message.max.bytes would be), one topic per writer; a reader reads all
writers' topics in one session. Producers are idempotent (InitProducerId, acks=all), except kcat's
and our own; readers use assign() with nothing committed (groups: tests/kafka/test_kafka_groups.py).

Also here, on the same brokers: confluent-kafka's acks 0/1/all, its admin's errors, kafka-python's
admin and offsets, our own Consumer reading what kcat wrote, and librdkafka reaching each owning
core with no forward (two cores).
"""

from __future__ import annotations

import asyncio
import pickle
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from broker.client import Admin, Consumer, Producer, TopicPartition
from broker.kafka.adapter import SUPPORTED_VERSIONS
from labkit.brokerproc import BrokerProcess, Wire, own_snapshot
from ringlog_proto import messages as m
from ringlog_proto.batch import CODEC_NAMES, iter_batches
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
import kafka_python_driver  # noqa: E402  (tests/kafka: kafka-python 3 in process, 2 as a script)

KCAT = shutil.which("kcat")
DRIVER = Path(kafka_python_driver.__file__)
# kafka-python 2 lives apart from the venv's kafka-python 3 (scripts/setup.sh installs it there).
KAFKA_PYTHON_2 = Path(sys.prefix) / "compat" / "kafka-python-2"

FIND_COORDINATOR = 10  # Kafka api key
MiB = 1 << 20
BIG = 2 * MiB  # broker --max-batch-bytes and every client's request/fetch size: room for 1 MiB records
BASE_TS = 1_700_000_000_000
CODECS = ("gzip", "snappy", "lz4", "zstd")

MATRIX = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]

# A record to produce: (partition, key, value, headers, timestamp_ms or None); one read back:
# (partition, offset, timestamp_ms, key, value, headers). Headers: tuple of (str, bytes | None).
Rec = tuple
Groups = list[tuple[str, list[Rec]]]


# --- the clients ------------------------------------------------------------------------------------


class Client:
    """One Kafka client's way to create a topic, produce groups of records (one codec each) and read
    partitions from earliest and by timestamp. `caps` says what its producer can express."""

    name = ""
    timestamps = True  # can set a record's timestamp
    empty = True  # can send an empty key or value that is not null
    any_bytes = True  # values may hold any byte (kcat: not its delimiters)
    null_header = True  # can send a header whose value is null (kafka-python's send() refuses one)
    codec_libs: ClassVar[
        dict[str, str]
    ] = {}  # codec -> the PyPI package it needs (what to install if missing)

    def available(self) -> str | None:
        """Why this client cannot run here, or None."""
        return None

    def codecs(self) -> list[str]:
        raise NotImplementedError

    def decodes(self) -> list[str]:
        """The codecs its consumer reads."""
        return self.codecs()

    def stored_as(self, codec: str) -> str:
        """The codec the broker is expected to store a batch asked to be `codec` in."""
        return codec

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        raise NotImplementedError

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        raise NotImplementedError

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        """The partitions `keys` ((topic, partition)) from earliest, `counts[key]` records each; for
        each `lookups[key] = k`, the offset for the timestamp of record k as read and the records
        from there. Answers {"earliest": {(topic, p): rows}, "by_time": {(topic, p): (ts, offset
        found, offset found past the last timestamp (-1: none; None: not asked), rows from the
        offset found)}, "bounds": {(topic, p): (beginning, end)} (when the client can ask)}."""
        raise NotImplementedError


def librdkafka_stored_as(codec: str) -> str:
    """librdkafka compresses with lz4 only when the broker advertises FindCoordinator (its proxy for
    "Kafka 0.8.2 or later", rdkafka_feature.c); until the group coordinator lands it sends those
    batches uncompressed. Once FindCoordinator is advertised, lz4 must be stored as lz4."""
    if codec == "lz4" and FIND_COORDINATOR not in SUPPORTED_VERSIONS:
        return "none"
    return codec


class Confluent(Client):
    name = "confluent-kafka"
    stored_as = staticmethod(librdkafka_stored_as)

    def codecs(self) -> list[str]:
        return list(CODECS)  # librdkafka's wheel builds them all in

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(topic, num_partitions=partitions)], operation_timeout=10)
        futures[topic].result(10)

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        errors: list = []
        for codec, records in groups:
            producer = confluent_kafka.Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "compression.type": codec,
                    "linger.ms": 20,
                    "message.max.bytes": BIG,
                    "enable.idempotence": True,  # InitProducerId; acks=all
                }
            )
            for partition, key, value, headers, ts in records:
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    headers=list(headers),
                    partition=partition,
                    timestamp=ts or 0,
                    on_delivery=lambda err, msg: err and errors.append(err),
                )
            assert producer.flush(30) == 0
            assert errors == []

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        TP = confluent_kafka.TopicPartition
        # GROUPS-TODO(groups): group.id is only there because librdkafka requires one with assign().
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "assign-only",
                "enable.auto.commit": False,
                "fetch.message.max.bytes": BIG,
                "fetch.wait.max.ms": 50,
            }
        )
        try:
            consumer.assign([TP(t, p, confluent_kafka.OFFSET_BEGINNING) for t, p in keys])
            earliest = self._drain(consumer, dict(counts))
            bounds = {key: consumer.get_watermark_offsets(TP(*key), timeout=10) for key in counts}
            by_time = {}
            for (t, p), k in lookups.items():
                ts = earliest[(t, p)][k][2]
                last = max(r[2] for r in earliest[(t, p)])
                (found,) = consumer.offsets_for_times([TP(t, p, ts)], timeout=10)
                (beyond,) = consumer.offsets_for_times([TP(t, p, last + 1)], timeout=10)
                rows = []
                if found.offset >= 0:
                    consumer.assign([TP(t, p, found.offset)])
                    rows = self._drain(consumer, {(t, p): counts[(t, p)] - found.offset})[(t, p)]
                by_time[(t, p)] = (ts, found.offset, beyond.offset, rows)
            return {"earliest": earliest, "by_time": by_time, "bounds": bounds}
        finally:
            consumer.close()

    @staticmethod
    def _drain(consumer: Any, want: dict) -> dict:
        out: dict = {key: [] for key in want}
        deadline = time.monotonic() + 30
        while any(len(out[k]) < n for k, n in want.items()) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            ts_type, ts = msg.timestamp()
            assert ts_type == confluent_kafka.TIMESTAMP_CREATE_TIME
            out[(msg.topic(), msg.partition())].append(
                (msg.partition(), msg.offset(), ts, msg.key(), msg.value(), tuple(msg.headers() or ()))
            )
        return out


KAFKA_PYTHON_CODEC_LIBS = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


class KafkaPython3(Client):
    name = "kafka-python-3"
    null_header = False
    codec_libs = KAFKA_PYTHON_CODEC_LIBS

    def codecs(self) -> list[str]:
        return kafka_python_driver.codecs()

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        kafka_python_driver.create_topic(bootstrap, topic, partitions)

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        kafka_python_driver.produce(bootstrap, topic, groups)

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        return kafka_python_driver.read(bootstrap, keys, counts, lookups)


class KafkaPython2(Client):
    """The same driver as kafka-python 3, run as a script with kafka-python 2 first on its path."""

    name = "kafka-python-2"
    null_header = False
    codec_libs = KAFKA_PYTHON_CODEC_LIBS  # found in the venv's site-packages, after kafka-python 2

    def available(self) -> str | None:
        if not (KAFKA_PYTHON_2 / "kafka").is_dir():
            return f"kafka-python 2 is not installed at {KAFKA_PYTHON_2} (scripts/setup.sh installs it)"
        return None

    def call(self, name: str, **kwargs: Any) -> Any:
        proc = subprocess.run(
            [sys.executable, str(DRIVER)],
            input=pickle.dumps((name, kwargs)),
            capture_output=True,
            timeout=90,
            env={"PYTHONPATH": str(KAFKA_PYTHON_2), "PATH": "/usr/bin:/bin"},
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        status, result = pickle.loads(proc.stdout)
        assert status == "ok", f"{result}\n{proc.stderr.decode(errors='replace')}"
        return result

    def codecs(self) -> list[str]:
        return self.call("codecs")

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.call("create_topic", bootstrap=bootstrap, topic=topic, partitions=partitions)

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        self.call("produce", bootstrap=bootstrap, topic=topic, groups=groups)

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        return self.call("read", bootstrap=bootstrap, keys=keys, counts=counts, lookups=lookups)


class AioKafka(Client):
    name = "aiokafka"
    codec_libs = dict.fromkeys(("snappy", "lz4", "zstd"), "cramjam")

    def codecs(self) -> list[str]:
        from aiokafka import codec

        have = {
            "gzip": codec.has_gzip,
            "snappy": codec.has_snappy,
            "lz4": codec.has_lz4,
            "zstd": codec.has_zstd,
        }
        return [name for name, check in have.items() if check()]

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def run() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
            await admin.start()
            try:
                await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
            finally:
                await admin.close()

        asyncio.run(run())

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        async def run() -> None:
            for codec, records in groups:
                producer = aiokafka.AIOKafkaProducer(
                    bootstrap_servers=bootstrap,
                    acks="all",
                    enable_idempotence=True,
                    compression_type=None if codec == "none" else codec,
                    max_request_size=BIG,
                    linger_ms=50,
                    request_timeout_ms=10_000,
                )
                await producer.start()
                try:
                    futures = [
                        await producer.send(
                            topic, key=key, value=value, headers=list(headers), partition=p, timestamp_ms=ts
                        )
                        for p, key, value, headers, ts in records
                    ]
                    await producer.flush()
                    for f in futures:
                        await f  # raises the broker's error, if any
                finally:
                    await producer.stop()

        asyncio.run(run())

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        TP = aiokafka.TopicPartition

        async def drain(consumer: Any, want: dict) -> dict:
            out: dict = {key: [] for key in want}
            deadline = time.monotonic() + 30
            while any(len(out[k]) < n for k, n in want.items()) and time.monotonic() < deadline:
                for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                    out[(tp.topic, tp.partition)].extend(
                        (tp.partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in msgs
                    )
            return out

        async def run() -> dict:
            # GROUPS-TODO(groups): a group_id/subscribe()/commit case plugs in beside this one.
            consumer = aiokafka.AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=None,
                enable_auto_commit=False,
                max_partition_fetch_bytes=BIG,
                fetch_max_wait_ms=100,
                request_timeout_ms=15_000,
            )
            await consumer.start()
            try:
                tps = [TP(t, p) for t, p in keys]
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                earliest = await drain(consumer, dict(counts))
                first = await consumer.beginning_offsets(tps)
                end = await consumer.end_offsets(tps)
                bounds = {(tp.topic, tp.partition): (first[tp], end[tp]) for tp in tps}
                by_time = {}
                for (t, p), k in lookups.items():
                    tp = TP(t, p)
                    ts = earliest[(t, p)][k][2]
                    found = (await consumer.offsets_for_times({tp: ts}))[tp]
                    last = max(r[2] for r in earliest[(t, p)])
                    beyond = (await consumer.offsets_for_times({tp: last + 1}))[tp]
                    rows = []
                    if found is not None:
                        consumer.seek(tp, found.offset)
                        rows = (await drain(consumer, {(t, p): counts[(t, p)] - found.offset}))[(t, p)]
                    by_time[(t, p)] = (
                        ts,
                        -1 if found is None else found.offset,
                        -1 if beyond is None else beyond.offset,
                        rows,
                    )
                return {"earliest": earliest, "by_time": by_time, "bounds": bounds}
            finally:
                await consumer.stop()

        return asyncio.run(run())


class Ringlog(Client):
    """Our own client on the same port, in our own protocol: the batches are one format, so what it
    writes every Kafka client reads and it reads theirs, in every codec."""

    name = "ringlog"

    def codecs(self) -> list[str]:
        return list(CODECS)

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        with Admin(bootstrap) as admin:
            admin.create_topic(topic, partitions=partitions)

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        for codec, records in groups:
            with Producer(bootstrap, linger_ms=20, max_batch_bytes=BIG, compression=codec) as producer:
                futures = [
                    producer.send(topic, value, key=key, headers=headers, partition=p, timestamp=ts)
                    for p, key, value, headers, ts in records
                ]
                producer.flush()
                for f in futures:
                    f.result(10)

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        def drain(consumer: Consumer, want: dict) -> dict:
            out: dict = {key: [] for key in want}
            deadline = time.monotonic() + 30
            while any(len(out[k]) < n for k, n in want.items()) and time.monotonic() < deadline:
                for r in consumer.poll(timeout_ms=200):
                    out[(r.topic, r.partition)].append(
                        (
                            r.partition,
                            r.offset,
                            r.timestamp,
                            r.key,
                            r.value,
                            tuple(tuple(h) for h in r.headers),
                        )
                    )
            return out

        with Consumer(bootstrap, fetch_max_bytes=BIG, fetch_max_wait_ms=100) as consumer:
            tps = [TopicPartition(t, p) for t, p in keys]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            earliest = drain(consumer, dict(counts))
            by_time = {}
            for (t, p), k in lookups.items():
                ts = earliest[(t, p)][k][2]
                consumer.assign([TopicPartition(t, p)])
                (found,) = consumer.seek_to_timestamp(ts).values()
                rows = drain(consumer, {(t, p): counts[(t, p)] - found})[(t, p)]
                by_time[(t, p)] = (ts, found, None, rows)
            return {"earliest": earliest, "by_time": by_time}


KCAT_KEY, KCAT_DELIM = b"\x1f", b"\x1e"  # the bytes kcat splits on: kept out of what kcat produces
KCAT_FORMAT = r"%p %o %T %K %S|%k%s%h\x1e"
KCAT_ROW = re.compile(rb"(\d+) (\d+) (-?\d+) (-?\d+) (-?\d+)\|")


class Kcat(Client):
    """kcat -P (delimited stdin, -Z: empty key or value sends null, -H for every record of a run) and
    -C with a format of lengths, so keys and values are read by length, byte for byte."""

    name = "kcat"
    stored_as = staticmethod(librdkafka_stored_as)
    timestamps = False
    empty = False
    any_bytes = False

    def available(self) -> str | None:
        return None if KCAT else "kcat is not installed (scripts/setup.sh installs it)"

    def run(self, bootstrap: str, *args: str, stdin: bytes = b"") -> bytes:
        assert KCAT is not None
        proc = subprocess.run(
            [KCAT, "-b", bootstrap, "-X", f"message.max.bytes={BIG}", *args],
            input=stdin,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        return proc.stdout

    def codecs(self) -> list[str]:
        assert KCAT is not None
        out = subprocess.run([KCAT, "-V"], capture_output=True, text=True, check=True).stdout
        features = re.search(r"builtin\.features=(\S+)", out)
        have = set(features.group(1).rstrip(")").split(",")) if features else set()
        return [c for c in CODECS if c in have]

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        with Admin(bootstrap) as admin:  # kcat has no admin: our own protocol, same port
            admin.create_topic(topic, partitions=partitions)

    def produce(self, bootstrap: str, topic: str, groups: Groups) -> None:
        for codec, records in groups:
            runs: list[list[Rec]] = []  # -p and -H hold for a whole kcat run
            for rec in records:
                if runs and (runs[-1][0][0], runs[-1][0][3]) == (rec[0], rec[3]):
                    runs[-1].append(rec)
                else:
                    runs.append([rec])
            for run in runs:
                partition, headers = run[0][0], run[0][3]
                args = [
                    "-P",
                    "-t",
                    topic,
                    "-p",
                    str(partition),
                    "-z",
                    codec,
                    "-K",
                    "\x1f",
                    "-D",
                    "\x1e",
                    "-Z",
                ]
                for name, value in headers:
                    args += ["-H", name if value is None else f"{name}={value.decode()}"]
                lines = [(key or b"") + KCAT_KEY + (value or b"") for _, key, value, _, _ in run]
                self.run(bootstrap, *args, stdin=KCAT_DELIM.join(lines))

    def consume(self, bootstrap: str, topic: str, *args: str) -> list[Rec]:
        out = self.run(
            bootstrap, "-C", "-t", topic, *args, "-e", "-q", "-X", "fetch.wait.max.ms=20", "-f", KCAT_FORMAT
        )
        rows, pos = [], 0
        while pos < len(out):
            head = KCAT_ROW.match(out, pos)
            assert head, out[pos : pos + 200]
            p, offset, ts, klen, vlen = map(int, head.groups())
            pos = head.end()
            key = None if klen < 0 else out[pos : pos + klen]
            pos += max(klen, 0)
            value = None if vlen < 0 else out[pos : pos + vlen]
            pos += max(vlen, 0)
            end = out.index(KCAT_DELIM, pos)
            headers = tuple(
                (name, None if v == "NULL" else v.encode())  # kcat prints a null header value as NULL
                for name, _, v in (h.partition("=") for h in out[pos:end].decode().split(",") if h)
            )
            pos = end + 1
            rows.append((p, offset, ts, key, value, headers))
        return rows

    def read(self, bootstrap: str, keys: list, counts: dict, lookups: dict) -> dict:
        earliest: dict = {key: [] for key in counts}
        for topic in dict.fromkeys(t for t, _ in keys):  # each topic whole, in one run
            for row in self.consume(bootstrap, topic, "-o", "beginning"):
                if (topic, row[0]) in earliest:
                    earliest[(topic, row[0])].append(row)
        by_time = {}
        for (t, p), k in lookups.items():
            ts = earliest[(t, p)][k][2]
            rows = self.consume(bootstrap, t, "-p", str(p), "-o", f"s@{ts}")
            by_time[(t, p)] = (ts, rows[0][1] if rows else -1, None, rows)
        return {"earliest": earliest, "by_time": by_time}


CLIENTS: dict[str, Client] = {
    c.name: c for c in (Kcat(), Confluent(), AioKafka(), KafkaPython2(), KafkaPython3(), Ringlog())
}


def client(name: str) -> Client:
    c = CLIENTS[name]
    why = c.available()
    if why:
        pytest.skip(why)
    return c


# --- what each writer sends -------------------------------------------------------------------------

HEADERS = (("h1", b"x"), ("trace", b"abc"), ("trace", b"def"), ("empty", b""), ("nil", None))
BIG_VALUE = (bytes(range(0x20, 0x100)) * (MiB // 0xE0 + 1))[:MiB]  # 1 MiB, none of kcat's delimiters
# A writer's topic: partition 0 uncompressed records, 1 a small and a 1 MiB record, then one
# partition per codec (empty when the writer lacks it), so a reader lacking a codec skips just that.
PARTITION = {"none": 0, "big": 1} | {codec: 2 + i for i, codec in enumerate(CODECS)}
PARTITIONS = len(PARTITION)
LOOKUP_AT = 2  # by timestamp: the index of the record whose timestamp is asked (1 in partition 1)


def plan(writer: Client, codecs: list[str]) -> Groups:
    """Per codec ("none" first), a group of keyed, null-key, null-value, headerless and (where the
    client can) empty records, in the codec's partition; then a small and a 1 MiB record."""
    binary = bytes(range(256)) if writer.any_bytes else bytes(b for b in range(256) if b not in (0x1E, 0x1F))
    headers = HEADERS if writer.null_header else tuple(h for h in HEADERS if h[1] is not None)
    seq = dict.fromkeys(PARTITION.values(), 0)

    def rec(p: int, key: bytes | None, value: bytes | None, headers: tuple = ()) -> Rec:
        seq[p] += 1
        return (p, key, value, headers, BASE_TS + seq[p] * 1000 if writer.timestamps else None)

    groups: Groups = []
    for codec in ["none", *codecs]:
        p = PARTITION[codec]
        records = [
            rec(p, f"key-{codec}".encode(), f"value {codec} ".encode() * 30 + binary, headers),
            rec(p, None, f"null key {codec} ".encode() * 10, headers),
            rec(p, f"null value {codec}".encode(), None, headers),
            rec(p, binary[::-1], f"no headers {codec} ".encode() * 10),
        ]
        if writer.empty:
            records.append(rec(p, b"", b""))
        groups.append((codec, records))
    big = PARTITION["big"]
    groups.append(("none", [rec(big, b"p1", b"small"), rec(big, b"big", BIG_VALUE, (("size", b"1MiB"),))]))
    return groups


class Written:
    """What a writer sent to its topic on this broker: rows expected at each offset, and the codec
    each is expected to be stored in."""

    def __init__(self, writer: Client, topic: str, groups: Groups, t0: int, t1: int) -> None:
        self.writer = writer
        self.topic = topic
        self.t0, self.t1 = t0, t1  # wall clock around the produce, for records with no set timestamp
        self.rows: dict[tuple[str, int], list[Rec]] = {(topic, p): [] for p in range(PARTITIONS)}
        self.codecs: dict[tuple[str, int], list[str]] = {(topic, p): [] for p in range(PARTITIONS)}
        for codec, records in groups:
            for rec in records:
                self.rows[(topic, rec[0])].append(rec)
                self.codecs[(topic, rec[0])].append(writer.stored_as(codec))

    def readable(self, reader: Client) -> list[tuple[str, int]]:
        """The partitions holding records that `reader` can decode."""
        can = {"none", *reader.decodes()}
        return [key for key, codecs in self.codecs.items() if codecs and set(codecs) <= can]


class Produced:
    """Each writer's topic on one broker, produced on first use (by its produce test or by the first
    reader that needs it), so a reader run alone still finds every writer's records."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.done: dict[str, Written] = {}
        self.batches: dict[tuple[str, int], list[tuple[str, int]]] = {}

    def stored(self, key: tuple[str, int]) -> list[tuple[str, int]]:
        if key not in self.batches:
            self.batches[key] = stored_batches(self.broker, *key)
        return self.batches[key]

    def __call__(self, name: str) -> Written:
        if name not in self.done:
            writer = client(name)
            topic = f"by-{name}"
            writer.create_topic(self.broker.bootstrap, topic, PARTITIONS)
            groups = plan(writer, writer.codecs())
            t0 = int(time.time() * 1000)
            writer.produce(self.broker.bootstrap, topic, groups)
            self.done[name] = Written(writer, topic, groups, t0, int(time.time() * 1000) + 1)
        return self.done[name]


@pytest.fixture(scope="module", params=MATRIX)
def mbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker per configuration for the whole module: 1 MiB records need --max-batch-bytes
    above 1 MiB (the record's framing is on top), as Kafka's message.max.bytes would."""
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data",
        tmp / "broker.log",
        cores=request.param["cores"],
        backend=request.param["backend"],
        extra=("--max-batch-bytes", str(BIG)),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


@pytest.fixture(scope="module")
def produced(mbroker: BrokerProcess) -> Produced:
    return Produced(mbroker)


# --- checks ----------------------------------------------------------------------------------------


def stored_batches(broker: BrokerProcess, topic: str, partition: int) -> list[tuple[str, int]]:
    """(codec, base offset) of each stored record's batch, offset by offset, read with our own
    protocol."""
    wire = Wire(broker.port)
    try:
        meta = wire.rpc(m.MetadataRequest((topic,)))
        assert isinstance(meta, m.MetadataResponse)
        (tmeta,) = meta.topics
        out: list[tuple[str, int]] = []
        while True:
            resp = wire.rpc(m.FetchRequest(tmeta.topic_id, partition, len(out), 4 * MiB, 0))
            assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
            batches = [h for _, h in iter_batches(resp.records) if h.next_offset > len(out)]
            if not batches:
                return out
            for h in batches:
                assert h.base_offset == len(out), (h, len(out))
                out += [(CODEC_NAMES[h.compression], h.base_offset)] * h.record_count
    finally:
        wire.close()


def check_rows(written: Written, key: tuple[str, int], rows: list[Rec], start: int = 0) -> None:
    """`rows` are what the writer sent from offset `start` on, field by field."""
    want = written.rows[key][start:]
    assert len(rows) == len(want), f"{key}: read {len(rows)} records, {len(want)} sent from offset {start}"
    for offset, (row, sent) in enumerate(zip(rows, want, strict=True), start):
        p, got_offset, ts, k, v, headers = row
        where = f"{written.writer.name} -> {key} offset {offset}"
        assert (p, got_offset) == (key[1], offset), where
        assert k == sent[1], f"{where}: key"
        assert v == sent[2], f"{where}: value"
        assert headers == sent[3], f"{where}: headers"
        if sent[4] is None:
            assert written.t0 - 1000 <= ts <= written.t1, f"{where}: timestamp {ts} (wall clock)"
        else:
            assert ts == sent[4], f"{where}: timestamp"


def check_read(written: Written, reader: Client, result: dict, lookups: dict, produced: Produced) -> None:
    """What `reader` read of the writer's topic: every partition it can decode from earliest, and
    the ones in `lookups` by timestamp."""
    keys = written.readable(reader)
    assert keys, f"{reader.name} can read nothing {written.writer.name} wrote"
    for key in keys:
        earliest = result["earliest"][key]
        check_rows(written, key, earliest)
        if "bounds" in result:
            assert tuple(result["bounds"][key]) == (0, len(written.rows[key])), key
        if key not in lookups:
            continue
        ts, found, beyond, rows = result["by_time"][key]
        assert ts == earliest[lookups[key]][2]
        # The first offset whose timestamp is at or after the one asked (kcat's may repeat); in a
        # batch the broker cannot decompress (snappy, lz4, zstd), that batch's first offset.
        exact = next(i for i, r in enumerate(earliest) if r[2] >= ts)
        codec, base = produced.stored(key)[exact]
        assert found == (exact if codec in ("none", "gzip") else base), (key, ts, found)
        check_rows(written, key, rows, found)
        asked_beyond = reader.name not in ("kcat", "ringlog")  # -o s@ts and seek_to_timestamp cannot say
        assert beyond == (-1 if asked_beyond else None), f"{key}: past the last timestamp: {beyond}"


# --- the matrix -------------------------------------------------------------------------------------


@pytest.mark.parametrize("writer", list(CLIENTS))
def test_produce(mbroker: BrokerProcess, produced: Produced, writer: str) -> None:
    """The writer's topic was made with its admin API and holds its records, each in a batch of the
    codec it was sent with."""
    written = produced(writer)
    for key, codecs in written.codecs.items():
        assert [codec for codec, _ in produced.stored(key)] == codecs, key


@pytest.mark.parametrize("reader", list(CLIENTS))
def test_consume(produced: Produced, reader: str) -> None:
    """The reader reads every writer's topic, itself included, from earliest and by timestamp: every
    partition whose codec it has (test_client_has_every_codec names the ones it lacks)."""
    r = client(reader)
    writers = [produced(name) for name, c in CLIENTS.items() if c.available() is None]
    keys = [key for w in writers for key in w.readable(r)]
    counts = {key: len(w.rows[key]) for w in writers for key in w.readable(r)}
    # By timestamp: the uncompressed and the 1 MiB partitions of every writer, and the compressed
    # ones of the reader's own topic (each codec a client writes is thus looked up by that client).
    lookups = {
        key: 1 if key[1] == PARTITION["big"] else LOOKUP_AT
        for key in keys
        if key[1] in (PARTITION["none"], PARTITION["big"]) or key[0] == f"by-{reader}"
    }
    result = r.read(produced.broker.bootstrap, keys, counts, lookups)
    for w in writers:
        check_read(w, r, result, lookups, produced)


@pytest.mark.parametrize("name", list(CLIENTS))
def test_client_has_every_codec(name: str) -> None:
    """Skipped, naming what to install, while a client lacks a codec's library on this machine."""
    c = client(name)
    missing = [codec for codec in CODECS if codec not in c.codecs()]
    if missing:
        libs = ", ".join(f"{codec} (needs {c.codec_libs.get(codec, '?')})" for codec in missing)
        pytest.skip(f"{name} cannot compress with {libs}: not installed")


def test_kafka_python_2_is_2() -> None:
    """The subprocess really runs kafka-python 2 (and the in-process one is 3)."""
    assert client("kafka-python-2").call("version").startswith("2.")
    assert kafka_python_driver.version().startswith("3.")


# --- the rest, on the same brokers --------------------------------------------------------------------


def consume_all(broker: BrokerProcess, topic: str, partitions: int, count: int) -> list:
    """`count` messages read with confluent-kafka's Consumer: assign() from the start, nothing
    committed (group.id only because librdkafka requires one)."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "assign-only", "enable.auto.commit": False}
    )
    try:
        TP = confluent_kafka.TopicPartition
        consumer.assign([TP(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)])
        out: list = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                out.append(msg)
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_acks(mbroker: BrokerProcess, acks: str) -> None:
    """acks 0 (no response), 1 (page cache) and all (fsynced), over four partitions."""
    topic = f"acks-{acks}"
    with Admin(mbroker.bootstrap) as admin:
        admin.create_topic(topic, partitions=4)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": mbroker.bootstrap, "acks": acks, "linger.ms": 5}
    )
    errors: list = []
    sent = []
    for i in range(200):
        key = None if i % 10 == 0 else f"k{i}".encode()
        value = None if i % 17 == 0 else f"v{i}".encode()
        sent.append((i % 4, key, value))
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=i % 4,
            on_delivery=lambda err, msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0
    assert errors == []
    got = consume_all(mbroker, topic, 4, 200)
    for p in range(4):  # each partition in the order sent
        assert [(m.key(), m.value()) for m in got if m.partition() == p] == [
            (k, v) for q, k, v in sent if q == p
        ]


def test_confluent_admin_create_and_delete_topics(mbroker: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    futures = admin.create_topics(
        [
            NewTopic("made", num_partitions=3, replication_factor=1, config={"retention.ms": "-1"}),
            NewTopic("copies", num_partitions=1, replication_factor=3),
        ],
        operation_timeout=10,
    )
    futures["made"].result(10)
    with pytest.raises(confluent_kafka.KafkaException, match="REPLICATION_FACTOR"):
        futures["copies"].result(10)
    again = admin.create_topics([NewTopic("made", num_partitions=1)])["made"]
    with pytest.raises(confluent_kafka.KafkaException, match="TOPIC_ALREADY_EXISTS"):
        again.result(10)
    md = admin.list_topics(timeout=10)
    assert len(md.topics["made"].partitions) == 3
    producer = confluent_kafka.Producer({"bootstrap.servers": mbroker.bootstrap})
    for p in range(3):
        producer.produce("made", value=b"x", partition=p)
    assert producer.flush(30) == 0
    admin.delete_topics(["made"], operation_timeout=10)["made"].result(10)
    gone = admin.delete_topics(["made"])["made"]
    with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_TOPIC"):
        gone.result(10)
    assert "made" not in {t for t, md in admin.list_topics(timeout=10).topics.items() if not md.error}


def test_kafka_python_admin_create_delete_and_offsets(mbroker: BrokerProcess) -> None:
    admin = kafka.KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        admin.create_topics([kafka.admin.NewTopic("kpa", num_partitions=2, replication_factor=1)])
        consumer = kafka.KafkaConsumer(bootstrap_servers=mbroker.bootstrap, enable_auto_commit=False)
        try:
            tps = [kafka.TopicPartition("kpa", p) for p in range(2)]
            assert consumer.end_offsets(tps) == dict.fromkeys(tps, 0)
            assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        finally:
            consumer.close()
        admin.delete_topics(["kpa"])
        assert "kpa" not in admin.list_topics()
    finally:
        admin.close()


def test_two_cores_librdkafka_goes_to_each_owner_with_no_forward(mbroker: BrokerProcess) -> None:
    """Forwards per request with librdkafka and two cores: none. Each core gets the Produce and
    Fetch requests of the partitions it owns, at its own port (counted over this test only)."""
    if mbroker.cores != 2:
        pytest.skip("two cores only")
    with Admin(mbroker.bootstrap) as admin:
        admin.create_topic("spread", partitions=8)
        tid = admin.describe_topic("spread").topic_id
    assert {shard_for(tid, p, 2) for p in range(8)} == {0, 1}
    before = [own_snapshot(mbroker.core_ports[c]) for c in (0, 1)]
    producer = confluent_kafka.Producer({"bootstrap.servers": mbroker.bootstrap, "linger.ms": 5})
    for i in range(400):
        producer.produce("spread", value=f"v{i}".encode(), partition=i % 8)
    assert producer.flush(30) == 0
    assert len(consume_all(mbroker, "spread", 8, 400)) == 400
    after = [own_snapshot(mbroker.core_ports[c]) for c in (0, 1)]
    for old, new in zip(before, after, strict=True):
        assert new["forwarded"] - old["forwarded"] == 0, new
        assert new["forwarded_in"] - old["forwarded_in"] == 0, new
        for api in ("kafka_0", "kafka_1"):  # Produce, Fetch
            assert new["requests"].get(api, 0) > old["requests"].get(api, 0), (api, new)


def test_a_batch_over_max_batch_bytes_is_message_too_large(mbroker: BrokerProcess) -> None:
    """Above --max-batch-bytes (Kafka's message.max.bytes) the producer gets MESSAGE_TOO_LARGE,
    and nothing is stored."""
    with Admin(mbroker.bootstrap) as admin:
        admin.create_topic("too-large", partitions=1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": mbroker.bootstrap, "message.max.bytes": 2 * BIG, "retries": 0}
    )
    errors: list = []
    producer.produce("too-large", value=b"x" * (BIG + 1), on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(30) == 0
    assert [e.code() for e in errors] == [confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE], errors
    assert stored_batches(mbroker, "too-large", 0) == []
