"""Ingest a file dataset (CSV, JSON lines or Parquet) into a ringlog topic with Spark, in parallel.

    spark-submit scripts/spark_ingest.py --bootstrap HOST:9092 --topic events --partitions 8 \
        --input data/events.csv [--key-column user_id]
    (or: .venv/bin/python scripts/spark_ingest.py ...; `make spark-demo` runs it on generated data)

Rules this job keeps:
- Each row becomes one record: value = the row as a JSON object, key = --key-column (so a key's
  rows stay in order in one partition), timestamp = now. The topic is created with --partitions
  if missing; the DataFrame is repartitioned to that many tasks, one producer each.
- --generate-mb N writes a synthetic dataset of about N MB to --input first (CSV, JSON lines or
  Parquet by its extension), so the job runs where no dataset ships.
- It runs under spark-submit (master and resources from its flags) or plain python (local[*]);
  executors need ringlog's client installed (docs/SPARK.md, "On a cluster").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

from broker.client import Admin, TopicExistsError
from broker.spark import register


def _format(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    ext = path.rstrip("/").rsplit(".", 1)[-1].lower()
    return {"csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}.get(ext, "parquet")


def generate(spark: object, path: str, fmt: str, megabytes: int) -> None:
    from pyspark.sql import functions as F  # noqa: PLC0415

    rows = megabytes * 1_000_000 // 110  # about 110 bytes a row as CSV
    df = spark.range(rows, numPartitions=max(2, megabytes // 64)).select(  # type: ignore[attr-defined]
        F.col("id").alias("event_id"),
        (F.col("id") % 10_007).alias("user_id"),
        F.element_at(
            F.array(*map(F.lit, ["view", "click", "buy", "share"])), (F.col("id") % 4 + 1).cast("int")
        ).alias("kind"),
        (F.col("id") * 7919 % 100_000 / 100).alias("amount"),
        F.sha2(F.col("id").cast("string"), 256).substr(1, 40).alias("session"),
        F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("at"),
    )
    w = df.write.mode("overwrite")
    if fmt == "csv":
        w.option("header", "true").csv(path)
    elif fmt == "json":
        w.json(path)
    else:
        w.parquet(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--partitions", type=int, default=4, help="topic partitions = parallel write tasks")
    ap.add_argument("--input", required=True, help="file or directory: CSV (header), JSON lines, Parquet")
    ap.add_argument("--format", choices=["csv", "json", "parquet"], help="default: from the extension")
    ap.add_argument("--key-column", help="column whose value is the record key")
    ap.add_argument("--generate-mb", type=int, default=0, help="first write a synthetic dataset of ~N MB")
    args = ap.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # local runs: workers use this Python
    from pyspark.sql import SparkSession  # noqa: PLC0415 (after PYSPARK_PYTHON is set)
    from pyspark.sql import functions as F  # noqa: PLC0415

    # No master set (plain python): local[*]. Under spark-submit its --master wins.
    spark = SparkSession.builder.appName(f"ringlog-ingest-{args.topic}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    fmt = _format(args.input, args.format)
    if args.generate_mb:
        t0 = time.perf_counter()
        generate(spark, args.input, fmt, args.generate_mb)
        print(
            f"generated ~{args.generate_mb} MB of {fmt} in {args.input} in {time.perf_counter() - t0:.1f} s"
        )

    with Admin(args.bootstrap) as admin:
        with contextlib.suppress(TopicExistsError):
            admin.create_topic(args.topic, partitions=args.partitions)
        partitions = len(admin.describe_topic(args.topic).partitions)

    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "false")
    df = reader.load(args.input)
    cols = [F.to_json(F.struct(*df.columns)).alias("value")]
    if args.key_column:
        cols.append(F.col(args.key_column).cast("string").alias("key"))
    out = df.select(*cols).repartition(partitions)
    out = out.cache()
    rows = out.count()  # read and convert the input before the clock starts: the write is measured
    value_bytes = out.agg(F.sum(F.length("value"))).collect()[0][0] or 0
    t0 = time.perf_counter()
    out.write.format("ringlog").option("bootstrap", args.bootstrap).option("topic", args.topic).mode(
        "append"
    ).save()
    secs = time.perf_counter() - t0
    print(
        f"ingested {rows:,} rows ({value_bytes / 1e6:,.1f} MB of values) into {args.topic!r} "
        f"in {secs:.1f} s: "
        f"{rows / secs:,.0f} records/s, {value_bytes / secs / 1e6:,.1f} MB/s"
    )
    spark.stop()


if __name__ == "__main__":
    main()
