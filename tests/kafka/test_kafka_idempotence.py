"""Idempotent Kafka producers against a real `broker serve`: InitProducerId, then Produce with the
ids and sequences it starts. The sequence checks are the partition's (broker/core/producer_state.py);
what is Kafka's here is the answer: a duplicate gets its original offsets, a gap
OUT_OF_ORDER_SEQUENCE_NUMBER, an older epoch INVALID_PRODUCER_EPOCH, a producer the partition holds
nothing of UNKNOWN_PRODUCER_ID.

The stock clients with idempotence on (confluent-kafka, kafka-python 3 by default, aiokafka) each
produce to several partitions and every record is read back exactly once; an idempotent producer
of each client (confluent-kafka, aiokafka, kafka-python 3 and 2) keeps sending while the broker is
killed with SIGKILL and restarted on the same data dir and port, and every record it reported
delivered is there exactly once, none twice."""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from kio.static.primitive import i16, i32, i64

from broker.kafka.codec import make, request_schema, response_schema
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import frame
from ringlog_proto import messages as m
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, encode_batch, iter_batches

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
import kafka_python_driver  # noqa: E402  (tests/kafka: kafka-python 3 in process, 2 as a script)

# kafka-python 2 lives apart from the venv's kafka-python 3 (scripts/setup.sh installs it there).
KAFKA_PYTHON_2 = Path(sys.prefix) / "compat" / "kafka-python-2"

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


class Stream:
    """A producer of one Python client sending numbered values (`%07d`) from a thread until told to
    stop: `delivered` (acknowledged values, as they come) and `failed` (error texts) grow live."""

    def __init__(self) -> None:
        self.delivered: list[bytes] = []
        self.failed: list[str] = []
        self.sent = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        raise NotImplementedError

    def emit(self, kind: str, text: str) -> None:
        if kind == "ack":
            self.delivered.append(text.encode())
        elif kind == "fail":
            self.failed.append(text)

    def stop(self) -> None:
        """Stop sending, flush, and wait for the producer to close."""
        self.stop_event.set()
        self.thread.join(90)
        assert not self.thread.is_alive(), "the producer did not close"


class KafkaPython3Stream(Stream):
    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.args = bootstrap, topic

    def run(self) -> None:
        self.sent = kafka_python_driver.stream(*self.args, self.stop_event, self.emit)


class KafkaPython2Stream(Stream):
    """The driver's `stream` as a script with kafka-python 2 first on its path: one line per ack."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.proc = subprocess.Popen(
            [sys.executable, str(kafka_python_driver.__file__), "stream", bootstrap, topic],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PYTHONPATH": str(KAFKA_PYTHON_2), "PATH": "/usr/bin:/bin"},
        )

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, text = line.decode().rstrip("\n").partition(" ")
            if kind == "sent":
                self.sent = int(text)
            self.emit(kind, text)

    def stop(self) -> None:
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()  # EOF: the driver stops sending and flushes
        self.thread.join(90)
        assert self.proc.wait(10) == 0, self.proc.stderr.read().decode(errors="replace")
        self.proc.stderr.close()


class AIOKafkaStream(Stream):
    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.args = bootstrap, topic

    def run(self) -> None:
        asyncio.run(self.produce(*self.args))

    async def produce(self, bootstrap: str, topic: str) -> None:
        # aiokafka retries a batch until request_timeout_ms after it was made ready: 10 s covers
        # the restart; metadata is refreshed every second and on errors, backoffs are short
        ap = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
            request_timeout_ms=10_000,
            retry_backoff_ms=50,
            metadata_max_age_ms=1000,
        )
        await ap.start()

        def done(value: bytes, fut: asyncio.Future) -> None:
            if fut.exception() is None:
                self.emit("ack", value.decode())
            else:
                self.emit("fail", f"{type(fut.exception()).__name__}: {fut.exception()}")

        try:
            i = 0
            while not self.stop_event.is_set():
                value = f"{i:07d}".encode()
                fut = await ap.send(topic, value=value, key=f"k{i % 7}".encode())
                fut.add_done_callback(lambda f, v=value: done(v, f))
                i += 1
                self.sent = i
                if i % 20 == 0:
                    await asyncio.sleep(0.002)
            await ap.flush()
        finally:
            await ap.stop()


STREAMS = {
    "kafka-python-3": KafkaPython3Stream,
    "kafka-python-2": KafkaPython2Stream,
    "aiokafka": AIOKafkaStream,
}


# Metadata names each core by its direct port, and kafka-python and aiokafka, after the first
# Metadata, talk only to the brokers it names (librdkafka re-asks its bootstrap address): the
# restarted broker must listen on the same direct ports (it remembers them in the data dir,
# `core-ports.json`), which these cases check with the kernel choosing the first ports.
KILL_CONFIGURATIONS = [
    pytest.param(
        {"cores": cores, "backend": backend},
        id=f"{backend}-{cores}core",
    )
    for backend, cores in (("uvloop", 1), ("io_uring", 2))
]


@pytest.mark.parametrize("client", list(STREAMS))
@pytest.mark.parametrize("broker", KILL_CONFIGURATIONS, indirect=True)
def test_python_idempotent_producers_across_a_broker_kill(broker: BrokerProcess, client: str) -> None:
    """The librdkafka case above for each Python client: idempotent, acks=all, retrying through
    the restart. Every acknowledged record is stored exactly once, no record twice, and every
    record sent is acknowledged (each client survives ~0.3 s of downtime plus the restart)."""
    if client == "kafka-python-2" and not (KAFKA_PYTHON_2 / "kafka").is_dir():
        pytest.skip(f"kafka-python 2 is not installed at {KAFKA_PYTHON_2} (scripts/setup.sh installs it)")
    partitions = 3
    create(broker, "kill", partitions)
    stream = STREAMS[client](broker.bootstrap, "kill")
    stream.thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(stream.delivered) < 300 and time.monotonic() < deadline and stream.thread.is_alive():
            time.sleep(0.01)
        assert len(stream.delivered) >= 300, f"nothing delivered before the kill: {stream.failed[:3]}"
        broker.kill()
        acked_at_kill = len(stream.delivered)
        time.sleep(0.3)
        broker.start()
        deadline = time.monotonic() + 30
        while len(stream.delivered) < acked_at_kill + 300 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stream.stop()
    assert len(stream.delivered) > acked_at_kill + 300, f"no acks after the restart: {stream.failed[:3]}"
    got = consume_exactly(broker, "kill", partitions, len(stream.delivered))
    twice = {v: c for v, c in got.items() if c > 1}
    assert not twice, f"{len(twice)} records stored twice, e.g. {sorted(twice)[:5]}"
    missing = set(stream.delivered) - set(got)
    assert not missing, f"{len(missing)} delivered records lost, e.g. {sorted(missing)[:5]}"
    assert not stream.failed, f"deliveries failed: {stream.failed[:3]}"
    assert len(got) == len(stream.delivered) == stream.sent
