"""The helpers that keep frame and batch bytes inside ringlog_proto, each checked against the
encoder and decoder (a round trip), never against offsets written out here: a format change that
forgets a helper fails these tests."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringlog_proto import messages as m
from ringlog_proto.batch import (
    NO_SEQUENCE,
    Record,
    decode_records,
    encode_batch,
    invalid_batch,
    iter_batches,
    read_header,
    rebased,
    set_base_offset,
    stored_damage,
)
from ringlog_proto.frames import (
    NEED_DATA,
    Frame,
    FrameDecoder,
    encode_frame,
    peek_frame_size,
    reframe,
    set_correlation_id,
    set_identity,
)

u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)


def decode_one(raw: bytes | bytearray) -> Frame:
    d = FrameDecoder()
    d.feed(raw)
    frame = d.next_frame()
    assert isinstance(frame, Frame)
    assert d.next_frame() is NEED_DATA
    return frame


def request_frame(req: m.Request, correlation_id: int = 1) -> Frame:
    return decode_one(b"".join(m.encode_request(req, correlation_id)))


# ------------------------------------------------------------------------------------ frames


@given(u32, u32, u32, st.binary(max_size=40), st.booleans())
def test_set_correlation_id_changes_only_the_id(
    corr: int, topic: int, part: int, body: bytes, resp: bool
) -> None:
    raw = bytearray(encode_frame(9, 3, 5, body, topic, part, 1 if resp else 0))
    before = decode_one(raw)
    set_correlation_id(raw, corr)
    assert decode_one(raw) == dataclasses.replace(before, correlation_id=corr)


@given(u32, u32, u32, st.binary(max_size=40))
def test_set_identity_changes_only_the_identity(topic: int, part: int, corr: int, body: bytes) -> None:
    raw = bytearray(b"".join(m.encode_request(m.ApiVersionsRequest("hello"), corr)))
    before = decode_one(raw)
    set_identity(raw, topic, part)
    assert decode_one(raw) == dataclasses.replace(before, topic_id=topic, partition=part)


def test_stamps_reach_a_frame_at_a_position() -> None:
    first = encode_frame(1, 1, 1, b"abc")
    raw = bytearray(first + encode_frame(2, 1, 2, b"defg", 4, 5))
    set_correlation_id(raw, 77, len(first))
    set_identity(raw, 8, 9, len(first))
    d = FrameDecoder()
    d.feed(raw)
    assert d.next_frame() == decode_one(first)
    second = d.next_frame()
    assert isinstance(second, Frame)
    assert (second.correlation_id, second.topic_id, second.partition, second.body) == (77, 8, 9, b"defg")


@given(u32, u32, u32, u32, st.binary(max_size=40), st.booleans())
def test_reframe_keeps_everything_but_the_id(
    old: int, new: int, topic: int, part: int, body: bytes, resp: bool
) -> None:
    frame = decode_one(encode_frame(5, 1, old, body, topic, part, 1 if resp else 0))
    buffers = reframe(frame, new)
    assert buffers[-1] is frame.body, "the body is not copied"
    assert decode_one(b"".join(buffers)) == dataclasses.replace(frame, correlation_id=new)


@given(st.binary(max_size=300))
def test_peek_frame_size_is_the_encoded_size(body: bytes) -> None:
    raw = encode_frame(4, 1, 1, body) + b"next frame"
    assert peek_frame_size(raw) == len(raw) - len(b"next frame")
    assert peek_frame_size(b"xx" + raw, 2) == len(raw) - len(b"next frame")


def test_peek_frame_size_needs_the_length_field() -> None:
    raw = encode_frame(4, 1, 1, b"body")
    sizes = [peek_frame_size(raw[:n]) for n in range(len(raw) + 1)]
    first = sizes.index(len(raw))
    assert first > 0 and all(s is None for s in sizes[:first]) and all(s == len(raw) for s in sizes[first:])


# ------------------------------------------------------------------------------------ message peeks


@pytest.mark.parametrize("acks", list(m.Acks))
def test_peek_produce_acks(acks: m.Acks) -> None:
    frame = request_frame(m.ProduceRequest(1, 2, acks, 500, encode_batch([b"v"])))
    assert m.peek_produce_acks(frame) == acks
    assert m.decode_request(frame).acks == acks  # type: ignore[attr-defined]


@given(st.integers(-(2**63), 2**63 - 1), i32, i32, i32)
def test_peek_fetch_fields(offset: int, max_bytes: int, max_wait_ms: int, min_bytes: int) -> None:
    req = m.FetchRequest(1, 2, offset, max_bytes, max_wait_ms, min_bytes)
    frame = request_frame(req)
    assert m.decode_request(frame) == req
    assert m.peek_fetch_max_bytes(frame) == max_bytes
    assert m.peek_fetch_max_wait_ms(frame) == max_wait_ms


def test_peeks_answer_only_for_their_request() -> None:
    fetch = request_frame(m.FetchRequest(1, 2, 0, 100, 200))
    produce = request_frame(m.ProduceRequest(1, 2, m.Acks.NONE, 5, b""))
    other = request_frame(m.ListOffsetsRequest(1, 2, -1))
    assert m.peek_produce_acks(fetch) is None and m.peek_produce_acks(other) is None
    assert m.peek_fetch_max_bytes(produce) is None and m.peek_fetch_max_bytes(other) is None
    assert m.peek_fetch_max_wait_ms(produce) is None and m.peek_fetch_max_wait_ms(other) is None


def test_peeks_of_a_truncated_body() -> None:
    """A body cut before a field: no value (decoding fails and the request is answered)."""
    whole = request_frame(m.FetchRequest(1, 2, 0, 100, 200))
    seen = set()
    for n in range(len(whole.body) + 1):
        cut = dataclasses.replace(whole, body=whole.body[:n])
        seen.add((m.peek_fetch_max_bytes(cut), m.peek_fetch_max_wait_ms(cut)))
    assert seen == {(None, None), (100, None), (100, 200)}
    produce = request_frame(m.ProduceRequest(1, 2, m.Acks.NONE, 5, b""))
    assert m.peek_produce_acks(dataclasses.replace(produce, body=b"")) is None


# ------------------------------------------------------------------------------------ batches


@given(st.integers(0, 2**31 - 2**20), st.integers(1, 50))
def test_last_sequence(base_sequence: int, n: int) -> None:
    h = read_header(encode_batch([b"x"] * n, producer_id=3, producer_epoch=1, base_sequence=base_sequence))
    assert h.last_sequence - h.base_sequence + 1 == len(decode_records(encode_batch([b"x"] * n)))
    assert h.last_sequence == base_sequence + n - 1
    assert read_header(encode_batch([b"x"])).base_sequence == NO_SEQUENCE


@given(st.integers(0, 2**62), st.lists(st.integers(1, 5), min_size=1, max_size=4))
def test_rebased_is_set_base_offset_without_touching_the_input(base: int, counts: list[int]) -> None:
    batches = [encode_batch([Record(f"v{i}".encode())] * n, timestamp=1) for i, n in enumerate(counts)]
    data = b"".join(batches)
    view = memoryview(data)
    parts: list[bytes | memoryview] = []
    next_base = base
    headers = []
    for pos, h in iter_batches(data):
        offset_bytes, rest, as_stored = rebased(view, h, next_base, pos)
        parts += (offset_bytes, rest)
        headers.append(as_stored)
        next_base += h.record_count
    stored = b"".join(parts)
    assert headers == [h for _, h in iter_batches(stored)]
    assert data == b"".join(batches), "the input is not changed"
    expected = bytearray(data)
    next_base = base
    for pos, h in iter_batches(data):
        set_base_offset(expected, next_base, pos)
        next_base += h.record_count
    assert stored == expected
    offsets = [r.offset for pos, _ in iter_batches(stored) for r in decode_records(stored, pos)]
    assert offsets == list(range(base, base + sum(counts)))


def stored(base: int, *counts: int, value: bytes = b"value") -> bytes:
    """Batches of `counts` records each, as the broker stores them from offset `base` on."""
    out = bytearray()
    for n in counts:
        b = bytearray(encode_batch([value] * n, timestamp=1))
        set_base_offset(b, base)
        out += b
        base += n
    return bytes(out)


def test_stored_damage_of_intact_batches() -> None:
    data = stored(40, 3, 1, 7)
    pos, offset, seen = 0, 40, []
    while pos < len(data):
        size, count, reason = stored_damage(data, pos, len(data), offset)
        assert reason is None
        seen.append((pos, count))
        pos += size
        offset += count
    assert seen == [(p, h.record_count) for p, h in iter_batches(data)]
    assert offset == 51


def test_stored_damage_names_a_wrong_base_offset() -> None:
    data = stored(40, 3)
    size, count, reason = stored_damage(data, 0, len(data), 41)
    assert (size, count) == (0, 0)
    assert reason is not None and "base offset 40" in reason and "41" in reason


def test_stored_damage_finds_every_flipped_byte_and_every_cut() -> None:
    data = stored(0, 2)
    for i in range(len(data)):
        damaged = bytearray(data)
        damaged[i] ^= 0x40
        expect_damage = invalid_batch(damaged) is not None or read_header(damaged).base_offset != 0
        assert (stored_damage(damaged, 0, len(damaged), 0)[2] is not None) == expect_damage, i
    for n in range(len(data)):
        assert stored_damage(data[:n], 0, n, 0)[2] is not None, n
