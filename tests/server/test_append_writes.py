"""io_uring's `--append-writes`: ring, inline and auto (small appends inline, large ones on the
ring) each store what they acknowledge, in order, with small and large batches interleaved and
several in flight, and the data survives a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire, values_after_restart

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
