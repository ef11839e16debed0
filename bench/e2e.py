"""End-to-end benchmark: a real `broker serve` process and the Python client over loopback, beside
the loopback ceiling measured in the same run.

Run: `.venv/bin/python bench/e2e.py [--quick] [--dir DIR] [--no-pin]`
     `.venv/bin/python bench/e2e.py --profile broker|client [--profiler auto|py-spy|cprofile]`

Processes. This script only orchestrates; it does no timed work itself.
- The broker: `python -m broker.cli serve --data-dir D --port 0 --cores 1`, a subprocess, with a
  fresh data directory under --dir (default `.bench-tmp/` in the repository, on the disk a real
  data directory would use); stopped with SIGTERM at the end, its data deleted.
- The client: ONE separate worker process (multiprocessing, spawn), so its GIL is shared with
  nothing. It runs one client at a time: the producer phase, then the consumer phase of the data
  just produced, then the latency phase. asyncio clients run on uvloop, as the broker does.
- The ceiling peer: a third process, the other end of the plain-socket measurements.
With at least two CPUs the broker and the ceiling peer are pinned to the first CPU and the client
worker to the second (`--no-pin` to let the scheduler place them).

What it measures, for 100 B and 1 KiB record values (no key, no headers), in this order:
5. Loopback ceiling, first, on an idle machine: a plain TCP stream between two processes (sendall
   of 1 MiB buffers against recv_into a 1 MiB buffer; an untimed round, then best of 5), and a
   ping-pong of a 128-byte message each way between two blocking Python sockets (TCP_NODELAY) as
   the latency floor. The peer's own CPU time gives two more floors: CPU seconds per GB of a
   process that only receives, and CPU microseconds per round trip of a process that only echoes.
   Every ringlog figure is printed beside its ceiling as a ratio: produce and consume wire bytes
   (batches as stored: values plus 18 B per record and 61 B per batch) against the stream, latency
   p50 against the ping-pong p50, broker CPU against the receiving and echoing processes' CPU.
1. Produce throughput for acks=0 (none), 1 (written), 2 (durable), one topic of 1 partition per
   run, and acks=1 on 4 partitions twice: keyless records (the sticky partitioner fills one batch
   at a time) and "4 rr", `partition=i % 4` on every send (four batches filling at once: the
   partition spread, which must cost the producer nothing). A small tuning grid at acks=1 picks,
   per record size, the fastest producer: AsyncProducer or the blocking Producer, batch_bytes and
   linger_ms; those settings are then used for every acks. Timed from the first `send` to `flush()` returning
   (every record acknowledged); for acks=0 (no answers) until the broker reports every record
   appended, so the broker's backlog is inside the clock. Each run is checked against the
   partition end offsets. Also "pre-encoded": batches encoded before the clock, written with
   `AsyncConnection.request_nowait`, 5 in flight: the broker's ingest rate with a client that
   costs almost nothing. One pre-encoded row runs before anything else touches the broker ("fresh
   broker"): the broker's cost per byte depends on whether it has ever received a frame larger
   than the batches at hand (glibc malloc's dynamic mmap and trim thresholds), and the tuning
   grid's 1 MiB batches change that for every later row.
2. Consume from the start of the acks=1 topic: `AsyncConsumer` iterated record by record
   (`async for`; fetch_max_bytes 1 MiB, the default, and 4 MiB), `poll()` lists, the blocking
   `Consumer` iterated (`for`, max_poll_records 500, the default) and its `poll()` lists (of up to
   10 000), and raw
   `FetchRequest`s on an `AsyncConnection` that only walk batch headers (the broker's serving rate
   with a free client; repeated passes for at least 0.5 s).
3. Acked single-record latency, acks=1, one record at a time: AsyncProducer.send_and_wait
   (linger_ms=0), the blocking Producer's send().result(), a raw AsyncConnection.request(
   ProduceRequest) of a pre-encoded one-record batch, and the same frame on a blocking socket
   (sendall, then read the response frame): p50/p99/p999 in microseconds after a warm-up.
4. Broker CPU: utime+stime of the broker's processes (the supervisor and its workers, found
   through /proc/<pid>/task/<tid>/children) from /proc/<pid>/stat, read by the client
   right before and after each timed section; shown as CPU seconds per GB of record values, as a
   share of one CPU (broker CPU %; client CPU % is the worker's own process time), and per
   single-record produce.

Every topic is deleted once measured (the acks=1 ones after the consume phase). Keeping them made
each run slower than the one before (the page cache growing into memory this VM had not touched
yet: the broker's CPU per GB rose by half over six runs), which would have made the results
depend on their order.

MB = 10^6 bytes, GB = 10^9 bytes; "MB/s" is record values per second; "wire MB/s" counts whole
batches as the broker stores them. Produce and consume rows are the best of 2 runs (1 with
--quick), with the largest spread printed; the tuning grid and the latency runs are single runs.
Nothing is fsynced except what acks=2 asks for.

`--profile broker|client` (instead of the tables): profiles three phases, produce 1 KiB acks=1,
consume-from-start 1 KiB (iterating), and single-record latency 100 B (AsyncProducer), on the
broker side or the client side, with py-spy (sampling, little overhead; `pip install py-spy`) or
cProfile (deterministic; its per-call overhead inflates call-heavy code: read it for where time
goes, not for how fast). With cProfile the broker runs as `python -m cProfile -o F -m broker.cli
serve ...`, one broker process per profiled phase (the consume phase's data is produced by an
unprofiled broker first, which is then restarted under the profiler on the same data directory).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import io
import math
import multiprocessing
import multiprocessing.connection
import os
import platform
import pstats
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import uvloop
from benchlib import REPO, children_of, code_version, fs_of, size_label, table

from broker.client import (
    Acks,
    Admin,
    AsyncAdmin,
    AsyncConnection,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    Producer,
)
from broker.storage import layout
from labkit.brokerproc import BrokerProcess
from ringlog_proto.batch import HEADER_SIZE, RECORD_COUNT_MAX, encode_batch, iter_batches, record_size
from ringlog_proto.frames import LENGTH_SIZE, Frame, FrameDecoder, peek_frame_size
from ringlog_proto.messages import ErrorCode, FetchRequest, ProduceRequest, decode_response, encode_request

KIB = 1024
MIB = 1024 * KIB
MB = 1_000_000
GB = 1_000_000_000

RECORD_SIZES = (100, KIB)
VALUE_POOL = 4096  # distinct values cycled by the producer (4 MiB of 1 KiB values)
PING_BYTES = 128
STREAM_CHUNK = MIB
CEILING_ROUNDS = 5
RAW_IN_FLIGHT = 5  # pre-encoded produce: requests in flight (the producer's max_in_flight)
RAW_FETCH_MIN_S = 0.5  # raw fetch: whole passes over the topic until at least this long

# The targets.
TARGET_PRODUCE_RPS = 150_000  # one Python producer, 1 KiB records, acks=written
TARGET_CONSUME_MBS = 300  # consume from start, MB/s of records
TARGET_P50_US = 150  # acked single-record produce, p50

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Sizes:
    """Record counts per run (per record size: 100 B, 1 KiB)."""

    tune: dict[int, int]
    produce: dict[int, int]
    latency: int
    warmup: int
    stream_bytes: int
    pings: int
    rounds: int  # produce and consume runs per configuration; the fastest is reported


FULL = Sizes(
    {100: 400_000, KIB: 200_000}, {100: 1_200_000, KIB: 600_000}, 5000, 500, 2 * 1024 * MIB, 20_000, 2
)
QUICK = Sizes({100: 150_000, KIB: 80_000}, {100: 400_000, KIB: 200_000}, 2000, 300, 512 * MIB, 5000, 1)

# The tuning grid, per record size: AsyncProducer with each batch_bytes at the default linger; the
# fastest batch_bytes is then tried with the other linger and with the blocking Producer.
TUNE_BATCHES = (64 * KIB, 256 * KIB, MIB)
TUNE_LINGER_DEFAULT = 5.0
TUNE_LINGER_OTHER = 50.0


# --------------------------------------------------------------------------------------- helpers


def proc_cpu(pid: int, reaped_children: bool = False) -> float:
    """utime + stime of process `pid` in seconds, from /proc/<pid>/stat (all its threads); with
    `reaped_children`, plus cutime + cstime: the time of its children that exited and were waited
    for (a worker the supervisor restarted)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    fields = data[data.rindex(b")") + 2 :].split()  # fields from 3 (state) on
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # fields 16 and 17
    return ticks / CLK_TCK


