"""Poison batches against a real broker: a batch whose crc is valid but whose
records do not frame is refused with INVALID_BATCH and the log is left untouched, on both backends,
when forwarded from another core, and for idempotent producers. Compressed ones too:
garbage or a cut stream under a valid crc is CORRUPT_MESSAGE, records that do not frame or are
fewer or more than counted INVALID_BATCH, a decompression bomb MESSAGE_TOO_LARGE; well-formed
batches of every codec are stored and read back."""

from __future__ import annotations

import pytest

from labkit.brokerproc import BrokerProcess, Wire
from labkit.poison_batches import POISON, compressed_good, compressed_poison, poison_batch
from ringlog_proto import messages as m
from ringlog_proto.batch import Record, decode_records, encode_batch
from ringlog_proto.routing import shard_for

E = m.ErrorCode
ONE_CORE = [{"cores": 1, "backend": "uvloop"}, {"cores": 1, "backend": "io_uring"}]
TWO_CORES = [{"cores": 2, "backend": "uvloop"}, {"cores": 2, "backend": "io_uring"}]


def produce(w: Wire, tid: int, records: bytes, acks: int = m.Acks.WRITTEN) -> m.Response:
    return w.rpc(m.ProduceRequest(tid, 0, acks=acks, records=records))


def end_offset(w: Wire, tid: int) -> int:
    resp = w.rpc(m.ListOffsetsRequest(tid, 0, spec=m.OffsetSpec.LATEST))
    assert isinstance(resp, m.ListOffsetsResponse) and resp.error == E.NONE, resp
    return resp.offset


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True)
def test_poison_batches_are_refused_and_nothing_is_written(broker: BrokerProcess, wire: Wire) -> None:
    tid = wire.create_topic("poison")
    good = encode_batch([Record(b"before", key=b"k", headers=[("h", b"v")])])
    assert produce(wire, tid, good).error == E.NONE
    for name in sorted(POISON):
        resp = produce(wire, tid, poison_batch(name))
        assert resp.error == E.INVALID_BATCH, (name, resp)
        assert resp.message, name
    # A good batch followed by a poison one in one request: all refused, none written.
    resp = produce(wire, tid, encode_batch([b"x", b"y"]) + poison_batch("count_above_records"))
    assert resp.error == E.INVALID_BATCH and "batch at byte" in resp.message, resp
    # An idempotent producer's poison batch is refused before its sequence is looked at, and its
    # (well-formed) retry with the same sequence is then the first batch of that producer.
    resp = produce(
        wire, tid, poison_batch("trailing_bytes", producer_id=7, producer_epoch=0, base_sequence=0)
    )
    assert resp.error == E.INVALID_BATCH, resp
    ok = encode_batch([b"idem"], producer_id=7, producer_epoch=0, base_sequence=0)
    assert produce(wire, tid, ok).error == E.NONE
    # acks=0 gets no answer but must not store the batch either.
    wire.send(m.ProduceRequest(tid, 0, acks=m.Acks.NONE, records=poison_batch("key_length_minus_2")))
    assert end_offset(wire, tid) == 2
    assert [r.value for r in wire.fetch_all(tid, 0)] == [b"before", b"idem"]


@pytest.mark.parametrize("broker", TWO_CORES, indirect=True)
def test_a_forwarded_poison_batch_is_refused_by_its_owner(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    try:
        tid = w.create_topic("poison")
        other = 1 - shard_for(tid, 0, 2)
        fw = Wire(broker.core_ports[other])  # the core that does not own partition 0 forwards
        try:
            resp = produce(fw, tid, poison_batch("record_length_past_end"))
            assert resp.error == E.INVALID_BATCH, resp
            assert produce(fw, tid, encode_batch([b"ok"])).error == E.NONE
            assert [r.value for r in fw.fetch_all(tid, 0)] == [b"ok"]
        finally:
            fw.close()
    finally:
        w.close()


COMPRESSED_CODES = {
    "corrupt": E.CORRUPT_MESSAGE,
    "framing": E.INVALID_BATCH,
    "too_large": E.MESSAGE_TOO_LARGE,
}


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True)
def test_compressed_poison_is_refused_and_good_compressed_batches_are_stored(
    broker: BrokerProcess, wire: Wire
) -> None:
    tid = wire.create_topic("zpoison")
    good = compressed_good()
    for name, batch in good.items():
        assert produce(wire, tid, batch).error == E.NONE, name
    end = end_offset(wire, tid)
    assert end == 3 * len(good)
    for name, (batch, kind) in sorted(compressed_poison().items()):
        resp = produce(wire, tid, batch)
        assert resp.error == COMPRESSED_CODES[kind], (name, resp)
        assert resp.message, name
    # one good compressed batch before a poison one, in one request: neither is stored
    resp = produce(wire, tid, good["zstd"] + compressed_poison()["lz4_fewer_records_than_count"][0])
    assert resp.error == E.INVALID_BATCH and "batch at byte" in resp.message, resp
    assert end_offset(wire, tid) == end
    assert produce(wire, tid, encode_batch([b"after"])).error == E.NONE  # the broker keeps serving
    assert [r.value for r in wire.fetch_all(tid, 0, start=end)] == [b"after"]
    # gzip, which our client decodes, comes back as it went in (Kafka clients read the others)
    first = wire.rpc(m.FetchRequest(tid, 0, 0, 1, 0))  # at least one batch: the gzip one
    assert isinstance(first, m.FetchResponse) and first.error == E.NONE, first
    stored = decode_records(first.records)
    assert [r.value for r in stored] == [r.value for r in decode_records(good["gzip"])]
