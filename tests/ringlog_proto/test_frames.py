"""Frame codec and messages: whole, byte-at-a-time and trailing feeds; every bad input is a clean error."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import random
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stream_pieces import cut_stream, receive_lent

from ringlog_proto import messages as m
from ringlog_proto.frames import _NATIVE as NATIVE
from ringlog_proto.frames import (
    HEADER_SIZE,
    NEED_DATA,
    PARTITION_OFFSET,
    READ_MIN,
    TOPIC_ID_OFFSET,
    Frame,
    FrameDecoder,
    FrameReader,
    ProtocolError,
    encode_frame,
    frame_decoder,
    frame_reader,
)

REQUESTS = [
    m.ApiVersionsRequest("test-client"),
    m.MetadataRequest(("orders", "ünïcode")),
    m.MetadataRequest(("made-if-missing",), allow_auto_create=True),
    m.CreateTopicRequest("orders", 12, 3_600_000, -1, 1 << 20),
    m.CreateTopicRequest("logs", 1, configs=(("cleanup.policy", "compact"), ("retention.ms", "-1"))),
    m.CreateTopicRequest("placed", 2, assignment=((1, 2), (3, 1))),
    m.DeleteTopicRequest("orders"),
    m.DescribeConfigsRequest("orders", ("retention.ms", "cleanup.policy")),
    m.DescribeConfigsRequest("orders"),
    m.AlterConfigsRequest(
        "orders",
        True,
        False,
        (
            m.ConfigChange("retention.ms", m.ConfigOp.SET, "1000"),
            m.ConfigChange("segment.ms", m.ConfigOp.DELETE),
        ),
    ),
    m.AlterConfigsRequest("orders", False, True, (m.ConfigChange("cleanup.policy", value="compact"),)),
    m.ProduceRequest(7, 3, m.Acks.DURABLE, 5000, b"\x00batch-bytes"),
    m.FetchRequest(7, 3, 42, 1 << 20, 500, 1),
    m.ListOffsetsRequest(7, 3, m.OffsetSpec.EARLIEST),
    m.OffsetCommitRequest(7, 3, "group-a", 99, "meta"),
    m.OffsetFetchRequest(7, 3, "group-a"),
    m.ReplicaFetchRequest(2, 500, 1, 8 << 20),
    m.ReplicaFetchRequest(
        3,
        0,
        1,
        1 << 20,
        (m.ReplicaFetchPartition(7, 0, 42, 3, 4), m.ReplicaFetchPartition(0xFFFFFFFF, 9, 0, -1, 0)),
    ),
]

RESPONSES = [
    m.ApiVersionsResponse(broker_version="0.1", node_id=1, cores=2, apis=(m.ApiVersion(4, 1, 1),)),
    m.MetadataResponse(
        host="127.0.0.1",
        port=9092,
        cores=2,
        steering=True,
        topics=(m.TopicMetadata(m.ErrorCode.NONE, "t", 5, 1, 2, 3, (m.PartitionMetadata(0, 1, 0, 10),)),),
    ),
    m.CreateTopicResponse(topic_id=5),
    m.DeleteTopicResponse(),
    m.DescribeConfigsResponse(
        configs=(
            m.ConfigDescription("retention.ms", "1000", m.ConfigSource.TOPIC, "how long"),
            m.ConfigDescription("segment.bytes", "134217728", m.ConfigSource.BROKER_FLAG),
        )
    ),
    m.AlterConfigsResponse(),
    m.ProduceResponse(base_offset=10, end_offset=20, log_start_offset=0),
    m.FetchResponse(high_watermark=20, log_start_offset=0, records=b"abc"),
    m.ListOffsetsResponse(offset=3),
    m.OffsetCommitResponse(),
    m.OffsetFetchResponse(offset=4, metadata="x"),
    m.FetchResponse(m.ErrorCode.OFFSET_OUT_OF_RANGE, "offset 99 is past the end"),
    m.ReplicaFetchResponse(),
    m.ReplicaFetchResponse(
        partitions=(
            m.ReplicaFetchPartitionData(7, 0, m.ErrorCode.NONE, 40, 2, records=b"batches"),
            m.ReplicaFetchPartitionData(7, 1, m.ErrorCode.NOT_OWNER, -1, -1),
            m.ReplicaFetchPartitionData(8, 0, m.ErrorCode.NONE, 9, 0, 3, 17),
            m.ReplicaFetchPartitionData(8, 1, m.ErrorCode.OFFSET_OUT_OF_RANGE, 5, 5, records=b""),
        )
    ),
]


def native_decoder(max_frame_bytes: int = 8 << 20) -> FrameDecoder:
    """native/frames.c's decoder (the broker's connections use it when it is built, as it is by
    `make setup`)."""
    if NATIVE is None:
        pytest.skip("native._frames is not built (pip install -e .)")
    return frame_decoder(max_frame_bytes)


def native_reader(max_frame_bytes: int = 8 << 20) -> FrameReader:
    """native/frames.c's reader (the clients' connections use it when it is built)."""
    if NATIVE is None:
        pytest.skip("native._frames is not built (pip install -e .)")
    return frame_reader(max_frame_bytes)


# Every test of FrameDecoder's behaviour runs on both: the Python reference and its C twin; and
# every test of FrameReader's on its two.
DECODERS = pytest.mark.parametrize("new_decoder", [FrameDecoder, native_decoder], ids=["python", "native"])
READERS = pytest.mark.parametrize("new_reader", [FrameReader, native_reader], ids=["python", "native"])


def frames_of(
    data: bytes, pieces: list[int] | None = None, new_decoder: Callable[..., FrameDecoder] = FrameDecoder
) -> list[Frame]:
    d = new_decoder()
    out: list[Frame] = []
    chunks = [data] if pieces is None else [data[i : i + 1] for i in range(len(data))]
    for chunk in chunks:
        d.feed(chunk)
        while (f := d.next_frame()) is not NEED_DATA:
            assert isinstance(f, Frame)
            out.append(f)
    return out


@DECODERS
def test_requests_round_trip_whole_and_byte_by_byte(new_decoder: Callable[..., FrameDecoder]) -> None:
    stream = b"".join(b"".join(m.encode_request(r, i)) for i, r in enumerate(REQUESTS))
    for pieces in (None, [1]):
        frames = frames_of(stream, pieces, new_decoder)
        assert [f.correlation_id for f in frames] == list(range(len(REQUESTS)))
        assert [m.decode_request(f) for f in frames] == REQUESTS


@DECODERS
def test_responses_round_trip(new_decoder: Callable[..., FrameDecoder]) -> None:
    stream = b"".join(b"".join(m.encode_response(r, 7)) for r in RESPONSES)
    frames = frames_of(stream, None, new_decoder)
    assert all(f.is_response for f in frames)
    assert [m.decode_response(f) for f in frames] == RESPONSES


def test_a_create_topic_of_version_2_or_3_still_reads() -> None:
    """v3 added configs at the end of the body, v4 the assignment after them: a v2 frame (an
    older client's) has neither, a v3 frame no assignment."""
    v4 = m.request_frame(m.CreateTopicRequest("orders", 4, -1, -1, -1, 1))
    assert v4.api_version == 4 and v4.body.endswith(b"\0" * 8)  # the empty configs and assignment
    v3 = Frame(v4.api_key, 3, 0, 1, 0, 0, v4.body[:-4])
    v2 = Frame(v4.api_key, 2, 0, 1, 0, 0, v4.body[:-8])
    for older in (v2, v3):
        assert m.unsupported(older) is None
        assert m.decode_request(older) == m.CreateTopicRequest("orders", 4, -1, -1, -1, 1)
    assert m.unsupported(Frame(v4.api_key, 1, 0, 1, 0, 0, v4.body)) is not None


def test_a_metadata_of_version_3_still_reads_and_never_creates() -> None:
    """v4 added allow_auto_create at the end of the body: a v3 frame (an older client's) has none,
    and asks for nothing to be created."""
    v4 = m.request_frame(m.MetadataRequest(("t",), allow_auto_create=True))
    assert v4.api_version == 4 and v4.body.endswith(b"\1")
    v3 = Frame(v4.api_key, 3, 0, 1, 0, 0, v4.body[:-1])
    assert m.unsupported(v3) is None
    assert m.decode_request(v3) == m.MetadataRequest(("t",), allow_auto_create=False)
    assert m.unsupported(Frame(v4.api_key, 2, 0, 1, 0, 0, v3.body)) is not None


def test_partition_identity_sits_at_a_fixed_offset() -> None:
    raw = b"".join(m.encode_request(m.FetchRequest(0xA1B2C3D4, 17, 0), 1))
    assert struct.unpack_from(">I", raw, TOPIC_ID_OFFSET)[0] == 0xA1B2C3D4
    assert struct.unpack_from(">I", raw, PARTITION_OFFSET)[0] == 17


@DECODERS
def test_trailing_partial_frame_waits(new_decoder: Callable[..., FrameDecoder]) -> None:
    one = encode_frame(1, 1, 1, b"x" * 10)
    d = new_decoder()
    d.feed(one + one[:5])
    assert isinstance(d.next_frame(), Frame)
    assert d.next_frame() is NEED_DATA
    assert d.buffered == 5


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x00\x00\x00\x14GET / HTTP/1.1\r\n\r\n", "bad frame magic"),
        (b"\x00\x00\x00\x14R\x09" + bytes(18), "unsupported frame version"),
        (struct.pack(">IBB", 4, 0x52, 1) + bytes(18), "shorter than"),
        (struct.pack(">IBB", 1 << 30, 0x52, 1) + bytes(18), "exceeds the maximum"),
        (struct.pack(">IBBHHH", 20, 0x52, 1, 0, 1, 0x80) + bytes(12), "unknown frame flags"),
    ],
)
@pytest.mark.parametrize("decoder", [FrameDecoder, FrameReader, native_decoder, native_reader])
def test_bad_frames_are_protocol_errors(raw: bytes, match: str, decoder: Callable[..., FrameDecoder]) -> None:
    d = decoder()
    d.feed(raw)
    with pytest.raises(ProtocolError, match=match):
        d.next_frame()


