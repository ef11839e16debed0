"""Kafka's decoder in C (native/frames.c `KafkaDecoder`) is its Python twin (`KafkaFrameDecoder`),
and lends its space to a receive.

- For any stream, cut anywhere, fed or received into through its lent space: the same requests
  (and, once a SaslHandshake v0 set `auth.raw_tokens`, the same bare tokens), the same bytes
  held after every piece and the same ProtocolError at the same point.
- A large request received into its space is a read-only view of where it arrived, whatever
  arrives after it; the readers of a request's data take a view as they take bytes.
- A real `broker serve` on each backend, where connections use it: librdkafka's produce requests
  of hundreds of KB are stored and read back whole, and a Produce v2 over 8 KiB (a view on
  io_uring) gets its UNSUPPORTED_VERSION answer.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stream_pieces import cut_stream, receive_lent

from broker.kafka.codec import (
    NATIVE_KAFKA_DECODER,
    RAW_TOKEN_MAX_BYTES,
    KafkaFrameDecoder,
    KafkaRequest,
    RawSaslToken,
    kafka_decoder,
    produce_v0_topics,
)
from broker.kafka.leader_epoch import _read_v0
from broker.security.session import ConnectionAuth
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import read_sized
from ringlog_proto.frames import NEED_DATA, ProtocolError

NATIVE = pytest.mark.skipif(
    NATIVE_KAFKA_DECODER is None, reason="native._frames is not built (pip install -e .)"
)


def native(max_frame_bytes: int, auth: ConnectionAuth | None = None) -> KafkaFrameDecoder:
    assert NATIVE_KAFKA_DECODER is not None
    return NATIVE_KAFKA_DECODER(max_frame_bytes, auth)


def request(api_key: int, version: int, corr: int, rest: bytes) -> bytes:
    """A Kafka request frame: size, the fixed header fields, then anything."""
    return struct.pack(">ihhi", 8 + len(rest), api_key, version, corr) + rest


def _take(decoder: KafkaFrameDecoder, seen: list[object], switch_after: int | None) -> None:
    """Every request (or token) the decoder yields now; once `switch_after` requests have come,
    what comes next is bare tokens (as a SaslHandshake v0's answer sets it)."""
    auth = decoder.auth
    assert auth is not None
    while True:
        if sum(type(s) is KafkaRequest for s in seen) == switch_after:
            auth.raw_tokens = True
        got = decoder.next_frame()
        if got is NEED_DATA:
            return
        assert type(got) in (KafkaRequest, RawSaslToken)
        seen.append(got)


def _run(decoder: KafkaFrameDecoder, pieces: list[bytes], switch_after: int | None) -> list[object]:
    """Everything a decoder shows for a stream fed in `pieces`: what it yields, the bytes it holds
    after each piece, and the error that ends the stream (type and message)."""
    seen: list[object] = []
    try:
        for piece in pieces:
            decoder.feed(piece)
            _take(decoder, seen, switch_after)
            seen.append(decoder.buffered)
    except ProtocolError as exc:
        seen.append(("ProtocolError", str(exc)))
    return seen


def _run_lent(
    decoder: KafkaFrameDecoder, pieces: list[bytes], lend: int, switch_after: int | None
) -> list[object]:
    """`_run` for the native decoder received into through its lent space (`buffer(n)`, as the
    io_uring backend's recv), `lend` bytes at a time at most."""
    seen: list[object] = []
    try:
        for piece in pieces:
            receive_lent(decoder, piece, lend, lambda: _take(decoder, seen, switch_after))
            seen.append(decoder.buffered)
    except ProtocolError as exc:
        seen.append(("ProtocolError", str(exc)))
    return seen


_PARTS = st.one_of(
    # well-formed requests of any api, version and correlation id, bodies of any size (large
    # ones are views when received into the lent space)
    st.builds(
        request,
        st.integers(0, 0x7FFF),
        st.integers(0, 0x7FFF),
        st.integers(-(1 << 31), (1 << 31) - 1),
        st.one_of(st.binary(max_size=300), st.binary(min_size=9000, max_size=20000)),
    ),
    # a negative api key or version; sizes short, negative or past any limit
    st.builds(
        request, st.integers(-(1 << 15), -1), st.integers(0, 9), st.integers(0, 9), st.binary(max_size=8)
    ),
    st.builds(
        request, st.integers(0, 9), st.integers(-(1 << 15), -1), st.integers(0, 9), st.binary(max_size=8)
    ),
    st.builds(
        lambda n, rest: struct.pack(">i", n) + rest, st.integers(-(1 << 31), 7), st.binary(max_size=12)
    ),
    # bare tokens (after the switch) and bytes of nothing in particular
    st.builds(lambda token: struct.pack(">i", len(token)) + token, st.binary(max_size=200)),
    st.binary(max_size=40),
)


@NATIVE
@settings(max_examples=300, deadline=None)
@given(
    st.lists(_PARTS, min_size=1, max_size=8),
    st.lists(st.integers(0, 60_000), max_size=10),
    st.sampled_from([12, 100, 4096, 8 << 20]),
    st.sampled_from([None, 0, 1, 2]),
)
def test_the_native_decoder_is_the_python_one(
    parts: list[bytes], cuts: list[int], max_frame: int, switch_after: int | None
) -> None:
    pieces = cut_stream(parts, cuts)
    ours = _run(native(max_frame, ConnectionAuth("c")), pieces, switch_after)
    assert ours == _run(KafkaFrameDecoder(max_frame, ConnectionAuth("c")), pieces, switch_after)


@NATIVE
@settings(max_examples=300, deadline=None)
@given(
    st.lists(_PARTS, min_size=1, max_size=8),
    st.lists(st.integers(0, 60_000), max_size=10),
    st.sampled_from([12, 100, 4096, 8 << 20]),
    st.sampled_from([1, 7, 4096, 1 << 16]),
    st.sampled_from([None, 0, 1]),
)
def test_received_into_it_yields_what_feeding_the_python_one_does(
    parts: list[bytes], cuts: list[int], max_frame: int, lend: int, switch_after: int | None
) -> None:
    pieces = cut_stream(parts, cuts)
    lent = _run_lent(native(max_frame, ConnectionAuth("c")), pieces, lend, switch_after)
    assert lent == _run(KafkaFrameDecoder(max_frame, ConnectionAuth("c")), pieces, switch_after)


@NATIVE
def test_a_large_request_is_a_view_of_where_it_arrived_and_keeps_its_bytes() -> None:
    """Its `data` is read-only, is the bytes after the size, and stays them while the decoder
    goes on receiving (the allocation it views is left to it); a small request is bytes."""
    d = native(8 << 20, ConnectionAuth("c"))
    big = [request(0, 9, i, bytes([i]) * (100_000 + i)) for i in range(6)]
    small = request(18, 3, 99, b"x" * 20)
    stream = b"".join(big[:3]) + small + b"".join(big[3:])
    kept: list[KafkaRequest] = []
    for pos in range(0, len(stream), 65536):
        piece = stream[pos : pos + 65536]
        view = d.buffer(len(piece))  # type: ignore[attr-defined]
        view[:] = piece
        view.release()
        d.received(len(piece))  # type: ignore[attr-defined]
        while (got := d.next_frame()) is not NEED_DATA:
            assert isinstance(got, KafkaRequest)
            kept.append(got)
    assert [r.correlation_id for r in kept] == [0, 1, 2, 99, 3, 4, 5]
    for r in kept:
        if r.correlation_id == 99:
            assert type(r.data) is bytes and r.data == small[4:]
            continue
        assert type(r.data) is memoryview and r.data.readonly
        assert r.data == big[r.correlation_id][4:]
        with pytest.raises(TypeError):
            r.data[20] = 0  # type: ignore[index]


@NATIVE
def test_connections_get_the_native_decoder_and_it_reads_the_connections_auth() -> None:
    """What the Kafka adapter hands a connection is the C twin, and it follows the auth it was
    given: once a SaslHandshake v0 set raw_tokens, a bare token (bounded as in Python) comes next."""
    auth = ConnectionAuth("c")
    d = kafka_decoder(1 << 20, auth)
    assert type(d) is NATIVE_KAFKA_DECODER and d.auth is auth
    d.feed(request(17, 0, 1, b"\0\5PLAIN") + struct.pack(">i", 5) + b"\0a\0b")
    assert isinstance(d.next_frame(), KafkaRequest)
    auth.raw_tokens = True  # the handshake's answer sets it
    assert d.next_frame() is NEED_DATA  # four of the token's five bytes
    d.feed(b"c")
    assert d.next_frame() == RawSaslToken(b"\0a\0bc")
    d.feed(struct.pack(">i", RAW_TOKEN_MAX_BYTES + 1))
    with pytest.raises(ProtocolError, match=f"SASL token of {RAW_TOKEN_MAX_BYTES + 1} bytes"):
        d.next_frame()


def test_the_readers_of_a_requests_bytes_take_a_view() -> None:
    """Produce v0-2 (refused) and OffsetForLeaderEpoch v0 read their topics themselves: a large
    request's data is a memoryview, and a topic's name comes out the same."""
    name = "tópico".encode()
    produce = struct.pack(">hhi", 2, 0, 7) + struct.pack(">h", 1) + b"t"  # api, version, corr, client
    produce += struct.pack(">hii", 1, 1000, 1) + struct.pack(">h", len(name)) + name
    produce += struct.pack(">i", 1) + struct.pack(">ii", 3, 9000) + bytes(9000)
    assert produce_v0_topics(memoryview(produce)) == produce_v0_topics(produce) == [("tópico", [3])]
    epochs = struct.pack(">hhi", 23, 0, 7) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1)
    epochs += struct.pack(">h", len(name)) + name + struct.pack(">i", 1000)
    epochs += b"".join(struct.pack(">ii", p, 0) for p in range(1000))
    assert _read_v0(memoryview(epochs)) == _read_v0(epochs)
    assert _read_v0(memoryview(epochs))[0][0] == "tópico"


