"""The hand-read Produce (broker/kafka/fast_decode.py) gives what kio's decode gives, field for
field, for every version it reads, on random requests kio wrote; every cut of one is refused as
kio refuses it; the entry bound holds; a large Produce through the adapter is read by hand and
stored from the request's own bytes."""

from __future__ import annotations

import datetime
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.static.primitive import i16, i32

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append
from broker.kafka import fast_encode
from broker.kafka.adapter import KafkaAdapter
from broker.kafka.codec import KafkaDecodeError, KafkaRequest, decode_request, make, request_schema
from broker.kafka.fast_decode import HAND_DECODED_FROM, decode_produce
from broker.storage.fileio import SyncFileIO, Write, run_ops
from labkit.kafka_requests import frame, request_of
from ringlog_proto.batch import Record, encode_batch

VERSIONS = range(fast_encode.PRODUCE_VERSIONS[0], fast_encode.PRODUCE_VERSIONS[1] + 1)
i16s = st.integers(-(2**15), 2**15 - 1)
i32s = st.integers(-(2**31), 2**31 - 1)
texts = st.text(max_size=12)
partitions = st.lists(st.tuples(i32s, st.none() | st.binary(max_size=64)), max_size=3)
topics = st.lists(st.tuples(texts, partitions), max_size=3)


def produce_frame(
    version: int,
    topic_data: list[tuple[str, list[tuple[int, bytes | None]]]],
    transactional_id: str | None = None,
    acks: int = 1,
    timeout_ms: int = 1000,
    client_id: str | None = "t",
) -> bytes:
    """A Produce request as kio writes it."""
    schema = request_schema(0, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["x"])
    body = make(
        schema,
        transactional_id=transactional_id,
        acks=i16(acks),
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=tuple(
            make(
                module.TopicProduceData,
                name=name,
                partition_data=tuple(
                    make(module.PartitionProduceData, index=i32(i), records=r) for i, r in parts
                ),
            )
            for name, parts in topic_data
        ),
    )
    return frame(0, version, 7, body, client_id=client_id)


def fields(body: Any) -> tuple[Any, ...]:
    """Every field of a decoded Produce, kio's or ours, as plain values."""
    timeout = body.timeout
    if isinstance(timeout, datetime.timedelta):
        timeout = round(timeout.total_seconds() * 1000)
    return (
        body.transactional_id,
        int(body.acks),
        int(timeout),
        [
            (
                t.name,
                [(int(p.index), None if p.records is None else bytes(p.records)) for p in t.partition_data],
            )
            for t in body.topic_data
        ],
    )


def both(raw: bytes) -> tuple[tuple[Any, str | None], tuple[Any, str | None]]:
    request = request_of(raw)
    schema = request_schema(0, request.api_version)
    assert schema is not None
    return decode_request(request, schema), decode_produce(request)


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    topic_data=topics,
    transactional_id=st.none() | texts,
    acks=i16s,
    timeout_ms=i32s,
    client_id=st.none() | texts,
)
def test_every_field_is_what_kio_reads(
    version: int,
    topic_data: list[tuple[str, list[tuple[int, bytes | None]]]],
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    client_id: str | None,
) -> None:
    raw = produce_frame(version, topic_data, transactional_id, acks, timeout_ms, client_id)
    (kio_body, kio_client), (ours, our_client) = both(raw)
    assert fields(ours) == fields(kio_body)
    assert our_client == kio_client == client_id


@pytest.mark.parametrize("version", VERSIONS)
def test_records_are_views_of_the_request_not_copies(version: int) -> None:
    batch = encode_batch([Record(b"v" * 100)])
    request = request_of(produce_frame(version, [("t", [(0, batch)])]))
    body, _ = decode_produce(request)
    records = body.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and records.readonly and bytes(records) == batch
    assert records.obj is memoryview(request.data).obj  # the request's own bytes


def test_every_cut_is_refused_as_kio_refuses_it() -> None:
    raw = produce_frame(8, [("a", [(0, b"x" * 20), (1, None)]), ("bc", [(2, b"")])], "txn")
    whole = request_of(raw)
    for end in range(len(whole.data)):
        cut = KafkaRequest(0, 8, 7, whole.data[:end])
        with pytest.raises(KafkaDecodeError):
            decode_produce(cut)
        schema = request_schema(0, 8)
        assert schema is not None
        with pytest.raises(KafkaDecodeError):  # kio refuses it too: nothing is read past the end
            decode_request(cut, schema)


def test_bytes_after_the_body_are_not_read() -> None:
    raw = produce_frame(7, [("a", [(0, b"r")])])
    request = request_of(raw)
    longer = KafkaRequest(0, 7, 7, bytes(request.data) + b"\0\0\0")
    assert fields(decode_produce(longer)[0]) == fields(decode_produce(request)[0])


def test_the_entry_bound_counts_topics_and_partitions() -> None:
    request = request_of(produce_frame(8, [("a", [(0, b"r"), (1, b"r")]), ("b", [(0, b"r")])]))
    decode_produce(request, max_entries=5)  # 2 topics + 3 partitions
    with pytest.raises(KafkaDecodeError, match="more than 4 array entries"):
        decode_produce(request, max_entries=4)


def test_null_where_kafka_allows_none_is_refused() -> None:
    head = struct.pack(">hhih", 0, 8, 7, 1) + b"t" + struct.pack(">hhi", -1, 1, 1000)
    with pytest.raises(KafkaDecodeError, match="topic_data is null"):
        decode_produce(KafkaRequest(0, 8, 7, head + struct.pack(">i", -1)))
    with pytest.raises(KafkaDecodeError, match="name is null"):
        decode_produce(KafkaRequest(0, 8, 7, head + struct.pack(">ih", 1, -1)))
    with pytest.raises(KafkaDecodeError, match="partition_data is null"):
        decode_produce(KafkaRequest(0, 8, 7, head + struct.pack(">ih", 1, 1) + b"a" + struct.pack(">i", -1)))
    with pytest.raises(KafkaDecodeError, match="not UTF-8"):
        decode_produce(
            KafkaRequest(0, 8, 7, head + struct.pack(">ih", 1, 1) + b"\xff" + struct.pack(">i", 0))
        )


def test_a_large_produce_is_read_by_hand_and_stored_from_the_request(tmp_path: Path) -> None:
    """Through the adapter: a Produce of HAND_DECODED_FROM bytes or more becomes an append whose
    write names the request's own bytes (no copy), and the batch is stored whole."""
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=1)
    adapter = KafkaAdapter(Core(config), config)
    adapter.core.create_topic("big", 1)
    batch = encode_batch([Record(b"v" * 1024) for _ in range(HAND_DECODED_FROM // 1024 + 1)])
    request = request_of(produce_frame(8, [("big", [(0, batch)])]))
    assert len(request.data) >= HAND_DECODED_FROM
    outcome = adapter.handle(request)
    assert isinstance(outcome, Append)
    (write,) = outcome.pending.ops
    assert isinstance(write, Write)
    source = memoryview(request.data).obj
    assert any(isinstance(b, memoryview) and b.obj is source for b in write.buffers)
    run_ops(SyncFileIO(), outcome.pending.ops)
    outcome.complete()
    log = outcome.partition.log
    assert log.end_offset == HAND_DECODED_FROM // 1024 + 1
    stored = bytes(log.read(0, 1 << 20).data)
    # as sent, but the base offset (bytes 0-7) and the leader epoch (12-15) the log stamps
    assert len(stored) == len(batch) and stored[8:12] == batch[8:12] and stored[16:] == batch[16:]