@DECODERS
def test_oversized_length_is_refused_before_the_body_arrives(
    new_decoder: Callable[..., FrameDecoder],
) -> None:
    d = new_decoder(max_frame_bytes=1024)
    d.feed(struct.pack(">IBBHHHIII", 5000, 0x52, 1, 4, 1, 0, 1, 0, 0))
    with pytest.raises(ProtocolError, match="exceeds"):
        d.next_frame()


def test_unknown_api_and_version_are_reported_not_raised() -> None:
    frames = frames_of(encode_frame(99, 1, 5) + encode_frame(m.ApiKey.FETCH, 7, 6))
    assert "unknown api key 99" in (m.unsupported(frames[0]) or "")
    assert "version 7" in (m.unsupported(frames[1]) or "")
    reply = frames_of(
        b"".join(m.encode_response(m.error_response(99, m.ErrorCode.UNSUPPORTED_VERSION, "no"), 5, 99))
    )
    got = m.decode_response(reply[0])
    assert got.error == m.ErrorCode.UNSUPPORTED_VERSION
    assert reply[0].api_key == 99


def test_a_replica_fetch_answer_cut_anywhere_is_malformed_and_its_records_are_views() -> None:
    """The follower's answer is read by hand (every partition the follower fetched, a thousand
    or more on a busy core), not through `Reader`: every cut of its body is still a
    `MalformedBody`, an unknown error code reads as UNKNOWN_SERVER_ERROR, and the records are
    views of the body, not copies."""
    answer = m.ReplicaFetchResponse(
        partitions=(
            m.ReplicaFetchPartitionData(7, 0, m.ErrorCode.NONE, 40, 2, records=b"first"),
            m.ReplicaFetchPartitionData(7, 1, m.ErrorCode.NONE, 41, 0, records=b"second"),
        )
    )
    (frame,) = frames_of(b"".join(m.encode_response(answer, 7)))
    got = m.decode_response(frame)
    assert got == answer
    assert isinstance(got, m.ReplicaFetchResponse)
    assert all(isinstance(p.records, memoryview) for p in got.partitions)
    for cut in range(len(frame.body)):
        short = Frame(frame.api_key, frame.api_version, frame.flags, 7, 0, 0, frame.body[:cut])
        with pytest.raises(m.MalformedBody):
            m.decode_response(short)
    body = bytearray(frame.body)
    struct.pack_into(">h", body, 2 + 2 + 4 + 8, 999)  # error, message, count, ids: the first error
    strange = m.decode_response(Frame(frame.api_key, frame.api_version, frame.flags, 7, 0, 0, bytes(body)))
    assert isinstance(strange, m.ReplicaFetchResponse)
    assert strange.partitions[0].error == m.ErrorCode.UNKNOWN_SERVER_ERROR
    longer = Frame(frame.api_key, frame.api_version, frame.flags, 7, 0, 0, frame.body + b"!")
    with pytest.raises(m.MalformedBody, match="unexpected bytes"):
        m.decode_response(longer)
    refused = m.ReplicaFetchResponse(m.ErrorCode.NOT_OWNER, "not here")  # read the generic way
    (frame,) = frames_of(b"".join(m.encode_response(refused, 7)))
    assert m.decode_response(frame) == refused


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_truncated_body_is_malformed(req: m.Request) -> None:
    (frame,) = frames_of(b"".join(m.encode_request(req, 1)))
    for cut in range(len(frame.body)):
        short = Frame(
            frame.api_key,
            frame.api_version,
            frame.flags,
            1,
            frame.topic_id,
            frame.partition,
            frame.body[:cut],
        )
        with pytest.raises(m.MalformedBody):
            m.decode_request(short)
    extra = Frame(
        frame.api_key, frame.api_version, frame.flags, 1, frame.topic_id, frame.partition, frame.body + b"!"
    )
    with pytest.raises(m.MalformedBody, match="unexpected bytes"):
        m.decode_request(extra)