def broker_cpu(pid: int) -> float:
    """CPU seconds of the broker whose supervisor is `pid`: the supervisor, every worker (its
    children, where the requests are served) and their descendants, and the children already
    reaped. A process that exits between the listing and the read is left out."""
    total = proc_cpu(pid, reaped_children=True)
    todo = children_of(pid)
    while todo:
        child = todo.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += proc_cpu(child)
            todo.extend(children_of(child))
    return total


class Clock:
    """Wall time, this process's CPU time and the broker's CPU time (supervisor and workers: see
    `broker_cpu`) of one timed section."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.wall = self.cpu = self.broker_cpu = 0.0

    def start(self) -> None:
        self._b0 = broker_cpu(self.broker_pid)
        self._c0 = time.process_time()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self._c0
        self.broker_cpu = broker_cpu(self.broker_pid) - self._b0

    def result(self) -> dict[str, float]:
        return {"wall": self.wall, "client_cpu": self.cpu, "broker_cpu": self.broker_cpu}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, max(0, math.ceil(q * n) - 1))]


def latency_summary(samples_ns: list[int]) -> dict[str, float]:
    us = sorted(s / 1000 for s in samples_ns)
    return {
        "p50": percentile(us, 0.50),
        "p99": percentile(us, 0.99),
        "p999": percentile(us, 0.999),
        "mean": sum(us) / len(us),
        "min": us[0],
        "n": len(us),
    }


def make_values(record_size: int) -> list[bytes]:
    raw = os.urandom(VALUE_POOL * record_size)
    return [raw[i * record_size : (i + 1) * record_size] for i in range(VALUE_POOL)]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def pin_to(cpu: int | None) -> None:
    if cpu is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu})


# --------------------------------------------------------------------------------------- the broker


def make_broker(
    data_dir: Path, log_path: Path, cpu: int | None, profile_out: Path | None = None
) -> BrokerProcess:
    """`broker serve --cores 1` (the backend its default picks) on a free port, pinned to `cpu`
    when given (its supervisor pins the worker to a CPU it may use), under cProfile writing
    `profile_out` when given."""
    return BrokerProcess(
        data_dir,
        log_path,
        backend="auto",
        wrapper=("taskset", "-c", str(cpu)) if cpu is not None else (),
        python_args=("-m", "cProfile", "-o", str(profile_out)) if profile_out is not None else (),
        cwd=REPO,
    )


def stored_bytes(broker: BrokerProcess, topic_id: int) -> int:
    """Bytes of the topic's store files: its record batches exactly as stored."""
    root = Path(layout.topic_dir(str(broker.data_dir), topic_id))
    return sum(p.stat().st_size for p in root.glob(f"*/*{layout.STORE_SUFFIX}"))


# --------------------------------------------------------------------------------------- client jobs
# These run in the client worker process.


def job_init(cpu: int | None) -> int:
    """Pin the worker process to its CPU; return its pid (for py-spy in --profile client)."""
    pin_to(cpu)
    return os.getpid()


def create_topic(bootstrap: str, name: str, partitions: int) -> int:
    with Admin(bootstrap) as admin:
        return admin.create_topic(name, partitions)


def job_delete_topic(bootstrap: str, name: str) -> None:
    with Admin(bootstrap) as admin:
        admin.delete_topic(name)


def end_offsets(bootstrap: str, name: str) -> int:
    with Admin(bootstrap) as admin:
        return sum(p.end_offset for p in admin.describe_topic(name).partitions)


