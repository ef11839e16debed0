"""Transaction markers (control batches) in a partition's log are skipped by every reader of ours,
against a real broker on both backends: `Consumer` and `AsyncConsumer` hand out the records around
them and nothing of them, `broker consume` prints only records, and the Spark source neither makes
rows of them nor counts them as a producer's records. confluent-kafka, reading the same log,
takes them for the markers they are. The markers are planted in a stopped broker's segment (no
broker writes one yet), where recovery at start keeps them, and new records follow them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.client import Admin, AsyncConsumer, Consumer, Producer
from broker.spark._io import Broker, fetch_range, records_by_producer
from labkit.brokerproc import BrokerProcess
from ringlog_proto.batch import control_batch, encode_batch, iter_batches

BACKENDS = [{"cores": 1, "backend": "uvloop"}, {"cores": 1, "backend": "io_uring"}]
TOPIC = "marked"
VALUES = [b"r0", b"r1", b"after"]  # at offsets 0, 1 and 3: a COMMIT marker at 2, an ABORT at 4
END = 5


def store_file(broker: BrokerProcess, topic_id: int) -> Path:
    pdir = broker.data_dir / "topics" / str(topic_id) / "0"
    (name,) = sorted(n for n in os.listdir(pdir) if n.endswith(".log"))
    return pdir / name


def produce(broker: BrokerProcess, values: list[bytes]) -> None:
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for v in values:
            p.send(TOPIC, v, partition=0)
            p.flush()


def marked_log(broker: BrokerProcess) -> int:
    """[r0, r1, COMMIT, after, ABORT]: r0 and r1 produced, the rest appended to the stopped
    broker's segment (the markers of r0's producer); returns that producer id."""
    with Admin(broker.bootstrap) as admin:
        tid = admin.create_topic(TOPIC, 1)
    produce(broker, VALUES[:2])
    broker.stop()
    path = store_file(broker, tid)
    data = path.read_bytes()
    batches = list(iter_batches(data))
    assert sum(h.size for _, h in batches) == len(data), "a stopped broker leaves whole batches"
    pid, epoch = batches[0][1].producer_id, batches[0][1].producer_epoch
    assert batches[-1][1].next_offset == 2
    with open(path, "ab") as f:
        f.write(control_batch(pid, epoch, True, 0, 1000, 0, base_offset=2))
        f.write(encode_batch([VALUES[2]], base_offset=3, partition_leader_epoch=0))
        f.write(control_batch(pid, epoch, False, 0, 1000, 0, base_offset=4))
    broker.start()
    return pid


def poll_all(c: Consumer, want: int, seconds: float = 20) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < deadline:
        got.extend(r.value for r in c.poll(200))  # type: ignore[misc]
    got.extend(r.value for r in c.poll(300))  # type: ignore[misc]  # nothing more comes
    return got


@pytest.mark.parametrize("broker", BACKENDS, indirect=True)
def test_our_readers_skip_markers(broker: BrokerProcess) -> None:
    pid = marked_log(broker)
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", max_poll_records=1) as c:
        c.assign([(TOPIC, 0)])
        assert poll_all(c, 3) == VALUES
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(TOPIC, 0)])
        c.seek((TOPIC, 0), 2)  # a fetch starting at a marker
        assert poll_all(c, 1) == [b"after"]

    async def async_consumer() -> list[bytes]:
        async with AsyncConsumer(broker.bootstrap, auto_offset_reset="earliest") as c:
            await c.assign([(TOPIC, 0)])
            got: list[bytes] = []
            for _ in range(100):
                got.extend(r.value for r in await c.poll(100))  # type: ignore[misc]
                if len(got) >= 3:
                    break
            return got

    assert asyncio.run(asyncio.wait_for(async_consumer(), 30)) == VALUES

    out = subprocess.run(
        [sys.executable, "-m", "broker.cli", "consume", TOPIC, "-b", broker.bootstrap, "--from-beginning",
         "--idle-timeout-ms", "2000"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out
    assert out.stdout.split() == [v.decode() for v in VALUES]

    spark = Broker(broker.bootstrap)
    chunks = list(fetch_range(spark, TOPIC, 0, 0, END))
    assert [(o, v) for ch in chunks for o, v in zip(ch.offsets, ch.values, strict=True)] == [
        (0, b"r0"), (1, b"r1"), (3, b"after"),
    ]  # fmt: skip
    assert [v for ch in fetch_range(spark, TOPIC, 0, 2, 3) for v in ch.values] == []  # a marker alone
    # r0 and r1 are the markers' producer's records; the markers are not
    assert records_by_producer(spark, TOPIC, {0: 0}, pid) == {0: 2}

    produce(broker, [b"later"])  # appended after the markers
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([(TOPIC, 0)])
        assert poll_all(c, 4) == [*VALUES, b"later"]


@pytest.mark.parametrize("broker", [BACKENDS[0]], indirect=True)
def test_confluent_kafka_skips_our_markers(broker: BrokerProcess) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    marked_log(broker)
    for isolation in ("read_uncommitted", "read_committed"):
        c = confluent_kafka.Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "markers",
                "enable.auto.commit": False,
                "isolation.level": isolation,
            }
        )
        try:
            c.assign([confluent_kafka.TopicPartition(TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 20
            while len(got) < 3 and time.monotonic() < deadline:
                msg = c.poll(0.2)
                if msg is not None:
                    assert msg.error() is None, msg.error()
                    got.append((msg.offset(), msg.value()))
            assert got == [(0, b"r0"), (1, b"r1"), (3, b"after")], isolation
        finally:
            c.close()
