"""ringlog as a PySpark data source (format "ringlog"): batch and streaming reads and writes.

    from broker.spark import register
    register(spark)
    df = spark.read.format("ringlog").option("bootstrap", "host:9092").option("topic", "t").load()

Rules this package keeps:
- It imports only `broker.client` and `ringlog_proto` of ringlog (never the server), plus pyspark
  and pyarrow (the `spark` extra): executors need the client and nothing else.
- Nothing here holds a connection between calls; see `_io.py`.
- The user-facing contract (schema, options, delivery guarantees) is docs/SPARK.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.spark._io import Broker, RinglogSparkError, group_lag
from broker.spark.source import FORMAT, SCHEMA, RinglogDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT", "SCHEMA", "Broker", "RinglogDataSource", "RinglogSparkError", "group_lag", "register"]


def register(spark: SparkSession) -> None:
    """Make `format("ringlog")` known to `spark` (Python data sources are registered per session)."""
    spark.dataSource.register(RinglogDataSource)
