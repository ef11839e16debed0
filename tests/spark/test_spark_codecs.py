"""The `ringlog` Spark source reads batches in every codec Kafka has: a topic whose partition i
librdkafka wrote in gzip, snappy, lz4 and zstd, and one stored in zstd by its compression.type,
read by a real local SparkSession, every record as sent."""

from __future__ import annotations

import datetime as dt

import pytest

from broker.client import Admin
from labkit.brokerproc import BrokerProcess

confluent_kafka = pytest.importorskip("confluent_kafka")

CODECS = ("gzip", "snappy", "lz4", "zstd")
T = 1_700_000_000_000


def produce(bootstrap: str, topic: str, partition: int, codec: str, values: list[bytes]) -> None:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})
    for i, value in enumerate(values):
        p.produce(topic, value, b"k%d" % i, partition=partition, headers=[("h", b"%d" % i)], timestamp=T + i)
    assert p.flush(30) == 0


def test_every_codec_is_read(spark, spark_broker: BrokerProcess) -> None:
    sent: dict[tuple[str, int], list[bytes]] = {}
    with Admin(spark_broker.bootstrap) as admin:
        admin.create_topic("spark-codecs", partitions=len(CODECS))
        admin.create_topic("spark-zstd-topic", partitions=1, configs={"compression.type": "zstd"})
    for i, codec in enumerate(CODECS):
        sent[("spark-codecs", i)] = [b"%s value %d " % (codec.encode(), n) * 8 for n in range(200)]
        produce(spark_broker.bootstrap, "spark-codecs", i, codec, sent[("spark-codecs", i)])
    sent[("spark-zstd-topic", 0)] = [b"rewritten %d " % n * 8 for n in range(200)]
    produce(spark_broker.bootstrap, "spark-zstd-topic", 0, "gzip", sent[("spark-zstd-topic", 0)])
    got: dict[tuple[str, int], list[tuple]] = {key: [] for key in sent}
    for topic in ("spark-codecs", "spark-zstd-topic"):
        df = (
            spark.read.format("ringlog")
            .option("bootstrap", spark_broker.bootstrap)
            .option("topic", topic)
            .load()
        )
        for r in df.collect():
            row = (r.offset, bytes(r.key), bytes(r.value), [(h.key, bytes(h.value)) for h in r.headers])
            got[(r.topic, r.partition)].append((*row, r.timestamp.replace(tzinfo=dt.UTC)))
    for key, values in sent.items():
        assert sorted(got[key]) == [
            (n, b"k%d" % n, v, [("h", b"%d" % n)], dt.datetime.fromtimestamp((T + n) / 1000, dt.UTC))
            for n, v in enumerate(values)
        ], key