@settings(max_examples=500)
@given(st.binary(max_size=300))
@DECODERS
def test_any_bytes_yield_frames_or_protocol_error(
    new_decoder: Callable[..., FrameDecoder], data: bytes
) -> None:
    d = new_decoder(max_frame_bytes=4096)
    d.feed(data)
    with contextlib.suppress(ProtocolError):
        while (f := d.next_frame()) is not NEED_DATA:
            assert isinstance(f, Frame)
            if m.unsupported(f) is None:
                with contextlib.suppress(m.MalformedBody):
                    m.decode_request(f)


@settings(max_examples=500)
@given(st.sampled_from(sorted(m.REQUEST_TYPES)), st.binary(max_size=200))
def test_any_body_decodes_or_is_malformed(api_key: int, body: bytes) -> None:
    frame = Frame(api_key, m.API_VERSION, 0, 1, 1, 1, body)
    with contextlib.suppress(m.MalformedBody):
        m.decode_request(frame)
    rframe = Frame(api_key, m.API_VERSION, 1, 1, 1, 1, body)
    with contextlib.suppress(m.MalformedBody):
        m.decode_response(rframe)


def test_header_size_is_24() -> None:
    assert HEADER_SIZE == 24


def read_frames(reader: FrameReader, data: bytes, cuts: list[int]) -> list[Frame]:
    """`data` received into `reader` the way a BufferedProtocol does, in reads ending at `cuts`
    (and never more than the buffer offered)."""
    out: list[Frame] = []
    pos = 0
    for cut in [*sorted(cuts), len(data)]:
        while pos < cut:
            view = reader.buffer()
            n = min(len(view), cut - pos)
            view[:n] = data[pos : pos + n]
            view.release()
            reader.received(n)
            pos += n
            while (f := reader.next_frame()) is not NEED_DATA:
                assert isinstance(f, Frame)
                out.append(f)
    return out


