"""Log compaction on one broker: the issue's figures (records and bytes before and after, clean
throughput, produce latency while cleaning against not cleaning, the offset map's memory), and
the figure test at full size: 1M updates over 10k keys read back exactly as the last record of
each key plus its live tombstones, also after a kill -9 during a clean.

Run: `.venv/bin/python bench/compaction.py [--quick] [--updates N --keys K --rounds R]
[--backend uvloop|io_uring] [--no-kill]`

What runs: `broker serve` (one core) with `--log-cleanup-policy compact`, 4 MiB segments, a min
compaction lag of 3 s (so a clean starts after a round's produce, not during it), a max lag of 8 s
(so the last records are cleaned even below the dirty ratio) and a backoff of 200 ms. Each of
`--rounds` rounds:
- produce: an idempotent confluent-kafka producer (acks=all, linger 5 ms) writes updates/rounds
  records over `--keys` keys (values of 20-80 bytes; the last update of every tenth key, in the
  last round, a tombstone), then the bytes the log grew by are counted (no clean runs yet);
- cleaning, then idle, alternated: a probe producer on its own topic (the same core) sends one
  record at a time and waits for it (acks=all: on one node, after the fsync), for as long as the
  clean that the round's records started runs, then for as long again with nothing to clean;
  p50/p99 of each window.
Then a sentinel record (past the max lag after the last round: it rolls the active segment, so
every update sits in a closed segment that is due), a wait for the clean that reaches it, and a
read of the whole topic from the start (confluent-kafka), which must be exactly each key's last
record at its offset. With the kill: a
further round's produce, a SIGKILL of the broker while its clean runs (under an I/O cap that makes
it last), a restart, every record still served, and the next clean's read exact again.

Rows: records and bytes produced against those left (bytes: closed segments' files, plus the
active segment's records); clean throughput, bytes read plus written per second of each clean
(the broker's log lines), beside the disk's own sequential write and read measured first (the
ceiling); produce latency, cleaning / idle; the offset map's memory (the dedupe buffer, fixed)
and the keys it held.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import MIB, code_version, fs_of, table

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto.batch import HEADER_SIZE, invalid_stored_batch, read_header

try:
    import confluent_kafka
except ImportError:  # pragma: no cover - the dev venv has it
    sys.exit("compaction: confluent-kafka is not installed (make setup)")

TOPIC = "changelog"
PROBE = "probe"
CLEANED = re.compile(
    r"cleaned \((?P<why>[^)]*)\) to offset (?P<to>\d+): (?P<kept>\d+) of (?P<read>\d+) records and "
    r"(?P<wrote>\d+) of (?P<of>\d+) bytes kept, (?P<mbs>[\d.]+) MB/s, "
    r"(?P<keys>\d+) keys in a map of (?P<map>\d+) bytes"
)


def disk_ceiling(directory: Path, size: int = 64 * MIB) -> tuple[float, float]:
    """(write MB/s with an fsync at the end, read MB/s) of a file of `size` in `directory`; the read
    drops the page cache's copy first where it can (else it reads from memory: said so below)."""
    path = directory / "ceiling.bin"
    block = os.urandom(MIB)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for _ in range(size // MIB):
        os.write(fd, block)
    os.fsync(fd)
    os.close(fd)
    write_s = time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter()
    while os.read(fd, MIB):
        pass
    read_s = time.perf_counter() - t0
    os.close(fd)
    path.unlink()
    return size / write_s / 1e6, size / read_s / 1e6


def log_bytes(broker: BrokerProcess) -> int:
    """Bytes of the topic's records on disk: every closed segment's store file, and the active
    one's records (its file is preallocated ahead of them)."""
    d = broker.data_dir / "topics" / "1" / "0"
    stores = sorted(d.glob("*.log"))
    total = sum(p.stat().st_size for p in stores[:-1])
    if stores:
        data = stores[-1].read_bytes()
        pos = 0
        while len(data) - pos >= HEADER_SIZE and invalid_stored_batch(data, pos) is None:
            pos += read_header(data, pos).size  # the zeros preallocated after them stop it
        total += pos
    return total


def cleaned_lines(broker: BrokerProcess) -> list[dict[str, Any]]:
    return [m.groupdict() for m in CLEANED.finditer(broker.log())]


def cleaning_now(broker: BrokerProcess) -> bool:
    text = broker.log()
    ended = text.count("cleaned (") + text.count("clean discarded") + text.count("clean failed")
    return text.count("cleaning (") > ended


class Updates:
    """The updates produced so far and what a full clean must leave of them."""

    def __init__(self, broker: BrokerProcess, keys: int) -> None:
        self.keys = keys
        self.producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
            }
        )
        self.last: dict[bytes, tuple[int, bytes | None]] = {}
        self.failed: list[Any] = []
        self.sent = 0
        self.rng = random.Random(1)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(err)
            return
        key = msg.key()
        if key not in self.last or self.last[key][0] < msg.offset():
            self.last[key] = (msg.offset(), msg.value())

    def produce(self, n: int, tombstones: bool = False) -> None:
        rng = self.rng
        for i in range(n):
            k = rng.randrange(self.keys)
            tomb = tombstones and k % 10 == 3 and i > n - 4 * self.keys
            value = None if tomb else b"v%d-" % self.sent + b"x" * rng.randrange(20, 80)
            self.producer.produce(TOPIC, key=b"key-%d" % k, value=value, on_delivery=self._delivered)
            self.sent += 1
            if i % 20_000 == 0:
                self.producer.poll(0)
        self.producer.flush(120)
        if self.failed:
            raise RuntimeError(f"produce failed: {self.failed[:3]}")

    def want(self) -> dict[int, tuple[bytes, bytes | None]]:
        return {offset: (key, value) for key, (offset, value) in self.last.items()}


