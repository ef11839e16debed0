"""Kafka transactions on one node: what they cost against idempotent produce, the latency a
read_committed consumer sees, and how long a transactional id takes to come back after a kill -9.

Run: `.venv/bin/python bench/transactions.py [--quick] [--rounds N] [--brokers B,...] [--only ROWS]
     [--records N] [--kills N] [--dir DIR]` (`make bench-txn`, `make bench-txn QUICK=1`).

Brokers (`--brokers`, default `ringlog-uvloop-1,ringlog-io_uring-1`; `-2` for `--cores 2`): a real
`broker serve --port 0 --backend B --cores N` on a fresh data directory under --dir (default
`.bench-tmp/txn/`), started and stopped through labkit/brokerproc.py as bench/kafka_clients.py
does (its `Ringlog`, `Clock` and client jobs are reused). A fresh broker for every broker and
round, the brokers in alternating order from round to round, and within a round the throughput
modes in a rotated order, so that a slow phase of the shared VM falls on every variant.

The client: ONE spawned Python process driving librdkafka through confluent-kafka, not pinned.
Every producer has acks=all and idempotence on (a transactional one needs both); 1 KiB values, no
keys, round-robin over 4 partitions by explicit partition; linger.ms 5 for throughput, 0 for
latency. MB = 10^6 bytes of values.

Rows (`--only throughput,latency,recovery`):
1. throughput: `--records` records per mode, from the first produce() to the last record
   acknowledged: `idempotent` (produce, then flush()), `txn/1000` and `txn/100` (begin, 1000 or
   100 records, commit_transaction(), which flushes them and then ends the transaction; the next
   transaction begins only when it returns, as in any application). Each mode is warmed first
   (for a transactional producer: init_transactions() and one transaction over every partition).
   Printed: records/s, MB/s, the ratio to idempotent of the same broker (median of the per-round
   ratios), the broker's CPU-seconds per GB of values (supervisor and workers, their CPU-time
   clocks: benchlib.proc_cpu), the client's and broker's CPU as shares of one CPU, the client's
   Python thread and its busiest librdkafka thread (one near 100%, or the client process near
   the CPU the broker leaves it, means the client is the limit), and for the transactional modes
   the mean wall time of one commit_transaction() call, the share of the run spent in it, and
   from the broker's own counters (labkit/brokerproc.py `own_snapshot`, per core) the
   AddPartitionsToTxn requests and the error answers per transaction: librdkafka sends one
   AddPartitionsToTxn per transaction, and again about 20 ms later for each CONCURRENT_TRANSACTIONS
   answer (the previous transaction's markers and CompleteCommit still being written), so
   adds/txn - 1 is the share of transactions that waited so.
2. latency: a read_committed and a read_uncommitted consumer (two threads of the client process,
   each assigned every partition from the beginning, librdkafka's default fetch settings) while
   one producer writes `single` (a transaction of 1 record begun every 10 ms), `steady` (records
   at a steady `STEADY_RATE` per second, committed every 100) or, as the reference, `plain` (the
   idempotent producer without transactions, 1 record every 10 ms). Each value carries its send
   time (CLOCK_MONOTONIC, ns, taken just before produce()); a consumer takes its receipt time as
   poll() hands it the record. p50 and p99 in ms for each isolation
   level, and the p50/p99 of the commit_transaction() call. Records of the warm-up are not counted.
3. recovery: a producer process opens a transaction (init, begin, 100 records, flush: the
   partitions are added and the records written), then the coordinator is killed with SIGKILL
   together with that producer process: `worker` kills the worker of the core coordinating the
   id (FindCoordinator key type 1 names it), which the supervisor restarts at once (docs/LIMITS.md,
   worker restart back-off); `broker` kills the supervisor and every worker, and the bench starts
   the broker again on the same port and data directory at once. From the kill, a new producer
   with the same transactional id runs init_transactions() (which has the coordinator load its
   state and abort the open transaction), begins, produces one record and commits: the time until
   that commit returns, median (min..max) over `--kills` per broker and round; for `broker`,
   also the part until the restarted broker listened. A fresh broker for each kill, so the worker
   restart back-off never applies. The kill and the producer are separate steps
   (`recovery_once(kill, ...)`), so a cluster bench can pass its own kill (a node's) to them.

The VM is shared: the header prints the load average before and after; docs/PERFORMANCE.md,
"Measuring on this machine", says how to read a figure from it.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import signal
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchlib import KIB, REPO, code_version, fs_of, table
from kafka_clients import RINGLOG, Clock, Ringlog, job_create, pct, pin_client, values

from labkit.brokerproc import BrokerProcess, own_snapshot

MB = 1_000_000
RECORD_BYTES = KIB
PARTITIONS = 4
LINGER_MS = 5
SINGLE_INTERVAL_S = 0.010
STEADY_RATE = 2000  # records/s in the steady latency row
STEADY_EVERY = 100
ADD_PARTITIONS_TO_TXN = 24  # Kafka's api key: the broker counts requests by it
MODES = {"idempotent": 0, "txn/1000": 1000, "txn/100": 100}  # name -> records per transaction
VALUE_POOL_MASK = 1023  # kafka_clients.values() makes 1024
DEFAULT_BROKERS = ["ringlog-uvloop-1", "ringlog-io_uring-1"]
ROW_NAMES = ("throughput", "latency", "recovery")


class Sizes:
    def __init__(self, records: int, single: int, steady: int, warm: int, kills: int) -> None:
        self.records = records  # per throughput mode
        self.single = single  # transactions of one record in the latency row
        self.steady = steady  # records in the steady latency row
        self.warm = warm  # records of each latency row not counted
        self.kills = kills  # per kill kind, broker and round


FULL = Sizes(100_000, 1000, 10_000, 50, 2)
QUICK = Sizes(20_000, 300, 3000, 30, 1)


# --------------------------------------------------------------------------------------- client jobs
# Module-level functions: they run in the spawned client process.


def producer_config(bootstrap: str, txn_id: str | None, linger_ms: int) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": linger_ms,
        "socket.nagle.disable": True,
        "log_level": 3,
    }
    if txn_id is not None:
        conf["transactional.id"] = txn_id
    return conf


def job_throughput(bootstrap: str, topic: str, count: int, every: int, pids: list[int]) -> dict:
    """One throughput mode: `every` 0 is idempotent produce, else a commit every `every` records."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    conf = producer_config(bootstrap, f"bench-{topic}" if every else None, LINGER_MS)
    conf.update({"delivery.report.only.error": True, "on_delivery": lambda err, _m: errors.append(err)})
    producer = Producer(conf)
    vals = values()
    if every:
        producer.init_transactions(30)
        producer.begin_transaction()
    for p in range(PARTITIONS):  # metadata, connections, the partitions added once: untimed
        producer.produce(topic, vals[0], partition=p)
    if every:
        producer.commit_transaction(30)
    elif producer.flush(30) != 0:
        raise RuntimeError("warm-up produce not acknowledged")
    if errors:
        raise RuntimeError(f"warm-up produce failed: {errors[:3]}")
    mask = VALUE_POOL_MASK
    produce, poll = producer.produce, producer.poll
    commits = 0
    in_commit = 0.0
    with Clock(pids) as clock:
        i = 0
        while i < count:
            n = min(every, count - i) if every else count
            if every:
                producer.begin_transaction()
            for j in range(i, i + n):
                while True:
                    try:
                        produce(topic, vals[j & mask], partition=j % PARTITIONS)
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        poll(0.005)
                if j & 1023 == 0:
                    poll(0)
            i += n
            if every:
                t = time.perf_counter()
                producer.commit_transaction(60)
                in_commit += time.perf_counter() - t
                commits += 1
        left = 0 if every else producer.flush(120)
    if left or errors:
        raise RuntimeError(f"produce every={every}: {left} unacknowledged, errors {errors[:3]}")
    out = clock.result(count)
    out["cpu_s_per_gb"] = out["broker"] * clock.wall / (count * RECORD_BYTES / 1e9)
    out["commit_ms"] = in_commit / commits * 1000 if commits else 0.0
    out["in_commit"] = in_commit / clock.wall
    return out


