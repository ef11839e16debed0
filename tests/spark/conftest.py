"""Fixtures of the Spark data source tests: one broker and one SparkSession for the whole session.

Starting a JVM costs ~10 s, so the session is shared; the broker is one `broker serve --cores 2`
(uvloop) of our own rather than the parametrized `broker` fixture, which would run every Spark
test four times. Each test makes its own topics (`topic` fixture) so tests stay independent.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterator

import pytest

from labkit.brokerproc import BrokerProcess

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e .[spark])")

from pyspark.sql import SparkSession

from broker.client import Admin
from broker.spark import register

_names = itertools.count()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    d = tmp_path_factory.mktemp("spark-broker")
    proc = BrokerProcess(d / "data", d / "broker.log", cores=2, backend="uvloop").start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # Python workers must run this interpreter (the venv with ringlog), not whatever python3 is on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    fast_jvm = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss4m"
    session = (
        SparkSession.builder.master("local[2,2]")  # 2 threads, a task may fail once and be retried
        .appName("ringlog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.extraJavaOptions", fast_jvm)
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def topic(spark_broker: BrokerProcess) -> Callable[[int], str]:
    """`topic(partitions)` creates a fresh topic and returns its name."""

    def make(partitions: int = 2) -> str:
        name = f"spark-{next(_names)}"
        with Admin(spark_broker.bootstrap) as admin:
            admin.create_topic(name, partitions=partitions)
        return name

    return make