def free_space(reader: FrameReader) -> tuple[int, int]:
    """(address, length) of the space `buffer()` offers now: where the reader's buffer is."""
    view = reader.buffer()
    c = ctypes.c_char.from_buffer(view)
    address = ctypes.addressof(c)
    del c
    n = len(view)
    view.release()
    return address, n


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 300_000), min_size=1, max_size=6),
    st.lists(st.integers(0, 2_000_000), max_size=12),
)
@READERS
def test_frame_reader_yields_what_the_decoder_yields_whatever_the_reads(
    new_reader: Callable[..., FrameReader], sizes: list[int], cuts: list[int]
) -> None:
    data = b"".join(encode_frame(1, 1, i, bytes([i]) * n) for i, n in enumerate(sizes))
    reader = new_reader(max_frame_bytes=1 << 20)
    got = read_frames(reader, data, [c for c in cuts if c < len(data)])
    assert got == frames_of(data)
    assert reader.buffered == 0


@READERS
def test_frame_reader_keeps_and_reuses_its_buffer(new_reader: Callable[..., FrameReader]) -> None:
    big = encode_frame(1, 1, 1, bytes(700_000))
    reader = new_reader()
    assert len(read_frames(reader, big + big[:1000], [70_000])) == 1
    assert reader.buffered == 1000
    assert len(read_frames(reader, big[1000:], [])) == 1
    address, free = free_space(reader)
    assert free >= len(big)  # grown to the whole frame once its header was in
    assert len(read_frames(reader, big + big, [5000, 400_000, 800_000])) == 2
    assert reader.buffered == 0
    assert free_space(reader) == (address, free)  # the same buffer: no allocation per frame


@READERS
def test_frame_reader_refuses_oversized_frames_before_their_body(
    new_reader: Callable[..., FrameReader],
) -> None:
    reader = new_reader(max_frame_bytes=1024)
    with pytest.raises(ProtocolError, match="exceeds"):
        read_frames(reader, struct.pack(">IBBHHHIII", 5000, 0x52, 1, 4, 1, 0, 1, 0, 0), [])
    assert reader.buffered + free_space(reader)[1] <= 1024 + READ_MIN