def read_all(broker: BrokerProcess, end: int) -> dict[int, tuple[bytes | None, bytes | None]]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        out: dict[int, tuple[bytes | None, bytes | None]] = {}
        position = 0
        deadline = time.monotonic() + 120
        while position < end and time.monotonic() < deadline:
            for msg in consumer.consume(50_000, timeout=1.0):
                if msg.error() is not None:
                    raise RuntimeError(str(msg.error()))
                out[msg.offset()] = (msg.key(), msg.value())
                position = msg.offset() + 1
        return out
    finally:
        consumer.close()


def probe(producer: Any, seconds: float, until_idle: BrokerProcess | None = None) -> list[float]:
    """Send-and-wait latencies (ms) for `seconds`, or while `until_idle` cleans."""
    out: list[float] = []
    deadline = time.monotonic() + seconds
    done: list[Any] = []
    while time.monotonic() < deadline if until_idle is None else cleaning_now(until_idle):
        done.clear()
        t0 = time.perf_counter()
        producer.produce(
            PROBE, key=b"p%d" % (len(out) % 100), value=b"x" * 100, on_delivery=lambda e, m: done.append(e)
        )
        while not done:
            producer.poll(0.001)
        out.append((time.perf_counter() - t0) * 1000)
        if done[0] is not None:
            raise RuntimeError(str(done[0]))
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--segment-mib", type=int, default=4)
    ap.add_argument("--backend", default="uvloop", choices=("uvloop", "io_uring"))
    ap.add_argument("--no-kill", action="store_true", help="skip the kill -9 during a clean")
    ap.add_argument("--quick", action="store_true", help="100k updates over 1k keys, 2 rounds")
    ap.add_argument("--dir", default=None, help="where the data dir goes (default: a temporary directory)")
    args = ap.parse_args()
    if args.quick:
        args.updates, args.keys, args.rounds, args.segment_mib = 100_000, 1_000, 2, 1
    work = Path(tempfile.mkdtemp(prefix="compaction-", dir=args.dir))
    print(f"bench/compaction.py: {code_version()}")
    print(f"data dir {work} on {fs_of(str(work))}; backend {args.backend}, one core")
    write_mbs, read_mbs = disk_ceiling(work)
    base = (
        "--log-cleanup-policy", "compact", "--segment-bytes", str(args.segment_mib * MIB),
        "--log-cleaner-min-compaction-lag-ms", "3000", "--log-cleaner-backoff-ms", "200",
        "--log-cleaner-max-compaction-lag-ms", "8000",
    )  # fmt: skip
    broker = BrokerProcess(work / "data", work / "broker.log", backend=args.backend, extra=base)
    broker.start()
    try:
        wire = Wire(broker.port)
        wire.create_topic(TOPIC, 1)
        wire.create_topic(PROBE, 1)
        wire.close()
        updates = Updates(broker, args.keys)
        prober = confluent_kafka.Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"}
        )
        probe(prober, 1.0)  # connections and metadata warm
        produced_bytes = 0
        cleaning_ms: list[float] = []
        idle_ms: list[float] = []
        per_round = args.updates // args.rounds
        for r in range(args.rounds):
            before = log_bytes(broker)
            t0 = time.perf_counter()
            updates.produce(per_round, tombstones=r == args.rounds - 1)
            produce_s = time.perf_counter() - t0
            produced_bytes += log_bytes(broker) - before
            started = broker.log().count("cleaning (")
            wait_for(lambda n=started: broker.log().count("cleaning (") > n, 30, "a clean")
            t0 = time.monotonic()
            cleaning_ms += probe(prober, 0, until_idle=broker)
            window = time.monotonic() - t0
            idle_ms += probe(prober, window)
            print(
                f"  round {r + 1}: {per_round} updates in {produce_s:.1f} s, cleaning window {window:.1f} s"
            )
        time.sleep(8.2)  # past the max lag: the sentinel rolls the active segment, which is then due
        updates.producer.produce(TOPIC, key=b"sentinel", value=b"end", on_delivery=updates._delivered)
        updates.producer.flush(30)
        want = updates.want()
        sentinel = max(want)
        wait_for(
            lambda: max((int(c["to"]) for c in cleaned_lines(broker)), default=-1) >= sentinel,
            120,
            "the last clean",
        )
        served = read_all(broker, sentinel + 1)
        exact = served == want
        produced_records = updates.sent + 1
        after_bytes = log_bytes(broker)
        cleans = cleaned_lines(broker)
        killed = "skipped (--no-kill)"
        if not args.no_kill:
            killed = kill_during_clean(broker, updates, per_round, base)
    finally:
        broker.stop()
    tombstones = sum(1 for _, v in want.values() if v is None)
    print()
    print(f"figure test: {len(served)} records read back, {len(want)} wanted ({tombstones} live tombstones): "
          f"{'EXACT' if exact else 'MISMATCH'}; kill -9 during a clean: {killed}")  # fmt: skip
    print()
    mbs = [float(c["mbs"]) for c in cleans]
    big = [float(c["mbs"]) for c in cleans if int(c["of"]) >= 4 * MIB] or mbs
    table(
        ["what", "", "before", "after", "after / before"],
        [
            [
                "records",
                "",
                f"{produced_records:,}",
                f"{len(served):,}",
                f"{len(served) / produced_records:.4f}",
            ],
            ["bytes", "", f"{produced_bytes:,}", f"{after_bytes:,}", f"{after_bytes / produced_bytes:.4f}"],
        ],
    )
    print()
    ceiling = f"{write_mbs:.0f} / {read_mbs:.0f}"
    table(
        ["clean throughput", "", "MB/s (read + written)", "ceiling: disk write / read MB/s"],
        [
            ["cleans of >= 4 MiB, median", f"n={len(big)}", f"{statistics.median(big):.1f}", ceiling],
            ["every clean, min..max", f"n={len(mbs)}", f"{min(mbs):.1f}..{max(mbs):.1f}", ""],
        ],
    )
    print()
    table(
        ["produce latency (acks=all, one at a time)", "sends", "p50 ms", "p99 ms"],
        [
            [label, str(len(ms)), f"{pct(ms, 0.5):.2f}", f"{pct(ms, 0.99):.2f}"]
            for label, ms in (("while cleaning", cleaning_ms), ("not cleaning (alternated)", idle_ms))
        ],
        1,
    )
    print()
    keys = max(int(c["keys"]) for c in cleans)
    print(f"offset map: {int(cleans[0]['map']):,} bytes (fixed: --log-cleaner-dedupe-buffer-size), "
          f"at most {keys:,} keys in one clean (24 bytes each)")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    return 0 if exact and (args.no_kill or killed.startswith("EXACT")) else 1


