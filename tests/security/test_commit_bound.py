"""An offset committed past its partition's high watermark is refused (OFFSET_OUT_OF_RANGE) and
not stored, on both protocols, whichever core owns the partition (with two cores the group's
coordinator asks the owner core for its high watermark); an offset up to it is stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire

from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

PARTITIONS = 4


@pytest.fixture(params=[("uvloop", 1), ("io_uring", 2)], ids=["uvloop-1core", "io_uring-2cores"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    backend, cores = request.param
    b = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", cores=cores, backend=backend).start()
    yield b
    b.stop()


def test_our_protocol(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    tid = w.create_topic("t", PARTITIONS)
    for p in range(PARTITIONS):
        for _ in range(p + 1):  # partition p holds p + 1 records
            resp = w.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 5000, encode_batch([b"v"])))
            assert resp.error == m.ErrorCode.NONE
    for p in range(PARTITIONS):
        end = p + 1
        ok = w.rpc(m.OffsetCommitRequest(topic_id=tid, partition=p, group="g", offset=end))
        assert ok.error == m.ErrorCode.NONE
        for beyond in (end + 1, 10**12):
            refused = w.rpc(m.OffsetCommitRequest(topic_id=tid, partition=p, group="g", offset=beyond))
            assert refused.error == m.ErrorCode.OFFSET_OUT_OF_RANGE, (p, beyond, refused)
        got = w.rpc(m.OffsetFetchRequest(topic_id=tid, partition=p, group="g"))
        assert isinstance(got, m.OffsetFetchResponse) and got.offset == end  # the refused ones left no trace
    w.close()


def test_kafka_clients(broker: BrokerProcess) -> None:
    conf = {"bootstrap.servers": broker.bootstrap}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("k", PARTITIONS)])["k"].result(15)
    p = Producer(conf)
    for part in range(PARTITIONS):
        p.produce("k", b"x", partition=part)
    p.flush(15)
    c = Consumer({**conf, "group.id": "kg", "enable.auto.commit": False})
    good = [TopicPartition("k", part, 1) for part in range(PARTITIONS)]
    assert all(tp.error is None for tp in c.commit(offsets=good, asynchronous=False))
    beyond = [TopicPartition("k", 0, 10**12), TopicPartition("k", 1, 1)]
    with pytest.raises(confluent_kafka.KafkaException) as info:
        c.commit(offsets=beyond, asynchronous=False)
    assert info.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE
    committed = {
        tp.partition: tp.offset for tp in c.committed([TopicPartition("k", i) for i in range(2)], 15)
    }
    assert committed == {0: 1, 1: 1}  # partition 0 kept its offset; partition 1's commit went through
    c.close()