def test_read_fetch_response_is_decode_response_without_copying_records() -> None:
    for resp in [r for r in RESPONSES if isinstance(r, m.FetchResponse)]:
        (frame,) = frames_of(b"".join(m.encode_response(resp, 7)))
        got = m.read_fetch_response(frame)
        assert (got.error, got.message) == (resp.error, resp.message)
        assert got.body[got.start : got.end] == resp.records
        if resp.error == m.ErrorCode.NONE:
            assert (got.high_watermark, got.log_start_offset) == (resp.high_watermark, resp.log_start_offset)
            assert got.body is frame.body
    (frame,) = frames_of(b"".join(m.encode_response(m.FetchResponse(records=b"abc"), 7)))
    short = Frame(frame.api_key, frame.api_version, frame.flags, 7, 0, 0, frame.body[:-1])
    with pytest.raises(m.MalformedBody):
        m.read_fetch_response(short)
    with pytest.raises(m.MalformedBody):
        m.read_fetch_response(Frame(frame.api_key, 0, frame.flags, 7, 0, 0, frame.body + b"!"))
    (other,) = frames_of(b"".join(m.encode_response(m.ListOffsetsResponse(offset=3), 7)))
    with pytest.raises(m.MalformedBody):
        m.read_fetch_response(other)


def _generic_decode(frame: Frame) -> m.Request:
    r = m.Reader(frame.body)
    req = m.REQUEST_TYPES[frame.api_key].read(r, frame)
    r.done()
    return req


def _outcome(decode: Callable[[Frame], object], frame: Frame) -> object:
    """What `decode` makes of `frame`: its result, or the message of the MalformedBody it raises."""
    try:
        return decode(frame)
    except m.MalformedBody as exc:
        return str(exc)


@settings(max_examples=300)
@given(
    st.integers(-128, 127), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=64), st.binary(max_size=3)
)
def test_the_produce_fast_decode_is_the_generic_one(
    acks: int, timeout_ms: int, records: bytes, extra: bytes
) -> None:
    """decode_request reads a produce in one unpack; it must give what ProduceRequest.read gives,
    and leave every body it cannot read to the generic path (same errors)."""
    body = struct.pack(">biI", acks, timeout_ms, len(records)) + records
    for b in (body, body + extra, body[: len(body) - len(extra)]):
        frame = Frame(m.ApiKey.PRODUCE, m.API_VERSION, 0, 1, 7, 3, b)
        assert _outcome(m.decode_request, frame) == _outcome(_generic_decode, frame)


@settings(max_examples=200)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
)
def test_encode_produced_is_encode_response(
    corr: int, topic: int, part: int, base: int, end: int, start: int
) -> None:
    resp = m.ProduceResponse(base_offset=base, end_offset=end, log_start_offset=start)
    want = b"".join(m.encode_response(resp, corr, None, topic, part))
    assert b"".join(m.encode_produced(corr, topic, part, base, end, start)) == want
    (frame,) = frames_of(want)
    assert m.decode_response(frame) == resp


@settings(max_examples=200)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(-128, 127),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=100),
)
def test_a_produce_request_encodes_as_the_generic_path_does(
    corr: int, topic: int, part: int, acks: int, timeout_ms: int, records: bytes
) -> None:
    """encode_request packs a produce's header and fixed fields in one call; the bytes are the
    generic Writer path's, and a decoder reads the request back."""
    req = m.ProduceRequest(topic, part, acks, timeout_ms, records)
    w = m.Writer()
    req.write(w)
    want = b"".join(m._frame(w, m.ApiKey.PRODUCE, corr, topic, part, 0))
    got = b"".join(m.encode_request(req, corr))
    assert got == want
    (frame,) = frames_of(got)
    assert m.decode_request(frame) == req


@settings(max_examples=200)
@given(
    st.one_of(st.just(0), st.integers(-(2**15), 2**15 - 1)),
    st.one_of(st.just(0), st.integers(0, 2**16 - 1)),
    st.binary(min_size=24, max_size=24),
)
def test_a_produce_response_decodes_as_the_generic_path_does(error: int, length: int, rest: bytes) -> None:
    """decode_response reads a produce's success in one unpack, and decode_produce_reply its base
    offset; any body of that size decodes as the generic path decodes it (or is malformed in all)."""
    body = struct.pack(">hH", error, length) + rest
    frame = Frame(m.ApiKey.PRODUCE, m.API_VERSION, 1, 1, 1, 1, body)
    assert _outcome(m.decode_response, frame) == _outcome(m.decode_response_fields, frame)
    # the producer's decode: a success's base offset alone, anything else as decode_response
    generic = _outcome(m.decode_response, frame)
    reply = _outcome(m.decode_produce_reply, frame)
    if isinstance(generic, m.ProduceResponse) and generic.error == m.ErrorCode.NONE and not generic.message:
        assert reply == generic.base_offset and type(reply) is int
    else:
        assert reply == generic


# --- native/frames.c: the twin of FrameDecoder ------------------------------------------------


