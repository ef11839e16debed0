"""The broker as a process: round trips, long polls, crashes, bad clients, many clients, shutdown."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
import time

import pytest

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import Record, decode_batches, encode_batch
from ringlog_proto.frames import encode_frame


def test_round_trip_across_partitions_with_keys_headers_timestamps(wire: Wire) -> None:
    tid = wire.create_topic("orders", 4)
    sent: dict[int, list[Record]] = {p: [] for p in range(4)}
    for i in range(40):
        p = i % 4
        rec = Record(
            f"v{i}".encode(), key=f"k{i}".encode(), headers=[("h", b"x")], timestamp=1_700_000_000_000 + i
        )
        resp = wire.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 1000, encode_batch([rec])))
        assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE
        assert resp.base_offset == len(sent[p])
        sent[p].append(rec)
    for p in range(4):
        got = wire.fetch_all(tid, p)
        assert [(r.key, r.value, r.headers, r.timestamp) for r in got] == [
            (r.key, r.value, r.headers, r.timestamp) for r in sent[p]
        ]
        assert [r.offset for r in got] == list(range(10))


def test_long_poll_wakes_on_new_data_not_the_deadline(broker: BrokerProcess, wire: Wire) -> None:
    tid = wire.create_topic("events")
    result: dict[str, object] = {}

    def poll() -> None:
        w = Wire(broker.port)
        t0 = time.monotonic()
        result["resp"] = w.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, max_wait_ms=10_000))
        result["elapsed"] = time.monotonic() - t0
        w.close()

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([b"wake"])))
    t.join(15)
    resp = result["resp"]
    assert isinstance(resp, m.FetchResponse)
    assert [r.value for r in decode_batches(resp.records)] == [b"wake"]
    assert 0.25 < result["elapsed"] < 2.0  # type: ignore[operator]


def test_a_long_poll_on_a_topic_deleted_meanwhile_is_answered_its_error_at_once(
    broker: BrokerProcess, wire: Wire
) -> None:
    """A parked fetch is woken when its partition closes, runs again on the request it decoded,
    and answers what the dispatch would answer a new one: the topic is unknown, not a failure
    of the wake (no traceback in the log, the connection kept)."""
    tid = wire.create_topic("doomed")
    w = Wire(broker.port)
    result: dict[str, object] = {}

    def poll() -> None:
        t0 = time.monotonic()
        result["resp"] = w.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, max_wait_ms=10_000))
        result["elapsed"] = time.monotonic() - t0

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    assert wire.rpc(m.DeleteTopicRequest("doomed")).error == m.ErrorCode.NONE
    t.join(15)
    resp = result["resp"]
    assert isinstance(resp, m.FetchResponse), resp
    assert resp.error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, resp
    assert result["elapsed"] < 5.0  # type: ignore[operator]
    assert isinstance(w.rpc(m.MetadataRequest()), m.MetadataResponse)  # the same connection serves on
    w.close()
    log_text = broker.log_path.read_text()
    assert "parked request failed" not in log_text and "Traceback" not in log_text


def test_long_poll_answers_empty_at_its_deadline(wire: Wire) -> None:
    tid = wire.create_topic("quiet")
    t0 = time.monotonic()
    resp = wire.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, max_wait_ms=400))
    assert isinstance(resp, m.FetchResponse) and resp.records == b"" and resp.error == m.ErrorCode.NONE
    assert 0.35 < time.monotonic() - t0 < 2.0


def test_replies_keep_request_order_behind_a_long_poll(wire: Wire) -> None:
    tid = wire.create_topic("ordered")
    first = wire.send(m.FetchRequest(tid, 0, 0, 1 << 20, max_wait_ms=300))
    second = wire.send(m.MetadataRequest())
    third = wire.send(m.ApiVersionsRequest("t"))
    ids = [wire.recv_frame().correlation_id for _ in range(3)]
    assert ids == [first, second, third]


@pytest.mark.parametrize("acks", [m.Acks.WRITTEN, m.Acks.DURABLE])
def test_kill_9_during_a_produce_stream_loses_no_acknowledged_record(
    broker: BrokerProcess, acks: int
) -> None:
    w = Wire(broker.port)
    tid = w.create_topic("stream", 2)
    acked: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
    stop = threading.Event()

    def produce() -> None:
        i = 0
        try:
            while not stop.is_set():
                p = i % 2
                value = f"record-{i}".encode()
                resp = w.rpc(m.ProduceRequest(tid, p, acks, 5000, encode_batch([value] * 3)))
                assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE
                acked.extend((p, resp.base_offset + k, value) for k in range(3))
                i += 1
        except (ConnectionError, OSError):
            pass

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(0.7)
    broker.kill()
    stop.set()
    t.join(10)
    w.close()
    assert len(acked) > 30, "the stream was running when the broker died"
    broker.start()
    w = Wire(broker.port)
    stored = {p: {r.offset: r.value for r in w.fetch_all(tid, p)} for p in range(2)}
    for p, offset, value in acked:
        assert stored[p].get(offset) == value, f"acknowledged record {p}/{offset} lost"
    w.close()


def flush_counters(w: Wire) -> tuple[int, int]:
    """(flushes, durable produces they answered), summed over the cores, from STATS."""
    resp = w.rpc(m.StatsRequest())
    assert isinstance(resp, m.StatsResponse) and resp.error == m.ErrorCode.NONE, resp
    snaps = json.loads(resp.stats_json)["snapshots"]
    return sum(s["flushes"] for s in snaps), sum(s["flush_waiters"] for s in snaps)


def test_group_commit_one_flush_answers_many_pipelined_durable_produces(wire: Wire) -> None:
    """64 acks=durable produces sent back to back: every answer comes after an fdatasync covering
    it, in order, and far fewer flushes than produces ran (one per partition per loop turn)."""
    tid = wire.create_topic("durable")
    n = 64
    frames = [
        b"".join(
            m.encode_request(
                m.ProduceRequest(tid, 0, m.Acks.DURABLE, 5000, encode_batch([b"v%d" % i])), i + 1
            )
        )
        for i in range(n)
    ]
    wire.sock.sendall(b"".join(frames))
    offsets = []
    for i in range(n):
        frame = wire.recv_frame()
        assert frame.correlation_id == i + 1
        resp = m.decode_response(frame)
        assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
        offsets.append(resp.base_offset)
    assert offsets == list(range(n))
    deadline = time.monotonic() + 5  # other cores' counters are published about once a second
    while (counters := flush_counters(wire))[1] < n and time.monotonic() < deadline:
        time.sleep(0.2)
    flushes, answered = counters
    assert answered == n, counters
    assert 1 <= flushes <= n // 4, f"{flushes} flushes for {n} pipelined durable produces"


def test_a_thousand_pipelined_requests_in_large_chunks_are_stored_intact(wire: Wire) -> None:
    """Frames arriving faster than they are answered, many per read and split across reads, some
    answered at once (ApiVersions) and some after a write (Produce): every batch is stored byte
    for byte. The backends answer while still reading and grow their read buffers as traffic
    grows: neither may lose, or read from the wrong place, bytes already received."""
    tid = wire.create_topic("pipelined")
    n = 1000
    values = [bytes([i % 251]) * (50 + i % 300) for i in range(n)]

    def request(i: int) -> m.Request:
        if i % 3 == 0:
            return m.ApiVersionsRequest("pipelining-test")
        return m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([values[i]]))

    stream = b"".join(b"".join(m.encode_request(request(i), i + 1)) for i in range(n))
    sender = threading.Thread(target=wire.sock.sendall, args=(stream,))
    sender.start()
    stored = []
    for i in range(n):
        frame = wire.recv_frame()
        assert frame.correlation_id == i + 1
        resp = m.decode_response(frame)
        assert resp.error == m.ErrorCode.NONE, (i, resp)
        if i % 3:
            stored.append(values[i])
    sender.join()
    assert [r.value for r in wire.fetch_all(tid, 0)] == stored


def test_topics_and_group_offsets_survive_a_restart(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    tid = w.create_topic("kept", 3)
    for _ in range(17):  # a commit may not pass the partition's end
        assert (
            w.rpc(m.ProduceRequest(tid, 2, m.Acks.WRITTEN, 5000, encode_batch([b"r"]))).error
            == m.ErrorCode.NONE
        )
    assert w.rpc(m.OffsetCommitRequest(tid, 2, "g1", 17, "m")).error == m.ErrorCode.NONE
    w.close()
    assert broker.stop() == 0
    broker.start()
    w = Wire(broker.port)
    meta = w.rpc(m.MetadataRequest(("kept",)))
    assert isinstance(meta, m.MetadataResponse)
    assert meta.topics[0].topic_id == tid and len(meta.topics[0].partitions) == 3
    got = w.rpc(m.OffsetFetchRequest(tid, 2, "g1"))
    assert isinstance(got, m.OffsetFetchResponse) and (got.offset, got.metadata) == (17, "m")
    w.close()


def test_bad_input_gets_clear_errors_and_the_broker_keeps_serving(broker: BrokerProcess, wire: Wire) -> None:
    tid = wire.create_topic("t")
    # Answerable: the connection stays open after each.
    assert (
        wire.rpc(m.ProduceRequest(tid, 5, 1, 1000, encode_batch([b"x"]))).error
        == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert wire.rpc(m.FetchRequest(999, 0, 0)).error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    bad_crc = bytearray(encode_batch([b"payload"]))
    bad_crc[-1] ^= 0xFF
    resp = wire.rpc(m.ProduceRequest(tid, 0, 1, 1000, bytes(bad_crc)))
    assert resp.error == m.ErrorCode.CORRUPT_MESSAGE and "crc" in resp.message
    huge = encode_batch([b"x" * (2 * 1024 * 1024)])
    assert wire.rpc(m.ProduceRequest(tid, 0, 1, 1000, huge)).error == m.ErrorCode.MESSAGE_TOO_LARGE
    assert wire.rpc(m.FetchRequest(tid, 0, 5)).error == m.ErrorCode.OFFSET_OUT_OF_RANGE
    assert wire.rpc(m.CreateTopicRequest("bad/name", 1)).error == m.ErrorCode.INVALID_TOPIC
    assert wire.rpc(m.CreateTopicRequest("t", 1)).error == m.ErrorCode.TOPIC_ALREADY_EXISTS
    metadata_v = m.CURRENT_VERSIONS[m.ApiKey.METADATA]  # a body whose array is too long:
    wire.sock.sendall(encode_frame(m.ApiKey.METADATA, metadata_v, 77, b"\x00\x00\x00\x05ab"))
    resp = wire.recv()
    assert resp.error == m.ErrorCode.INVALID_REQUEST
    wire.sock.sendall(encode_frame(42, 1, 78))
    frame = wire.recv_frame()
    assert (frame.api_key, frame.correlation_id) == (42, 78)
    assert m.decode_response(frame).error == m.ErrorCode.UNSUPPORTED_VERSION
    # Not answerable: only that connection closes.
    for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", struct.pack(">IBB", 1 << 31, 0x52, 1) + bytes(18)):
        g = Wire(broker.port)
        g.sock.sendall(garbage)
        assert g.closed_by_peer()
        g.close()
    # A client that vanishes mid-frame.
    half = b"".join(m.encode_request(m.ProduceRequest(tid, 0, 1, 1000, encode_batch([b"y" * 1000])), 1))
    v = Wire(broker.port)
    v.sock.sendall(half[: len(half) // 2])
    v.close()
    # Everyone else is still served, and nothing half-sent was stored.
    assert wire.rpc(m.ProduceRequest(tid, 0, 1, 1000, encode_batch([b"ok"]))).error == m.ErrorCode.NONE
    assert [r.value for r in wire.fetch_all(tid, 0)] == [b"ok"]
    assert broker.wait_for_log("went away mid-frame")


def test_two_hundred_concurrent_connections(broker: BrokerProcess, wire: Wire) -> None:
    tid = wire.create_topic("many", 8)
    conns = [Wire(broker.port) for _ in range(200)]
    for i, c in enumerate(conns):
        c.send(m.ProduceRequest(tid, i % 8, m.Acks.WRITTEN, 5000, encode_batch([f"c{i}".encode()])))
    for c in conns:
        resp = c.recv()
        assert resp.error == m.ErrorCode.NONE
    for c in conns:
        c.close()
    values = sorted(r.value for p in range(8) for r in wire.fetch_all(tid, p))
    assert values == sorted(f"c{i}".encode() for i in range(200))


def test_sigterm_answers_parked_long_polls_and_exits_zero(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    tid = w.create_topic("bye")
    w.send(m.FetchRequest(tid, 0, 0, 1 << 20, max_wait_ms=30_000))
    time.sleep(0.2)
    t0 = time.monotonic()
    assert broker.stop() == 0
    resp = w.recv()
    assert isinstance(resp, m.FetchResponse) and resp.records == b""
    assert time.monotonic() - t0 < 5
    assert "stopped cleanly" in broker.log()
    w.close()


def test_idempotent_retry_is_stored_once_even_across_a_restart(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    tid = w.create_topic("idem")
    batch = encode_batch([b"a", b"b"], producer_id=42, producer_epoch=0, base_sequence=0)
    first = w.rpc(m.ProduceRequest(tid, 0, 1, 1000, batch))
    assert isinstance(first, m.ProduceResponse) and first.base_offset == 0
    w.close()
    assert broker.stop() == 0
    broker.start()
    w = Wire(broker.port)
    again = w.rpc(m.ProduceRequest(tid, 0, 1, 1000, batch))
    assert isinstance(again, m.ProduceResponse) and again.base_offset == 0
    gap = w.rpc(
        m.ProduceRequest(
            tid, 0, 1, 1000, encode_batch([b"c"], producer_id=42, producer_epoch=0, base_sequence=5)
        )
    )
    assert gap.error == m.ErrorCode.OUT_OF_ORDER_SEQUENCE
    nxt = w.rpc(
        m.ProduceRequest(
            tid, 0, 1, 1000, encode_batch([b"c"], producer_id=42, producer_epoch=0, base_sequence=2)
        )
    )
    assert isinstance(nxt, m.ProduceResponse) and nxt.base_offset == 2
    assert [r.value for r in w.fetch_all(tid, 0)] == [b"a", b"b", b"c"]
    w.close()


def test_port_in_use_is_a_clear_error(broker: BrokerProcess, tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker.cli",
            "serve",
            "--data-dir",
            str(tmp_path / "d2"),
            "--port",
            str(broker.port),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 1
    assert "cannot serve" in out.stderr and "Traceback" not in out.stderr


def test_live_fuzz_random_bodies_and_bytes_leave_the_broker_serving(
    broker: BrokerProcess, wire: Wire
) -> None:
    """Valid headers with random bodies for every api, then raw random bytes: each answered with
    an error or closed, and the broker serves correctly afterwards."""
    import random

    rng = random.Random(1234)
    tid = wire.create_topic("fuzz", 2)
    fuzz = Wire(broker.port)
    for i in range(300):
        api = rng.choice(sorted(m.REQUEST_TYPES))
        body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 80)))
        fuzz.sock.sendall(encode_frame(api, 1, i, body, topic_id=tid, partition=rng.randrange(3)))
        frame = fuzz.recv_frame()
        assert frame.correlation_id == i and frame.is_response
        m.decode_response(frame)  # whatever it says, it is a well-formed answer
    fuzz.close()
    for _ in range(20):
        g = Wire(broker.port)
        g.sock.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 200))))
        g.sock.shutdown(1)
        g.closed_by_peer()
        g.close()
    resp = wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([b"still here"])))
    assert resp.error == m.ErrorCode.NONE
    assert b"still here" in [r.value for r in wire.fetch_all(tid, 0)]
    assert "Traceback" not in broker.log()
