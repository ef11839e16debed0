"""Spark data source benchmark: read and write throughput through Spark, beside the plain client's.

Run: `.venv/bin/python bench/spark.py [--records N] [--value-bytes B] [--cores C]` (make bench-spark)

What it measures, in one run against one `broker serve --cores C` subprocess (uvloop):
1. Plain client write: `Producer` (acks=1) fills topics of 1, 2 and 4 partitions with N records of
   B random bytes each (keyless, round-robin over partitions by explicit partition).
2. Plain client read: one `Consumer` reads each topic back from the start (one process, one thread).
3. Spark read: `spark.read.format("ringlog")` of each topic with one Spark task per partition,
   forced by an aggregate over the value column (`sum(length(value))`): every record crosses
   from the broker into the Python worker, into Arrow, into the JVM. With local[*] there are as
   many task threads as CPUs, so 1 -> 2 partitions should scale and 2 -> 4 cannot on 2 CPUs.
4. Spark write: a DataFrame of N rows (value = B bytes) written to a 4-partition topic from
   `spark.range(N, numPartitions=4)`.
Each Spark figure is the best of two runs after one warm-up (Python worker start-up and JIT are
not throughput). Records/s and MB/s of value bytes. The broker shares the machine's CPUs with
Spark and the client: figures are for that whole system, not for the broker alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from broker.client import Admin, Consumer, Producer
from labkit.brokerproc import BrokerProcess


def fill(bootstrap: str, topic: str, partitions: int, n: int, size: int) -> float:
    payloads = [os.urandom(size) for _ in range(256)]
    t0 = time.perf_counter()
    with Producer(bootstrap, linger_ms=5) as p:
        for i in range(n):
            p.send(topic, payloads[i & 255], partition=i % partitions)
        p.flush()
    return time.perf_counter() - t0


def consume(bootstrap: str, topic: str, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    with Consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=10_000) as c:
        c.subscribe(topic)
        while got < n:
            got += len(c.poll(timeout_ms=5000))
    return time.perf_counter() - t0


def line(what: str, n: int, size: int, secs: float) -> None:
    print(f"{what:<38} {n / secs:>12,.0f} rec/s {n * size / secs / 1e6:>9.1f} MB/s  ({secs:.2f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--cores", type=int, default=2, help="broker cores")
    args = ap.parse_args()
    n, size = args.records, args.value_bytes

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from broker.spark import register

    tmp = Path(tempfile.mkdtemp(prefix="ringlog-bench-spark-"))
    broker = BrokerProcess(tmp / "data", tmp / "broker.log", cores=args.cores).start()
    spark = None
    try:
        bs = broker.bootstrap
        print(f"{n:,} records of {size} B, broker --cores {args.cores}, {os.cpu_count()} CPUs")
        print("-- plain client")
        with Admin(bs) as admin:
            for parts in (1, 2, 4):
                admin.create_topic(f"bench-{parts}", partitions=parts)
            admin.create_topic("bench-write", partitions=4)
        for parts in (1, 2, 4):
            line(f"client write, {parts} partition(s)", n, size, fill(bs, f"bench-{parts}", parts, n, size))
        for parts in (1, 2, 4):
            line(f"client read, {parts} partition(s)", n, size, consume(bs, f"bench-{parts}", n))

        spark = (
            SparkSession.builder.master("local[*]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.local.dir", str(tmp / "spark"))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        print(f"-- Spark {spark.version}, local[*] = {spark.sparkContext.defaultParallelism} task threads")

        def spark_read(topic: str) -> float:
            df = spark.read.format("ringlog").option("bootstrap", bs).option("topic", topic).load()
            t0 = time.perf_counter()
            total = df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
            secs = time.perf_counter() - t0
            assert total.n == n and total.b == n * size, total
            return secs

        spark_read("bench-1")  # warm-up: Python workers, JIT
        for parts in (1, 2, 4):
            line(
                f"spark read, {parts} partition(s)",
                n,
                size,
                min(spark_read(f"bench-{parts}") for _ in range(2)),
            )

        rows = spark.range(n, numPartitions=4).select(
            F.expr(f"unhex(lpad(hex(id), {2 * size}, '0'))").alias("value")
        )
        rows = rows.cache()
        rows.count()

        def spark_write() -> float:
            t0 = time.perf_counter()
            rows.write.format("ringlog").option("bootstrap", bs).option("topic", "bench-write").mode(
                "append"
            ).save()
            return time.perf_counter() - t0

        spark_write()  # warm-up
        line("spark write, 4 partitions, 4 tasks", n, size, min(spark_write() for _ in range(2)))
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
