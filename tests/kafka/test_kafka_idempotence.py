"""Idempotent Kafka producers against a real `broker serve`: InitProducerId, then Produce with the
ids and sequences it starts. The sequence checks are the partition's (broker/core/producer_state.py);
what is Kafka's here is the answer: a duplicate gets its original offsets, a gap
OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch INVALID_PRODUCER_EPOCH, a producer the partition holds
nothing of UNKNOWN_PRODUCER_ID.

The stock clients with idempotence on (confluent-kafka, kafka-python 3 by default, aiokafka) each
produce to several partitions and every record is read back exactly once; an idempotent
confluent-kafka producer keeps sending while the broker is killed with SIGKILL and restarted on the
same data dir and port, and every record it reported delivered is there exactly once."""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
import threading
import time
from collections import Counter
from typing import Any

import pytest
from brokerproc import BrokerProcess, Wire
from kafka_requests import frame
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.primitive import i16, i32, i64

from broker.kafka.codec import make, request_schema, response_schema
from ringlog_proto import messages as m
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, encode_batch, iter_batches

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

ONE_CORE = [
    pytest.param({"cores": 1, "backend": backend}, id=f"{backend}-1core")
    for backend in ("uvloop", "io_uring")
]


def create(broker: BrokerProcess, name: str, partitions: int = 1) -> int:
    wire = Wire(broker.port)
    try:
        return wire.create_topic(name, partitions)
    finally:
        wire.close()


class KafkaWire:
    """A blocking Kafka connection speaking kio's schemas: requests no stock client sends on
    purpose (a duplicate, a gap, an old epoch)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, version: int, **values: Any) -> Any:
        schema = request_schema(api_key, version)
        assert schema is not None
        self.correlation += 1
        body = make(schema, **values)
        self.sock.sendall(frame(api_key, version, self.correlation, body, client_id="idempotence-test"))
        (size,) = struct.unpack(">i", self._exactly(4))
        raw = self._exactly(size)
        rschema = response_schema(api_key, version)
        assert rschema is not None
        head, used = entity_reader(rschema.__header_schema__)(raw, 0)
        assert head.correlation_id == self.correlation
        body, more = entity_reader(rschema)(raw, used)
        assert used + more == len(raw)
        return body

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def init_producer_id(self, producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        resp = self.call(
            22,
            4,
            transactional_id=None,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(producer_id),
            producer_epoch=i16(epoch),
        )
        assert resp.error_code == ErrorCode.none
        return int(resp.producer_id), int(resp.producer_epoch)

    def produce(self, topic: str, records: bytes, version: int = 8) -> tuple[ErrorCode, int]:
        """(error, base offset) of one batch to partition 0 of `topic`, acks=all."""
        schema = request_schema(0, version)
        assert schema is not None
        module = __import__(schema.__module__, fromlist=["x"])
        data = make(
            module.TopicProduceData,
            name=topic,
            partition_data=(make(module.PartitionProduceData, index=i32(0), records=records),),
        )
        resp = self.call(
            0,
            version,
            transactional_id=None,
            acks=i16(-1),
            timeout=datetime.timedelta(seconds=10),
            topic_data=(data,),
        )
        part = resp.responses[0].partition_responses[0]
        return part.error_code, int(part.base_offset)


def batch(pid: int, epoch: int, seq: int, *values: bytes) -> bytes:
    return encode_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True)
def test_kafka_produce_answers_sequences_as_kafka(broker: BrokerProcess) -> None:
    tid = create(broker, "seq")
    kw = KafkaWire(broker.port)
    try:
        pid, epoch = kw.init_producer_id()
        assert 0 <= pid < BROKER_PRODUCER_ID_LIMIT and epoch == 0
        assert kw.init_producer_id()[0] != pid
        assert kw.produce("seq", batch(pid, 0, 0, b"a", b"b")) == (ErrorCode.none, 0)
        assert kw.produce("seq", batch(pid, 0, 2, b"c")) == (ErrorCode.none, 2)
        # a retry of either batch: the original offsets, nothing appended
        assert kw.produce("seq", batch(pid, 0, 0, b"a", b"b")) == (ErrorCode.none, 0)
        assert kw.produce("seq", batch(pid, 0, 2, b"c")) == (ErrorCode.none, 2)
        assert kw.produce("seq", batch(pid, 0, 5, b"gap"))[0] == ErrorCode.out_of_order_sequence_number
        # KIP-360 epoch bump: the same id, epoch + 1, starting over at sequence 0
        assert kw.init_producer_id(pid, 0) == (pid, 1)
        assert kw.produce("seq", batch(pid, 1, 0, b"d")) == (ErrorCode.none, 3)
        assert kw.produce("seq", batch(pid, 0, 3, b"old"))[0] == ErrorCode.invalid_producer_epoch
        # a producer this partition holds nothing of, not at sequence 0 (Kafka before KIP-360's
        # relaxation answered the same; clients start the partition's sequences over)
        other, _ = kw.init_producer_id()
        assert kw.produce("seq", batch(other, 0, 7, b"x"))[0] == ErrorCode.unknown_producer_id
        assert kw.produce("seq", batch(other, 0, 0, b"x")) == (ErrorCode.none, 4)
        # the same through Produce v3, the oldest we answer
        assert kw.produce("seq", batch(other, 0, 0, b"x"), version=3) == (ErrorCode.none, 4)
    finally:
        kw.close()
    wire = Wire(broker.port)
    try:
        assert [r.value for r in wire.fetch_all(tid, 0)] == [b"a", b"b", b"c", b"d", b"x"]
    finally:
        wire.close()


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True)
def test_producer_ids_are_never_reused_across_a_restart(broker: BrokerProcess) -> None:
    kw = KafkaWire(broker.port)
    first = {kw.init_producer_id()[0] for _ in range(3)}
    kw.close()
    broker.kill()
    broker.start()
    kw = KafkaWire(broker.port)
    try:
        after = kw.init_producer_id()[0]
    finally:
        kw.close()
    assert after > max(first), "a restart claims a new block: ids of the old one are skipped"


def consume_exactly(broker: BrokerProcess, topic: str, partitions: int, count: int) -> Counter:
    """Values read from the start of every partition (assign, no group), counted, once `count` are
    read and nothing more arrives for a moment."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.auto.commit": False}
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(partitions)
            ]
        )
        got: Counter = Counter()
        deadline = time.monotonic() + 60
        quiet_until = None
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if sum(got.values()) >= count:
                    quiet_until = quiet_until or time.monotonic() + 1
                    if time.monotonic() > quiet_until:
                        break
                continue
            assert msg.error() is None, msg.error()
            got[msg.value()] += 1
        return got
    finally:
        consumer.close()