STAMP = struct.Struct(">qI")  # send time (monotonic ns), sequence number


def job_latency(bootstrap: str, topic: str, kind: str, count: int, warm: int) -> dict:
    """Send time to receipt time of each record, for a read_committed and a read_uncommitted
    consumer at once, while one producer writes `kind` ('plain', 'single' or 'steady')."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    total = warm + count
    padding = os.urandom(RECORD_BYTES - STAMP.size)
    lat: dict[str, list[float]] = {"read_committed": [], "read_uncommitted": []}
    got: dict[str, int] = {k: 0 for k in lat}
    stop = threading.Event()
    failures: list[str] = []

    def consume(level: str) -> None:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"txn-bench-{level}",  # librdkafka wants one; assign() never joins it
                "enable.auto.commit": False,
                "isolation.level": level,
                "log_level": 3,
            }
        )
        try:
            c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
            mine = lat[level]
            ns = time.monotonic_ns
            while not stop.is_set():
                # poll(), not consume(n, timeout): that one waits for n records or the timeout
                m = c.poll(0.05)
                if m is not None:
                    now = ns()
                    if m.error() is not None:
                        failures.append(f"{level}: {m.error()}")
                        continue
                    sent, seq = STAMP.unpack_from(m.value())
                    got[level] += 1
                    if seq >= warm:
                        mine.append((now - sent) / 1e6)
        except Exception as exc:  # reported by the main thread
            failures.append(f"{level}: {exc!r}")
        finally:
            c.close()

    threads = [threading.Thread(target=consume, args=(lvl,), daemon=True) for lvl in lat]
    for t in threads:
        t.start()
    txn = kind != "plain"
    producer = Producer(producer_config(bootstrap, f"bench-lat-{topic}" if txn else None, 0))
    if txn:
        producer.init_transactions(30)
    every = STEADY_EVERY if kind == "steady" else 1
    interval = 1.0 / STEADY_RATE if kind == "steady" else SINGLE_INTERVAL_S
    commit_ms: list[float] = []
    ns = time.monotonic_ns
    t0 = time.monotonic()
    due = t0
    for seq in range(total):
        if seq == warm:  # both consumers fetching before the counted records are sent
            deadline = time.monotonic() + 30
            while min(got.values()) < warm and time.monotonic() < deadline and not failures:
                time.sleep(0.01)
            due = t0 = time.monotonic()
        if txn and seq % every == 0:
            producer.begin_transaction()
        # single: a transaction begins every interval; steady: a record is sent every interval
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        due += interval
        producer.produce(topic, STAMP.pack(ns(), seq) + padding, partition=seq % PARTITIONS)
        producer.poll(0)
        if txn and (seq % every == every - 1 or seq == total - 1):
            t = time.perf_counter()
            producer.commit_transaction(30)
            if seq >= warm:
                commit_ms.append((time.perf_counter() - t) * 1000)
    if not txn and producer.flush(30) != 0:
        raise RuntimeError("latency plain: records not acknowledged")
    sent_s = time.monotonic() - t0
    deadline = time.monotonic() + 30
    while min(got.values()) < total and time.monotonic() < deadline and not failures:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(10)
    if failures or min(got.values()) != total:
        raise RuntimeError(f"latency {kind}: received {got} of {total}; {failures[:3]}")
    out: dict[str, Any] = {"rate": count / sent_s}
    for level, xs in lat.items():
        xs.sort()
        out[level] = (pct(xs, 0.50), pct(xs, 0.99))
    commit_ms.sort()
    out["commit"] = (pct(commit_ms, 0.50), pct(commit_ms, 0.99)) if commit_ms else None
    return out


def open_transaction(bootstrap: str, topic: str, txn_id: str, ready: Any) -> None:
    """Producer A: a transaction left open (records written, not committed); then wait to be killed."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap, txn_id, LINGER_MS))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(100):
        producer.produce(topic, b"open" * 256, partition=i % PARTITIONS)
    if producer.flush(30) != 0:
        raise RuntimeError("open transaction's records not acknowledged")
    ready.send(True)
    time.sleep(3600)


