"""The request handlers without any server: frames in, outcomes out, I/O run by the test."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Durable, Reply
from broker.ringlog.adapter import RinglogAdapter
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto import messages as m
from ringlog_proto.batch import Record, encode_batch
from ringlog_proto.frames import Frame, FrameDecoder


def frame_of(req: m.Request, cid: int = 1) -> Frame:
    return m.request_frame(req, cid)


def response(outcome) -> m.Response:
    assert isinstance(outcome, Reply), outcome
    d = FrameDecoder()
    d.feed(b"".join(outcome.buffers))
    return m.decode_response(d.next_frame())


@pytest.fixture
def handlers(tmp_path: Path):
    h = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path))))
    yield h
    h.core.close()


def create(h: RinglogAdapter, name: str = "t") -> int:
    resp = response(h.handle(frame_of(m.CreateTopicRequest(name, 1))))
    assert isinstance(resp, m.CreateTopicResponse)
    return resp.topic_id


def produce(h: RinglogAdapter, tid: int, batch: bytes, acks: int = m.Acks.WRITTEN):
    return h.handle(frame_of(m.ProduceRequest(tid, 0, acks, 1000, batch)))


def test_produce_is_an_append_the_caller_runs(handlers: RinglogAdapter) -> None:
    tid = create(handlers)
    outcome = produce(handlers, tid, encode_batch([b"a", b"b"]))
    assert isinstance(outcome, Append)
    assert handlers.core.partitions[(tid, 0)].log.end_offset == 0, "nothing visible before the writes ran"
    run_ops(SyncFileIO(), outcome.pending.ops)
    resp = response(outcome.complete())
    assert isinstance(resp, m.ProduceResponse) and (resp.base_offset, resp.end_offset) == (0, 2)


def test_an_acks_of_none_of_ours_is_invalid_whatever_the_partition(
    handlers: RinglogAdapter,
) -> None:
    """Which acks are valid is the core's (broker/core/acks.py), asked before the partition is
    looked up: a bad acks to a topic that does not exist is INVALID_REQUEST too, and the
    partition is not even opened."""
    tid = create(handlers)
    for topic_id in (tid, tid + 99):
        resp = response(produce(handlers, topic_id, encode_batch([b"a"]), acks=3))
        assert isinstance(resp, m.ProduceResponse)
        assert resp.error == m.ErrorCode.INVALID_REQUEST and "acks must be" in resp.message
    assert (tid, 0) not in handlers.core.partitions, "refused before the lookup opened it"


def test_a_new_producer_must_start_at_sequence_zero(handlers: RinglogAdapter) -> None:
    tid = create(handlers)
    late = encode_batch([b"x"], producer_id=9, producer_epoch=0, base_sequence=1)
    assert response(produce(handlers, tid, late)).error == m.ErrorCode.UNKNOWN_PRODUCER_ID
    first = produce(handlers, tid, encode_batch([b"x"], producer_id=9, producer_epoch=0, base_sequence=0))
    assert isinstance(first, Append)


def test_a_durable_retry_waits_for_a_flush_covering_the_original(handlers: RinglogAdapter) -> None:
    tid = create(handlers)
    batch = encode_batch([b"x"], producer_id=5, producer_epoch=0, base_sequence=0)
    first = produce(handlers, tid, batch, m.Acks.DURABLE)
    assert isinstance(first, Append)
    run_ops(SyncFileIO(), first.pending.ops)
    first.complete()  # written, not yet flushed: the backend would flush before answering
    retry = produce(handlers, tid, batch, m.Acks.DURABLE)
    assert isinstance(retry, Durable)
    handlers.core.partitions[(tid, 0)].log.flush()
    again = produce(handlers, tid, batch, m.Acks.DURABLE)
    resp = response(again)
    assert isinstance(resp, m.ProduceResponse) and resp.base_offset == 0


def test_a_retry_is_not_confirmed_after_a_failed_fsync(handlers: RinglogAdapter) -> None:
    tid = create(handlers)
    batch = encode_batch([b"x"], producer_id=5, producer_epoch=0, base_sequence=0)
    first = produce(handlers, tid, batch, m.Acks.DURABLE)
    run_ops(SyncFileIO(), first.pending.ops)
    first.complete()
    handlers.core.partitions[(tid, 0)].log.fail_flush(OSError(errno.EIO, "Input/output error"))
    resp = response(produce(handlers, tid, batch, m.Acks.DURABLE))
    assert resp.error == m.ErrorCode.STORAGE_ERROR
    assert "fdatasync failed" in resp.message


def test_unknown_api_is_answered_not_raised(handlers: RinglogAdapter) -> None:
    from ringlog_proto.frames import encode_frame

    d = FrameDecoder()
    d.feed(encode_frame(77, 1, 3))
    resp = response(handlers.handle(d.next_frame()))
    assert resp.error == m.ErrorCode.UNSUPPORTED_VERSION


def test_pipelined_batches_of_a_producer_are_checked_against_those_still_in_flight(
    handlers: RinglogAdapter,
) -> None:
    """An asynchronous backend (io_uring) prepares the next batch of a producer while the write of
    the one before is in flight: its sequence follows the in-flight one, a retry of the in-flight
    one is refused retriably (its outcome is unknown yet), and an undone write is forgotten."""
    tid = create(handlers)
    io = SyncFileIO()
    b0 = encode_batch([b"a", b"b"], producer_id=7, producer_epoch=0, base_sequence=0)
    b1 = encode_batch([b"c"], producer_id=7, producer_epoch=0, base_sequence=2)
    b2 = encode_batch([b"d"], producer_id=7, producer_epoch=0, base_sequence=3)
    first = produce(handlers, tid, b0)
    second = produce(handlers, tid, b1)  # before the first write ran
    assert isinstance(first, Append) and isinstance(second, Append)
    retry = response(produce(handlers, tid, b0))
    assert retry.error == m.ErrorCode.REQUEST_TIMED_OUT and retry.error.retriable, retry
    for outcome in (first, second):
        run_ops(io, outcome.pending.ops)
        assert response(outcome.complete()).error == m.ErrorCode.NONE
    # Now the retry is an ordinary duplicate, answered with the original offsets.
    dup = response(produce(handlers, tid, b0))
    assert isinstance(dup, m.ProduceResponse) and dup.base_offset == 0
    # A write that fails is undone, and the producer's next expected sequence goes back with it.
    third = produce(handlers, tid, b2)
    assert isinstance(third, Append)
    handlers.core.partitions[(tid, 0)].log.abort_append(third.pending)
    assert response(third.fail(OSError(errno.EIO, "injected"))).error == m.ErrorCode.STORAGE_ERROR
    again = produce(handlers, tid, b2)
    assert isinstance(again, Append), "sequence 3 is expected again after the undone write"


def test_a_deleted_topic_is_closed_without_a_flush(
    handlers: RinglogAdapter, tmp_path: Path, monkeypatch
) -> None:
    """Deleting a topic closes its partitions without writing back and syncing their unsynced
    data (its files go next): a flush there held the core ~60 ms per 128 MiB segment."""
    tid = create(handlers, "gone")
    batch = encode_batch([b"v" * 1000] * 50)
    for _ in range(20):  # acks=1: written, nothing synced
        outcome = produce(handlers, tid, batch)
        assert isinstance(outcome, Append)
        run_ops(SyncFileIO(), outcome.pending.ops)
        outcome.complete()
    topic_dir = next(p for p in tmp_path.rglob("*.log") if p.stat().st_size > 0).parent
    synced: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    resp = response(handlers.handle(frame_of(m.DeleteTopicRequest("gone"))))
    assert resp.error == m.ErrorCode.NONE
    assert not [p for p in synced if p.startswith(str(topic_dir))], synced
    assert not topic_dir.exists()
    assert (tid, 0) not in handlers.core.partitions


def test_a_compacted_topic_answers_invalid_record_to_records_without_a_key(handlers: RinglogAdapter) -> None:
    resp = response(
        handlers.handle(frame_of(m.CreateTopicRequest("kept", 1, configs=(("cleanup.policy", "compact"),))))
    )
    assert isinstance(resp, m.CreateTopicResponse) and resp.error == m.ErrorCode.NONE
    refused = response(produce(handlers, resp.topic_id, encode_batch([Record(b"v", key=b"k"), Record(b"v")])))
    assert isinstance(refused, m.ProduceResponse) and refused.error == m.ErrorCode.INVALID_RECORD
    assert "1 record(s) without a key (index 1)" in refused.message
    assert not refused.error.retriable
    keyed = produce(handlers, resp.topic_id, encode_batch([Record(b"v", key=b"k")]))
    assert isinstance(keyed, Append)
    run_ops(SyncFileIO(), keyed.pending.ops)
    stored = response(keyed.complete())
    assert isinstance(stored, m.ProduceResponse) and (stored.error, stored.base_offset) == (
        m.ErrorCode.NONE,
        0,
    )


def metadata(h: RinglogAdapter, *names: str, allow: bool) -> dict[str, tuple[m.ErrorCode, int]]:
    resp = response(h.handle(frame_of(m.MetadataRequest(names, allow_auto_create=allow))))
    assert isinstance(resp, m.MetadataResponse)
    return {t.name: (t.error, len(t.partitions)) for t in resp.topics}


def test_a_metadata_allowing_it_creates_the_missing_topics_it_names(tmp_path: Path) -> None:
    """Auto topic creation on our protocol (Kafka's Metadata with allow_auto_topic_creation):
    the named topics that do not exist and have a valid name, with the broker's default
    partitions; a request that does not allow it, and a broker that does not auto-create,
    create nothing."""
    h = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path), default_partitions=3)))
    try:
        create(h, "old")
        unknown = (m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
        assert metadata(h, "asked", allow=False) == {"asked": unknown}
        assert metadata(h, "old", "new", "new", "bad name!", allow=True) == {
            "old": (m.ErrorCode.NONE, 1),
            "new": (m.ErrorCode.NONE, 3),
            "bad name!": unknown,
        }
        assert sorted(t.name for t in h.core.registry.by_id.values()) == ["new", "old"]
    finally:
        h.core.close()
    off = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path / "off"), auto_create_topics=False)))
    try:
        assert metadata(off, "new", allow=True) == {"new": unknown}
        assert not off.core.registry.by_id
    finally:
        off.core.close()


def test_transactional_batches_need_a_produce_naming_a_transactional_id(handlers: RinglogAdapter) -> None:
    """A transactional batch in a v1 Produce is refused (INVALID_BATCH, as ever); a v2 Produce
    naming a transactional id takes it (docs/PROTOCOL.md §4.7)."""
    from ringlog_proto.batch_encode import as_transactional

    tid = create(handlers)
    batch = as_transactional(encode_batch([b"t"], producer_id=5, producer_epoch=0, base_sequence=0))
    assert response(produce(handlers, tid, batch)).error == m.ErrorCode.INVALID_BATCH
    outcome = handlers.handle(frame_of(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, batch, "tx")))
    assert isinstance(outcome, Append)


def test_a_v1_fetch_is_answered_in_v1_layout(handlers: RinglogAdapter) -> None:
    """Fetch v2 answers carry the last stable offset and the aborted list; a v1 request (no
    isolation byte) is still read, and answered without them, v1 in the header."""
    tid = create(handlers)
    outcome = produce(handlers, tid, encode_batch([b"a"]))
    run_ops(SyncFileIO(), outcome.pending.ops)
    outcome.complete()
    v2 = frame_of(m.FetchRequest(tid, 0, 1, 1000, 0, 1))  # at the end: nothing to read
    resp = response(handlers.handle(v2))
    assert isinstance(resp, m.FetchResponse) and resp.last_stable_offset == resp.high_watermark == 1
    v1 = Frame(m.ApiKey.FETCH, 1, 0, 2, tid, 0, v2.body[:-1])
    reply = handlers.handle(v1)
    assert isinstance(reply, Reply)
    d = FrameDecoder()
    d.feed(b"".join(reply.buffers))
    answer = d.next_frame()
    assert answer.api_version == 1
    assert answer.body[:4] == b"\0\0\0\0" and len(answer.body) == 4 + 8 + 8 + 4  # hw, start, records