def _run(decoder: FrameDecoder, pieces: list[bytes]) -> list[object]:
    """Everything a decoder shows for a stream fed in `pieces`: after each piece, every frame it
    yields and how much it then holds, and the error that ends the stream (type and message)."""
    seen: list[object] = []
    try:
        for piece in pieces:
            decoder.feed(piece)
            while (f := decoder.next_frame()) is not NEED_DATA:
                assert type(f) is Frame
                seen.append(f)
            seen.append(decoder.buffered)
    except ProtocolError as exc:
        seen.append(("ProtocolError", str(exc)))
    return seen


def _run_reader(reader: FrameReader, pieces: list[bytes]) -> list[object]:
    """`_run` for a reader received into: each piece written into `buffer()` (as much as it
    offers at a time), then its frames and bytes held."""
    seen: list[object] = []
    try:
        for piece in pieces:
            pos = 0
            while pos < len(piece) or not piece:
                view = reader.buffer(len(piece) - pos)
                n = min(len(view), len(piece) - pos)
                view[:n] = piece[pos : pos + n]
                view.release()
                reader.received(n)
                pos += n
                while (f := reader.next_frame()) is not NEED_DATA:
                    assert type(f) is Frame
                    seen.append(f)
                seen.append(reader.buffered)
                if not piece:
                    break
    except ProtocolError as exc:
        seen.append(("ProtocolError", str(exc)))
    return seen


_FRAME_PARTS = st.one_of(
    # well-formed frames of any api, flags 0 or response, any identity, bodies of any size
    st.builds(
        lambda key, ver, resp, corr, topic, part, body: encode_frame(key, ver, corr, body, topic, part, resp),
        st.integers(0, 0xFFFF),
        st.integers(0, 0xFFFF),
        st.sampled_from([0, 1]),
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.integers(0, 0xFFFFFFFF),
        st.binary(max_size=3000),
    ),
    # headers that break one rule each, and bytes of nothing in particular
    st.builds(
        lambda length, magic, version, flags: (
            struct.pack(">IBBHHH", length, magic, version, 1, 1, flags) + bytes(12)
        ),
        st.integers(0, 1 << 31),
        st.sampled_from([0x52, 0x52, 0x00, 0xFF]),
        st.sampled_from([1, 1, 0, 2]),
        st.sampled_from([0, 1, 2, 0x8000]),
    ),
    st.binary(max_size=40),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_FRAME_PARTS, min_size=1, max_size=8),
    st.lists(st.integers(0, 30_000), max_size=10),
    st.sampled_from([HEADER_SIZE, 100, 4096, 8 << 20]),
)
@pytest.mark.parametrize("twin", ["decoder", "reader"])
def test_the_native_twins_are_the_python_ones(
    twin: str, parts: list[bytes], cuts: list[int], max_frame: int
) -> None:
    """The same frames, the same bytes held after every piece, and the same ProtocolError (at the
    same point, with the same message), for any stream cut anywhere: fed to the decoder, or
    received into the reader (see `_run_reader`)."""
    pieces = cut_stream(parts, cuts)
    if twin == "decoder":
        assert _run(native_decoder(max_frame), pieces) == _run(FrameDecoder(max_frame), pieces)
    else:
        assert _run_reader(native_reader(max_frame), pieces) == _run_reader(FrameReader(max_frame), pieces)


def _run_lent(decoder: FrameDecoder, pieces: list[bytes], lend: int) -> list[object]:
    """`_run` for the native decoder received into through its lent space (`buffer(n)`, as
    the io_uring backend's recv): each piece written `lend` bytes at a time at most."""
    seen: list[object] = []

    def take() -> None:
        while (f := decoder.next_frame()) is not NEED_DATA:
            assert type(f) is Frame
            seen.append(f)

    try:
        for piece in pieces:
            receive_lent(decoder, piece, lend, take)
            seen.append(decoder.buffered)
    except ProtocolError as exc:
        seen.append(("ProtocolError", str(exc)))
    return seen


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_FRAME_PARTS, min_size=1, max_size=8),
    st.lists(st.integers(0, 30_000), max_size=10),
    st.sampled_from([HEADER_SIZE, 100, 4096, 8 << 20]),
    st.sampled_from([1, 7, 4096, 1 << 16]),
)
def test_the_native_decoder_received_into_yields_what_feeding_it_does(
    parts: list[bytes], cuts: list[int], max_frame: int, lend: int
) -> None:
    """The space the native decoder lends to a receive: the same frames, bytes held and errors
    as the Python decoder fed the same pieces, whatever the receive's size."""
    pieces = cut_stream(parts, cuts)
    assert _run_lent(native_decoder(max_frame), pieces, lend) == _run(FrameDecoder(max_frame), pieces)


