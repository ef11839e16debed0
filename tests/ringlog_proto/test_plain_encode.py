"""A batch of plain values (the producer's common case) is encoded in one C call, native._batch's
`encode_values`: the section, the header and its crc. It must give the bytes the pure-Python
encoder gives for the same values and fields, and leave to it (which raises its own error)
whatever it does not encode: a field out of its width, a count outside 1..RECORD_COUNT_MAX."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringlog_proto import batch as b
from ringlog_proto import batch_encode, records_codec
from ringlog_proto.batch import BatchError, decode_records, encode_batch

plain = batch_encode._native_plain_encoder()
needs_c = pytest.mark.skipif(plain is None, reason="native._batch is not built")

INT64 = st.integers(-(2**63), 2**63 - 1)


def in_python(fn: Callable[[], object]) -> object:
    """`fn()` with the pure-Python codec (no C section, no C batch)."""
    saved = records_codec._codec
    records_codec._codec = records_codec.PYTHON
    try:
        return fn()
    except BatchError as exc:
        return "BatchError", str(exc)
    finally:
        records_codec._codec = saved


def both(values: list[bytes], **fields: int) -> bytes:
    """The batch from the C encoder and from Python, which must be the same bytes."""
    assert plain is not None
    fast = plain(
        values,
        fields.get("timestamp", 1),
        fields.get("base_offset", 0),
        fields.get("partition_leader_epoch", -1),
        fields.get("producer_id", -1),
        fields.get("producer_epoch", -1),
        fields.get("base_sequence", -1),
    )
    slow = in_python(lambda: encode_batch(values, **fields))
    assert fast == slow
    assert isinstance(fast, bytes)
    return fast


@needs_c
def test_encode_batch_uses_it() -> None:
    encode_batch([b"v"], timestamp=1)
    assert batch_encode._plain is not None


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=200), min_size=1, max_size=40),
    INT64,
    INT64,
    st.integers(-(2**31), 2**31 - 1),
    INT64,
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**31), 2**31 - 1),
)
def test_the_same_bytes_as_python(
    values: list[bytes], ts: int, base: int, leader: int, pid: int, epoch: int, seq: int
) -> None:
    data = both(
        values,
        timestamp=ts,
        base_offset=base,
        partition_leader_epoch=leader,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
    )
    assert [r.value for r in decode_records(data)] == values


@needs_c
@pytest.mark.parametrize("count", [1, 63, 64, 127, 128, 300, 8192])
def test_counts_past_the_varint_widths(count: int) -> None:
    values = [bytes([i % 256]) * (i % 130) for i in range(count)]
    assert len(decode_records(both(values, timestamp=1_700_000_000_000))) == count


@needs_c
@pytest.mark.parametrize(
    "fields",
    [
        {"producer_epoch": 2**15},
        {"producer_epoch": -(2**15) - 1},
        {"base_sequence": 2**31},
        {"partition_leader_epoch": -(2**31) - 1},
        {"producer_id": 2**63},
        {"timestamp": -(2**63) - 1},
    ],
)
def test_what_it_does_not_encode_python_refuses(fields: dict[str, int]) -> None:
    """Out of its width: no batch from C, and encode_batch raises a BatchError, as the Python
    path does (the two codecs word a timestamp out of range differently)."""
    assert plain is not None
    args = {"timestamp": 1, "base_offset": 0, "partition_leader_epoch": -1, "producer_id": -1}
    args |= {"producer_epoch": -1, "base_sequence": -1} | fields
    fast = plain(
        [b"v"],
        args["timestamp"],
        args["base_offset"],
        args["partition_leader_epoch"],
        args["producer_id"],
        args["producer_epoch"],
        args["base_sequence"],
    )
    assert fast is None
    with pytest.raises(BatchError):
        encode_batch([b"v"], **args)
    refused = in_python(lambda: encode_batch([b"v"], **args))
    assert isinstance(refused, tuple) and refused[0] == "BatchError"


@needs_c
def test_no_values_and_non_bytes_are_left_to_python() -> None:
    assert plain is not None
    assert plain([], 1, 0, -1, -1, -1, -1) is None
    assert plain([b"a", None], 1, 0, -1, -1, -1, -1) is None
    assert plain([b"a", bytearray(b"b")], 1, 0, -1, -1, -1, -1) is None  # bytes only
    with pytest.raises(BatchError):
        encode_batch([])


@needs_c
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=200), min_size=1, max_size=20),
    st.binary(min_size=8, max_size=40),
    st.data(),
    INT64,
    INT64,
    st.integers(-(2**15), 2**15 - 1),
    st.integers(-(2**31), 2**31 - 1),
)
def test_framed_is_the_head_then_the_batch(
    values: list[bytes], head: bytes, data: st.DataObject, ts: int, pid: int, epoch: int, seq: int
) -> None:
    """`encode_batch_framed`: the head, its two u32 fields set, then the batch: from C and from
    Python (the path without the build) the same bytes."""
    total_at = data.draw(st.integers(0, len(head) - 8))
    length_at = data.draw(st.integers(total_at + 4, len(head) - 4))
    batch = both(values, timestamp=ts, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    fast = b.encode_batch_framed(head, total_at, length_at, values, ts, pid, epoch, seq)
    slow = in_python(lambda: b.encode_batch_framed(head, total_at, length_at, values, ts, pid, epoch, seq))
    assert fast == slow
    assert fast[len(head) :] == batch
    assert int.from_bytes(fast[length_at : length_at + 4], "big") == len(batch)
    assert int.from_bytes(fast[total_at : total_at + 4], "big") == len(fast) - total_at - 4
    filled = {*range(total_at, total_at + 4), *range(length_at, length_at + 4)}
    untouched = [i for i in range(len(head)) if i not in filled]
    assert [fast[i] for i in untouched] == [head[i] for i in untouched]


@needs_c
def test_framed_refuses_fields_outside_the_head() -> None:
    from native._batch import encode_framed

    with pytest.raises(ValueError, match="within the head"):
        encode_framed(b"\0" * 8, 5, 0, [b"v"], 1, 0, -1, -1, -1, -1)
    with pytest.raises(ValueError, match="within the head"):
        encode_framed(b"\0" * 8, 0, -1, [b"v"], 1, 0, -1, -1, -1, -1)
    # what encode_values does not encode, neither does it (encode_batch_framed's Python path says why)
    assert encode_framed(b"\0" * 8, 0, 4, [b"v"], 1, 0, 2**31, -1, -1, -1) is None


def test_a_produce_frame_of_values_is_the_request_encode_request_makes() -> None:
    """`encode_produce_values` (the one-record send's frame) against the generic encoding of the
    same `ProduceRequest`, and read back by the broker's decoder."""
    from ringlog_proto.frames import FrameDecoder
    from ringlog_proto.messages import (
        PRODUCE_HEAD_SIZE,
        ProduceRequest,
        decode_request,
        encode_produce_values,
        encode_request,
    )

    values = [b"x" * 1000, b"", b"abc"]
    frame = encode_produce_values(77, 7, 3, 1, 30_000, values, 1_700_000_000_000, 5, 2, 41)
    batch = encode_batch(
        values, timestamp=1_700_000_000_000, producer_id=5, producer_epoch=2, base_sequence=41
    )
    assert frame == b"".join(encode_request(ProduceRequest(7, 3, 1, 30_000, batch), 77))
    assert frame[PRODUCE_HEAD_SIZE:] == batch
    decoder = FrameDecoder()
    decoder.feed(frame)
    got = decoder.next_frame()
    assert got.correlation_id == 77
    req = decode_request(got)
    fields = (req.topic_id, req.partition, req.acks, req.timeout_ms, bytes(req.records))
    assert fields == (7, 3, 1, 30_000, batch)
    assert [r.value for r in decode_records(batch)] == values
