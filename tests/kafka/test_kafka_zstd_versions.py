"""zstd and the request versions that predate it (KIP-110), as Kafka answers them, against a real
`broker serve` (two cores, both backends):
- Fetch below v10 of a topic whose compression.type is zstd: UNSUPPORTED_COMPRESSION_TYPE for its
  partitions, the request's other partitions served (KafkaApis.handleFetchRequest's rule: the
  topic's setting decides, so zstd batches of a topic that keeps the producer's codec are served
  to any version); v10 and v11 read the topic. kafka-python told the broker is Kafka 2.0 (Fetch
  v8) raises UnsupportedCompressionTypeError on such a topic and reads it as 2.1 (v10).
- Produce below v7 whose partition's batch is zstd: UNSUPPORTED_COMPRESSION_TYPE, nothing stored,
  the request's other partitions stored (ProduceRequest.validateRecords); v7 stores it.
Raw requests (kio's schemas) to the partition's owning core."""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.client import Admin
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess
from labkit.kafka_requests import rpc
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    COMPRESSION_MASK,
    COMPRESSION_ZSTD,
    encode_batch,
    iter_batches,
)
from ringlog_proto.routing import shard_for

kafka = pytest.importorskip("kafka")

FETCH, PRODUCE = 1, 0
CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def zbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data", tmp / "broker.log", cores=request.param["cores"], backend=request.param["backend"]
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def owners(broker: BrokerProcess, topics: list[str]) -> dict[tuple[str, int], int]:
    """(topic, partition) -> the port of the core that owns it."""
    out = {}
    with Admin(broker.bootstrap) as admin:
        for topic in topics:
            info = admin.describe_topic(topic)
            for p in range(len(info.partitions)):
                out[(topic, p)] = broker.core_ports[shard_for(info.topic_id, p, broker.cores)]
    return out