def stored_producer_ids(broker: BrokerProcess, topic_id: int, partitions: int) -> list[int]:
    """The producer id of every batch stored in the topic (our own fetch, whole partitions)."""
    wire = Wire(broker.port)
    try:
        out = []
        for p in range(partitions):
            resp = wire.rpc(m.FetchRequest(topic_id, p, 0, 1 << 20, 0))
            assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
            out += [h.producer_id for _pos, h in iter_batches(resp.records)]
        return out
    finally:
        wire.close()


def test_idempotent_stock_clients_write_each_record_once(broker: BrokerProcess) -> None:
    """confluent-kafka (enable.idempotence), kafka-python 3 (idempotence on by default) and aiokafka
    (enable_idempotence=True), each over three partitions: InitProducerId, then sequences."""
    tid = create(broker, "idem", 3)
    n = 60
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    errors: list = []
    for i in range(n):
        p.produce(
            "idem", value=f"ck-{i}".encode(), partition=i % 3, on_delivery=lambda e, _m: errors.append(e)
        )
    assert p.flush(30) == 0
    assert errors == [None] * n

    kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)  # enable_idempotence defaults on
    try:
        assert kp.config["enable_idempotence"]
        futures = [kp.send("idem", value=f"kp-{i}".encode(), partition=i % 3) for i in range(n)]
        kp.flush(30)
        for f in futures:
            f.get(10)
    finally:
        kp.close(10)

    async def aio() -> None:
        ap = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await ap.start()
        try:
            sent = [await ap.send("idem", value=f"ak-{i}".encode(), partition=i % 3) for i in range(n)]
            await asyncio.gather(*sent)
        finally:
            await ap.stop()

    asyncio.run(aio())
    got = consume_exactly(broker, "idem", 3, 3 * n)
    want = {f"{c}-{i}".encode() for c in ("ck", "kp", "ak") for i in range(n)}
    assert set(got) == want
    assert set(got.values()) == {1}, "a record written twice"
    pids = stored_producer_ids(broker, tid, 3)
    assert all(0 <= pid < BROKER_PRODUCER_ID_LIMIT for pid in pids), "every batch has a broker-assigned id"
    assert len(set(pids)) == 3, "one producer id per client"


def test_idempotent_producer_across_a_broker_kill(broker: BrokerProcess) -> None:
    """librdkafka with idempotence and acks=all sends a numbered stream while the broker is killed
    with SIGKILL and restarted on the same data dir and port: every record it reported delivered
    is stored exactly once, and no record is stored twice."""
    partitions = 3
    create(broker, "kill", partitions)
    delivered: list[bytes] = []
    failed: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivered.append(msg.value())
        else:
            failed.append(str(err))

    p = confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,  # off, the same run stores the records in flight twice
            "acks": "all",
            "linger.ms": 2,
            "retry.backoff.ms": 50,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200,
            "topic.metadata.refresh.interval.ms": 1000,
            "message.timeout.ms": 60_000,
        }
    )
    stop = threading.Event()
    sent = [0]

    def send() -> None:
        i = 0
        while not stop.is_set():
            try:
                p.produce(
                    "kill", value=f"{i:07d}".encode(), key=f"k{i % 7}".encode(), on_delivery=on_delivery
                )
            except BufferError:
                p.poll(0.05)
                continue
            i += 1
            sent[0] = i
            if i % 50 == 0:
                p.poll(0)
                time.sleep(0.002)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        deadline = time.monotonic() + 20
        while len(delivered) < 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(delivered) >= 500, f"nothing delivered before the kill: {failed[:3]}"
        broker.kill()
        at_kill, acked_at_kill = sent[0], len(delivered)
        time.sleep(0.3)
        broker.start()
        deadline = time.monotonic() + 30
        while sent[0] < at_kill + 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        sender.join()
    assert p.flush(60) == 0
    assert sent[0] > at_kill + 500, "the producer did not go on after the restart"
    assert acked_at_kill < at_kill, "nothing was in flight at the kill"
    got = consume_exactly(broker, "kill", partitions, len(delivered))
    twice = {v: c for v, c in got.items() if c > 1}
    assert not twice, f"{len(twice)} records stored twice, e.g. {sorted(twice)[:5]}"
    missing = set(delivered) - set(got)
    assert not missing, f"{len(missing)} delivered records lost, e.g. {sorted(missing)[:5]}"
    assert not failed, f"deliveries failed: {failed[:3]}"
    assert len(got) == len(delivered) == sent[0]
