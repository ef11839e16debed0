"""Stock Kafka clients producing and consuming through a real `broker serve`: kcat, confluent-kafka
(librdkafka) and kafka-python 3, on both backends and with two cores (a partition's requests go to
its owning core's direct port: Metadata names it the leader).

Stored batches are Kafka's RecordBatch v2 as the client sent them, so what one client produces
every other reads, our own Consumer included."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from brokerproc import BrokerProcess, Wire, own_snapshot

from broker.client import Consumer
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (scripts/setup.sh installs it)")


def create(broker: BrokerProcess, name: str, partitions: int = 1) -> int:
    wire = Wire(broker.port)
    try:
        return wire.create_topic(name, partitions)
    finally:
        wire.close()


def kcat(broker: BrokerProcess, *args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    return subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def consume_all(broker: BrokerProcess, topic: str, partitions: int, count: int, **conf: object) -> list:
    """`count` messages read with confluent-kafka's Consumer: assign() from the start, nothing
    committed (group.id is set only because librdkafka requires one)."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "assign-only",
            "enable.auto.commit": False,
            **conf,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(partitions)
            ]
        )
        out: list = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(msg)
        return out
    finally:
        consumer.close()


@needs_kcat
def test_kcat_produce_then_consume(broker: BrokerProcess) -> None:
    create(broker, "lines", 3)
    lines = [f"key{i}\tvalue {i}" for i in range(50)]
    kcat(broker, "-P", "-t", "lines", "-K", "\t", stdin="\n".join(lines) + "\n")
    out = kcat(broker, "-C", "-t", "lines", "-o", "beginning", "-e", "-K", "\t", "-q")
    assert sorted(out.splitlines()) == sorted(lines)


@needs_kcat
def test_kcat_headers_and_our_consumer_reads_it(broker: BrokerProcess) -> None:
    create(broker, "h", 1)
    kcat(broker, "-P", "-t", "h", "-H", "trace=abc", "-K", ":", stdin="k1:v1\nk2:v2\n")
    out = kcat(broker, "-C", "-t", "h", "-o", "beginning", "-e", "-q", "-f", "%k=%s %h\n")
    assert out.splitlines() == ["k1=v1 trace=abc", "k2=v2 trace=abc"]
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.subscribe("h")
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=500))
    assert [(r.key, r.value) for r in got] == [(b"k1", b"v1"), (b"k2", b"v2")]
    assert [tuple(tuple(h) for h in r.headers) for r in got] == [(("trace", b"abc"),)] * 2


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_confluent_producer_round_trip(broker: BrokerProcess, acks: str) -> None:
    create(broker, "cf", 4)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "acks": acks, "linger.ms": 5})
    errors: list = []
    sent = []
    for i in range(200):
        key = None if i % 10 == 0 else f"k{i}".encode()
        value = None if i % 17 == 0 else f"v{i}".encode()
        headers = [("n", str(i).encode())] if i % 3 == 0 else None
        sent.append((key, value))
        producer.produce(
            "cf",
            value=value,
            key=key,
            headers=headers,
            partition=i % 4,
            on_delivery=lambda err, msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0
    assert errors == []
    got = consume_all(broker, "cf", 4, 200)
    assert sorted(((m.key(), m.value()) for m in got), key=repr) == sorted(sent, key=repr)
    hdrs = {m.value(): m.headers() for m in got if m.headers()}
    assert hdrs[b"v3"] == [("n", b"3")]


def test_confluent_codecs(broker: BrokerProcess) -> None:
    create(broker, "codec", 1)
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    for codec in codecs:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20}
        )
        for i in range(20):
            producer.produce("codec", key=codec.encode(), value=(f"{codec} {i} " * 20).encode())
        assert producer.flush(30) == 0
    got = consume_all(broker, "codec", 1, 80)
    assert [m.key().decode() for m in got] == [c for c in codecs for _ in range(20)]
    assert got[-1].value() == ("zstd 19 " * 20).encode()


BIG_BATCHES = [
    pytest.param(
        {"cores": cores, "backend": backend, "extra": ("--max-batch-bytes", str(2 << 20))},
        id=f"{backend}-{cores}core",
    )
    for backend in ("uvloop", "io_uring")
    for cores in (1, 2)
]


@pytest.mark.parametrize("broker", BIG_BATCHES, indirect=True)
def test_confluent_one_mib_record(broker: BrokerProcess) -> None:
    """A 1 MiB record: like Kafka's message.max.bytes, the broker's --max-batch-bytes (1 MiB by
    default) is raised for it, as is the producer's."""
    create(broker, "big", 1)
    value = bytes(range(256)) * 4096  # 1 MiB
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 2 << 20})
    errors: list = []
    producer.produce("big", key=b"big", value=value, on_delivery=lambda err, msg: err and errors.append(err))
    assert producer.flush(30) == 0
    assert errors == []
    got = consume_all(broker, "big", 1, 1, **{"fetch.message.max.bytes": 2 << 20})
    assert got[0].value() == value