def kill_during_clean(broker: BrokerProcess, updates: Updates, n: int, base: tuple[str, ...]) -> str:
    """One more round, killed (SIGKILL) while its clean runs under an I/O cap; restarted without
    the cap; every record still served, then the next clean's read exact."""
    broker.stop()
    broker.extra = (*base, "--log-cleaner-io-max-bytes-per-second", "3000000")
    broker.start()
    updates.producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
         "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576}
    )  # fmt: skip
    updates.produce(n)
    before = broker.log().count("cleaning (")
    wait_for(lambda: broker.log().count("cleaning (") > before and cleaning_now(broker), 60, "a clean")
    time.sleep(random.Random(5).uniform(0.5, 2.0))
    if not cleaning_now(broker):
        return "NOT TESTED (the clean ended before the kill)"
    broker.kill()
    leftovers = sorted(
        n for n in os.listdir(broker.data_dir / "topics" / "1" / "0") if ".cleaned" in n or ".swap" in n
    )
    broker.extra = base
    broker.start()
    time.sleep(8.2)  # as before the first sentinel
    updates.producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True}
    )
    updates.producer.produce(TOPIC, key=b"sentinel-2", value=b"again", on_delivery=updates._delivered)
    updates.producer.flush(30)
    want = updates.want()
    sentinel = max(want)
    first = read_all(broker, sentinel + 1)
    folded_ok = all(first.get(o) == kv for o, kv in want.items())
    wait_for(
        lambda: max((int(c["to"]) for c in cleaned_lines(broker)), default=-1) >= sentinel,
        120,
        "the clean after the restart",
    )
    served = read_all(broker, sentinel + 1)
    exact = served == want
    if not exact:
        extra, missing = sorted(set(served) - set(want)), sorted(set(want) - set(served))
        print(f"  after the kill: {len(extra)} records served beyond the last of their keys {extra[:5]}, "
              f"{len(missing)} missing {missing[:5]}")  # fmt: skip
    verdict = "EXACT" if exact and folded_ok else "MISMATCH"
    return (
        f"{verdict} (killed with {len(leftovers)} clean files on disk; after the restart every "
        f"last record was served before the next clean: {folded_ok})"
    )


if __name__ == "__main__":
    sys.exit(main())
