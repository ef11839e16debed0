"""Read a ringlog topic back into Parquet with Spark, one task per partition (or per split).

    spark-submit scripts/spark_export.py --bootstrap HOST:9092 --topic events --output out/events \
        [--max-records-per-split 500000] [--value-as-string]
    (or: .venv/bin/python scripts/spark_export.py ...; `make spark-demo` runs it)

Rules this job keeps:
- It reads the offsets fixed when the job starts (earliest to latest, or --starting-offsets /
  --ending-offsets in Spark Kafka's JSON), so a topic still being written yields a consistent cut.
- The Parquet files hold the source's columns (topic, partition, offset, timestamp, key, value,
  headers); --value-as-string stores key and value as UTF-8 strings instead of binary.
- spark-submit or plain python (local[*]); executors need ringlog's client (docs/SPARK.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--topic", required=True)
    ap.add_argument("--output", required=True, help="Parquet directory (overwritten)")
    ap.add_argument("--starting-offsets", default="earliest")
    ap.add_argument("--ending-offsets", default="latest")
    ap.add_argument("--max-records-per-split", type=int, help="split big partitions into several tasks")
    ap.add_argument("--value-as-string", action="store_true")
    args = ap.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # local runs: workers use this Python
    from pyspark.sql import SparkSession  # noqa: PLC0415 (after PYSPARK_PYTHON is set)
    from pyspark.sql import functions as F  # noqa: PLC0415

    from broker.spark import register  # noqa: PLC0415

    spark = SparkSession.builder.appName(f"ringlog-export-{args.topic}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    reader = (
        spark.read.format("ringlog")
        .option("bootstrap", args.bootstrap)
        .option("topic", args.topic)
        .option("startingOffsets", args.starting_offsets)
        .option("endingOffsets", args.ending_offsets)
    )
    if args.max_records_per_split:
        reader = reader.option("maxRecordsPerSplit", str(args.max_records_per_split))
    df = reader.load()
    if args.value_as_string:
        df = df.withColumn("key", F.col("key").cast("string")).withColumn(
            "value", F.col("value").cast("string")
        )
    t0 = time.perf_counter()
    df.write.mode("overwrite").parquet(args.output)
    secs = time.perf_counter() - t0
    stats = spark.read.parquet(args.output).agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("b"))
    n, b = stats.collect()[0]
    b = b or 0
    print(
        f"exported {n:,} records ({b / 1e6:,.1f} MB of values) from {args.topic!r} to {args.output} in "
        f"{secs:.1f} s: {n / secs:,.0f} records/s, {b / secs / 1e6:,.1f} MB/s "
        f"({df.rdd.getNumPartitions()} read tasks)"
    )
    spark.stop()


if __name__ == "__main__":
    main()
