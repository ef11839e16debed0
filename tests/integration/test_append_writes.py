"""io_uring's `--append-writes`: ring, inline and auto (small appends inline, large ones on the
ring) each store what they acknowledge, in order, with small and large batches interleaved and
several in flight, and the data survives a restart; auto gathers the appends of requests received
together into one write (a server in this process, its writes counted)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from inprocess import serve_with_wire

import broker.backends.primitives as primitives_mod
import broker.backends.uring as uring_mod
from broker.storage.fileio import Write, WriteError
from labkit.brokerproc import BrokerProcess, Wire, values_after_restart
from native.constants import APPEND_INLINE_BYTES_MAX
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

SMALL = b"s" * 100
LARGE = b"L" * (APPEND_INLINE_BYTES_MAX + 1)  # one record: its batch is over the inline limit
MAX_BATCH_BYTES = 2 * APPEND_INLINE_BYTES_MAX  # the default (1 MiB) would refuse LARGE


@pytest.mark.parametrize("mode", ["auto", "ring", "inline"])
def test_append_writes_store_what_they_acknowledge(tmp_path: Path, mode: str) -> None:
    broker = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        extra=("--append-writes", mode, "--max-batch-bytes", str(MAX_BATCH_BYTES)),
        backend="io_uring",
    ).start()
    try:
        broker.skip_if_fell_back()
        w = Wire(broker.port)
        tid = w.create_topic("a", 1)
        values = [LARGE if i % 3 == 1 else SMALL + bytes([i]) for i in range(9)]
        for v in values:  # all sent before any answer is read: several appends in flight
            w.send(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([v])))
        offsets = []
        for _ in values:
            resp = w.recv()
            assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE
            offsets.append(resp.base_offset)
        assert offsets == list(range(len(values)))
        assert [r.value for r in w.fetch_all(tid, 0)] == values
        w.close()
        assert values_after_restart(broker, tid) == values
    finally:
        broker.stop()


def _send_together(w: Wire, tid: int, batches: list[bytes]) -> list[m.Response]:
    """One produce per batch, all in one send (the broker receives them together); the replies."""
    frames = [
        b"".join(m.encode_request(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, b), 100 + i))
        for i, b in enumerate(batches)
    ]
    w.sock.sendall(b"".join(frames))
    return [w.recv() for _ in batches]


def test_pipelined_appends_go_out_in_one_write_and_a_lone_one_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto (the default): the appends of requests that arrived together are gathered into one
    pwritev at the end of the pass (`appends_now` waits while more of the connection's bytes
    follow); a request that arrives alone is written at once. Every reply is right and in
    order either way, and the log holds the values in the order sent."""
    writes: list[list[int]] = []  # the store write lengths of each write call, in order

    def counting(real):  # type: ignore[no-untyped-def]
        def run_ops(io, ops):  # type: ignore[no-untyped-def]
            writes.append([op.length for op in ops if isinstance(op, Write)])
            return real(io, ops)

        return run_ops

    monkeypatch.setattr(uring_mod, "run_ops", counting(uring_mod.run_ops))
    monkeypatch.setattr(primitives_mod, "run_ops", counting(primitives_mod.run_ops))
    burst = [SMALL + bytes([i]) for i in range(8)]
    batches = [encode_batch([v]) for v in burst]
    seen: dict[str, object] = {}

    def client(w: Wire) -> None:
        tid = w.create_topic("g", 1)
        before = len(writes)
        seen["burst"] = _send_together(w, tid, batches)
        seen["burst writes"] = writes[before:]
        before = len(writes)
        seen["alone"] = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"alone"])))
        seen["alone writes"] = writes[before:]
        seen["log"] = [r.value for r in w.fetch_all(tid, 0)]

    serve_with_wire("io_uring", str(tmp_path / "data"), client)
    burst_replies = seen["burst"]
    assert [(r.error, r.base_offset) for r in burst_replies] == [(m.ErrorCode.NONE, i) for i in range(8)]  # type: ignore[attr-defined]
    assert seen["burst writes"] == [[sum(len(b) for b in batches)]]  # one write of the eight
    alone = seen["alone"]
    assert isinstance(alone, m.ProduceResponse) and alone.base_offset == 8
    assert seen["alone writes"] == [[len(encode_batch([b"alone"]))]]
    assert seen["log"] == [*burst, b"alone"]


def test_a_gathered_write_that_fails_fails_every_append_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one pwritev of a burst's appends fails: every request of the burst gets the error,
    none of their records is stored, and the next produce takes their offsets (the log undid
    them all). Its appends are told of the write last first, and the first undoes the rest."""
    real = uring_mod.run_ops
    failed: list[int] = []

    def failing(io, ops):  # type: ignore[no-untyped-def]
        lengths = [op.length for op in ops if isinstance(op, Write)]
        if not failed and sum(lengths) > len(batches[0]):  # the gathered write, once
            failed.append(sum(lengths))
            raise WriteError(errno.EIO, "injected: the gathered write failed")
        return real(io, ops)

    monkeypatch.setattr(uring_mod, "run_ops", failing)
    batches = [encode_batch([SMALL + bytes([i])]) for i in range(6)]
    seen: dict[str, object] = {}

    def client(w: Wire) -> None:
        tid = w.create_topic("f", 1)
        seen["burst"] = _send_together(w, tid, batches)  # one send: one gathered write
        seen["after"] = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"after"])))
        seen["log"] = [r.value for r in w.fetch_all(tid, 0)]

    serve_with_wire("io_uring", str(tmp_path / "data"), client)
    assert failed == [sum(len(b) for b in batches)]  # the six went out in the one write that failed
    replies: list[m.ProduceResponse] = seen["burst"]  # type: ignore[assignment]
    assert len(replies) == 6
    assert all(isinstance(r, m.ProduceResponse) and r.error != m.ErrorCode.NONE for r in replies)
    after = seen["after"]
    assert isinstance(after, m.ProduceResponse) and (after.error, after.base_offset) == (m.ErrorCode.NONE, 0)
    assert seen["log"] == [b"after"]
