"""The `ringlog` PySpark data source against a real broker and a real local SparkSession."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from broker.client import AsyncClient, Consumer, Producer
from broker.spark import group_lag
from labkit.brokerproc import BrokerProcess
from ringlog_proto.batch import iter_batches
from ringlog_proto.messages import FetchRequest

UTC = dt.UTC


def produce(bootstrap: str, topic: str, n: int, start: int = 0, partition: int | None = None) -> None:
    with Producer(bootstrap) as p:
        for i in range(start, start + n):
            p.send(topic, b"v%d" % i, key=b"k%d" % i, partition=partition)


def reader(spark: SparkSession, broker: BrokerProcess, topic: str, **options: str):
    r = spark.read.format("ringlog").option("bootstrap", broker.bootstrap).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def consume_all(bootstrap: str, topic: str, expected: int) -> list:
    out: list = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as c:
        c.subscribe(topic)
        while len(out) < expected:
            batch = c.poll(timeout_ms=2000)
            if not batch:
                break
            out.extend(batch)
    return out


def test_importing_the_data_source_never_imports_the_server() -> None:
    code = (
        "import sys, broker.spark\n"
        "bad = [m for m in sys.modules if m.startswith('broker.') and m.split('.')[1] not in "
        "('client', 'spark')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_round_trip_with_keys_headers_and_timestamps(
    spark, spark_broker, topic: Callable[[int], str]
) -> None:
    t = topic(3)
    base = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    rows = [
        (
            f"v{i}".encode(),
            None if i % 5 == 0 else f"k{i}".encode(),
            [{"key": "i", "value": str(i).encode()}, {"key": "none", "value": None}] if i % 2 else [],
            base + dt.timedelta(milliseconds=i),
        )
        for i in range(600)
    ]
    schema = (
        "value BINARY, key BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, timestamp TIMESTAMP"
    )
    df = spark.createDataFrame(rows, schema).repartition(2)
    df.write.format("ringlog").option("bootstrap", spark_broker.bootstrap).option("topic", t).mode(
        "append"
    ).save()

    back = reader(spark, spark_broker, t)
    assert back.columns == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
    got = back.collect()
    assert len(got) == 600
    assert {r.topic for r in got} == {t}
    by_value = {bytes(r.value): r for r in got}
    for value, key, headers, ts in rows:
        r = by_value[value]
        assert (bytes(r.key) if r.key is not None else None) == key
        assert [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers] == [
            (h["key"], h["value"]) for h in headers
        ]
        assert r.timestamp.replace(tzinfo=UTC) == ts
    # Offsets are dense per partition, and the key decided the partition (same key, same place).
    for p in range(3):
        offs = sorted(r.offset for r in got if r.partition == p)
        assert offs == list(range(len(offs)))
    # The plain client sees the same records.
    assert Counter(r.value for r in consume_all(spark_broker.bootstrap, t, 600)) == Counter(by_value.keys())


def test_string_columns_and_explicit_partition_are_written(spark, spark_broker, topic) -> None:
    t = topic(2)
    df = spark.range(100).select(
        F.col("id").cast("string").alias("value"),
        (F.col("id") % 2).cast("int").alias("partition"),
    )
    df.write.format("ringlog").option("bootstrap", spark_broker.bootstrap).option("topic", t).mode(
        "append"
    ).save()
    got = reader(spark, spark_broker, t).collect()
    assert sorted(int(bytes(r.value)) for r in got) == list(range(100))
    assert all(int(bytes(r.value)) % 2 == r.partition for r in got)


def test_offset_ranges_and_split_partitions(spark, spark_broker, topic) -> None:
    t = topic(2)
    produce(spark_broker.bootstrap, t, 1000, partition=0)
    produce(spark_broker.bootstrap, t, 300, start=1000, partition=1)
    df = reader(
        spark,
        spark_broker,
        t,
        startingOffsets=json.dumps({t: {"0": 100, "1": -2}}),
        endingOffsets=json.dumps({t: {"0": 950}}),
        maxRecordsPerSplit="200",
    )
    # p0: [100, 950) in 200-offset splits = 5 tasks; p1: [0, 300) = 2 tasks.
    assert df.rdd.getNumPartitions() == 7
    got = df.select("partition", "offset").collect()
    assert sorted(r.offset for r in got if r.partition == 0) == list(range(100, 950))
    assert sorted(r.offset for r in got if r.partition == 1) == list(range(300))
    # latest as the start: nothing; earliest..latest: everything.
    assert reader(spark, spark_broker, t, startingOffsets="latest").count() == 0
    assert reader(spark, spark_broker, t).count() == 1300


def test_a_task_failing_on_its_first_attempt_is_retried_without_duplicates(
    spark, spark_broker, topic
) -> None:
    t = topic(3)
    df = spark.range(0, 4000, numPartitions=2).select(
        F.col("id").cast("string").alias("value"),
        (F.col("id") % 7).cast("string").alias("key"),
    )
    # Each task's first attempt appends 1500 records (acknowledged), then fails; the retry must
    # append only the rest.
    df.write.format("ringlog").option("bootstrap", spark_broker.bootstrap).option("topic", t).option(
        "_failFirstAttemptAfter", "1500"
    ).mode("append").save()
    values = [int(bytes(r.value)) for r in reader(spark, spark_broker, t).select("value").collect()]
    assert len(values) == 4000
    assert sorted(values) == list(range(4000))
    # Both attempts of both tasks wrote: epoch 0 (first attempt) 1500 records, epoch 1 (retry) the rest.
    per_identity = batch_identities(spark_broker.bootstrap, t, 3)
    assert len({pid for pid, _ in per_identity}) == 2
    assert sorted(per_identity.values()) == [500, 500, 1500, 1500]
    assert {epoch for _, epoch in per_identity} == {0, 1}


def batch_identities(bootstrap: str, topic: str, partitions: int) -> Counter:
    """Records per (producer id, epoch), from the batch headers in the log."""

    async def go() -> Counter:
        out: Counter = Counter()
        async with AsyncClient(bootstrap) as client:
            for p in range(partitions):
                pos = 0
                while True:
                    resp = await client.partition_request(
                        topic, p, lambda tid, p=p, pos=pos: FetchRequest(tid, p, pos)
                    )
                    if not resp.records:
                        break
                    for _, h in iter_batches(resp.records):
                        out[(h.producer_id, h.producer_epoch)] += h.record_count
                        pos = h.base_offset + h.record_count
        return out

    return asyncio.run(go())


def test_streaming_available_now_reads_exactly_the_new_records(
    spark, spark_broker, topic, tmp_path: Path
) -> None:
    t, out_topic = topic(2), topic(2)
    produce(spark_broker.bootstrap, t, 500)
    checkpoint, sink_checkpoint = tmp_path / "ckpt", tmp_path / "ckpt-sink"
    output = tmp_path / "out"

    def run_once() -> None:
        stream = (
            spark.readStream.format("ringlog")
            .option("bootstrap", spark_broker.bootstrap)
            .option("topic", t)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "150")
            .option("groupId", "spark-test")
            .load()
        )
        q = (
            stream.writeStream.format("parquet")
            .option("path", str(output))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None
        batches = [p["numInputRows"] for p in q.recentProgress]
        assert max(batches) <= 150  # the read limit held
        # and the sink: the same stream written back to ringlog
        q2 = (
            stream.select("key", "value")
            .writeStream.format("ringlog")
            .option("bootstrap", spark_broker.bootstrap)
            .option("topic", out_topic)
            .option("checkpointLocation", str(sink_checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        q2.awaitTermination(120)
        assert q2.exception() is None

    run_once()
    first = spark.read.parquet(str(output))
    assert first.count() == 500
    assert group_lag(spark_broker.bootstrap, t, "spark-test") == {0: 0, 1: 0}

    produce(spark_broker.bootstrap, t, 300, start=500)
    assert group_lag(spark_broker.bootstrap, t, "spark-test")[0] > 0
    run_once()
    values = sorted(
        int(bytes(r.value)[1:]) for r in spark.read.parquet(str(output)).select("value").collect()
    )
    assert values == list(range(800))  # the second run read exactly the 300 new records
    sunk = sorted(int(bytes(r.value)[1:]) for r in reader(spark, spark_broker, out_topic).collect())
    assert sunk == list(range(800))
    assert group_lag(spark_broker.bootstrap, t, "spark-test") == {0: 0, 1: 0}


def test_a_missing_topic_fails_with_a_clear_message(spark, spark_broker) -> None:
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        reader(spark, spark_broker, "no-such-topic").collect()


def test_an_unreachable_broker_fails_with_a_clear_message(spark) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Exception, match=r"cannot reach the broker at 127\.0\.0\.1"):
        spark.read.format("ringlog").option("bootstrap", f"127.0.0.1:{port}").option(
            "topic", "t"
        ).load().collect()


def test_unsupported_modes_and_columns_fail_with_a_clear_message(spark, spark_broker, topic) -> None:
    t = topic(1)
    df = spark.range(3).select(F.col("id").cast("string").alias("value"))

    def w():
        return df.write.format("ringlog").option("bootstrap", spark_broker.bootstrap).option("topic", t)

    with pytest.raises(Exception, match="'overwrite' is not supported"):
        w().mode("overwrite").save()
    with pytest.raises(Exception, match="ErrorIfExists"):
        w().save()  # Spark's own message: only Append (and Overwrite) exist for Python sources
    bad = spark.range(3).select(F.col("id").alias("nope"))
    with pytest.raises(Exception, match="needs a 'value' column"):
        bad.write.format("ringlog").option("bootstrap", spark_broker.bootstrap).option("topic", t).mode(
            "append"
        ).save()
