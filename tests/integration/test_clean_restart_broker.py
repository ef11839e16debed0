"""A broker stopped with SIGTERM leaves each core's clean-shutdown marker; the next start takes the
marker (gone before the broker answers anyone) and opens the partitions from their snapshots, with
their producers' state as it was; a kill -9 after that start is a full recovery
(broker/storage/clean_marker.py, broker/storage/producer_snapshot.py)."""

from __future__ import annotations

from pathlib import Path

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch


def markers(broker: BrokerProcess) -> list[Path]:
    return sorted((Path(broker.data_dir) / "run").glob("core-*.clean"))


def produced(w: Wire, tid: int, partition: int, seq: int, values: list[bytes]) -> m.Response:
    batch = encode_batch(values, producer_id=42, producer_epoch=0, base_sequence=seq)
    return w.rpc(m.ProduceRequest(tid, partition, m.Acks.WRITTEN, 5000, batch))


def test_sigterm_marks_the_cores_clean_and_the_next_start_keeps_producer_state(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    tid = w.create_topic("kept", 4)
    for i in range(4):
        first = produced(w, tid, i, 0, [b"a", b"b"])
        assert isinstance(first, m.ProduceResponse) and first.base_offset == 0
    w.close()
    assert broker.stop(60) == 0, broker.log_tail()  # a loaded machine's shutdown: not the point here
    assert len(markers(broker)) == broker.cores, broker.log_tail()
    broker.start()
    assert markers(broker) == [], "taken before the broker answered anyone"
    assert broker.log().count("after a clean shutdown") == broker.cores, broker.log_tail()
    w = Wire(broker.port)
    for i in range(4):
        again = produced(w, tid, i, 0, [b"a", b"b"])  # a retry: answered from the restored state
        assert isinstance(again, m.ProduceResponse) and again.base_offset == 0
        nxt = produced(w, tid, i, 2, [b"c"])
        assert isinstance(nxt, m.ProduceResponse) and nxt.base_offset == 2
    w.close()
    broker.kill()
    assert markers(broker) == []
    broker.start()
    assert broker.log().count("full recovery") >= broker.cores, broker.log_tail()
    w = Wire(broker.port)
    for i in range(4):
        assert [r.value for r in w.fetch_all(tid, i)] == [b"a", b"b", b"c"]
        gap = produced(w, tid, i, 5, [b"d"])
        assert gap.error == m.ErrorCode.OUT_OF_ORDER_SEQUENCE, "the walk found sequence 2 too"
    w.close()
