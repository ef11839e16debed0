"""io_uring's `--flush-syncs`: where a durable flush's fdatasync runs (broker/backends/uring_options.py).

"auto" (the default) runs it on the loop when nothing else waits for the loop, as between the
requests of a client producing one at a time, and on the ring when other work does, as in a
pipelined burst over two partitions. "ring" never holds the loop, "inline" always does. Whichever
runs it, what was acknowledged survives SIGKILL, across segment rolls too (whose flushes sync
on the ring and on the loop)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire, own_snapshot, values_after_restart
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

ROUNDS = 40


def _start(tmp_path: Path, mode: str, *extra: str) -> BrokerProcess:
    broker = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", extra=("--flush-syncs", mode, *extra), backend="io_uring"
    ).start()
    broker.skip_if_fell_back()
    return broker


def _durable(tid: int, partition: int, value: bytes) -> m.ProduceRequest:
    return m.ProduceRequest(tid, partition, m.Acks.DURABLE, 5000, encode_batch([value]))


def _flushes(port: int) -> tuple[int, int]:
    snap = own_snapshot(port)
    return snap["flushes"], snap["flush_syncs_inline"]


def _one_at_a_time(port: int, w: Wire, tid: int, values: list[bytes]) -> tuple[int, int]:
    """Produce `values` durably to partition 0, each once the last is answered; the flushes
    that took and how many of them synced on the loop."""
    flushes0, inline0 = _flushes(port)
    for i, value in enumerate(values):
        resp = w.rpc(_durable(tid, 0, value))
        assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
        assert resp.base_offset == i
    flushes, inline = _flushes(port)
    return flushes - flushes0, inline - inline0


@pytest.mark.parametrize("mode", ["auto", "ring", "inline"])
def test_one_at_a_time_durable_produces_sync_where_the_mode_says(tmp_path: Path, mode: str) -> None:
    broker = _start(tmp_path, mode)
    try:
        w = Wire(broker.port)
        tid = w.create_topic("t", 1)
        values = [b"d%d" % i for i in range(ROUNDS)]
        flushes, inline = _one_at_a_time(broker.port, w, tid, values)
        assert flushes == ROUNDS  # one at a time: each waits for a flush of its own
        if mode == "ring":
            assert inline == 0
        elif mode == "inline":
            assert inline == ROUNDS
        else:  # idle between requests: on the loop, unless the last flush took over 1 ms (as
            # on a loaded machine, such as this suite's)
            assert 0 < inline <= ROUNDS, (inline, flushes)
        w.close()
        assert values_after_restart(broker, tid, kill=True) == values
    finally:
        broker.stop()


def test_a_burst_over_two_partitions_syncs_on_the_ring_and_is_stored(tmp_path: Path) -> None:
    broker = _start(tmp_path, "auto")
    try:
        w = Wire(broker.port)
        tid = w.create_topic("t", 2)
        flushes0, inline0 = _flushes(broker.port)
        # one send, one recv: the last request's flush starts while the others' wait
        w.sock.sendall(
            b"".join(b"".join(m.encode_request(_durable(tid, i % 2, b"b%d" % i), 100 + i)) for i in range(8))
        )
        offsets: list[list[int]] = [[], []]
        for i in range(8):
            resp = w.recv()
            assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
            offsets[i % 2].append(resp.base_offset)
        assert offsets == [[0, 1, 2, 3], [0, 1, 2, 3]]
        flushes, inline = _flushes(broker.port)
        assert flushes - flushes0 >= 2  # one per partition at least
        assert inline == inline0, "a flush held the loop while another partition's waited"
        assert [r.value for r in w.fetch_all(tid, 1)] == [b"b%d" % i for i in range(1, 8, 2)]
        w.close()
        assert values_after_restart(broker, tid, kill=True) == [b"b%d" % i for i in range(0, 8, 2)]
    finally:
        broker.stop()


def test_durable_appends_across_segment_rolls_are_stored(tmp_path: Path) -> None:
    # 1 MiB segments of ~100 KB records: a flush after a roll syncs the closed segment's files and
    # the directory on the ring, then the active store's (there too, in a later pass, whatever
    # the loop is doing then); the others sync on the loop
    broker = _start(tmp_path, "auto", "--segment-bytes", str(1 << 20))
    try:
        w = Wire(broker.port)
        tid = w.create_topic("t", 1)
        values = [bytes([i]) * 100_000 for i in range(30)]  # about three rolls
        flushes, inline = _one_at_a_time(broker.port, w, tid, values)
        assert flushes == len(values)
        assert 0 < inline < flushes, (inline, flushes)
        w.close()
        assert values_after_restart(broker, tid, kill=True) == values
    finally:
        broker.stop()