def test_the_native_decoder_lends_exactly_and_never_moves_under_a_view() -> None:
    """`buffer(n)` is n bytes; while its view is held nothing may move the buffer (feed and
    another buffer raise BufferError) yet frames are taken; received() counts at most what is
    lent; once released, a smaller receive gets a smaller allocation (a quiet connection's)."""
    import tracemalloc

    d = native_decoder()
    frame = encode_frame(1, 1, 9, b"!")
    view = d.buffer(len(frame) + 4)
    assert len(view) == len(frame) + 4
    with pytest.raises(BufferError):
        d.feed(b"x")
    with pytest.raises(BufferError):
        d.buffer(1)
    view[: len(frame)] = frame
    with pytest.raises(ValueError, match="lent"):
        d.received(len(frame) + 5)
    with pytest.raises(ValueError, match="lent"):
        d.received(-1)
    d.received(len(frame))
    assert d.next_frame() == Frame(1, 1, 0, 9, 0, 0, b"!")  # taken while the view is held
    assert d.next_frame() is NEED_DATA and d.buffered == 0
    view.release()
    with pytest.raises(ValueError, match="at least one"):
        d.buffer(0)
    tracemalloc.start()
    try:
        big = d.buffer(256 * 1024)
        big[:10] = frame[:10]
        big.release()
        d.received(10)
        assert d.next_frame() is NEED_DATA and d.buffered == 10
        held_big = tracemalloc.get_traced_memory()[0]
        d.buffer(4096).release()
        held_small = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held_big >= 256 * 1024 and held_small < 16 * 1024
    assert d.buffered == 10  # what was held moved with the allocation


def _receive(decoder: FrameDecoder, data: bytes, lend: int) -> None:
    """`data` received into the decoder's lent space, `lend` bytes at most (the io_uring recv)."""
    view = decoder.buffer(lend)  # type: ignore[attr-defined]
    view[: len(data)] = data
    view.release()
    decoder.received(len(data))  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 96 * 1024), st.integers(0, 255)), min_size=1, max_size=10),
    st.lists(st.integers(1, 300 * 1024), min_size=1, max_size=10),
    st.lists(st.booleans(), min_size=1, max_size=10),
)
def test_bodies_received_in_place_keep_their_bytes(
    sizes: list[tuple[int, int]], lends: list[int], keeps: list[bool]
) -> None:
    """A lending decoder's large bodies are read-only views of where they were received, not
    copies (native/frames.c, "Bodies in place"): whatever is received after them, in receives of
    any size, and whichever frames are kept or dropped meanwhile, a kept body keeps its bytes."""
    bodies = [random.Random(seed).randbytes(n) for n, seed in sizes]
    stream = b"".join(encode_frame(0, 0, i, body) for i, body in enumerate(bodies))
    d = native_decoder(1 << 20)
    kept: list[Frame] = []
    taken = pos = 0
    for i in itertools.count():
        lend = lends[i % len(lends)]
        _receive(d, stream[pos : pos + lend], lend)
        pos += lend
        while (f := d.next_frame()) is not NEED_DATA:
            assert isinstance(f, Frame) and f.correlation_id == taken
            if type(f.body) is memoryview:
                assert f.body.readonly and len(f.body) >= 8 * 1024
            if keeps[taken % len(keeps)]:
                kept.append(f)
            taken += 1
        if pos >= len(stream):
            break
    assert taken == len(bodies) and d.buffered == 0
    assert [bytes(f.body) for f in kept] == [bodies[f.correlation_id] for f in kept]


def test_an_ingest_stream_views_its_batches_in_two_allocations_that_take_turns() -> None:
    """64 KiB bodies received 256 KiB at a time, each receive's frames dropped before the one
    after next (an ingesting connection's appends, written at the end of the pass): every body
    is a view, none is copied, and the views of 40 receives are of two allocations only (nothing
    allocated in the steady state). A body viewed is read-only."""
    body = bytes(range(256)) * 256
    frame = encode_frame(0, 0, 7, body)
    stream = frame * 200
    d = native_decoder()
    owners: set[int] = set()
    previous: list[Frame] = []
    for at in range(0, 40 * 256 * 1024, 256 * 1024):
        _receive(d, stream[at : at + 256 * 1024], 256 * 1024)
        frames = []
        while (f := d.next_frame()) is not NEED_DATA:
            assert isinstance(f, Frame) and type(f.body) is memoryview and f.body == body
            owners.add(id(f.body.obj))
            frames.append(f)
        assert all(f.body == body for f in previous)  # the last receive's, still intact
        previous = frames
    assert len(owners) == 2
    with pytest.raises(TypeError):
        previous[0].body[0] = 1  # type: ignore[index]


