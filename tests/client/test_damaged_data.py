"""Stored damage reaches the application, never hidden, against a real
broker on both backends:

- a poison batch already in the log (planted in a stopped broker's segment, as older data or
  damage the crc missed would be): `Consumer.poll` (blocking and async) delivers every record
  before it, then raises `UndecodableBatchError` naming topic, partition and offset until a seek
  past it; `broker consume` prints the records before it, then the error, and exits 1;
- a batch whose bytes were damaged under a running broker (STORAGE_ERROR on every fetch): after
  `storage_error_retries` failures `poll` raises `BrokerStorageError` naming the offset, instead
  of retrying silently forever; `broker consume` exits 1 with the message.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.client import (
    Admin,
    AsyncConsumer,
    BrokerStorageError,
    Consumer,
    Producer,
    UndecodableBatchError,
)
from labkit.brokerproc import BrokerProcess
from labkit.poison_batches import poison_batch
from ringlog_proto.batch import read_header

BACKENDS = [{"cores": 1, "backend": "uvloop"}, {"cores": 1, "backend": "io_uring"}]


def store_file(broker: BrokerProcess, topic_id: int, partition: int = 0) -> Path:
    pdir = broker.data_dir / "topics" / str(topic_id) / str(partition)
    (name,) = sorted(n for n in os.listdir(pdir) if n.endswith(".log"))
    return pdir / name


def produce_each(broker: BrokerProcess, topic: str, values: list[bytes]) -> None:
    """One batch per value (each `flush` sends what is pending)."""
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for v in values:
            p.send(topic, v, partition=0)
            p.flush()


def consume(broker: BrokerProcess, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "consume", topic, "-b", broker.bootstrap, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def poll_until_error(c: Consumer, seconds: float = 20) -> tuple[list[bytes], BaseException]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            got.extend(r.value for r in c.poll(200))  # type: ignore[misc]
        except Exception as exc:
            return got, exc
    raise AssertionError(f"no error within {seconds} s; got {got}")


@pytest.mark.parametrize("broker", BACKENDS, indirect=True)
def test_a_stored_poison_batch_is_delivered_up_to_then_raised(broker: BrokerProcess) -> None:
    with Admin(broker.bootstrap) as admin:
        tid = admin.create_topic("damaged", 1)
    produce_each(broker, "damaged", [b"r0", b"r1", b"r2"])
    broker.stop()
    # A poison batch at offset 3 holding 2 records (count_below_records frames 3 but says 2).
    with open(store_file(broker, tid), "ab") as f:
        f.write(poison_batch("count_below_records", base_offset=3))
    broker.start()
    produce_each(broker, "damaged", [b"after"])  # lands at offset 5, behind the poison

    with Consumer(broker.bootstrap, auto_offset_reset="earliest", max_poll_records=2) as c:
        c.assign([("damaged", 0)])
        got, exc = poll_until_error(c)
        assert got == [b"r0", b"r1", b"r2"], "every good record before the bad batch comes first"
        assert isinstance(exc, UndecodableBatchError), exc
        assert (exc.topic, exc.partition, exc.offset, exc.next_offset) == ("damaged", 0, 3, 5)
        assert "damaged/0" in str(exc) and "offset 3" in str(exc)
        with pytest.raises(UndecodableBatchError):  # sticky until the application seeks
            c.poll(100)
        assert c.position(("damaged", 0)) == 3
        c.seek(("damaged", 0), exc.next_offset)
        deadline = time.monotonic() + 20
        rest: list[bytes] = []
        while not rest and time.monotonic() < deadline:
            rest = [r.value for r in c.poll(200)]  # type: ignore[misc]
        assert rest == [b"after"]

    async def async_consumer() -> tuple[list[bytes], BaseException]:
        async with AsyncConsumer(broker.bootstrap, auto_offset_reset="earliest") as c:
            await c.assign([("damaged", 0)])
            got: list[bytes] = []
            for _ in range(100):
                try:
                    got.extend(r.value for r in await c.poll(200))  # type: ignore[misc]
                except UndecodableBatchError as exc:
                    return got, exc
            raise AssertionError(f"no error; got {got}")

    got, exc = asyncio.run(asyncio.wait_for(async_consumer(), 30))
    assert got == [b"r0", b"r1", b"r2"]
    assert isinstance(exc, UndecodableBatchError) and exc.offset == 3

    out = consume(broker, "damaged", "--from-beginning", "--idle-timeout-ms", "5000")
    assert out.returncode == 1, out
    assert out.stdout.split() == ["r0", "r1", "r2"]
    assert "damaged/0" in out.stderr and "offset 3" in out.stderr, out.stderr
    assert "--partition 0 --offset 5" in out.stderr, out.stderr


@pytest.mark.parametrize("broker", BACKENDS, indirect=True)
def test_storage_errors_are_raised_after_bounded_retries(broker: BrokerProcess) -> None:
    with Admin(broker.bootstrap) as admin:
        tid = admin.create_topic("rotten", 1)
    produce_each(broker, "rotten", [b"r0", b"r1", b"r2"])
    # Flip a payload byte of the batch at offset 2 under the running broker: its crc no longer
    # matches, so every fetch from offset 2 is answered STORAGE_ERROR.
    path = store_file(broker, tid)
    data = path.read_bytes()
    pos = 0
    for _ in range(2):
        pos += read_header(data, pos).size
    assert read_header(data, pos).base_offset == 2
    last = pos + read_header(data, pos).size - 1  # the value's last byte
    with open(path, "r+b") as f:
        f.seek(last)
        f.write(bytes([data[last] ^ 0xFF]))

    started = time.monotonic()
    with Consumer(
        broker.bootstrap,
        auto_offset_reset="earliest",
        storage_error_retries=3,
        retry_backoff_ms=50,
        retry_backoff_max_ms=100,
    ) as c:
        c.assign([("rotten", 0)])
        got, exc = poll_until_error(c)
        elapsed = time.monotonic() - started
        assert got == [b"r0", b"r1"]
        assert isinstance(exc, BrokerStorageError), exc
        assert "rotten/0 at offset 2" in str(exc) and "4 fetches in a row" in str(exc), exc
        assert elapsed < 15, elapsed  # 4 failures, backoff <= 100 ms: well under a second unloaded
        assert c.position(("rotten", 0)) == 2
        _, again = poll_until_error(c)  # still broken: raised again after as many more failures
        assert isinstance(again, BrokerStorageError)

    out = consume(broker, "rotten", "--from-beginning")
    assert out.returncode == 1, out
    assert out.stdout.split() == ["r0", "r1"]
    assert "STORAGE_ERROR" in out.stderr and "rotten/0 at offset 2" in out.stderr, out.stderr