def job_recover(bootstrap: str, topic: str, txn_id: str, t_kill_ns: int) -> dict:
    """Producer B, made after the kill: init, begin, one record, commit; seconds from the kill.
    librdkafka retries what is retriable inside each call; a call that still fails is made again."""
    from confluent_kafka import KafkaException, Producer

    conf = producer_config(bootstrap, txn_id, 0)
    # reconnect at a steady short interval, not librdkafka's back-off up to 10 s: the bench
    # measures the broker's recovery, not the client's back-off
    conf.update({"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200})
    producer = Producer(conf)
    attempts = 0
    deadline = time.monotonic() + 120
    while True:
        attempts += 1
        try:
            producer.init_transactions(30)
            break
        except KafkaException as exc:
            if time.monotonic() > deadline or exc.args[0].fatal():
                raise
    t_init = time.monotonic_ns()
    while True:
        producer.begin_transaction()
        producer.produce(topic, b"after" * 200, partition=0)
        try:
            producer.commit_transaction(30)
            break
        except KafkaException as exc:
            err = exc.args[0]
            if time.monotonic() > deadline or err.fatal():
                raise
            if err.txn_requires_abort():
                producer.abort_transaction(30)
            attempts += 1
    t_done = time.monotonic_ns()
    return {"total": (t_done - t_kill_ns) / 1e9, "init": (t_init - t_kill_ns) / 1e9, "attempts": attempts}


# --------------------------------------------------------------------------------------- recovery


def find_txn_coordinator(port: int, txn_id: str) -> int:
    """The node (ringlog: the core) coordinating `txn_id`: FindCoordinator v1, key type 1."""
    key = txn_id.encode()
    client = b"txn-bench"
    body = struct.pack(">hhih", 10, 1, 1, len(client)) + client + struct.pack(">h", len(key)) + key + b"\x01"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("FindCoordinator: connection closed")
            buf += chunk
    _corr, _throttle, error, msg_len = struct.unpack_from(">iihh", buf, 4)
    pos = 4 + 12 + max(msg_len, 0)
    if error:
        raise RuntimeError(f"FindCoordinator for {txn_id!r}: error {error}")
    return struct.unpack_from(">i", buf, pos)[0]


def recovery_once(
    pool: ProcessPoolExecutor,
    bootstrap: str,
    topic: str,
    txn_id: str,
    kill: Callable[[], None],
    bring_back: Callable[[], None] | None = None,
) -> dict:
    """Open a transaction in a producer process, then (clock started) SIGKILL that process and
    call `kill`; a new producer of the same id runs in `pool` while `bring_back` (if any) runs
    here. The seconds from the kill until its commit returned, and until `bring_back` returned."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    victim = ctx.Process(target=open_transaction, args=(bootstrap, topic, txn_id, theirs), daemon=True)
    victim.start()
    if not ours.poll(60):
        victim.kill()
        raise RuntimeError("the open transaction was not ready in 60 s")
    ours.recv()
    t_kill = time.monotonic_ns()
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    kill()
    future = pool.submit(job_recover, bootstrap, topic, txn_id, t_kill)
    back = None
    if bring_back is not None:
        bring_back()
        back = (time.monotonic_ns() - t_kill) / 1e9
    out = future.result(180)
    victim.join(10)
    out["back"] = back
    return out


def kill_broker(proc: BrokerProcess) -> None:
    """SIGKILL the supervisor and every worker at once (a crash of the whole broker)."""
    for pid in (proc.pid, *proc.worker_pids.values()):
        os.kill(pid, signal.SIGKILL)
    assert proc.proc is not None
    proc.proc.wait(10)


def recovery_round(workdir: Path, name: str, pool: ProcessPoolExecutor, kills: int) -> dict[str, list]:
    out: dict[str, list] = {"worker": [], "broker": []}
    for kind in ("worker", "broker") * kills:
        broker = Ringlog(workdir, name).start()
        proc = broker.proc
        try:
            topic = f"rec-{kind}"
            pool.submit(job_create, broker.bootstrap, topic, PARTITIONS).result()
            txn_id = f"bench-recover-{kind}"

            if kind == "worker":
                core = find_txn_coordinator(proc.port, txn_id)  # makes the state topic if new
                kill = functools.partial(os.kill, proc.worker_pids[core], signal.SIGKILL)
                r = recovery_once(pool, broker.bootstrap, topic, txn_id, kill)
            else:
                kill = functools.partial(kill_broker, proc)
                r = recovery_once(pool, broker.bootstrap, topic, txn_id, kill, proc.start)
            out[kind].append(r)
        finally:
            broker.stop()
    return out


# --------------------------------------------------------------------------------------- one round


def broker_counts(broker: Ringlog) -> tuple[int, int]:
    """(AddPartitionsToTxn requests, error answers) summed over the broker's cores."""
    adds = errors = 0
    for port in broker.proc.core_ports.values():
        snap = own_snapshot(port)
        adds += int(snap["requests"].get(f"kafka_{ADD_PARTITIONS_TO_TXN}", 0))
        errors += int(snap["errors"])
    return adds, errors


def throughput_round(broker: Ringlog, pool: ProcessPoolExecutor, sizes: Sizes, round_: int) -> dict:
    names = list(MODES)
    order = names[round_ % len(names) :] + names[: round_ % len(names)]
    out = {}
    for mode in order:
        topic = "tp-" + mode.replace("/", "")
        pool.submit(job_create, broker.bootstrap, topic, PARTITIONS).result()
        adds0, errors0 = broker_counts(broker)
        out[mode] = pool.submit(
            job_throughput, broker.bootstrap, topic, sizes.records, MODES[mode], broker.pids()
        ).result()
        adds1, errors1 = broker_counts(broker)
        txns = -(-sizes.records // MODES[mode]) if MODES[mode] else 1
        out[mode]["adds_per_txn"] = (adds1 - adds0) / txns
        out[mode]["errors_per_txn"] = (errors1 - errors0) / txns
    return out


def latency_kinds(sizes: Sizes) -> tuple[tuple[str, int], ...]:
    return (("plain", sizes.single), ("single", sizes.single), ("steady", sizes.steady))


def latency_round(broker: Ringlog, pool: ProcessPoolExecutor, sizes: Sizes) -> dict:
    out = {}
    for kind, count in latency_kinds(sizes):
        topic = f"lat-{kind}"
        pool.submit(job_create, broker.bootstrap, topic, PARTITIONS).result()
        out[kind] = pool.submit(job_latency, broker.bootstrap, topic, kind, count, sizes.warm).result()
    return out


# --------------------------------------------------------------------------------------- report


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def spread(xs: list[float], digits: int = 0) -> str:
    return f"{fmt(statistics.median(xs), digits)} ({fmt(min(xs), digits)}..{fmt(max(xs), digits)})"


def report_throughput(results: dict[str, list[dict]]) -> None:
    rows = []
    for name, runs in results.items():
        for mode in MODES:
            rs = [r[mode] for r in runs]
            ratio = [r[mode]["rps"] / r["idempotent"]["rps"] for r in runs]

            def med(key: str, rs: list[dict] = rs) -> float:
                return statistics.median(x[key] for x in rs)

            rows.append(
                [
                    name,
                    mode,
                    spread([x["rps"] for x in rs]),
                    fmt(med("mbs"), 1),
                    spread(ratio, 2),
                    fmt(med("cpu_s_per_gb"), 2),
                    *(f"{med(k) * 100:.0f}" for k in ("client", "python", "busiest", "broker")),
                    f"{med('commit_ms'):.1f}" if MODES[mode] else "",
                    f"{med('in_commit') * 100:.0f}" if MODES[mode] else "",
                    f"{med('adds_per_txn'):.2f}" if MODES[mode] else "",
                    f"{med('errors_per_txn'):.2f}" if MODES[mode] else "",
                ]
            )
    header = ["broker", "mode", "records/s (min..max)", "MB/s", "x idempotent", "broker CPU-s/GB"]
    header += ["client CPU%", "py%", "rdk%", "broker CPU%", "commit ms", "% in commit", "adds/txn"]
    header += ["errors/txn"]
    table(header, rows)


def report_latency(results: dict[str, list[dict]]) -> None:
    rows = []
    for name, runs in results.items():
        for kind in ("plain", "single", "steady"):
            rs = [r[kind] for r in runs]
            row = [name, kind, fmt(statistics.median(x["rate"] for x in rs))]
            for key in ("read_committed", "read_uncommitted", "commit"):
                if rs[0][key] is None:
                    row += ["", ""]
                    continue
                row.append(spread([x[key][0] for x in rs], 1))
                row.append(spread([x[key][1] for x in rs], 1))
            rows.append(row)
    header = ["broker", "producer", "records/s", "committed p50 ms", "p99 ms", "uncommitted p50 ms"]
    header += ["p99 ms", "commit() p50 ms", "p99 ms"]
    table(header, rows)


def report_recovery(results: dict[str, list[dict]]) -> None:
    rows = []
    for name, rounds in results.items():
        for kind in ("worker", "broker"):
            rs = [r for rnd in rounds for r in rnd[kind]]
            if not rs:
                continue
            back = [r["back"] for r in rs if r["back"] is not None]
            rows.append(
                [
                    name,
                    kind,
                    str(len(rs)),
                    spread([r["total"] for r in rs], 2),
                    spread([r["init"] for r in rs], 2),
                    spread(back, 2) if back else "",
                    str(max(r["attempts"] for r in rs)),
                ]
            )
    header = ["broker", "killed", "n", "to commit s (min..max)", "to init done s", "broker back s"]
    header += ["most calls"]
    table(header, rows)


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 rounds")
    ap.add_argument("--rounds", type=int, help="rounds (each broker once per round); 3, or 2 with --quick")
    ap.add_argument("--brokers", default=",".join(DEFAULT_BROKERS), help=f"some of {', '.join(RINGLOG)}")
    ap.add_argument("--only", default=",".join(ROW_NAMES), help=f"some of {', '.join(ROW_NAMES)}")
    ap.add_argument("--records", type=int, help="records per throughput mode (100k, 20k with --quick)")
    ap.add_argument("--kills", type=int, help="kills of each kind per broker and round (2, 1 with --quick)")
    ap.add_argument("--dir", default=str(REPO / ".bench-tmp"))
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.records:
        sizes.records = args.records
    if args.kills is not None:
        sizes.kills = args.kills
    rounds = args.rounds or (2 if args.quick else 3)
    names = args.brokers.split(",")
    only = set(args.only.split(","))
    if unknown := [n for n in names if n not in RINGLOG] + sorted(only - set(ROW_NAMES)):
        ap.error(f"unknown {unknown}")
    workdir = Path(args.dir) / "txn"
    workdir.mkdir(parents=True, exist_ok=True)
    import confluent_kafka

    print(f"ringlog bench/transactions.py: {code_version()}")
    print(
        f"  {len(os.sched_getaffinity(0))} CPUs, load average {loadavg()}; data on {fs_of(str(workdir))}; "
        f"confluent-kafka {confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}"
    )
    print(
        f"  1 KiB values over {PARTITIONS} partitions, acks=all, idempotent; {sizes.records:,} records per "
        f"throughput mode; latency {sizes.single} single + {sizes.steady:,} steady; {sizes.kills} kills "
        f"of each kind; {rounds} rounds, brokers alternating"
    )
    thr: dict[str, list[dict]] = {n: [] for n in names}
    lat: dict[str, list[dict]] = {n: [] for n in names}
    rec: dict[str, list[dict]] = {n: [] for n in names}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=pin_client, initargs=(None,)) as pool:
        pool.submit(time.sleep, 0).result()  # the client process exists before any clock
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else reversed(names):
                line = f"  round {round_ + 1} {name}:"
                if only & {"throughput", "latency"}:
                    broker = Ringlog(workdir, name).start()
                    try:
                        if "throughput" in only:
                            t = throughput_round(broker, pool, sizes, round_)
                            thr[name].append(t)
                            line += " " + ", ".join(f"{m} {fmt(t[m]['rps'])}/s" for m in MODES)
                        if "latency" in only:
                            lt = latency_round(broker, pool, sizes)
                            lat[name].append(lt)
                            line += f"; single p50 committed {lt['single']['read_committed'][0]:.1f} ms"
                        if broker.backend_in_use() != broker.backend:
                            line += f" (fell back to {broker.backend_in_use()})"
                    finally:
                        broker.stop()
                if "recovery" in only:
                    r = recovery_round(workdir, name, pool, sizes.kills)
                    rec[name].append(r)
                    line += "; recovery " + ", ".join(
                        f"{k} {statistics.median(x['total'] for x in v):.2f} s" for k, v in r.items()
                    )
                print(line, f"[load {loadavg()}]", flush=True)
    if "throughput" in only:
        print(f"\nThroughput, acks=all: median of {rounds} rounds (min..max); x idempotent per round")
        report_throughput(thr)
    if "latency" in only:
        print(
            f"\nSend to receipt, ms: a transaction of 1 record every {SINGLE_INTERVAL_S * 1000:.0f} ms "
            f"(single), {STEADY_RATE}/s committed every {STEADY_EVERY} (steady); median of rounds (min..max)"
        )
        report_latency(lat)
    if "recovery" in only:
        print("\nFrom kill -9 of the coordinator (an open transaction) to a new producer's commit")
        report_recovery(rec)
    print(f"\n  load average at the end {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
