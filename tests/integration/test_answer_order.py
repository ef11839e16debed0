"""An acknowledged append is visible to the next request, whichever connection sends it.

Both backends answer a client's acks=0/1 append written on the loop before they publish it
(`Append` in broker/core/outcomes.py), and send that answer before the loop's pass ends; a
durable append's flush starts before the pass ends. The client must not be able to tell: a fetch
sent on another connection as soon as the answer arrives returns the record, a long poll parked
before the produce is woken with it, and pipelined durable appends (the last of a recv flushed at
once, the ones before it by the group commit) are all answered, in order, and stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess, Wire, values_after_restart
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch

ROUNDS = 200


def _start(tmp_path: Path, backend: str) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", backend=backend).start()
    broker.skip_if_fell_back()
    return broker


def _values(resp: m.Response) -> list[bytes | None]:
    assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
    return [r.value for r in decode_batches(resp.records)]


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
@pytest.mark.parametrize("acks", [m.Acks.WRITTEN, m.Acks.DURABLE])
def test_an_acknowledged_record_is_fetched_at_once_on_another_connection(
    tmp_path: Path, backend: str, acks: int
) -> None:
    broker = _start(tmp_path, backend)
    try:
        producer, consumer = Wire(broker.port), Wire(broker.port)
        tid = producer.create_topic("t", 1)
        for i in range(ROUNDS):
            value = b"v%d" % i
            resp = producer.rpc(m.ProduceRequest(tid, 0, acks, 5000, encode_batch([value])))
            assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
            assert resp.base_offset == i
            fetched = consumer.rpc(m.FetchRequest(tid, 0, offset=i))
            assert isinstance(fetched, m.FetchResponse) and fetched.high_watermark == i + 1
            assert _values(fetched) == [value]
        producer.close()
        consumer.close()
    finally:
        broker.stop()


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_a_long_poll_parked_before_the_produce_is_woken_with_the_record(tmp_path: Path, backend: str) -> None:
    broker = _start(tmp_path, backend)
    try:
        producer, consumer = Wire(broker.port), Wire(broker.port)
        tid = producer.create_topic("t", 1)
        for i in range(20):
            consumer.send(m.FetchRequest(tid, 0, offset=i, max_wait_ms=5000))
            resp = producer.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"p%d" % i])))
            assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
            assert _values(consumer.recv()) == [b"p%d" % i]
        producer.close()
        consumer.close()
    finally:
        broker.stop()


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_pipelined_durable_appends_are_answered_in_order_and_stored(tmp_path: Path, backend: str) -> None:
    broker = _start(tmp_path, backend)
    try:
        w = Wire(broker.port)
        tid = w.create_topic("t", 1)
        values = [b"d%d" % i for i in range(60)]
        for burst in (values[:1], values[1:21], values[21:22], values[22:]):
            for v in burst:  # sent before any answer is read: one recv may hold several
                w.send(m.ProduceRequest(tid, 0, m.Acks.DURABLE, 5000, encode_batch([v])))
            offsets = []
            for _ in burst:
                resp = w.recv()
                assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
                offsets.append(resp.base_offset)
            first = values.index(burst[0])
            assert offsets == list(range(first, first + len(burst)))
        assert [r.value for r in w.fetch_all(tid, 0)] == values
        w.close()
        assert values_after_restart(broker, tid, kill=True) == values  # recovery alone finds them
    finally:
        broker.stop()