def test_confluent_offsets_for_times(broker: BrokerProcess) -> None:
    create(broker, "ts", 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    base = 1_700_000_000_000
    for i in range(10):
        producer.produce("ts", value=f"v{i}".encode(), timestamp=base + i * 1000)
        producer.flush(10)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        TP = confluent_kafka.TopicPartition
        (found,) = consumer.offsets_for_times([TP("ts", 0, base + 4500)], timeout=10)
        assert found.offset == 5
        (none,) = consumer.offsets_for_times([TP("ts", 0, base + 99_000)], timeout=10)
        assert none.offset == -1
        low, high = consumer.get_watermark_offsets(TP("ts", 0), timeout=10)
        assert (low, high) == (0, 10)
        consumer.assign([TP("ts", 0, found.offset)])
        msg = None
        deadline = time.monotonic() + 10
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
        assert msg is not None and msg.value() == b"v5"
        assert msg.timestamp()[1] == base + 5000
    finally:
        consumer.close()


def test_kafka_python_producer(broker: BrokerProcess) -> None:
    create(broker, "kp", 2)
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)  # idempotent: its default
    try:
        assert producer.config["enable_idempotence"]
        for i in range(20):
            producer.send("kp", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
        producer.flush(30)
    finally:
        producer.close(10)
    got = consume_all(broker, "kp", 2, 20)
    assert sorted(m.value() for m in got) == sorted(f"v{i}".encode() for i in range(20))


def test_confluent_admin_create_and_delete_topics(broker: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics(
        [
            NewTopic("made", num_partitions=3, replication_factor=1, config={"retention.ms": "-1"}),
            NewTopic("copies", num_partitions=1, replication_factor=3),
        ],
        operation_timeout=10,
    )
    futures["made"].result(10)
    with pytest.raises(confluent_kafka.KafkaException, match="REPLICATION_FACTOR"):
        futures["copies"].result(10)
    again = admin.create_topics([NewTopic("made", num_partitions=1)])["made"]
    with pytest.raises(confluent_kafka.KafkaException, match="TOPIC_ALREADY_EXISTS"):
        again.result(10)
    md = admin.list_topics(timeout=10)
    assert len(md.topics["made"].partitions) == 3
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for p in range(3):
        producer.produce("made", value=b"x", partition=p)
    assert producer.flush(30) == 0
    admin.delete_topics(["made"], operation_timeout=10)["made"].result(10)
    gone = admin.delete_topics(["made"])["made"]
    with pytest.raises(confluent_kafka.KafkaException, match="UNKNOWN_TOPIC"):
        gone.result(10)
    assert "made" not in {t for t, m in admin.list_topics(timeout=10).topics.items() if not m.error}


def test_kafka_python_admin_create_delete_and_offsets(broker: BrokerProcess) -> None:
    admin = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([kafka.admin.NewTopic("kpa", num_partitions=2, replication_factor=1)])
        consumer = kafka.KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
        try:
            tps = [kafka.TopicPartition("kpa", p) for p in range(2)]
            assert consumer.end_offsets(tps) == dict.fromkeys(tps, 0)
            assert consumer.beginning_offsets(tps) == dict.fromkeys(tps, 0)
        finally:
            consumer.close()
        admin.delete_topics(["kpa"])
    finally:
        admin.close()


@pytest.mark.parametrize(
    "broker",
    [pytest.param({"cores": 2, "backend": b}, id=f"{b}-2core") for b in ("uvloop", "io_uring")],
    indirect=True,
)
def test_two_cores_librdkafka_goes_to_each_owner_with_no_forward(broker: BrokerProcess) -> None:
    """Forwards per request with librdkafka and two cores: none. Each core gets the Produce and
    Fetch requests of the partitions it owns, at its own port."""
    tid = create(broker, "spread", 8)
    owners = {shard_for(tid, p, 2) for p in range(8)}
    assert owners == {0, 1}
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(400):
        producer.produce("spread", value=f"v{i}".encode(), partition=i % 8)
    assert producer.flush(30) == 0
    assert len(consume_all(broker, "spread", 8, 400)) == 400
    snaps = [own_snapshot(broker.core_ports[c]) for c in (0, 1)]
    for snap in snaps:
        assert snap["forwarded"] == 0 and snap["forwarded_in"] == 0, snap
        assert snap["requests"].get("kafka_0", 0) >= 1, snap  # Produce
        assert snap["requests"].get("kafka_1", 0) >= 1, snap  # Fetch
