"""Backends and cores end to end: the io_uring backend beside the uvloop backend in one run, and
`--cores 1` beside `--cores 2` with two producers on partitions owned by different cores.

Run: `.venv/bin/python bench/cores.py [--quick] [--rounds N] [--dir DIR] [--variants uvloop,...]`

Processes. This script only orchestrates. Each configuration starts a real `broker serve --port 0
--cores N --backend B` (its supervisor pins worker k to CPU k) on a fresh data directory under
--dir (default `.bench-tmp/`), and runs every client in a separate process (multiprocessing,
spawn). With `--cores 1` the client process is pinned to the other CPU, so broker and client do
not share one; with `--cores 2` on a two-CPU machine the two producers and the two workers share
both CPUs, which is the honest picture of such a machine.

What it measures (1 KiB record values, no keys; MB = 10^6 bytes of values):
1. Produce, acks=1 (written): the routing-aware `AsyncProducer` (256 KiB batches, linger 5 ms),
   from the first send to the last acknowledgement; and pre-encoded 64 KiB batches written with
   `AsyncConnection.request_nowait`, 8 in flight (the broker's ingest rate with a nearly free
   client).
2. Produce, acks=2 (durable): the same `AsyncProducer`; group commit makes one fdatasync per
   partition per loop turn cover every batch that turn appended.
3. Acked single-record latency, acks=1: a pre-encoded one-record produce frame on a blocking
   socket (the broker plus loopback), and `AsyncProducer.send_and_wait` (linger 0): p50/p99 in
   microseconds after a warm-up.
4. Broker CPU: utime+stime of the supervisor and every worker (from /proc) over each timed
   section, per GB of record values; the backends are compared as throughput ratios and CPU-per-GB
   ratios, side by side.
5. Cores: two producer processes, each on its own partition, the two partitions owned by
   different cores under `--cores 2` (the same partitions under `--cores 1`, where one core owns
   both): total records/s and the forwards the routing-aware producers caused (from STATS: zero
   expected).
6. Forwarding: with `--cores 2`, pre-encoded produce and single-record latency sent to the
   partition owner's direct port and to the other core's, which forwards each request over the
   inter-core unix socket: what a forward costs in throughput, CPU and latency.

The issue's targets are printed beside the figures: io_uring at least 1.5x uvloop's throughput at
equal or lower CPU per GB; acked single-record p50 <= 100 us; 1 KiB produce with one routing-aware
producer >= 250k records/s; durable produce >= 100k records/s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop
from benchlib import REPO, code_version, fs_of, table, tree_cpu

from broker.client import Acks, Admin, AsyncConnection, AsyncProducer
from labkit.brokerproc import BrokerProcess
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import LENGTH_SIZE, peek_frame_size
from ringlog_proto.messages import ErrorCode, ProduceRequest, encode_request
from ringlog_proto.routing import shard_for

KIB = 1024
GB = 1_000_000_000
RECORD_BYTES = KIB
VALUE_POOL = 4096
BATCH_BYTES = 256 * KIB
LINGER_MS = 5.0
RAW_BATCH_RECORDS = 63  # 63 x (1 KiB + 18 B) + 61 B header: one 64 KiB batch
RAW_IN_FLIGHT = 8
# Broker configurations by name (`--variants`): (backend, more `serve` arguments): the two backends
# at their defaults, and the io_uring backend with each of its two options.
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "uvloop": ("uvloop", ()),
    # the defaults: appends inline up to 1 MiB a pass, 200 us of busy polling (a CPU per core here)
    "io_uring": ("io_uring", ()),
    "io_uring-poll": ("io_uring", ("--busy-poll-us", "0")),
    "io_uring+inline": ("io_uring", ("--append-writes", "inline")),
}
TARGET_RATIO = 1.5
TARGET_P50_US = 100.0
TARGET_PRODUCE_RPS = 250_000
TARGET_DURABLE_RPS = 100_000


@dataclass(frozen=True)
class Sizes:
    produce: int  # records per produce run
    raw_batches: int
    latency: int
    warmup: int


FULL = Sizes(400_000, 6000, 5000, 500)
QUICK = Sizes(120_000, 2000, 2000, 300)


# --------------------------------------------------------------------------------------- the broker


def start_broker(workdir: Path, variant: str, cores: int) -> BrokerProcess:
    """A `broker serve` of `variant` on a fresh data directory under `workdir`."""
    data_dir = workdir / f"data-{variant}-{cores}"
    log_path = workdir / f"broker-{variant}-{cores}.log"
    shutil.rmtree(data_dir, ignore_errors=True)
    log_path.unlink(missing_ok=True)
    backend, extra = VARIANTS[variant]
    broker = BrokerProcess(data_dir, log_path, extra, cores, backend, cwd=REPO)
    return broker.start(timeout_s=30)


def stop_broker(broker: BrokerProcess) -> None:
    """SIGTERM (a minute for the flush of what it holds), and its data deleted."""
    if broker.running():
        broker.stop(timeout_s=60)
    shutil.rmtree(broker.data_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------- client jobs


def job_init(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def values() -> list[bytes]:
    raw = os.urandom(VALUE_POOL * RECORD_BYTES)
    return [raw[i * RECORD_BYTES : (i + 1) * RECORD_BYTES] for i in range(VALUE_POOL)]


def create_topic(bootstrap: str, name: str, partitions: int) -> int:
    with Admin(bootstrap) as admin:
        return admin.create_topic(name, partitions)


def end_offset(bootstrap: str, name: str) -> int:
    with Admin(bootstrap) as admin:
        return sum(p.end_offset for p in admin.describe_topic(name).partitions)


def job_produce(bootstrap: str, topic: str, partition: int, count: int, acks: int, start_at: float) -> dict:
    """AsyncProducer, `count` records to one partition; times from `start_at` (a shared start
    line when several producers run together) to the last acknowledgement."""
    return uvloop.run(_produce(bootstrap, topic, partition, count, acks, start_at))


async def _produce(
    bootstrap: str, topic: str, partition: int, count: int, acks: int, start_at: float
) -> dict:
    vals = values()
    mask = VALUE_POOL - 1
    async with AsyncProducer(bootstrap, acks=acks, batch_bytes=BATCH_BYTES, linger_ms=LINGER_MS) as p:
        await (await p.send(topic, vals[0], partition=partition))  # metadata, connection: untimed
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        send = p.send
        t0 = time.perf_counter()
        for i in range(count):
            await send(topic, vals[i & mask], partition=partition)
        await p.flush()
        wall = time.perf_counter() - t0
    return {"wall": wall, "records": count}


def job_raw_produce(bootstrap: str, topic_id: int, batches: int) -> dict:
    return uvloop.run(_raw_produce(bootstrap, topic_id, batches))


async def _raw_produce(bootstrap: str, topic_id: int, batches: int) -> dict:
    vals = values()
    pool = [encode_batch(vals[i * RAW_BATCH_RECORDS : (i + 1) * RAW_BATCH_RECORDS]) for i in range(32)]
    host, port = bootstrap.split(":")
    conn = await AsyncConnection.connect(host, int(port))
    window: collections.deque[asyncio.Future[Any]] = collections.deque()
    t0 = time.perf_counter()
    for i in range(batches):
        window.append(conn.request_nowait(ProduceRequest(topic_id, 0, Acks.WRITTEN, 30_000, pool[i % 32])))
        if len(window) >= RAW_IN_FLIGHT:
            resp = await window.popleft()
            if resp.error != ErrorCode.NONE:
                raise RuntimeError(f"produce failed: {resp}")
    for fut in window:
        resp = await fut
        if resp.error != ErrorCode.NONE:
            raise RuntimeError(f"produce failed: {resp}")
    wall = time.perf_counter() - t0
    await conn.close()
    return {"wall": wall, "records": batches * RAW_BATCH_RECORDS}


def job_latency_socket(bootstrap: str, topic_id: int, count: int, warmup: int) -> list[int]:
    host, port = bootstrap.split(":")
    frame = b"".join(
        encode_request(ProduceRequest(topic_id, 0, Acks.WRITTEN, 30_000, encode_batch([b"x" * 100])), 7)
    )
    buf = bytearray(64 * KIB)
    view = memoryview(buf)
    ns = time.perf_counter_ns
    samples = []
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(warmup + count):
            t = ns()
            s.sendall(frame)
            got, need = 0, 4
            while got < need:
                k = s.recv_into(view[got:])
                if not k:
                    raise ConnectionError("broker closed the connection")
                got += k
                if got >= LENGTH_SIZE:
                    need = peek_frame_size(buf) or need
            if i >= warmup:
                samples.append(ns() - t)
    return samples


def job_latency_producer(bootstrap: str, topic: str, count: int, warmup: int) -> list[int]:
    return uvloop.run(_latency_producer(bootstrap, topic, count, warmup))


async def _latency_producer(bootstrap: str, topic: str, count: int, warmup: int) -> list[int]:
    ns = time.perf_counter_ns
    samples = []
    async with AsyncProducer(bootstrap, acks=Acks.WRITTEN, linger_ms=0) as p:
        for i in range(warmup + count):
            t = ns()
            await p.send_and_wait(topic, b"x" * 100)
            if i >= warmup:
                samples.append(ns() - t)
    return samples


def job_forwards(bootstrap: str) -> int:
    """Requests forwarded between cores so far, from STATS (-1 if the broker cannot say)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "broker.cli", "stats", "-b", bootstrap, "--format", "json"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout
        doc = json.loads(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return -1
    return sum(int(c.get("forwarded", 0)) for c in doc.get("snapshots", []) if isinstance(c, dict))


# --------------------------------------------------------------------------------------- the runs


def pct(sorted_us: list[float], q: float) -> float:
    return sorted_us[min(len(sorted_us) - 1, max(0, int(q * len(sorted_us) + 0.999999) - 1))]


def measure_backend(
    broker: BrokerProcess, pool: ProcessPoolExecutor, sizes: Sizes, tag: str
) -> dict[str, Any]:
    """Produce (producer, raw), durable produce and latency on a `--cores 1` broker."""
    bs = broker.bootstrap
    out: dict[str, Any] = {"backend": broker.backend_in_use()}

    def timed(name: str, fn: Any, *args: Any) -> dict:
        c0 = tree_cpu(broker.pid)
        r = pool.submit(fn, *args).result()
        cpu = tree_cpu(broker.pid) - c0
        gb = r["records"] * RECORD_BYTES / GB
        out[name] = {"rps": r["records"] / r["wall"], "mbs": gb * 1000 / r["wall"], "cpu_per_gb": cpu / gb}
        return out[name]

    pool.submit(create_topic, bs, f"p-{tag}", 1).result()
    timed("produce", job_produce, bs, f"p-{tag}", 0, sizes.produce, Acks.WRITTEN, 0.0)
    raw_id = pool.submit(create_topic, bs, f"raw-{tag}", 1).result()
    timed("raw", job_raw_produce, bs, raw_id, sizes.raw_batches)
    pool.submit(create_topic, bs, f"d-{tag}", 1).result()
    timed("durable", job_produce, bs, f"d-{tag}", 0, sizes.produce // 2, Acks.DURABLE, 0.0)
    lat_id = pool.submit(create_topic, bs, f"l-{tag}", 1).result()
    for name, fn, arg in (
        ("lat_socket", job_latency_socket, lat_id),
        ("lat_producer", job_latency_producer, f"l-{tag}"),
    ):
        us = sorted(s / 1000 for s in pool.submit(fn, bs, arg, sizes.latency, sizes.warmup).result())
        out[name] = {"p50": pct(us, 0.5), "p99": pct(us, 0.99)}
    return out


def best_of(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Per figure, the better of two rounds: higher throughput (with its CPU), lower latency."""
    if a is None:
        return b
    out = dict(a)
    for name, x in b.items():
        if not isinstance(x, dict):
            continue
        faster = "rps" in x and x["rps"] > a[name]["rps"]
        quicker = "p50" in x and x["p50"] < a[name]["p50"]
        if faster or quicker:
            out[name] = x
    return out


def measure_cores(broker: BrokerProcess, sizes: Sizes, tag: str) -> dict[str, Any]:
    """Two producer processes at once, on partitions owned by different cores (under 2 cores)."""
    bs = broker.bootstrap
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as one:
        topic_id = one.submit(create_topic, bs, f"c-{tag}", 8).result()
    owners = [shard_for(topic_id, p, 2) for p in range(8)]
    parts = [owners.index(0), owners.index(1)]
    count = sizes.produce // 2
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(time.sleep, 0).result()
        start_at = time.time() + 2.0
        c0 = tree_cpu(broker.pid)
        futs = [pool.submit(job_produce, bs, f"c-{tag}", p, count, Acks.WRITTEN, start_at) for p in parts]
        results = [f.result() for f in futs]
        cpu = tree_cpu(broker.pid) - c0
        forwards = pool.submit(job_forwards, bs).result()
    wall = max(r["wall"] for r in results)
    gb = 2 * count * RECORD_BYTES / GB
    return {"rps": 2 * count / wall, "mbs": gb * 1000 / wall, "cpu_per_gb": cpu / gb, "forwards": forwards}


def measure_forwarding(broker: BrokerProcess, sizes: Sizes, tag: str) -> list[list[str]]:
    """The price of the inter-core channel: the same requests to a partition's owner and to the
    other core (which forwards them over its unix socket and relays the answers)."""
    ports = broker.core_ports
    ctx = multiprocessing.get_context("spawn")
    rows = []
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        topic_id = pool.submit(create_topic, broker.bootstrap, f"f-{tag}", 1).result()
        owner = shard_for(topic_id, 0, 2)
        for label, core in (("to the owner", owner), ("to the other core (forwarded)", 1 - owner)):
            direct = f"127.0.0.1:{ports[core]}"
            before = pool.submit(job_forwards, broker.bootstrap).result()
            c0 = tree_cpu(broker.pid)
            r = pool.submit(job_raw_produce, direct, topic_id, sizes.raw_batches // 2).result()
            cpu = tree_cpu(broker.pid) - c0
            samples = pool.submit(job_latency_socket, direct, topic_id, 2000, 200).result()
            us = sorted(s / 1000 for s in samples)
            forwards = pool.submit(job_forwards, broker.bootstrap).result() - before
            requests = sizes.raw_batches // 2 + 2200
            gb = r["records"] * RECORD_BYTES / GB
            rows.append(
                [
                    label,
                    fmt(r["records"] / r["wall"]),
                    fmt(cpu / gb, 2),
                    fmt(pct(us, 0.5), 1),
                    fmt(pct(us, 0.99), 1),
                    f"{forwards / requests:.2f}",
                ]
            )
    return rows


def warm_page_cache(workdir: Path, nbytes: int) -> float:
    """Write and delete `nbytes` once, so that no variant is the first to make the page cache grow
    into memory this VM has not touched yet: that costs the first broker several times the CPU
    per GB of the others (seen here: 4.9 s/GB for whichever variant ran first, 2-3 otherwise)."""
    path = workdir / "warm-up"
    chunk = os.urandom(1 << 20)
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(nbytes >> 20):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        os.unlink(path)
    return time.perf_counter() - t


def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=2, help="runs per variant; the best is shown")
    ap.add_argument("--dir", default=str(REPO / ".bench-tmp"))
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"some of {', '.join(VARIANTS)}")
    ap.add_argument("--cores-variants", default="uvloop,io_uring", help="variants of the cores table")
    args = ap.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    workdir = Path(args.dir) / "cores"
    workdir.mkdir(parents=True, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu = cpus[1] if len(cpus) > 1 else None
    print(f"ringlog bench/cores.py: {code_version()}")
    print(
        f"  {len(cpus)} CPUs; data on {fs_of(str(workdir))}; 1 KiB values; "
        f"{'quick' if args.quick else 'full'} sizes"
    )
    warm = warm_page_cache(workdir, (768 if args.quick else 1536) << 20)  # more than one variant writes
    print(f"  page cache warmed: {warm:.1f} s")
    backends = args.variants.split(",")
    unknown = [v for v in [*backends, *args.cores_variants.split(",")] if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    results: dict[str, dict[str, Any]] = {}
    ctx = multiprocessing.get_context("spawn")
    # Each variant runs `--rounds` times, in alternating order; each figure is its variant's best
    # round (single runs on this VM differed by a third between identical configurations).
    for round_ in range(args.rounds):
        for backend in backends if round_ % 2 == 0 else reversed(backends):
            broker = start_broker(workdir, backend, 1)
            tag = f"{backend.replace('+', '.')}-{round_}"
            try:
                with ProcessPoolExecutor(
                    1, mp_context=ctx, initializer=job_init, initargs=(client_cpu,)
                ) as pool:
                    r = measure_backend(broker, pool, sizes, tag)
            finally:
                stop_broker(broker)
            results[backend] = best_of(results.get(backend), r)
    print("\n1-4. Backends, --cores 1 (worker on CPU 0, client on CPU 1)")
    rows = []
    for backend, r in results.items():
        wanted = backend.split("+")[0]
        shown = backend if r["backend"] == wanted else f"{backend} (fell back to {r['backend']})"
        for name, label in (
            ("produce", "AsyncProducer acks=1"),
            ("raw", "pre-encoded acks=1"),
            ("durable", "AsyncProducer acks=2"),
        ):
            x = r[name]
            rows.append([shown, label, fmt(x["rps"]), fmt(x["mbs"]), fmt(x["cpu_per_gb"], 2)])
    table(["backend", "produce", "records/s", "MB/s", "broker CPU s/GB"], rows)
    rows = []
    for backend, r in results.items():
        for name, label in (("lat_socket", "raw socket"), ("lat_producer", "AsyncProducer.send_and_wait")):
            rows.append([backend, label, fmt(r[name]["p50"], 1), fmt(r[name]["p99"], 1)])
    print()
    table(["backend", "single record acks=1", "p50 us", "p99 us"], rows)
    u = results.get("uvloop")
    for variant, i in results.items():
        if u is None or variant == "uvloop":
            continue
        print(f"\n  {variant} / uvloop (target: throughput >= {TARGET_RATIO}x at CPU/GB <= 1.0x):")
        for name in ("produce", "raw", "durable"):
            ratio = i[name]["rps"] / u[name]["rps"]
            cpu_ratio = i[name]["cpu_per_gb"] / u[name]["cpu_per_gb"]
            print(f"    {name:8} throughput {ratio:.2f}x, CPU per GB {cpu_ratio:.2f}x")
    for backend, r in results.items():
        print(
            f"\n  targets on {backend}: "
            f"producer {fmt(r['produce']['rps'])}/s (>= {fmt(TARGET_PRODUCE_RPS)}), "
            f"durable {fmt(r['durable']['rps'])}/s (>= {fmt(TARGET_DURABLE_RPS)}), "
            f"p50 {r['lat_socket']['p50']:.1f} us raw / {r['lat_producer']['p50']:.1f} us producer "
            f"(<= {TARGET_P50_US:.0f})"
        )
    print("\n5. Cores: two producer processes on partitions owned by different cores (acks=1)")
    rows = []
    for backend in args.cores_variants.split(","):
        for cores in (1, 2):
            broker = start_broker(workdir, backend, cores)
            try:
                r = measure_cores(broker, sizes, f"{backend}-{cores}".replace("+", "."))
            finally:
                stop_broker(broker)
            rows.append(
                [
                    backend,
                    str(cores),
                    fmt(r["rps"]),
                    fmt(r["mbs"]),
                    fmt(r["cpu_per_gb"], 2),
                    str(r["forwards"]),
                ]
            )
    table(["backend", "cores", "records/s", "MB/s", "broker CPU s/GB", "forwards"], rows)
    print("\n6. Forwarding: pre-encoded acks=1 produce and single-record latency, --cores 2 io_uring")
    broker = start_broker(workdir, "io_uring", 2)
    try:
        rows = measure_forwarding(broker, sizes, "fwd")
    finally:
        stop_broker(broker)
    table(["requests sent", "records/s", "broker CPU s/GB", "p50 us", "p99 us", "forwards/request"], rows, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