def test_bytes_fed_after_a_viewed_body_leave_it_as_it_was() -> None:
    """`feed` into a lending decoder (bytes that came another way) moves what it holds to the
    front of other memory while a body views its own: the body keeps its bytes."""
    d = native_decoder()
    first, second = encode_frame(0, 0, 1, b"a" * 65536), encode_frame(0, 0, 2, b"b" * 65536)
    _receive(d, first + second[:1000], 256 * 1024)
    taken = d.next_frame()
    assert isinstance(taken, Frame) and type(taken.body) is memoryview
    assert d.next_frame() is NEED_DATA
    d.feed(second[1000:])
    after = d.next_frame()
    assert isinstance(after, Frame) and after.body == b"b" * 65536
    assert taken.body == b"a" * 65536


def test_small_bodies_are_copied() -> None:
    """Under 8 KiB, or under an eighth of the allocation received into, a body is bytes: a view
    would keep an allocation many times its size from being reused or freed."""
    d = native_decoder()
    small, mid = encode_frame(0, 0, 1, b"s" * 8000), encode_frame(0, 0, 2, b"m" * 20_000)
    _receive(d, small + mid, 256 * 1024)
    first, second = d.next_frame(), d.next_frame()
    assert isinstance(first, Frame) and type(first.body) is bytes  # under 8 KiB
    assert isinstance(second, Frame) and type(second.body) is bytes  # 20 KB of a ~290 KB allocation
    _receive(d, mid, 4096 * 8)
    third = d.next_frame()
    assert isinstance(third, Frame) and type(third.body) is memoryview and third.body == b"m" * 20_000


def test_the_native_decoder_lets_go_of_what_it_took() -> None:
    """A large frame taken leaves nothing held, and a partial frame after it is all it keeps."""
    d = native_decoder()
    big = encode_frame(1, 1, 1, bytes(1 << 20))
    d.feed(big + big[:10])
    frame = d.next_frame()
    assert isinstance(frame, Frame) and len(frame.body) == 1 << 20
    assert d.next_frame() is NEED_DATA
    assert d.buffered == 10
    d.feed(big[10:])
    assert isinstance(d.next_frame(), Frame)
    assert d.next_frame() is NEED_DATA and d.buffered == 0


def test_native_frames_are_frames() -> None:
    """What the C decoder builds is a `Frame` as any other: equal, frozen, its property working."""
    d = native_decoder()
    d.feed(encode_frame(4, 1, 77, b"body", 9, 3, 1))
    frame = d.next_frame()
    assert frame == Frame(4, 1, 1, 77, 9, 3, b"body")
    assert frame.is_response
    with pytest.raises(AttributeError):
        frame.body = b"other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "raw",
    [
        encode_frame(4, 1, 7, b"x" * 30) + b"\x00\x00\x00\x14GET / HTTP/1.1\r\n\r\n",
        encode_frame(4, 1, 7, b"") + b"\x00\x00\x00\x14R\x09" + bytes(18),
        encode_frame(4, 1, 7, b"y") + struct.pack(">IBBHHH", 20, 0x52, 1, 0, 1, 0x80) + bytes(12),
        encode_frame(4, 1, 7, b"z" * 3) + struct.pack(">IBB", 4, 0x52, 1) + bytes(18),
    ],
    ids=["magic", "version", "flags", "short"],
)
def test_the_native_decoder_fails_where_the_python_one_does(raw: bytes) -> None:
    """Cut at every byte: the error comes after the same piece (a bad magic or version as soon
    as its byte is in, the rest with the whole header)."""
    for cut in range(1, len(raw)):
        pieces = [raw[:cut], raw[cut:]]
        assert _run(native_decoder(), pieces) == _run(FrameDecoder(), pieces), cut


def test_the_native_reader_never_moves_its_buffer_under_a_view() -> None:
    """A view still held (a transport that did not release it) pins the buffer: growing raises
    BufferError, and received() cannot count more than the space there is."""
    reader = native_reader()
    frame = encode_frame(1, 1, 9, b"!")
    view = reader.buffer()
    with pytest.raises(BufferError):
        reader.buffer(len(view) + 1)
    with pytest.raises(BufferError):
        reader.feed(bytes(len(view) + 1))
    view[:4] = frame[:4]
    free = len(view)
    view.release()
    with pytest.raises(ValueError, match="free"):
        reader.received(free + 1)
    with pytest.raises(ValueError, match="free"):
        reader.received(-1)
    reader.received(4)
    assert reader.buffered == 4
    big = reader.buffer(free + 1)  # released: it grows, and keeps what it held
    assert len(big) >= free + 1
    big.release()
    reader.feed(frame[4:])
    assert reader.next_frame() == Frame(1, 1, 0, 9, 0, 0, b"!")
