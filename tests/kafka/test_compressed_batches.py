"""Compressed batches through Kafka's Produce: librdkafka's real gzip, snappy, lz4 and
zstd batches are stored and consumed back; hand-made poison under a valid crc (garbage, a cut
stream, records that do not frame or miscount, a decompression bomb) is refused as Kafka refuses
it (CORRUPT_MESSAGE; MESSAGE_TOO_LARGE for the bomb), nothing is stored, and the broker keeps
serving. Before, every one of them was stored, and librdkafka consumers then stopped
("Decompression failed") or hung. Both backends, one core."""

from __future__ import annotations

import datetime
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import frame, read_response
from labkit.poison_batches import compressed_poison

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

KAFKA_CODES = {
    "corrupt": ErrorCode.corrupt_message,
    "framing": ErrorCode.corrupt_message,
    "too_large": ErrorCode.message_too_large,
}


@pytest.fixture(scope="module", params=["uvloop", "io_uring"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp(f"zbatches-{request.param}")
    proc = BrokerProcess(tmp / "data", tmp / "broker.log", backend=request.param).start()
    wire = Wire(proc.port)
    try:
        for codec in ("gzip", "snappy", "lz4", "zstd", "poison"):
            wire.create_topic(codec, 1)
    finally:
        wire.close()
    yield proc
    assert proc.stop() == 0, proc.log()


def produce(port: int, topic: str, records: bytes) -> ErrorCode:
    schema = request_schema(0, 7)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    body = make(
        schema,
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            make(
                module.TopicProduceData,
                name=topic,
                partition_data=(make(module.PartitionProduceData, index=i32(0), records=records),),
            ),
        ),
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame(0, 7, 1, body))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = sock.recv(1 << 16)
            assert chunk, "the broker closed the connection"
            data += chunk
    resp: Any = read_response(0, 7, data)[1]
    return resp.responses[0].partition_responses[0].error_code


def consume(bootstrap: str, topic: str, count: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is None:
                out.append(msg.value())
                continue
            assert err.code() == confluent_kafka.KafkaError._PARTITION_EOF, err
            if len(out) >= count:
                break
        return out
    finally:
        c.close()


def end_offset(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_compressed_batches_are_stored_and_read_back(server: BrokerProcess, codec: str) -> None:
    values = [(b"%d " % i) + b"compressible text " * 20 for i in range(500)]
    p = Producer({"bootstrap.servers": server.bootstrap, "compression.codec": codec, "linger.ms": 20})
    failed: list[Any] = []
    for v in values:
        p.produce(codec, v, partition=0, on_delivery=lambda err, _m: failed.append(err) if err else None)
    assert p.flush(15) == 0
    assert not failed, failed
    assert consume(server.bootstrap, codec, len(values)) == values


def test_compressed_poison_is_refused_and_nothing_is_stored(server: BrokerProcess) -> None:
    for name, (batch, kind) in sorted(compressed_poison().items()):
        assert produce(server.port, "poison", batch) == KAFKA_CODES[kind], name
    assert end_offset(server.bootstrap, "poison") == 0
    p = Producer({"bootstrap.servers": server.bootstrap, "compression.codec": "zstd"})
    p.produce("poison", b"after", partition=0)
    assert p.flush(15) == 0
    assert consume(server.bootstrap, "poison", 1) == [b"after"]  # a consumer reads on, no stall