async def wait_appended(admin: AsyncAdmin, topic: str, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        d = await admin.describe_topic(topic)
        if sum(p.end_offset for p in d.partitions) >= expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: the broker did not append {expected} records in {timeout} s")
        await asyncio.sleep(0.0005)


def profile_text(prof: cProfile.Profile | None, limit: int = 20) -> str:
    if prof is None:
        return ""
    out = io.StringIO()
    for key in ("tottime", "cumulative"):
        out.write(f"\n--- top {limit} by {key} ---\n")
        pstats.Stats(prof, stream=out).strip_dirs().sort_stats(key).print_stats(limit)
    return out.getvalue()


@dataclass(frozen=True)
class ProduceSpec:
    bootstrap: str
    broker_pid: int
    topic: str
    record_size: int
    count: int
    acks: int
    batch_bytes: int
    linger_ms: float
    client: str = "async"  # "async": AsyncProducer; "sync": the blocking Producer
    partitions: int = 1
    spread: bool = False  # partition=i % partitions on every send (else keyless: sticky)
    profile: bool = False


def job_produce(spec: ProduceSpec) -> dict[str, Any]:
    values = make_values(spec.record_size)
    topic_id = create_topic(spec.bootstrap, spec.topic, spec.partitions)
    sync = spec.client == "sync"
    out = produce_sync(spec, values) if sync else uvloop.run(produce_async(spec, values))
    total = end_offsets(spec.bootstrap, spec.topic)
    if total != spec.count + 1:  # + the untimed first record
        raise RuntimeError(f"{spec.topic}: {total} records in the log, sent {spec.count + 1}")
    return {**out, "topic_id": topic_id, "records_in_log": total}


async def produce_async(spec: ProduceSpec, values: list[bytes]) -> dict[str, Any]:
    clock = Clock(spec.broker_pid)
    mask = VALUE_POOL - 1
    topic = spec.topic
    prof = cProfile.Profile() if spec.profile else None
    async with AsyncProducer(
        spec.bootstrap, acks=spec.acks, batch_bytes=spec.batch_bytes, linger_ms=spec.linger_ms
    ) as p:
        await (await p.send(topic, values[0]))  # metadata and connection, untimed
        admin = AsyncAdmin(client=p.client)
        send = p.send
        parts = spec.partitions if spec.spread else 0
        clock.start()
        if prof is not None:
            prof.enable()
        if parts:
            for i in range(spec.count):
                await send(topic, values[i & mask], partition=i % parts)
        else:
            for i in range(spec.count):
                await send(topic, values[i & mask])
        await p.flush()
        if spec.acks == Acks.NONE:
            await wait_appended(admin, topic, spec.count + 1)
        if prof is not None:
            prof.disable()
        clock.stop()
    return {**clock.result(), "profile": profile_text(prof)}


def produce_sync(spec: ProduceSpec, values: list[bytes]) -> dict[str, Any]:
    clock = Clock(spec.broker_pid)
    mask = VALUE_POOL - 1
    topic = spec.topic
    prof = cProfile.Profile() if spec.profile else None  # this thread only, not the loop thread
    with Producer(
        spec.bootstrap, acks=spec.acks, batch_bytes=spec.batch_bytes, linger_ms=spec.linger_ms
    ) as p:
        p.send(topic, values[0]).result()
        send = p.send
        parts = spec.partitions if spec.spread else 0
        clock.start()
        if prof is not None:
            prof.enable()
        if parts:
            for i in range(spec.count):
                send(topic, values[i & mask], partition=i % parts)
        else:
            for i in range(spec.count):
                send(topic, values[i & mask])
        p.flush()
        if spec.acks == Acks.NONE:
            deadline = time.monotonic() + 60
            while end_offsets(spec.bootstrap, topic) < spec.count + 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{topic}: acks=0 records not all appended")
                time.sleep(0.0005)
        if prof is not None:
            prof.disable()
        clock.stop()
    return {**clock.result(), "profile": profile_text(prof)}


@dataclass(frozen=True)
class RawProduceSpec:
    bootstrap: str
    broker_pid: int
    topic: str
    record_size: int
    count: int
    batch_bytes: int


def job_raw_produce(spec: RawProduceSpec) -> dict[str, Any]:
    """Pre-encoded batches (no producer id) written with `request_nowait`, RAW_IN_FLIGHT at a time."""
    per_record = record_size(bytes(spec.record_size), offset_delta=RECORD_COUNT_MAX)  # at any index
    per = max(1, (spec.batch_bytes - HEADER_SIZE) // per_record)
    nbatches = max(1, spec.count // per)
    distinct = min(nbatches, max(1, 64 * MIB // spec.batch_bytes))
    pool = []
    for _ in range(distinct):
        raw = os.urandom(per * spec.record_size)
        pool.append(
            encode_batch([raw[i * spec.record_size : (i + 1) * spec.record_size] for i in range(per)])
        )
    topic_id = create_topic(spec.bootstrap, spec.topic, 1)
    out = uvloop.run(_raw_produce(spec, topic_id, pool, nbatches))
    total = end_offsets(spec.bootstrap, spec.topic)
    if total != nbatches * per:
        raise RuntimeError(f"{spec.topic}: {total} records in the log, sent {nbatches * per}")
    return {**out, "topic_id": topic_id, "records": nbatches * per, "batch_records": per}


async def _raw_produce(spec: RawProduceSpec, topic_id: int, pool: list[bytes], nbatches: int) -> dict:
    host, port = spec.bootstrap.split(":")
    conn = await AsyncConnection.connect(host, int(port))
    clock = Clock(spec.broker_pid)
    try:
        window: collections.deque[asyncio.Future[Any]] = collections.deque()
        clock.start()
        for i in range(nbatches):
            req = ProduceRequest(topic_id, 0, Acks.WRITTEN, 30_000, pool[i % len(pool)])
            window.append(conn.request_nowait(req))
            if len(window) >= RAW_IN_FLIGHT:
                resp = await window.popleft()
                if resp.error != ErrorCode.NONE:
                    raise RuntimeError(f"produce failed: {resp}")
        for fut in window:
            resp = await fut
            if resp.error != ErrorCode.NONE:
                raise RuntimeError(f"produce failed: {resp}")
        clock.stop()
    finally:
        await conn.close()
    return clock.result()


@dataclass(frozen=True)
class ConsumeSpec:
    bootstrap: str
    broker_pid: int
    topic: str
    topic_id: int
    expected: int
    mode: str  # "iter", "poll", "raw" (AsyncConsumer or a bare connection), "sync-iter", "sync-poll"
    fetch_max_bytes: int = MIB
    profile: bool = False


def job_consume(spec: ConsumeSpec) -> dict[str, Any]:
    if spec.mode.startswith("sync-"):
        return _consume_sync(spec)
    return uvloop.run(_consume(spec))


def _consume_sync(spec: ConsumeSpec) -> dict[str, Any]:
    """The blocking `Consumer`: iterated record by record, or `poll()` lists of up to 10 000."""
    clock = Clock(spec.broker_pid)
    n = nbytes = 0
    expected = spec.expected
    with Consumer(
        spec.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_bytes=spec.fetch_max_bytes,
        iter_timeout_ms=20_000,
        max_poll_records=10_000 if spec.mode == "sync-poll" else 500,
    ) as c:
        c.assign([(spec.topic, 0)])  # metadata and the start position, untimed
        clock.start()
        if spec.mode == "sync-iter":
            for r in c:
                n += 1
                nbytes += len(r.value)  # type: ignore[arg-type]
                if n >= expected:
                    break
        else:
            while n < expected:
                got = c.poll(timeout_ms=20_000)
                if not got:
                    break
                n += len(got)
                for r in got:
                    nbytes += len(r.value)  # type: ignore[arg-type]
        clock.stop()
    if n != expected:
        raise RuntimeError(f"{spec.topic}: consumed {n} records, expected {expected}")
    return {**clock.result(), "records": n, "value_bytes": nbytes, "profile": ""}


async def _consume(spec: ConsumeSpec) -> dict[str, Any]:
    clock = Clock(spec.broker_pid)
    prof = cProfile.Profile() if spec.profile else None
    n = nbytes = 0
    expected = spec.expected
    if spec.mode == "raw":
        host, port = spec.bootstrap.split(":")
        conn = await AsyncConnection.connect(host, int(port))
        try:
            clock.start()
            while n == 0 or time.perf_counter() - clock.t0 < RAW_FETCH_MIN_S:  # whole passes
                offset = 0
                while offset < expected:
                    req = FetchRequest(spec.topic_id, 0, offset, spec.fetch_max_bytes, 0, 1)
                    data = (await conn.request(req)).records  # type: ignore[attr-defined]
                    nbytes += len(data)
                    last = None
                    for _pos, h in iter_batches(data):
                        last = h
                    if last is None:
                        raise RuntimeError(f"fetch at {offset} returned no whole batch")
                    offset = last.base_offset + last.record_count
                n += offset
            clock.stop()
        finally:
            await conn.close()
        return {**clock.result(), "records": n, "fetched_bytes": nbytes, "profile": ""}
    async with AsyncConsumer(
        spec.bootstrap,
        auto_offset_reset="earliest",
        fetch_max_bytes=spec.fetch_max_bytes,
        iter_timeout_ms=20_000,
        max_poll_records=100_000 if spec.mode == "poll" else 500,
    ) as c:
        await c.client.topic(spec.topic)  # metadata, untimed
        clock.start()
        if prof is not None:
            prof.enable()
        await c.assign([(spec.topic, 0)])
        if spec.mode == "iter":
            async for r in c:
                n += 1
                nbytes += len(r.value)  # type: ignore[arg-type]
                if n >= expected:
                    break
        else:
            while n < expected:
                got = await c.poll(timeout_ms=20_000)
                if not got:
                    break
                n += len(got)
                for r in got:
                    nbytes += len(r.value)  # type: ignore[arg-type]
        if prof is not None:
            prof.disable()
        clock.stop()
    if n != expected:
        raise RuntimeError(f"{spec.topic}: consumed {n} records, expected {expected}")
    return {**clock.result(), "records": n, "value_bytes": nbytes, "profile": profile_text(prof)}


@dataclass(frozen=True)
class LatencySpec:
    bootstrap: str
    broker_pid: int
    topic: str
    record_size: int
    count: int
    warmup: int
    paths: tuple[str, ...] = ("producer", "sync-producer", "connection", "socket")
    profile: bool = False


def job_latency(spec: LatencySpec) -> dict[str, Any]:
    value = os.urandom(spec.record_size)
    topic_id = create_topic(spec.bootstrap, spec.topic, 1)
    out: dict[str, Any] = {}
    for path in spec.paths:
        if path == "sync-producer":
            out[path] = latency_sync_producer(spec, value)
        elif path == "socket":
            out[path] = latency_socket(spec, topic_id, value)
        else:
            out[path] = uvloop.run(latency_async(spec, path, topic_id, value))
    return out


def _latency_result(clock: Clock, samples: list[int], prof: cProfile.Profile | None) -> dict[str, Any]:
    return {**latency_summary(samples), **clock.result(), "profile": profile_text(prof)}


async def latency_async(spec: LatencySpec, path: str, topic_id: int, value: bytes) -> dict[str, Any]:
    clock = Clock(spec.broker_pid)
    prof = cProfile.Profile() if spec.profile else None
    ns = time.perf_counter_ns
    samples: list[int] = []
    if path == "producer":
        async with AsyncProducer(spec.bootstrap, acks=Acks.WRITTEN, linger_ms=0) as p:
            send = p.send_and_wait
            topic = spec.topic
            for _ in range(spec.warmup):
                await send(topic, value)
            clock.start()
            if prof is not None:
                prof.enable()
            for _ in range(spec.count):
                t = ns()
                await send(topic, value)
                samples.append(ns() - t)
            if prof is not None:
                prof.disable()
            clock.stop()
        return _latency_result(clock, samples, prof)
    host, port = spec.bootstrap.split(":")
    conn = await AsyncConnection.connect(host, int(port))
    try:
        batch = encode_batch([value])
        request = conn.request
        for _ in range(spec.warmup):
            await request(ProduceRequest(topic_id, 0, Acks.WRITTEN, 30_000, batch))
        clock.start()
        if prof is not None:
            prof.enable()
        for _ in range(spec.count):
            t = ns()
            await request(ProduceRequest(topic_id, 0, Acks.WRITTEN, 30_000, batch))
            samples.append(ns() - t)
        if prof is not None:
            prof.disable()
        clock.stop()
    finally:
        await conn.close()
    return _latency_result(clock, samples, prof)


def latency_sync_producer(spec: LatencySpec, value: bytes) -> dict[str, Any]:
    clock = Clock(spec.broker_pid)
    ns = time.perf_counter_ns
    samples: list[int] = []
    with Producer(spec.bootstrap, acks=Acks.WRITTEN, linger_ms=0) as p:
        send = p.send
        topic = spec.topic
        for _ in range(spec.warmup):
            send(topic, value).result()
        clock.start()
        for _ in range(spec.count):
            t = ns()
            send(topic, value).result()
            samples.append(ns() - t)
        clock.stop()
    return _latency_result(clock, samples, None)


def latency_socket(spec: LatencySpec, topic_id: int, value: bytes) -> dict[str, Any]:
    """The same produce frame on a blocking socket: the broker plus the network, no client library."""
    clock = Clock(spec.broker_pid)
    ns = time.perf_counter_ns
    host, port = spec.bootstrap.split(":")
    frame = b"".join(
        encode_request(ProduceRequest(topic_id, 0, Acks.WRITTEN, 30_000, encode_batch([value])), 7)
    )
    samples: list[int] = []
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(64 * KIB)
        view = memoryview(buf)

        def round_trip() -> int:
            s.sendall(frame)
            got = 0
            need = 4
            while got < need:
                k = s.recv_into(view[got:])
                if not k:
                    raise ConnectionError("broker closed the connection")
                got += k
                if got >= LENGTH_SIZE:
                    need = peek_frame_size(buf) or need
            if got != need:
                raise RuntimeError("more than one response frame")
            return got

        for _ in range(spec.warmup):  # check that the broker accepts it, untimed
            size = round_trip()
            dec = FrameDecoder()
            dec.feed(bytes(buf[:size]))
            f = dec.next_frame()
            assert isinstance(f, Frame)
            resp = decode_response(f)
            if resp.error != ErrorCode.NONE:
                raise RuntimeError(f"produce on the raw socket failed: {resp}")
        clock.start()
        for _ in range(spec.count):
            t = ns()
            round_trip()
            samples.append(ns() - t)
        clock.stop()
    return _latency_result(clock, samples, None)


# --------------------------------------------------------------------------------------- the ceiling


def recv_exact(s: socket.socket, n: int) -> bytes:
    parts = []
    while n:
        chunk = s.recv(n)
        if not chunk:
            raise ConnectionError("peer closed")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def ceiling_peer(conn: multiprocessing.connection.Connection, cpu: int | None) -> None:
    """The other process of the loopback ceiling: a stream sink and a ping-pong echo."""
    pin_to(cpu)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        conn.send(srv.getsockname()[1])
        while True:
            s, _ = srv.accept()
            with s:
                kind = recv_exact(s, 1)
                if kind == b"s":  # stream: 8-byte length, then that many bytes; answer one byte
                    total = struct.unpack(">Q", recv_exact(s, 8))[0]
                    buf = bytearray(STREAM_CHUNK)
                    got = 0
                    recv_into = s.recv_into
                    while got < total:
                        k = recv_into(buf)
                        if not k:
                            raise ConnectionError("stream sender closed early")
                        got += k
                    s.sendall(b"k")
                elif kind == b"p":  # ping-pong: size, count; echo each message
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    size, count = struct.unpack(">II", recv_exact(s, 8))
                    for _ in range(count):
                        s.sendall(recv_exact(s, size))
                else:
                    return


def job_ceiling(port: int, peer_pid: int, stream_bytes: int, pings: int, warmup: int) -> dict[str, Any]:
    """Stream rates (bytes/s; round 0, the warm-up, untimed), the receiver's CPU seconds per byte,
    and the ping-pong round trips with the echo side's CPU seconds per round trip."""
    chunk = os.urandom(STREAM_CHUNK)
    rates = []
    sink_cpu = []
    for rnd in range(CEILING_ROUNDS + 1):  # round 0 warms up
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"s" + struct.pack(">Q", stream_bytes))
            sendall = s.sendall
            c0 = proc_cpu(peer_pid)
            t0 = time.perf_counter()
            for _ in range(stream_bytes // STREAM_CHUNK):
                sendall(chunk)
            if s.recv(1) != b"k":
                raise ConnectionError("stream not acknowledged")
            dt = time.perf_counter() - t0
            if rnd:
                rates.append(stream_bytes / dt)
                sink_cpu.append((proc_cpu(peer_pid) - c0) / stream_bytes)
    msg = os.urandom(PING_BYTES)
    samples: list[int] = []
    ns = time.perf_counter_ns
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"p" + struct.pack(">II", PING_BYTES, warmup + pings))
        c0 = 0.0
        for i in range(warmup + pings):
            if i == warmup:
                c0 = proc_cpu(peer_pid)
            t = ns()
            s.sendall(msg)
            recv_exact(s, PING_BYTES)
            if i >= warmup:
                samples.append(ns() - t)
        echo_cpu = (proc_cpu(peer_pid) - c0) / pings
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"q")
    return {
        "stream": rates,
        "sink_cpu_per_byte": min(sink_cpu),
        "ping": latency_summary(samples),
        "echo_cpu": echo_cpu,
    }


# --------------------------------------------------------------------------------------- orchestration


@dataclass
class Run:
    """The run's processes and settings, shared by the phases."""

    broker: BrokerProcess
    pool: ProcessPoolExecutor
    sizes: Sizes
    worker_pid: int = 0
    topics: int = 0
    results: dict[str, Any] = field(default_factory=dict)

    def call(self, fn: Any, *args: Any) -> Any:
        return self.pool.submit(fn, *args).result()

    def topic(self, label: str) -> str:
        self.topics += 1
        return f"e2e-{self.topics:03d}-{label}"


def mbs(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / MB


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def fmt_us(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def produce_row_values(spec: ProduceSpec, r: dict[str, Any], stored: int) -> dict[str, float]:
    wall = r["wall"]
    payload = spec.count * spec.record_size
    wire = stored * spec.count / r["records_in_log"]  # the timed records' share of the store
    return {
        "rps": spec.count / wall,
        "mbs": mbs(payload, wall),
        "wire_mbs": mbs(wire, wall),
        "broker_pct": r["broker_cpu"] / wall,
        "client_pct": r["client_cpu"] / wall,
        "broker_s_per_gb": r["broker_cpu"] / (payload / GB),
        "client_s_per_gb": r["client_cpu"] / (payload / GB),
    }


def client_label(client: str) -> str:
    return {"async": "AsyncProducer", "sync": "Producer"}[client]


def tune(run: Run, record_size: int) -> tuple[ProduceSpec, list[list[str]]]:
    """Try producer settings at acks=1 on 1 partition; return the fastest spec and the grid rows."""
    b = run.broker
    base = ProduceSpec(
        b.bootstrap,
        b.pid,
        "",
        record_size,
        run.sizes.tune[record_size],
        Acks.WRITTEN,
        256 * KIB,
        TUNE_LINGER_DEFAULT,
    )
    tried: list[tuple[ProduceSpec, dict[str, float]]] = []

    def attempt(spec: ProduceSpec) -> None:
        spec = replace(spec, topic=run.topic(f"tune-{record_size}"))
        r = run.call(job_produce, spec)
        tried.append((spec, produce_row_values(spec, r, stored_bytes(b, r["topic_id"]))))
        run.call(job_delete_topic, b.bootstrap, spec.topic)

    for bb in TUNE_BATCHES:
        attempt(replace(base, batch_bytes=bb))
    best_bb = max(tried, key=lambda t: t[1]["rps"])[0].batch_bytes
    attempt(replace(base, batch_bytes=best_bb, linger_ms=TUNE_LINGER_OTHER))
    attempt(replace(base, batch_bytes=best_bb, client="sync"))
    best = max(tried, key=lambda t: t[1]["rps"])[0]
    rows = [
        [
            size_label(record_size),
            client_label(s.client),
            size_label(s.batch_bytes),
            f"{s.linger_ms:g}",
            fmt_rate(v["rps"]),
            fmt_rate(v["mbs"]),
            f"{v['broker_pct']:.0%}",
            f"{v['client_pct']:.0%}",
            "<- best" if s is best else "",
        ]
        for s, v in tried
    ]
    return replace(best, count=run.sizes.produce[record_size], topic=""), rows


def raw_produce_row(
    run: Run, rs: int, batch_bytes: int, label: str, noise: list[float]
) -> tuple[list[str], dict[str, float]]:
    """Best of `rounds` pre-encoded produce runs as a produce-table row (and its broker figures)."""
    b = run.broker
    raw_count = run.sizes.produce[KIB] * KIB // rs  # the same bytes for both record sizes
    tries = []
    for _ in range(run.sizes.rounds):
        spec = RawProduceSpec(b.bootstrap, b.pid, run.topic(f"raw{rs}"), rs, raw_count, batch_bytes)
        r = run.call(job_raw_produce, spec)
        r["stored"] = stored_bytes(b, r["topic_id"])
        tries.append(r)
        run.call(job_delete_topic, b.bootstrap, spec.topic)
    noise.append(max(t["wall"] for t in tries) / min(t["wall"] for t in tries) - 1)
    r = min(tries, key=lambda t: t["wall"])
    wall = r["wall"]
    payload = r["records"] * rs
    v = {"broker_s_per_gb": r["broker_cpu"] / (payload / GB), "broker_pct": r["broker_cpu"] / wall}
    stream = run.results["stream"]
    row = [
        size_label(rs),
        label,
        "1",
        fmt_rate(r["records"] / wall),
        fmt_rate(mbs(payload, wall)),
        fmt_rate(mbs(r["stored"], wall)),
        f"{r['stored'] / wall / stream:.2f}x",
        f"{v['broker_pct']:.0%}",
        f"{r['client_cpu'] / wall:.0%}",
        f"{v['broker_s_per_gb']:.2f}",
        f"{r['client_cpu'] / (payload / GB):.2f}",
    ]
    return row, v


def run_tables(run: Run, args: argparse.Namespace) -> None:
    b = run.broker
    sizes = run.sizes
    t_start = time.perf_counter()

    # 5 first: the ceiling, on an idle machine.
    parent, child = multiprocessing.get_context("spawn").Pipe()
    peer = multiprocessing.get_context("spawn").Process(target=ceiling_peer, args=(child, args.cpu_broker))
    peer.start()
    try:
        peer_port = parent.recv()
        ceiling = run.call(job_ceiling, peer_port, peer.pid, sizes.stream_bytes, sizes.pings, sizes.warmup)
    finally:
        peer.join(30)
        if peer.is_alive():
            peer.kill()
    stream = max(ceiling["stream"])
    spread = max(ceiling["stream"]) / min(ceiling["stream"]) - 1
    ping = ceiling["ping"]
    print(
        "\n5. Loopback ceiling (two plain Python processes, measured first):"
        f" stream {mbs(stream, 1):,.0f} MB/s"
        f" (sendall 1 MiB / recv_into 1 MiB, {size_label(sizes.stream_bytes)} x {CEILING_ROUNDS}, best;"
        f" spread {spread:.0%})"
    )
    sink_s_per_gb = ceiling["sink_cpu_per_byte"] * GB
    echo_us = ceiling["echo_cpu"] * 1e6
    print(
        f"   the receiving process spends {sink_s_per_gb:.2f} CPU s/GB (recv_into alone: the floor for"
        " broker CPU per GB ingested)"
    )
    print(
        f"   ping-pong {PING_BYTES} B each way, TCP_NODELAY, {ping['n']:,} round trips:"
        f" p50 {fmt_us(ping['p50'])} us,"
        f" p99 {fmt_us(ping['p99'])} us, p999 {fmt_us(ping['p999'])} us;"
        f" the echoing process spends {fmt_us(echo_us)} CPU us per round trip"
    )

    # 1. First, on the fresh broker: pre-encoded 256 KiB batches before it has seen any larger frame.
    run.results["stream"] = stream
    noise: list[float] = []
    cold_row, cold = raw_produce_row(
        run, KIB, 256 * KIB, f"1, pre-encoded, {RAW_IN_FLIGHT} in flight, fresh broker*", noise
    )

    # Tuning, then produce.
    best: dict[int, ProduceSpec] = {}
    grid: list[list[str]] = []
    for rs in RECORD_SIZES:
        best[rs], rows = tune(run, rs)
        grid.extend(rows)
    print(
        "\n1a. Producer settings tried at acks=1, 1 partition"
        f" ({', '.join(f'{sizes.tune[r]:,} x {size_label(r)}' for r in RECORD_SIZES)}"
        " records per run); the best per record size is used below"
    )
    table(
        ["record", "client", "batch_bytes", "linger_ms", "records/s", "MB/s", "broker CPU", "client CPU", ""],
        grid,
        2,
    )

    produce_rows: list[list[str]] = []
    raw_v: dict[int, dict[str, float]] = {}
    produced: dict[tuple[int, int, int], tuple[ProduceSpec, dict[str, Any], dict[str, float]]] = {}
    for rs in RECORD_SIZES:
        for acks, parts, spread in (
            (Acks.NONE, 1, False),
            (Acks.WRITTEN, 1, False),
            (Acks.DURABLE, 1, False),
            (Acks.WRITTEN, 4, False),
            (Acks.WRITTEN, 4, True),
        ):
            tries = []
            for _ in range(sizes.rounds):  # a fresh topic each round
                spec = replace(
                    best[rs],
                    acks=acks,
                    partitions=parts,
                    spread=spread,
                    topic=run.topic(f"p{rs}-a{acks}-x{parts}{'rr' if spread else ''}"),
                )
                r = run.call(job_produce, spec)
                tries.append((spec, r, produce_row_values(spec, r, stored_bytes(b, r["topic_id"]))))
            noise.append(max(t[1]["wall"] for t in tries) / min(t[1]["wall"] for t in tries) - 1)
            spec, r, v = min(tries, key=lambda t: t[1]["wall"])
            produced[(rs, acks, parts)] = (spec, r, v)
            for t in tries:  # the acks=1 single-partition topic is consumed below, then deleted
                if t[0] is not spec or (acks, parts) != (Acks.WRITTEN, 1):
                    run.call(job_delete_topic, b.bootstrap, t[0].topic)
            produce_rows.append(
                [
                    size_label(rs),
                    f"{int(acks)} ({Acks(acks).name.lower()})",
                    f"{parts} rr" if spread else str(parts),
                    fmt_rate(v["rps"]),
                    fmt_rate(v["mbs"]),
                    fmt_rate(v["wire_mbs"]),
                    f"{v['wire_mbs'] * MB / stream:.2f}x",
                    f"{v['broker_pct']:.0%}",
                    f"{v['client_pct']:.0%}",
                    f"{v['broker_s_per_gb']:.2f}",
                    f"{v['client_s_per_gb']:.2f}",
                ]
            )
        row, raw_v[rs] = raw_produce_row(
            run, rs, best[rs].batch_bytes, f"1, pre-encoded, {RAW_IN_FLIGHT} in flight", noise
        )
        produce_rows.append(row)
    produce_rows.append(cold_row)
    print(
        "\n1. Produce throughput, one producer; timed from the first send to flush() returning"
        " (acks=0: to the broker reporting every record appended); settings per record size:"
    )
    for rs in RECORD_SIZES:
        s = best[rs]
        print(
            f"   {size_label(rs)}: {client_label(s.client)}, batch_bytes {size_label(s.batch_bytes)},"
            f" linger_ms {s.linger_ms:g}, max_in_flight 5, idempotent; {sizes.produce[rs]:,} records per run"
        )
    table(
        [
            "record",
            "acks",
            "parts",
            "records/s",
            "MB/s",
            "wire MB/s",
            "x loopback",
            "broker CPU",
            "client CPU",
            "broker s/GB",
            "client s/GB",
        ],
        produce_rows,
        2,
    )
    print(
        "  x loopback: wire MB/s over the stream ceiling. broker/client CPU: share of one CPU during the"
        " run; s/GB: CPU seconds per GB of record values. pre-encoded: no producer, batches built"
        " before the clock"
    )
    print(
        "  * measured first, on the fresh broker, before it had received any frame over 256 KiB; every"
        " other row follows the tuning grid's 1 MiB batches (glibc's malloc raises its mmap and trim"
        " thresholds after freeing its first large block, and the broker's per-request buffers stop"
        " being trimmed and faulted in again)"
    )
    print(
        f"  best of {sizes.rounds} run(s) per row, each on a fresh topic; noise: largest slowest/fastest - 1"
        f" over the rows: {max(noise):.0%}"
    )

    # 2. Consume from start, the acks=1 single-partition topic.
    consume_rows: list[list[str]] = []
    consume_noise: list[float] = []
    consumed: dict[int, dict[str, float]] = {}
    for rs in RECORD_SIZES:
        spec_p, r_p, _ = produced[(rs, Acks.WRITTEN, 1)]
        stored = stored_bytes(b, r_p["topic_id"])
        expected = r_p["records_in_log"]
        for mode, fmb, label in (
            ("iter", MIB, "AsyncConsumer async for, fetch 1 MiB"),
            ("iter", 4 * MIB, "AsyncConsumer async for, fetch 4 MiB"),
            ("poll", MIB, "AsyncConsumer poll() lists, fetch 1 MiB"),
            ("sync-iter", MIB, "Consumer for-loop, fetch 1 MiB"),
            ("sync-poll", MIB, "Consumer poll() lists, fetch 1 MiB"),
            ("raw", MIB, "raw FetchRequest, headers only, 1 MiB"),
        ):
            cspec = ConsumeSpec(b.bootstrap, b.pid, spec_p.topic, r_p["topic_id"], expected, mode, fmb)
            tries = [run.call(job_consume, cspec) for _ in range(sizes.rounds)]
            consume_noise.append(max(t["wall"] for t in tries) / min(t["wall"] for t in tries) - 1)
            r = min(tries, key=lambda t: t["wall"])
            wall = r["wall"]
            n_rec = r["records"]  # raw: several passes over the topic
            payload = n_rec * rs
            v = {
                "rps": n_rec / wall,
                "mbs": mbs(payload, wall),
                "wire_mbs": mbs(stored * n_rec / expected, wall),
                "broker_pct": r["broker_cpu"] / wall,
                "client_pct": r["client_cpu"] / wall,
                "broker_s_per_gb": r["broker_cpu"] / (payload / GB),
                "client_s_per_gb": r["client_cpu"] / (payload / GB),
            }
            if mode == "iter" and fmb == MIB:
                consumed[rs] = v
            consume_rows.append(
                [
                    size_label(rs),
                    label,
                    fmt_rate(v["rps"]),
                    fmt_rate(v["mbs"]),
                    fmt_rate(v["wire_mbs"]),
                    f"{v['wire_mbs'] * MB / stream:.2f}x",
                    f"{v['broker_pct']:.0%}",
                    f"{v['client_pct']:.0%}",
                    f"{v['broker_s_per_gb']:.2f}",
                    f"{v['client_s_per_gb']:.2f}",
                ]
            )
        run.call(job_delete_topic, b.bootstrap, spec_p.topic)
    print(
        "\n2. Consume from the start of the acks=1 topic above (page cache warm: it was just written);"
        " records handed to the loop, len(value) summed"
    )
    table(
        [
            "record",
            "how",
            "records/s",
            "MB/s",
            "wire MB/s",
            "x loopback",
            "broker CPU",
            "client CPU",
            "broker s/GB",
            "client s/GB",
        ],
        consume_rows,
        2,
    )
    print(
        f"  best of {sizes.rounds} run(s) per row; noise: largest slowest/fastest - 1 over the rows:"
        f" {max(consume_noise):.0%}"
    )

    # 3. Latency.
    lat_rows: list[list[str]] = []
    lat: dict[int, dict[str, Any]] = {}
    labels = {
        "producer": "AsyncProducer.send_and_wait",
        "sync-producer": "Producer.send().result()",
        "connection": "AsyncConnection.request",
        "socket": "blocking socket, same frame",
    }
    for rs in RECORD_SIZES:
        lspec = LatencySpec(b.bootstrap, b.pid, run.topic(f"lat{rs}"), rs, sizes.latency, sizes.warmup)
        lat[rs] = run.call(job_latency, lspec)
        run.call(job_delete_topic, b.bootstrap, lspec.topic)
        for path, label in labels.items():
            x = lat[rs][path]
            lat_rows.append(
                [
                    size_label(rs),
                    label,
                    fmt_us(x["p50"]),
                    fmt_us(x["p99"]),
                    fmt_us(x["p999"]),
                    fmt_us(x["mean"]),
                    f"{x['p50'] / ping['p50']:.1f}x",
                    fmt_us(x["broker_cpu"] / x["n"] * 1e6),
                    fmt_us(x["client_cpu"] / x["n"] * 1e6),
                ]
            )
    print(
        f"\n3. Acked single-record latency, acks=1, one record at a time, {sizes.latency:,} sends after"
        f" {sizes.warmup} warm-up (microseconds)"
    )
    table(
        ["record", "path", "p50", "p99", "p999", "mean", "p50 x floor", "broker CPU/req", "client CPU/req"],
        lat_rows,
        2,
    )
    print(
        f"  floor: the ping-pong p50 above ({fmt_us(ping['p50'])} us). CPU/req: CPU microseconds per"
        " acknowledged record (the broker's from /proc, the client's own process time)"
    )

    # 4. Summary against the ceiling, and the targets.
    print(
        "\n4. Broker CPU (utime+stime from /proc) per GB of record values, from sections 1 and 2, beside"
        f" the ceiling's receiving process ({sink_s_per_gb:.2f} s/GB of plain recv_into)"
    )
    rows4 = []
    for rs in RECORD_SIZES:
        phases = [
            (f"ingest, acks={int(a)}", produced[(rs, a, 1)][2])
            for a in (Acks.NONE, Acks.WRITTEN, Acks.DURABLE)
        ]
        phases.append(("ingest, pre-encoded", raw_v[rs]))
        if rs == KIB:
            phases.append(("ingest, pre-encoded, fresh broker*", cold))
        phases.append(("serve, async for", consumed[rs]))
        for label, v in phases:
            rows4.append(
                [
                    size_label(rs),
                    label,
                    f"{v['broker_s_per_gb']:.2f}",
                    f"{v['broker_s_per_gb'] / sink_s_per_gb:.1f}x",
                    f"{v['broker_pct']:.0%}",
                ]
            )
    table(["record", "phase", "broker CPU s/GB", "x recv floor", "broker CPU busy"], rows4, 2)
    for rs in RECORD_SIZES:
        x = lat[rs]["producer"]
        per_req = x["broker_cpu"] / x["n"] * 1e6
        print(
            f"  per single-record produce ({size_label(rs)}, section 3): {fmt_us(per_req)} broker CPU us,"
            f" {per_req / echo_us:.1f}x the {fmt_us(echo_us)} us of the ping-pong's echoing process"
        )

    print("\nSummary: ringlog beside the loopback ceiling of this run")
    p1 = produced[(KIB, Acks.WRITTEN, 1)][2]
    c1 = consumed[KIB]
    l1 = lat[100]["producer"]
    print(
        f"  produce 1 KiB acks=1: {p1['wire_mbs']:,.0f} wire MB/s vs stream {mbs(stream, 1):,.0f} MB/s"
        f" = {p1['wire_mbs'] * MB / stream:.2f}x"
    )
    print(
        f"  consume 1 KiB from start: {c1['wire_mbs']:,.0f} wire MB/s vs stream {mbs(stream, 1):,.0f} MB/s"
        f" = {c1['wire_mbs'] * MB / stream:.2f}x"
    )
    print(
        f"  acked latency 100 B p50: {fmt_us(l1['p50'])} us vs ping-pong {fmt_us(ping['p50'])} us"
        f" = {l1['p50'] / ping['p50']:.1f}x"
    )
    print("\nTargets")
    targets = [
        (
            "one Python producer, 1 KiB, acks=written",
            f">= {TARGET_PRODUCE_RPS:,} records/s",
            f"{p1['rps']:,.0f} records/s",
            p1["rps"] >= TARGET_PRODUCE_RPS,
        ),
        (
            "consume from start, 1 KiB, async for",
            f">= {TARGET_CONSUME_MBS} MB/s",
            f"{c1['mbs']:,.0f} MB/s",
            c1["mbs"] >= TARGET_CONSUME_MBS,
        ),
    ]
    for rs in RECORD_SIZES:
        x = lat[rs]["producer"]
        targets.append(
            (
                f"acked single-record p50, {size_label(rs)}, AsyncProducer",
                f"<= {TARGET_P50_US} us",
                f"{fmt_us(x['p50'])} us",
                x["p50"] <= TARGET_P50_US,
            )
        )
    table(
        ["what", "target", "measured", "verdict"],
        [[w, t, m, "met" if ok else "NOT met"] for w, t, m, ok in targets],
        2,
    )
    print(f"\n  whole run: {time.perf_counter() - t_start:.0f} s of measurement")


# --------------------------------------------------------------------------------------- profiling


def find_py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


class PySpy:
    """`py-spy record --native` of one process for the duration of a `with` block (raw stacks).

    Native frames are needed: without them py-spy counts a thread blocked in uvloop's epoll_pwait
    (C code under `Runner.run`) as active, and the event loop's idle time looks like work.
    """

    def __init__(self, exe: str, pid: int, out: Path, rate: int = 250) -> None:
        self.argv = [exe, "record", "--pid", str(pid), "--format", "raw", "--output", str(out)]
        self.argv += ["--rate", str(rate), "--native"]
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # attached before the phase starts
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')}")


FRAME_RE = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")
IDLE_FRAMES = ("epoll_pwait", "epoll_wait", "select", "poll")  # native leaves that mean waiting


def parse_frame(frame: str) -> tuple[str, bool]:
    """("function (short file)", is a Python frame) of one py-spy frame; native code at an
    unnamed address becomes "code in LIBRARY"."""
    m = FRAME_RE.match(frame.strip())
    if not m:
        return frame.strip(), False
    func, path = m.groups()
    python = path.endswith(".py") or path.startswith("<")
    if func.startswith("0x"):
        return f"code in {Path(path).name}", False
    return f"{func} ({'/'.join(Path(path).parts[-2:])})", python


def summarize_py_spy(path: Path, limit: int = 20) -> str:
    """From py-spy's raw stacks: idle share, and among the busy samples the Python function
    running (own time, native callees included), the native leaf (syscalls, copies), and the
    inclusive share of Python functions."""
    own: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [parse_frame(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        if frames[-1][0].split(" (")[0] in IDLE_FRAMES:
            idle += n
            continue
        python = [name for name, is_py in frames if is_py]
        own[python[-1] if python else "(no Python frame)"] += n
        name, is_py = frames[-1]
        leaf["(Python code)" if is_py else name] += n
        for f in set(python):
            incl[f] += n
    busy = total - idle
    if not busy:
        return "  (no busy samples)"
    out = [
        f"  {total} samples, {idle} of them waiting in epoll (left out); shares of the {busy} busy samples"
    ]
    tables = (
        ("own time (the innermost Python function, with the C code it called)", own),
        ("native leaf (where the CPU was: Python bytecode, or which C function)", leaf),
        ("inclusive (Python functions)", incl),
    )
    for title, counter in tables:
        out.append(f"\n  --- top {limit} by {title} ---")
        for name, k in counter.most_common(limit):
            out.append(f"  {k / busy:6.1%}  {name}")
    return "\n".join(out)


def cpu_note(r: dict[str, Any]) -> str:
    return f"broker CPU {r['broker_cpu'] / r['wall']:.0%}, client CPU {r['client_cpu'] / r['wall']:.0%}"


def run_profile(args: argparse.Namespace, workdir: Path, pool: ProcessPoolExecutor, worker_pid: int) -> None:
    side = args.profile
    profiler = args.profiler
    spy = find_py_spy()
    if profiler == "auto":
        profiler = "py-spy" if spy else "cprofile"
    if profiler == "py-spy" and not spy:
        raise SystemExit("py-spy not found: `.venv/bin/pip install py-spy` or use --profiler cprofile")
    sizes = QUICK if args.quick else FULL
    print(f"ringlog end-to-end profile: {side} side, {profiler}")
    print(f"  code: {code_version()}; Python {platform.python_version()}; {os.cpu_count()} CPUs")
    log_path = workdir / "broker.log"
    data_dir = workdir / "data"
    counter = iter(range(1, 1000))
    best_bb = args.batch_bytes

    def fresh_broker(name: str) -> BrokerProcess:
        prof_out = workdir / f"broker-{name}.prof" if side == "broker" and profiler == "cprofile" else None
        return make_broker(data_dir, log_path, args.cpu_broker, prof_out).start(timeout_s=30)

    def finish(broker: BrokerProcess, name: str, spy_out: Path | None, client_profile: str) -> None:
        rc = broker.stop(timeout_s=60)
        if rc != 0:
            raise RuntimeError(f"broker exited {rc}:\n{broker.log_tail()}")
        print(f"\n=== {name}: {side} profile ===")
        if side == "client" and profiler == "cprofile":
            print(client_profile)
        elif spy_out is not None:
            print(summarize_py_spy(spy_out))
        elif broker.python_args:  # ("-m", "cProfile", "-o", PATH): make_broker's
            out = io.StringIO()
            stats = pstats.Stats(broker.python_args[-1], stream=out).strip_dirs()
            for key in ("tottime", "cumulative"):
                out.write(f"\n--- top 25 by {key} ---\n")
                stats.sort_stats(key).print_stats(25)
            print(out.getvalue())

    def spy_on(pid: int, name: str) -> contextlib.AbstractContextManager[Any]:
        if profiler != "py-spy":
            return contextlib.nullcontext()
        assert spy is not None
        return PySpy(spy, pid, workdir / f"spy-{name}.txt")

    client_cprof = side == "client" and profiler == "cprofile"
    count = sizes.produce[KIB]

    # Produce 1 KiB acks=1.
    broker = fresh_broker("produce")
    spec = ProduceSpec(
        broker.bootstrap,
        broker.pid,
        f"prof-{next(counter)}",
        KIB,
        count,
        Acks.WRITTEN,
        best_bb,
        5.0,
        profile=client_cprof,
    )
    target_pid = broker.worker_pids[0] if side == "broker" else worker_pid
    with spy_on(target_pid, "produce"):
        r = pool.submit(job_produce, spec).result()
    print(
        f"\nproduce 1 KiB acks=1 (AsyncProducer, batch_bytes {size_label(best_bb)}):"
        f" {count / r['wall']:,.0f} records/s under the profiler; {cpu_note(r)}"
    )
    finish(
        broker,
        "produce 1 KiB acks=1",
        workdir / "spy-produce.txt" if profiler == "py-spy" else None,
        r["profile"],
    )

    # Consume: produce with an unprofiled broker (cProfile) or outside the sampling window (py-spy).
    topic = f"prof-{next(counter)}"
    if side == "broker" and profiler == "cprofile":
        plain = make_broker(data_dir, log_path, args.cpu_broker).start(timeout_s=30)
        r = pool.submit(
            job_produce,
            replace(spec, bootstrap=plain.bootstrap, broker_pid=plain.pid, topic=topic, profile=False),
        ).result()
        plain.stop(timeout_s=60)
        broker = fresh_broker("consume")
    else:
        broker = fresh_broker("consume")
        r = pool.submit(
            job_produce,
            replace(spec, bootstrap=broker.bootstrap, broker_pid=broker.pid, topic=topic, profile=False),
        ).result()
    cspec = ConsumeSpec(
        broker.bootstrap, broker.pid, topic, r["topic_id"], r["records_in_log"], "iter", MIB, client_cprof
    )
    target_pid = broker.worker_pids[0] if side == "broker" else worker_pid
    with spy_on(target_pid, "consume"):
        c = pool.submit(job_consume, cspec).result()
    print(
        "\nconsume 1 KiB from start (AsyncConsumer async for):"
        f" {mbs(c['records'] * KIB, c['wall']):,.0f} MB/s under the profiler; {cpu_note(c)}"
    )
    finish(
        broker, "consume 1 KiB", workdir / "spy-consume.txt" if profiler == "py-spy" else None, c["profile"]
    )

    # Latency 100 B.
    broker = fresh_broker("latency")
    lspec = LatencySpec(
        broker.bootstrap,
        broker.pid,
        f"prof-{next(counter)}",
        100,
        sizes.latency * 4,
        sizes.warmup,
        ("producer",),
        client_cprof,
    )
    target_pid = broker.worker_pids[0] if side == "broker" else worker_pid
    with spy_on(target_pid, "latency"):
        lr = pool.submit(job_latency, lspec).result()["producer"]
    print(
        "\nlatency 100 B acks=1 (AsyncProducer.send_and_wait):"
        f" p50 {fmt_us(lr['p50'])} us under the profiler;"
        f" broker CPU {lr['broker_cpu'] / lr['n'] * 1e6:.0f} us/req,"
        f" client CPU {lr['client_cpu'] / lr['n'] * 1e6:.0f} us/req"
    )
    finish(
        broker, "latency 100 B", workdir / "spy-latency.txt" if profiler == "py-spy" else None, lr["profile"]
    )


# --------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="about a third of the records per run (under a minute)"
    )
    p.add_argument("--dir", help="parent of the temporary directory (default: .bench-tmp/ in the repo)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the broker and the client to CPUs")
    p.add_argument("--profile", choices=["broker", "client"], help="profile one side instead of the tables")
    p.add_argument("--profiler", choices=["auto", "py-spy", "cprofile"], default="auto")
    p.add_argument(
        "--batch-bytes",
        type=int,
        default=256 * KIB,
        help="producer batch_bytes in --profile mode (default 256 KiB)",
    )
    args = p.parse_args(argv)
    ncpu = len(os.sched_getaffinity(0))
    pinned = not args.no_pin and ncpu >= 2
    cpus = sorted(os.sched_getaffinity(0))
    args.cpu_broker = cpus[0] if pinned else None
    args.cpu_client = cpus[1] if pinned else None

    parent = Path(args.dir) if args.dir else REPO / ".bench-tmp"
    created_parent = not parent.exists()
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="ringlog-e2e-", dir=parent))
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    broker: BrokerProcess | None = None
    try:
        worker_pid = pool.submit(job_init, args.cpu_client).result()
        if args.profile:
            run_profile(args, workdir, pool, worker_pid)
            return 0
        sizes = QUICK if args.quick else FULL
        broker = make_broker(workdir / "data", workdir / "broker.log", args.cpu_broker)
        print("ringlog end-to-end benchmark: a real broker process, Python clients, loopback TCP")
        print(
            f"  Python {platform.python_version()}, uvloop {uvloop.__version__}, {platform.system()}"
            f" {platform.release()}, {ncpu} CPUs ({cpu_model()})"
        )
        print(f"  code: {code_version()}")
        print(f"  data dir {workdir / 'data'} on {fs_of(str(workdir))}")
        print(f"  broker: {' '.join(Path(a).name if a == sys.executable else a for a in broker.argv)}")
        print(
            "  processes: this script orchestrates only; the broker is a supervisor and one worker process"
            " (broker CPU: both); the client (producer, then consumer, then latency) is ONE other process,"
            " one client at a time, asyncio on uvloop"
        )
        print(
            "  pinning: "
            + (
                f"broker and ceiling peer on CPU {args.cpu_broker}, client on CPU {args.cpu_client}"
                if pinned
                else "none (scheduler's choice)"
            )
        )
        print(
            f"  {'--quick; ' if args.quick else ''}MB = 10^6 B; MB/s counts record values;"
            " wire MB/s whole stored batches"
        )
        broker.start(timeout_s=30)
        run = Run(broker, pool, sizes, worker_pid)
        run_tables(run, args)
        rc = broker.stop(timeout_s=60)
        stopped = "stopped cleanly" in broker.log_path.read_text()
        print(f"  broker stopped with SIGTERM: exit code {rc}{', stopped cleanly' if stopped else ''}")
        if rc != 0:
            print(broker.log_tail())
            return 1
        return 0
    finally:
        if broker is not None and broker.running():
            broker.stop(timeout_s=60)
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(workdir, ignore_errors=True)
        if created_parent:
            with contextlib.suppress(OSError):  # someone else's files are in it
                parent.rmdir()


if __name__ == "__main__":
    sys.exit(main())
