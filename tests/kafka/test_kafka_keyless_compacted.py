"""A compacted topic refuses records without a key, as Kafka's LogValidator does: the whole batch,
nothing written, INVALID_RECORD with a record error per keyless record and an error message from
Produce v8 (KIP-467), INVALID_RECORD alone below v8; our protocol's INVALID_RECORD. Against a real
`broker serve` (two cores, both backends): confluent-kafka (plain and compressed batches, a
compact,delete topic too, a topic altered to compact live), kafka-python 3, raw Produce v7 and v8
requests read field by field, and our own client; a topic that does not compact takes them."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.client import Admin, InvalidRecordError, Producer
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, wait_for
from labkit.kafka_requests import rpc
from ringlog_proto.batch import Record, encode_batch
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
from confluent_kafka import KafkaError, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]
PRODUCE = 0
KAFKA_MESSAGE = "Compacted topic cannot accept message without key in topic partition {}-{}."


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def kbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data", tmp / "broker.log", cores=request.param["cores"], backend=request.param["backend"]
    ).start()
    admin = AdminClient({"bootstrap.servers": proc.bootstrap})
    topics = [
        NewTopic("compacted", 4, 1, config={"cleanup.policy": "compact"}),
        NewTopic("both", 4, 1, config={"cleanup.policy": "compact,delete"}),
        NewTopic("plain", 4, 1),
    ]
    for future in admin.create_topics(topics).values():
        future.result(15)
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def delivered(
    kbroker: BrokerProcess, topic: str, records: list[tuple[bytes | None, bytes]], **conf: Any
) -> list[Any]:
    """Each record's delivery error (None: stored), produced to partition 0 in one batch."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kbroker.bootstrap, "linger.ms": 500, "retries": 0, **conf}
    )
    # The topic known first, so no record waits for metadata while another leaves: one batch.
    producer.list_topics(topic, timeout=10)
    errors: list[Any] = []
    for key, value in records:
        producer.produce(topic, value, key=key, partition=0, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    return errors


def end_offset(kbroker: BrokerProcess, topic: str, partition: int = 0) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kbroker.bootstrap, "group.id": "ends"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
    finally:
        consumer.close()


def owner_port(kbroker: BrokerProcess, topic: str, partition: int) -> int:
    with Admin(kbroker.bootstrap) as ours:
        topic_id = ours.describe_topic(topic).topic_id
    return kbroker.core_ports[shard_for(topic_id, partition, kbroker.cores)]


def produce_raw(kbroker: BrokerProcess, version: int, topic: str, records: bytes) -> Any:
    """A Produce of `records` to partition 0 of `topic` at `version`, asked of its owning core: the
    partition's answer."""
    schema = request_schema(PRODUCE, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    body = make(
        schema,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            make(
                module.TopicProduceData,
                name=topic,
                partition_data=(make(module.PartitionProduceData, index=0, records=records),),
            ),
        ),
    )
    resp = rpc(owner_port(kbroker, topic, 0), PRODUCE, version, body)
    ((answer,),) = [t.partition_responses for t in resp.responses]
    return answer


# ------------------------------------------------------------------------------ confluent-kafka


@pytest.mark.parametrize("topic", ["compacted", "both"])
def test_librdkafka_gets_invalid_record_for_records_without_a_key(kbroker: BrokerProcess, topic: str) -> None:
    before = end_offset(kbroker, topic)
    errors = delivered(kbroker, topic, [(None, b"no key")])
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_RECORD]
    assert end_offset(kbroker, topic) == before, "nothing stored"
    assert delivered(kbroker, topic, [(b"k", b"keyed"), (b"k", None)]) == [None, None], "keys and tombstones"
    assert end_offset(kbroker, topic) == before + 2


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_one_keyless_record_refuses_its_whole_compressed_batch(kbroker: BrokerProcess, codec: str) -> None:
    before = end_offset(kbroker, "compacted")
    records = [(b"a", b"1"), (None, b"2"), (b"c", b"3")]
    errors = delivered(kbroker, "compacted", records, **{"compression.type": codec})
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_RECORD] * 3
    assert end_offset(kbroker, "compacted") == before


def test_a_topic_that_does_not_compact_takes_them(kbroker: BrokerProcess) -> None:
    assert delivered(kbroker, "plain", [(None, b"v"), (b"k", b"v")]) == [None, None]


def test_a_topic_altered_to_compact_refuses_them_on_every_core(kbroker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": kbroker.bootstrap})
    admin.create_topics([NewTopic("later", 8, 1)])["later"].result(15)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kbroker.bootstrap, "linger.ms": 0, "retries": 0}
    )

    def errors() -> list[Any]:
        out: dict[int, Any] = {}
        for p in range(8):
            producer.produce(
                "later", b"v", partition=p, on_delivery=lambda err, msg: out.__setitem__(msg.partition(), err)
            )
        assert producer.flush(30) == 0
        return [out[p] for p in range(8)]

    assert errors() == [None] * 8
    change = ConfigResource(
        "topic",
        "later",
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([change])[change].result(15)
    wait_for(
        lambda: all(e is not None and e.code() == KafkaError.INVALID_RECORD for e in errors()),
        timeout=10,
        step=0.5,
    )


# ------------------------------------------------------------------------------ the wire, field by field


def test_produce_v8_answers_record_errors_and_v7_the_bare_code(kbroker: BrokerProcess) -> None:
    batch = encode_batch([Record(b"1", key=b"a"), Record(b"2"), Record(b"3", key=b"c"), Record(b"4")])
    before = end_offset(kbroker, "compacted")
    v8 = produce_raw(kbroker, 8, "compacted", batch)
    assert (v8.error_code, v8.base_offset) == (ErrorCode.invalid_record, -1)
    assert [(e.batch_index, e.batch_index_error_message) for e in v8.record_errors] == [
        (1, KAFKA_MESSAGE.format("compacted", 0)),
        (3, KAFKA_MESSAGE.format("compacted", 0)),
    ]
    assert v8.error_message is not None and "2 record(s) without a key" in v8.error_message
    v7 = produce_raw(kbroker, 7, "compacted", batch)
    assert (v7.error_code, v7.base_offset) == (ErrorCode.invalid_record, -1)
    assert end_offset(kbroker, "compacted") == before
    keyed = produce_raw(kbroker, 8, "compacted", encode_batch([Record(b"1", key=b"a")]))
    assert (keyed.error_code, keyed.record_errors, keyed.error_message) == (ErrorCode.none, (), None)


# ------------------------------------------------------------------------------ other clients


def test_kafka_python_gets_invalid_record(kbroker: BrokerProcess) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=kbroker.bootstrap, retries=0)
    try:
        with pytest.raises(kafka.errors.InvalidRecordError):
            producer.send("compacted", b"no key", partition=0).get(timeout=15)
        assert producer.send("compacted", b"keyed", key=b"k", partition=0).get(timeout=15).offset >= 0
    finally:
        producer.close()


def test_our_client_gets_invalid_record(kbroker: BrokerProcess) -> None:
    with Producer(kbroker.bootstrap) as producer:
        with pytest.raises(InvalidRecordError) as info:
            producer.send("compacted", b"no key", partition=1).result(15)
        assert "without a key" in str(info.value)
        assert producer.send("compacted", b"keyed", key=b"k", partition=1).result(15).offset >= 0
        assert producer.send("plain", b"no key", partition=1).result(15).offset >= 0
