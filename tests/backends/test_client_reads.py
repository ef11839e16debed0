"""Where a client connection's bytes are read to, on each backend, served in this process.

- Once the first bytes chose the protocol, both of ours and Kafka's get a decoder that lends its
  space (native/frames.c), and the backend reads into it: on uvloop the transport is handed the
  decoder's space (`get_buffer`), as the io_uring backend's recv is.
- Large requests (1 MiB produces, ours and Kafka's) are stored whole and read back the same.
- A read that fills what was lent asks for more next time (up to the backend's maximum), and a
  connection quiet for a sweep asks for the minimum again and its decoder lets go of the large
  allocation: thousands of idle connections cost little.
"""

from __future__ import annotations

import datetime
import socket
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from inprocess import BACKENDS, Post, on_loop, served
from kio.schema.produce.v8 import request as produce_v8
from kio.static.primitive import i16, i32

from broker.backends.backend_core import BackendCore
from broker.kafka.codec import NATIVE_KAFKA_DECODER
from labkit.brokerproc import Wire
from labkit.kafka_requests import frame, read_response, read_sized
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import LENDING_DECODER

pytestmark = pytest.mark.skipif(
    LENDING_DECODER is None or NATIVE_KAFKA_DECODER is None,
    reason="native._frames is not built: no decoder lends",
)

MIB = 1 << 20


def the_connection(server: BackendCore) -> Any:
    """The one client connection the server has (a test's)."""
    conns = [c for c in server.connections if not c.from_peer]
    assert len(conns) == 1, conns
    return conns[0]


def read_size(conn: Any) -> int:
    return conn.read_size if hasattr(conn, "read_size") else conn.recv_size


def kafka_produce(corr: int, records: bytes) -> bytes:
    body = produce_v8.ProduceRequest(
        transactional_id=None,
        acks=i16(1),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            produce_v8.TopicProduceData(
                name="t", partition_data=(produce_v8.PartitionProduceData(index=i32(0), records=records),)
            ),
        ),
    )
    return frame(0, 8, corr, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_protocols_are_read_into_their_decoders_space(backend: str, tmp_path: Path) -> None:
    big = [bytes([i]) * (MIB - 200) for i in range(3)]

    def client(port: int, server: BackendCore, post: Post) -> None:
        wire = Wire(port)
        tid = wire.create_topic("t", 1)
        for value in big[:2]:
            resp = wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([value])))
            assert resp.error == m.ErrorCode.NONE, resp
        conn = the_connection(server)
        assert on_loop(post, lambda: type(conn.decoder)) is LENDING_DECODER
        assert on_loop(post, lambda: read_size(conn)) == 256 * 1024  # grown by full reads
        wire.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            time.sleep(0.2)  # the Wire's connection gone from the server's list
            s.sendall(kafka_produce(7, encode_batch([big[2]])))
            raw = read_sized(s)
            corr, answer = read_response(0, 8, struct.pack(">i", len(raw)) + raw)
            assert corr == 7
            assert answer.responses[0].partition_responses[0].error_code == 0
            assert on_loop(post, lambda: type(the_connection(server).decoder)) is NATIVE_KAFKA_DECODER
        wire = Wire(port)
        try:
            got = [r.value for r in wire.fetch_all(tid, 0)]
        finally:
            wire.close()
        assert got == big

    served(backend, tmp_path, client)


def test_a_quiet_uvloop_connection_reads_small_again_and_its_decoder_lets_go(tmp_path: Path) -> None:
    """After a 1 MiB produce the connection's reads are 256 KiB and its decoder holds about that
    between them; one sweep after it went quiet, its reads ask for 4 KiB again and the decoder's
    allocation shrinks to that (the io_uring backend's recv buffers: the same rule). The
    decoder's memory is PyMem's, which tracemalloc counts."""
    from broker.backends.aio import READ_BYTES_MAX, READ_BYTES_MIN

    def client(port: int, server: BackendCore, post: Post) -> None:
        wire = Wire(port)
        tid = wire.create_topic("t", 1)
        resp = wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([b"x" * (MIB - 200)])))
        assert resp.error == m.ErrorCode.NONE
        conn = the_connection(server)
        assert on_loop(post, lambda: conn.read_size) == READ_BYTES_MAX

        def sweep_after_quiet() -> tuple[int, int]:
            before = tracemalloc.get_traced_memory()[0]
            conn.budget.last_active = time.monotonic() - server.admission.sweep_s - 1
            server.after_sweep()
            return before, tracemalloc.get_traced_memory()[0]

        before, after = on_loop(post, sweep_after_quiet)
        assert before - after >= READ_BYTES_MAX - 2 * READ_BYTES_MIN, (before, after)
        assert on_loop(post, lambda: conn.read_size) == READ_BYTES_MIN
        resp = wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([b"small"])))
        assert resp.error == m.ErrorCode.NONE  # read into the small space: the next request still reads
        assert [r.value for r in wire.fetch_all(tid, 0)] == [b"x" * (MIB - 200), b"small"]
        wire.close()

    tracemalloc.start()
    try:
        served("uvloop", tmp_path, client)
    finally:
        tracemalloc.stop()