# ----------------------------------------------------------------------------- a real broker


@pytest.fixture(scope="module", params=["uvloop", "io_uring"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp: Path = tmp_path_factory.mktemp(f"kdecoder-{request.param}")
    proc = BrokerProcess(tmp / "data", tmp / "broker.log", backend=request.param).start()
    wire = Wire(proc.port)
    try:
        wire.create_topic("big", 1)
    finally:
        wire.close()
    yield proc
    assert proc.stop() == 0, proc.log()


def test_librdkafka_produce_requests_of_hundreds_of_kb_are_stored_whole(server: BrokerProcess) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    bootstrap = f"127.0.0.1:{server.port}"
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20, "acks": "all"}
    )
    values = [(i.to_bytes(4, "big") * 256) for i in range(3000)]  # 1 KiB each, ~3 MB in all
    for v in values:
        producer.produce("big", v)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "g",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([confluent_kafka.TopicPartition("big", 0, 0)])
    got: list[bytes] = []
    try:
        while len(got) < len(values):
            msg = consumer.poll(10)
            assert msg is not None, f"{len(got)} of {len(values)} read back"
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    finally:
        consumer.close()
    assert got == values
    assert "protocol error" not in server.log()


def test_a_large_produce_v2_is_answered_unsupported(server: BrokerProcess) -> None:
    """Kafka's refusal of Produce v0-2 (broker/kafka/produce.py) reads the request itself."""
    name = b"big"
    body = struct.pack(">hhi", 0, 2, 41) + struct.pack(">h", 1) + b"t"
    body += struct.pack(">hii", 1, 1000, 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">i", 1) + struct.pack(">ii", 0, 20_000) + bytes(20_000)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        answer = read_sized(s)
    corr, topics, n = struct.unpack_from(">iih", answer)
    assert (corr, topics, answer[10 : 10 + n]) == (41, 1, name)
    partitions, index, error = struct.unpack_from(">iih", answer, 10 + n)
    assert (partitions, index, error) == (1, 0, 35)  # UNSUPPORTED_VERSION
