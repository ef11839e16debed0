"""Kafka's Fetch, ListOffsets and DescribeProducers over a partition holding transactions, in
process: read_committed stops at the last stable offset and is told the aborted transactions,
read_uncommitted reads to the high watermark and is told none (null), ListOffsets latest with
isolation_level 1 is the last stable offset, DescribeProducers names an open transaction's start.
The transactions are written through the partition (its allow switch and `write_marker`): the
wire still refuses transactional produce."""

from __future__ import annotations

import datetime
import struct
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32, i64

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Gather, Read, Reply
from broker.core.partition import Partition, PendingProduce
from broker.kafka.adapter import KafkaAdapter
from broker.kafka.codec import make, request_schema
from broker.ringlog.adapter import RinglogAdapter
from broker.storage.diskspace import DiskSpace
from broker.storage.fileio import SyncFileIO, run_ops
from labkit.kafka_requests import frame as frame_of
from labkit.kafka_requests import read_response, request_of
from ringlog_proto import messages as m
from ringlog_proto.batch import CRC_START, encode_batch, iter_batches
from ringlog_proto.batch_header import TRANSACTIONAL_BIT
from ringlog_proto.frames import FrameDecoder

IO = SyncFileIO()
FETCH, LIST_OFFSETS, DESCRIBE_PRODUCERS = 1, 2, 61


def create_topic(adapter: KafkaAdapter, name: str, partitions: int) -> int:
    """Through our protocol's CreateTopic (Kafka's would need the controller's checks)."""
    decoder = FrameDecoder()
    decoder.feed(b"".join(m.encode_request(m.CreateTopicRequest(name, partitions), 1)))
    outcome = RinglogAdapter(adapter.core).handle(decoder.next_frame())  # type: ignore[arg-type]
    assert isinstance(outcome, Reply)
    decoder = FrameDecoder()
    decoder.feed(b"".join(outcome.buffers))
    resp = m.decode_response(decoder.next_frame())  # type: ignore[arg-type]
    assert isinstance(resp, m.CreateTopicResponse) and resp.error == m.ErrorCode.NONE
    return resp.topic_id


def carried_out(outcome: Any) -> Reply:
    """A Fetch's outcome carried out in process: each part's pread, then the reply."""
    if isinstance(outcome, Reply):
        return outcome
    assert isinstance(outcome, Gather)
    for part in outcome.parts:
        if isinstance(part, Read):
            e = part.extent
            part.finish(IO.pread(e.segment.store_fd, e.length, e.position))
    reply = outcome.finish()
    assert isinstance(reply, Reply)
    return reply


def ask(adapter: KafkaAdapter, api: int, version: int, body: Any) -> Any:
    outcome = adapter.handle(request_of(frame_of(api, version, 7, body)))
    return read_response(api, version, b"".join(carried_out(outcome).buffers))[1]


def txn_batch(pid: int, seq: int, n: int = 1) -> bytes:
    out = bytearray(encode_batch([b"t"] * n, producer_id=pid, producer_epoch=0, base_sequence=seq))
    struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def complete(out: Any) -> None:
    assert isinstance(out, PendingProduce)
    run_ops(IO, out.pending.ops)
    out.complete()


@pytest.fixture
def setup(tmp_path: Path) -> tuple[KafkaAdapter, Partition]:
    config = BrokerConfig(data_dir=str(tmp_path), port=9092, cores=1, core_ports=(9100,))
    adapter = KafkaAdapter(Core(config), config)
    topic_id = create_topic(adapter, "txns", 1)
    part = adapter.core.partition(topic_id, 0)
    space = DiskSpace(str(tmp_path), 0)
    complete(part.produce(encode_batch([b"plain"]), space))  # 0
    complete(part.produce(txn_batch(7, 0, 2), space, transactional=True))  # 1-2
    complete(part.write_marker(7, 0, 0, commit=False))  # 3
    complete(part.produce(txn_batch(8, 0), space, transactional=True))  # 4: open
    complete(part.produce(encode_batch([b"after"]), space))  # 5
    assert (part.last_stable_offset, part.high_watermark) == (4, 6)
    return adapter, part


def fetch_body(version: int, isolation: int) -> Any:
    schema = request_schema(FETCH, version)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["FetchPartition"])
    fields = {"partition": i32(0), "fetch_offset": i64(0), "partition_max_bytes": i32(1 << 20)}
    if version >= 5:
        fields["log_start_offset"] = i64(-1)
    if version >= 9:
        fields["current_leader_epoch"] = i32(-1)
    partition = make(module.FetchPartition, **fields)
    body = {
        "replica_id": i32(-1),
        "max_wait": datetime.timedelta(0),
        "min_bytes": i32(1),
        "max_bytes": i32(1 << 20),
        "isolation_level": i8(isolation),
        "topics": (make(module.FetchTopic, topic="txns", partitions=(partition,)),),
    }
    if version >= 7:
        body.update(session_id=i32(0), session_epoch=i32(-1), forgotten_topics_data=())
    if version >= 11:
        body["rack_id"] = ""
    return make(schema, **body)


@pytest.mark.parametrize("version", [4, 11])
def test_fetch_read_committed_stops_at_the_last_stable_offset_and_names_the_aborted(
    setup: tuple[KafkaAdapter, Partition], version: int
) -> None:
    adapter, _ = setup
    p = ask(adapter, FETCH, version, fetch_body(version, 1)).responses[0].partitions[0]
    assert (p.error_code, p.high_watermark, p.last_stable_offset) == (ErrorCode.none, 6, 4)
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(7, 1)]
    assert [h.base_offset for _, h in iter_batches(bytes(p.records))] == [0, 1, 3]
    p = ask(adapter, FETCH, version, fetch_body(version, 0)).responses[0].partitions[0]
    assert (p.high_watermark, p.last_stable_offset, p.aborted_transactions) == (6, 4, None)
    assert [h.base_offset for _, h in iter_batches(bytes(p.records))] == [0, 1, 3, 4, 5]


def test_list_offsets_latest_is_the_last_stable_offset_for_read_committed(
    setup: tuple[KafkaAdapter, Partition],
) -> None:
    adapter, _ = setup
    schema = request_schema(LIST_OFFSETS, 5)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["ListOffsetsPartition"])
    latest = make(
        module.ListOffsetsPartition, partition_index=i32(0), current_leader_epoch=i32(-1), timestamp=i64(-1)
    )
    for isolation, want in ((0, 6), (1, 4)):
        body = make(
            schema,
            replica_id=i32(-1),
            isolation_level=i8(isolation),
            topics=(make(module.ListOffsetsTopic, name="txns", partitions=(latest,)),),
        )
        assert ask(adapter, LIST_OFFSETS, 5, body).topics[0].partitions[0].offset == want


def test_describe_producers_names_an_open_transactions_start(setup: tuple[KafkaAdapter, Partition]) -> None:
    adapter, _ = setup
    schema = request_schema(DESCRIBE_PRODUCERS, 0)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["TopicRequest"])
    body = make(schema, topics=(make(module.TopicRequest, name="txns", partition_indexes=(i32(0),)),))
    states = ask(adapter, DESCRIBE_PRODUCERS, 0, body).topics[0].partitions[0].active_producers
    got = {s.producer_id: (s.coordinator_epoch, s.current_txn_start_offset) for s in states}
    assert got == {7: (0, -1), 8: (-1, 4)}