def fetch(port: int, version: int, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
    """A Fetch at `version` of each partition from offset 0: each partition's answer."""
    schema = request_schema(FETCH, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    topics: dict[str, list[Any]] = {}
    for topic, index in partitions:
        topics.setdefault(topic, []).append(
            make(
                module.FetchPartition,
                partition=index,
                current_leader_epoch=-1,
                fetch_offset=0,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
        )
    body = make(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=1,
        max_bytes=1 << 24,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=tuple(make(module.FetchTopic, topic=t, partitions=tuple(ps)) for t, ps in topics.items()),
        forgotten_topics_data=(),
        rack_id="",
    )
    resp = rpc(port, FETCH, version, body)
    return {(t.topic, int(p.partition_index)): p for t in resp.responses for p in t.partitions}


def produce(port: int, version: int, batches: dict[tuple[str, int], bytes]) -> dict[tuple[str, int], Any]:
    """A Produce at `version` (acks 1) of one batch per partition: each partition's answer."""
    schema = request_schema(PRODUCE, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    topics: dict[str, list[Any]] = {}
    for (topic, index), records in batches.items():
        topics.setdefault(topic, []).append(make(module.PartitionProduceData, index=index, records=records))
    body = make(
        schema,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=tuple(
            make(module.TopicProduceData, name=t, partition_data=tuple(ps)) for t, ps in topics.items()
        ),
    )
    resp = rpc(port, PRODUCE, version, body)
    return {(t.name, int(p.index)): p for t in resp.responses for p in t.partition_responses}


def codecs_of(records: bytes | None) -> list[int]:
    return [h.attributes & COMPRESSION_MASK for _, h in iter_batches(records or b"")]


def test_a_fetch_below_v10_of_a_zstd_topic_is_unsupported_compression_type(zbroker: BrokerProcess) -> None:
    """The zstd topic's partition is refused at v4-v9 and read at v10-v11; a partition of the
    producer-codec topic holding zstd batches is read at every version, as Kafka serves it, in
    the same Fetch when the same core owns it (a partition of eight: almost always)."""
    with Admin(zbroker.bootstrap) as admin:
        admin.create_topic("zv-zstd", 1, configs={"compression.type": "zstd"})
        admin.create_topic("zv-as-sent", 8)
    ports = owners(zbroker, ["zv-zstd", "zv-as-sent"])
    port = ports[("zv-zstd", 0)]
    beside = [key for key, owner in ports.items() if key[0] == "zv-as-sent" and owner == port]
    other = beside[0] if beside else ("zv-as-sent", 0)
    for key in (("zv-zstd", 0), other):  # a zstd batch each (the topic's codec; the producer's)
        answer = produce(ports[key], 8, {key: encode_batch([b"x" * 100] * 3, compression=COMPRESSION_ZSTD)})
        assert answer[key].error_code == ErrorCode.none
    for version in range(4, 12):
        got = fetch(port, version, [("zv-zstd", 0), other] if beside else [("zv-zstd", 0)])
        zstd = got[("zv-zstd", 0)]
        if version < 10:
            assert zstd.error_code == ErrorCode.unsupported_compression_type, version
            assert not zstd.records and zstd.high_watermark == -1
        else:
            assert zstd.error_code == ErrorCode.none, version
            assert codecs_of(zstd.records) == [COMPRESSION_ZSTD]
        if not beside:
            got = fetch(ports[other], version, [other])
        as_sent = got[other]
        assert as_sent.error_code == ErrorCode.none, version
        assert codecs_of(as_sent.records) == [COMPRESSION_ZSTD]


def test_kafka_python_as_a_2_0_client_is_refused_and_as_2_1_reads(zbroker: BrokerProcess) -> None:
    with Admin(zbroker.bootstrap) as admin:
        admin.create_topic("zv-kp", 1, configs={"compression.type": "zstd"})
    (port,) = owners(zbroker, ["zv-kp"]).values()
    assert produce(port, 8, {("zv-kp", 0): encode_batch([b"a", b"b"])})[("zv-kp", 0)].error_code == 0

    def consumer(api_version: tuple[int, int]) -> Any:
        c = kafka.KafkaConsumer(
            bootstrap_servers=zbroker.bootstrap,
            api_version=api_version,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        c.assign([kafka.TopicPartition("zv-kp", 0)])
        return c

    old = consumer((2, 0))  # Fetch v8
    try:
        with pytest.raises(kafka.errors.UnsupportedCompressionTypeError):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                assert not old.poll(timeout_ms=200), "records read through a Fetch that predates zstd"
    finally:
        old.close()
    new = consumer((2, 1))  # Fetch v10
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.value for msgs in new.poll(timeout_ms=200).values() for r in msgs]
        assert got == [b"a", b"b"]
    finally:
        new.close()


def test_a_produce_below_v7_carrying_zstd_is_unsupported_compression_type(zbroker: BrokerProcess) -> None:
    """Each partition is judged by its own batch: a zstd one refused at v3-v6, with nothing
    stored, a gzip one beside it stored; v7 stores zstd."""
    with Admin(zbroker.bootstrap) as admin:
        admin.create_topic("zv-produce", 8)
    ports = owners(zbroker, ["zv-produce"])
    # two partitions of one core for each version: one for zstd, one for gzip
    by_core: dict[int, list[int]] = {}
    for (_, p), port in ports.items():
        by_core.setdefault(port, []).append(p)
    port, mine = max(by_core.items(), key=lambda item: len(item[1]))
    assert len(mine) >= 2
    zstd_p, gzip_p = mine[:2]
    stored = {zstd_p: 0, gzip_p: 0}
    for version in range(3, 9):
        answer = produce(
            port,
            version,
            {
                ("zv-produce", zstd_p): encode_batch([b"z%d" % version] * 2, compression=COMPRESSION_ZSTD),
                ("zv-produce", gzip_p): encode_batch([b"g%d" % version] * 2, compression=COMPRESSION_GZIP),
            },
        )
        refused = answer[("zv-produce", zstd_p)]
        if version < 7:
            assert refused.error_code == ErrorCode.unsupported_compression_type, version
            assert refused.base_offset == -1
        else:
            assert refused.error_code == ErrorCode.none, version
            assert refused.base_offset == stored[zstd_p]
            stored[zstd_p] += 2
        ok = answer[("zv-produce", gzip_p)]
        assert (ok.error_code, ok.base_offset) == (ErrorCode.none, stored[gzip_p]), version
        stored[gzip_p] += 2
    got = fetch(port, 11, [("zv-produce", zstd_p), ("zv-produce", gzip_p)])
    assert codecs_of(got[("zv-produce", zstd_p)].records) == [COMPRESSION_ZSTD] * 2  # v7 and v8's
    assert got[("zv-produce", zstd_p)].high_watermark == 4
    assert got[("zv-produce", gzip_p)].high_watermark == 12
