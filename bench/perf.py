"""The performance targets in one run: ringlog's two backends beside Redis, every target as a ratio.

Run: `.venv/bin/python bench/perf.py [--quick] [--rounds N] [--only latency,durable,ingest,fetch]
     [--variants uvloop,io_uring] [--broker-args "..."] [--json PATH] [--no-netns]
     [--guest-halt-poll-ns N] [--tcp-congestion NAME] [--page-reporting-min-free-ms MS]`
     (`make bench-perf`)

Processes and placement. This script orchestrates and is the client. As root it first re-runs
itself inside a fresh network namespace (`rl-perf-<pid>`, only `lo` up, deleted at exit whatever
happens), so nothing another test left on the machine's `lo` (an XDP program, a sysctl) touches
the figures; `--no-netns` runs on the machine's loopback. The servers run for the whole bench, idle
while another is measured, each pinned to CPU 0: one `broker serve --cores 1 --port 0` per
backend (its supervisor pins worker 0 to CPU 0) on a fresh data directory under `--dir`, and two
Debian `redis-server`s (`--appendonly yes`, `appendfsync everysec` and `always`, `--save ""`),
started here and stopped by pid. The client (this process) is pinned to CPU 1. Variants are
measured in rotating order, round after round; a row shows the median of the rounds and their
spread (min..max).

What it measures (1 KiB values; MB and GB are 10^6 and 10^9 bytes of record values):
1. Acked single-record latency, acks=1 (written to the page cache; Redis everysec, where the
   reply also precedes the fsync): p50 and p99 in µs after a warm-up. ringlog: the blocking
   `Producer.send(...).result()` and `AsyncProducer.send_and_wait` with linger 0 (the paths a user
   takes), a pre-encoded produce frame on a blocking socket (the broker's own floor) and the same
   frame through uvloop and a bare asyncio protocol (the floor of any asyncio client). Redis:
   redis-py (hiredis parser) `XADD` of one field to a stream, the closest analogue of appending to
   a log, and `SET`.
2. Durable single-record latency: ringlog acks=2 (fdatasync before the reply) against Redis
   `appendfsync always` (fsync of the AOF before the reply), the same clients. Its floor: a
   blocking Python server that writes each message to a preallocated file and fdatasyncs it
   before echoing (what any durable server must wait for, with no request handling).
3. Ingest: pre-encoded 64 KiB batches (63 records of 1 KiB), acks=1, 8 in flight over one
   connection on a blocking socket (a sendall and a recv_into per batch: the broker is the limit):
   MB/s and broker CPU-seconds per GB (utime+stime of the supervisor and its worker from /proc over
   the timed section). The io_uring/uvloop ratios of throughput and CPU per GB.
4. Fetch: a raw fetch loop on a blocking socket (a FetchRequest with max_bytes `--fetch-max-bytes`,
   `recv_into` one buffer, only the batch headers read to find the next offset), whole passes over
   the partition ingest just wrote (page cache warm), for at least `FETCH_MIN_S`: GB/s of record
   batches served and broker CPU-seconds per GB; the client's CPU is printed beside it (when it is
   near 100%, the client is the limit, not the broker).
   Floors (ingest and fetch): the same client work against bench/floor_server.py on the same
   CPU, a server that only moves the bytes (recv_into + pwrite to a fresh file + a fixed reply
   per frame; pread + send, and sendfile, of a warm file): the kernel's own CPU-seconds per GB,
   under which no broker on this machine can go, printed beside the broker's. Two more add the
   byte-wise check ringlog makes on each path, a crc32c of every batch produced and of every
   extent served (read through a mapping, as the broker does): the floor of a broker that checks.
   The Python handlers alone (bench/handler_floor.py, in this process after the rounds): what a
   produce and a fetch cost in the request handlers with no loop, socket or backend around them.
5. The targets (docs/PERFORMANCE.md), each with its figure, its goal and met or missed (io_uring's
   latency through the raw frame and the AsyncProducer, its durable latency, its ingest against
   uvloop's, CPU per GB and fetch); then, against the same goals, the figures no target is set
   for (uvloop's latency, the blocking Producer's acks=1); beside the CPU targets, their floor
   that checks and that floor plus the handlers alone: the least a backend that keeps the
   handlers in Python can reach on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import handler_floor
import uvloop
from benchlib import (
    PAGE_REPORTING,
    REPO,
    code_version,
    fs_of,
    knob_for_the_run,
    page_reporting,
    proc_cpu,
    table,
    tree_cpu,
)

from broker.client import Acks, Admin, AsyncProducer, Producer
from labkit.brokerproc import BrokerProcess
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import HEADER_SIZE
from ringlog_proto.messages import ErrorCode, FetchRequest, ProduceRequest, encode_request

KIB = 1024
MIB = KIB * KIB
GB = 1_000_000_000
VALUE_BYTES = KIB
BATCH_RECORDS = 63  # 63 x (1 KiB + 18 B) + 61 B of header: one 64 KiB batch
IN_FLIGHT = 8
FETCH_MIN_S = 2.0
FETCH_FLOORS = ("copy", "sendfile", "sendfile-crc")  # bench/floor_server.py's fetch modes
SERVER_CPU = 0
CLIENT_CPU = 1
REDIS = "/usr/bin/redis-server"

# (samples, warm-up) per latency measurement, ingest bytes per round
FULL = {"samples": 5000, "warmup": 500, "ingest_bytes": 1_000_000_000}
QUICK = {"samples": 1500, "warmup": 300, "ingest_bytes": 300_000_000}

# The targets' goals (docs/PERFORMANCE.md, "The targets")
GOAL_P50_VS_REDIS = 0.8
GOAL_P99_VS_REDIS = 1.0
GOAL_DURABLE_P50_VS_REDIS = 1.0
GOAL_URING_THROUGHPUT = 1.3
GOAL_URING_CPU = 0.8
GOAL_PRODUCE_CPU_S_PER_GB = 1.0
GOAL_FETCH_CPU_S_PER_GB = 0.3
GOAL_FETCH_GB_S = 1.5


# --------------------------------------------------------------------------------------- servers


def stop_pid(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Broker:
    """One `broker serve --cores 1` on its own data directory, for the whole bench: started,
    stopped and measured as the other servers here are."""

    def __init__(self, workdir: Path, backend: str, extra: list[str]) -> None:
        self.backend = backend
        # taskset, like Redis: the supervisor pins its worker to a CPU it may use, and this
        # process is pinned to the client's CPU by then (a worker on the client's CPU measured
        # same-CPU latency: 53 us against 122 across CPUs, while Redis ran across).
        self.proc = BrokerProcess(
            workdir / f"ringlog-{backend}",
            workdir / f"ringlog-{backend}.log",
            ("--ebpf", "off", *extra),
            backend=backend,
            wrapper=("taskset", "-c", str(SERVER_CPU)),
            cwd=REPO,
        )

    @property
    def bootstrap(self) -> str:
        return self.proc.bootstrap

    def start(self) -> Broker:
        shutil.rmtree(self.proc.data_dir, ignore_errors=True)
        self.proc.start(timeout_s=30)
        if self.proc.fell_back():
            raise RuntimeError(f"the broker fell back from io_uring:\n{self.proc.log_tail()}")
        pinned = list(self.proc.worker_cpus.values())
        if pinned != [SERVER_CPU]:
            raise RuntimeError(f"the broker's core is on cpu {pinned}, not the servers' {SERVER_CPU}")
        return self

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc.running():
            self.proc.stop(timeout_s=30)


# A server that answers every read of a connection with 16 bytes: what a round trip between the
# two CPUs costs before any server does any work. "block" sleeps in recv like every server here;
# "spin" polls a non-blocking recv while a client is connected (never while idle), so its CPU
# never sleeps: the difference is the price of waking a halted vCPU. "sync DIR" blocks, and
# writes and fdatasyncs each read to a preallocated file in DIR before answering.
ECHO_SERVER = """
import os, socket, sys
spin = sys.argv[1] == "spin"
fd = -1
if sys.argv[1] == "sync":  # a durable store's floor: each message written and fdatasynced first
    path = os.path.join(sys.argv[2], "floor-sync.log")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.unlink(path)
    os.posix_fallocate(fd, 0, SYNC_FILE_BYTES)  # preallocated, as a broker's segment: no size change
    os.fsync(fd)
end = 0
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen()
print(ls.getsockname()[1], flush=True)
buf = bytearray(65536)
while True:
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.setblocking(not spin)
    while True:
        try:
            n = c.recv_into(buf)
        except BlockingIOError:
            continue
        if not n:
            break
        if fd >= 0:
            end = 0 if end + n > SYNC_FILE_BYTES else end
            os.pwrite(fd, memoryview(buf)[:n], end)
            end += n
            os.fdatasync(fd)
        c.sendall(b"k" * 16)
    c.close()
""".replace("SYNC_FILE_BYTES", str(64 * MIB))


class Floor:
    """A Python floor server pinned to the servers' CPU, started as `python *args`; it prints its
    port: `ECHO_SERVER` ("block" or "spin", the round-trip floor; "sync DIR", the durable one) or
    bench/floor_server.py (the kernel's share of a GB produced or fetched, with no broker in the
    way)."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @classmethod
    def echo(cls, mode: str, *args: str) -> Floor:
        return cls("-c", ECHO_SERVER, mode, *args)

    @classmethod
    def moving(cls, *args: str) -> Floor:
        """bench/floor_server.py `args` (`ingest DIR`, `fetch FILE BYTES copy|sendfile`)."""
        return cls(str(Path(__file__).with_name("floor_server.py")), *args)

    def start(self) -> Floor:
        argv = ["taskset", "-c", str(SERVER_CPU), sys.executable, *self.args]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        return self

    def cpu(self) -> float:
        assert self.proc is not None
        return proc_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)


def floor_fetch(port: int, file_bytes: int, chunk: int, min_s: float) -> tuple[int, float]:
    """Whole passes over a floor server's file in `chunk`-byte requests for at least `min_s`;
    (bytes, seconds)."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    pack = struct.Struct(">QI").pack
    nbytes = 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        while nbytes == 0 or time.perf_counter() - t0 < min_s:
            for offset in range(0, file_bytes - chunk + 1, chunk):
                s.sendall(pack(offset, chunk))
                got = 0
                while got < chunk:
                    k = s.recv_into(view[got:])
                    if not k:
                        raise ConnectionError("floor server closed the connection")
                    got += k
                nbytes += chunk
        return nbytes, time.perf_counter() - t0


def echo_latency(port: int, samples: int, warmup: int) -> list[float]:
    msg = value()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one() -> None:
            s.sendall(msg)
            if not s.recv(64):
                raise ConnectionError("echo server closed the connection")

        return timed_samples(one, samples, warmup)


class Redis:
    """Debian's redis-server with an append-only file, pinned to the servers' CPU."""

    def __init__(self, workdir: Path, fsync: str) -> None:
        self.fsync = fsync
        self.dir = workdir / f"redis-{fsync}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> Redis:
        self.dir.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        argv = ["taskset", "-c", str(SERVER_CPU), REDIS, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "yes", "--appendfsync", self.fsync, "--dir", str(self.dir)]
        argv += ["--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port).ping()
                return self
            except redis.ConnectionError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError(f"redis-server ({self.fsync}) did not start")

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)


# --------------------------------------------------------------------------------------- clients


def value() -> bytes:
    return os.urandom(VALUE_BYTES)


def timed_samples(fn: Callable[[], Any], samples: int, warmup: int) -> list[float]:
    ns = time.perf_counter_ns
    out = []
    for i in range(warmup + samples):
        t = ns()
        fn()
        if i >= warmup:
            out.append((ns() - t) / 1000)
    return out


def redis_latency(port: int, command: str, samples: int, warmup: int) -> list[float]:
    import redis

    r = redis.Redis(port=port)
    v = value()
    if command == "XADD":
        return timed_samples(lambda: r.xadd("log", {"v": v}), samples, warmup)
    return timed_samples(lambda: r.set("k", v), samples, warmup)


def raw_latency(bootstrap: str, topic_id: int, acks: int, samples: int, warmup: int) -> list[float]:
    host, port = bootstrap.split(":")
    frame = b"".join(encode_request(ProduceRequest(topic_id, 0, acks, 30_000, encode_batch([value()])), 7))
    buf = bytearray(64 * KIB)
    view = memoryview(buf)
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def one() -> None:
            s.sendall(frame)
            got, need = 0, 4
            while got < need:
                k = s.recv_into(view[got:])
                if not k:
                    raise ConnectionError("broker closed the connection")
                got += k
                if got >= 4:
                    need = 4 + struct.unpack_from(">I", buf)[0]
            if struct.unpack_from(">h", buf, HEADER_SIZE)[0] != ErrorCode.NONE:
                raise RuntimeError("produce failed")

        return timed_samples(one, samples, warmup)


def producer_latency(bootstrap: str, topic: str, acks: int, samples: int, warmup: int) -> list[float]:
    v = value()
    with Producer(bootstrap, acks=acks, linger_ms=0) as p:
        return timed_samples(lambda: p.send(topic, v, partition=0).result(), samples, warmup)


def async_producer_latency(bootstrap: str, topic: str, acks: int, samples: int, warmup: int) -> list[float]:
    async def run() -> list[float]:
        v = value()
        ns = time.perf_counter_ns
        out = []
        async with AsyncProducer(bootstrap, acks=acks, linger_ms=0) as p:
            for i in range(warmup + samples):
                t = ns()
                await p.send_and_wait(topic, v, partition=0)
                if i >= warmup:
                    out.append((ns() - t) / 1000)
        return out

    return uvloop.run(run())


class _OneReply(asyncio.Protocol):
    """The least an asyncio client does per request: write a frame, and resolve a future when a
    whole reply frame has arrived (no request object, no encoding, no correlation table)."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[bytes] | None = None
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
            reply = bytes(buf)
            buf.clear()
            assert self.waiter is not None
            self.waiter.set_result(reply)


def asyncio_latency(bootstrap: str, topic_id: int, acks: int, samples: int, warmup: int) -> list[float]:
    """The raw socket's pre-encoded produce frame, through uvloop and a bare protocol: the floor
    of any asyncio client (AsyncProducer's own loop), to read its rows against."""
    frame = b"".join(encode_request(ProduceRequest(topic_id, 0, acks, 30_000, encode_batch([value()])), 7))
    host, port = bootstrap.split(":")

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_connection(_OneReply, host, int(port))
        out = []
        ns = time.perf_counter_ns
        try:
            for i in range(warmup + samples):
                t = ns()
                proto.waiter = loop.create_future()
                transport.write(frame)
                reply = await proto.waiter
                if i >= warmup:
                    out.append((ns() - t) / 1000)
                if struct.unpack_from(">h", reply, HEADER_SIZE)[0] != ErrorCode.NONE:
                    raise RuntimeError("produce failed")
        finally:
            transport.close()
        return out

    return uvloop.run(run())


def ingest(bootstrap: str, topic_id: int, nbytes: int) -> tuple[int, float]:
    """Pre-encoded 64 KiB batches, `IN_FLIGHT` unanswered at a time, on a blocking socket (the
    client costs a sendall and a recv_into per batch, so the broker is the limit); (value bytes
    written, seconds). Every reply is checked for an error."""
    raw = os.urandom(32 * BATCH_RECORDS * VALUE_BYTES)
    vals = [raw[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(32 * BATCH_RECORDS)]
    frames = [
        b"".join(
            encode_request(
                ProduceRequest(
                    topic_id,
                    0,
                    Acks.WRITTEN,
                    30_000,
                    encode_batch(vals[i * BATCH_RECORDS : (i + 1) * BATCH_RECORDS]),
                ),
                i,
            )
        )
        for i in range(32)
    ]
    batches = max(1, nbytes // (BATCH_RECORDS * VALUE_BYTES))
    host, port = bootstrap.split(":")
    buf = bytearray(MIB)
    view = memoryview(buf)
    unpack_from = struct.unpack_from
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        sent = answered = have = 0
        while answered < batches:
            while sent < batches and sent - answered < IN_FLIGHT:
                s.sendall(frames[sent % 32])
                sent += 1
            k = s.recv_into(view[have:])
            if not k:
                raise ConnectionError("broker closed the connection")
            have += k
            pos = 0
            while have - pos >= 4:
                size = 4 + unpack_from(">I", buf, pos)[0]
                if have - pos < size:
                    break
                if unpack_from(">h", buf, pos + HEADER_SIZE)[0] != ErrorCode.NONE:
                    raise RuntimeError("produce failed")
                answered += 1
                pos += size
            if pos:
                buf[: have - pos] = buf[pos:have]
                have -= pos
        wall = time.perf_counter() - t0
    return batches * BATCH_RECORDS * VALUE_BYTES, wall


def fetch_loop(
    bootstrap: str, topic_id: int, end: int, max_bytes: int, min_s: float
) -> tuple[int, int, float]:
    """Whole passes over the partition until `min_s` has passed; (batch bytes, records, seconds)."""
    host, port = bootstrap.split(":")
    buf = bytearray(max_bytes + 64 * KIB + 4096)
    view = memoryview(buf)
    unpack_from = struct.unpack_from
    nbytes = records = 0
    with socket.create_connection((host, int(port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        while records == 0 or time.perf_counter() - t0 < min_s:
            offset = 0
            while offset < end:
                s.sendall(b"".join(encode_request(FetchRequest(topic_id, 0, offset, max_bytes, 0, 1), 1)))
                got, need = 0, 4
                while got < need:
                    k = s.recv_into(view[got:need] if need > 4 else view[got:])
                    if not k:
                        raise ConnectionError("broker closed the connection")
                    got += k
                    if got >= 4 and need == 4:
                        need = 4 + unpack_from(">I", buf)[0]
                        if need > len(buf):
                            raise RuntimeError(f"a fetch reply of {need} bytes")
                pos = HEADER_SIZE
                error, mlen = unpack_from(">hH", buf, pos)
                if error != ErrorCode.NONE:
                    raise RuntimeError(f"fetch failed: error {error}")
                pos += 4 + mlen + 16  # error, message, high watermark, log start
                (n,) = unpack_from(">I", buf, pos)
                pos += 4
                stop = pos + n
                nbytes += n
                last = offset
                while pos + 12 <= stop:
                    base, length = unpack_from(">qi", buf, pos)
                    if pos + 12 + length > stop:
                        break
                    (delta,) = unpack_from(">i", buf, pos + 23)
                    last = base + delta + 1
                    pos += 12 + length
                if last == offset:
                    raise RuntimeError(f"a fetch at {offset} returned no whole batch")
                records += last - offset
                offset = last
        return nbytes, records, time.perf_counter() - t0


def client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------------------- the run


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(s: dict[str, float], digits: int = 0) -> str:
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f}..{s['max']:,.{digits}f})"


def rotate(items: list[Any], k: int) -> list[Any]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


def warn_if_noisy() -> list[str]:
    warnings = []
    load = os.getloadavg()[0]
    if load > 0.5:
        warnings.append(f"load average {load:.2f}: something else is running; figures will be low")
    try:
        links = subprocess.run(
            ["ip", "link", "show", "lo"], capture_output=True, text=True, check=False
        ).stdout
        if "xdp" in links:
            warnings.append("an XDP program is attached to lo: loopback figures are not to be trusted")
    except OSError:
        pass
    busy = subprocess.run(
        ["pgrep", "-af", "broker.cli serve|redis-server"], capture_output=True, text=True, check=False
    ).stdout
    if busy.strip():
        warnings.append(
            "other brokers or Redis servers are running:\n    " + busy.strip().replace("\n", "\n    ")
        )
    return warnings


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sizes = QUICK if args.quick else FULL
    only = set(args.only.split(","))
    backends = args.variants.split(",")
    workdir = Path(args.dir) / f"perf-{os.getpid()}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    os.sched_setaffinity(0, {CLIENT_CPU})
    brokers = {b: Broker(workdir, b, shlex.split(args.broker_args)) for b in backends}
    redis_ok = os.path.exists(REDIS)
    if not redis_ok:
        print(f"  {REDIS} is missing (scripts/setup.sh installs redis-server): no Redis rows, ratios n/a")
    redises = {f: Redis(workdir, f) for f in ("everysec", "always")} if redis_ok else {}
    echoes = {mode: Floor.echo(mode) for mode in ("block", "spin")} if "latency" in only else {}
    if "durable" in only:
        echoes["sync"] = Floor.echo("sync", str(workdir))
    floors: dict[str, Floor] = {}
    if "ingest" in only:
        floors["ingest"] = Floor.moving("ingest", str(workdir))
        floors["ingest-crc"] = Floor.moving("ingest", str(workdir), "crc")
    if "fetch" in only:
        for how in FETCH_FLOORS:
            path = str(workdir / f"floor-{how}.data")
            floors[how] = Floor.moving("fetch", path, str(sizes["ingest_bytes"]), how)
    results: dict[str, Any] = {"lat": collections.defaultdict(list), "ingest": {}, "fetch": {}, "floors": {}}
    started: list[Broker | Redis | Floor] = []
    try:
        for server in [*brokers.values(), *redises.values(), *echoes.values(), *floors.values()]:
            started.append(server.start())
        topics: dict[str, tuple[str, int]] = {}
        for b, broker in brokers.items():
            with Admin(broker.bootstrap) as admin:
                topics[b] = ("lat", admin.create_topic("lat", 1))
        n, w = sizes["samples"], sizes["warmup"]

        # Latency and durability: every (server, client) pair once per round, in rotating order.
        jobs: list[tuple[str, Callable[[], list[float]]]] = []
        for mode, e in echoes.items():
            label = {
                "block": "echo, blocking",
                "spin": "echo, spinning",
                "sync": "pwrite + fdatasync + echo",
            }[mode]
            jobs.append((f"floor: {label} server", partial(echo_latency, e.port, n, w)))
        for f, r in redises.items():
            if ("latency" in only and f == "everysec") or ("durable" in only and f == "always"):
                jobs.append((f"redis {f} XADD", partial(redis_latency, r.port, "XADD", n, w)))
                jobs.append((f"redis {f} SET", partial(redis_latency, r.port, "SET", n, w)))
        for b, broker in brokers.items():
            topic, tid = topics[b]
            bs = broker.bootstrap
            for acks, label, want in (
                (Acks.WRITTEN, "acks=1", "latency"),
                (Acks.DURABLE, "acks=2", "durable"),
            ):
                if want in only:
                    jobs.append((f"{b} {label} raw socket", partial(raw_latency, bs, tid, acks, n, w)))
                    if acks == Acks.WRITTEN:
                        jobs.append(
                            (f"{b} {label} asyncio floor", partial(asyncio_latency, bs, tid, acks, n, w))
                        )
                    jobs.append((f"{b} {label} Producer", partial(producer_latency, bs, topic, acks, n, w)))
                    jobs.append(
                        (f"{b} {label} AsyncProducer", partial(async_producer_latency, bs, topic, acks, n, w))
                    )
        for rnd in range(args.rounds):
            for key, job in rotate(jobs, rnd):
                samples = job()
                results["lat"][key].append((pct(samples, 0.5), pct(samples, 0.99)))
                print(f"  round {rnd + 1}: {key} p50 {pct(samples, 0.5):.0f} us", flush=True)

        # Ingest then fetch of what was written, alternating the backends round by round.
        if "ingest" in only or "fetch" in only:
            for rnd in range(args.rounds):
                for b in rotate(backends, rnd):
                    broker = brokers[b]
                    name = f"ingest-{rnd}"
                    with Admin(broker.bootstrap) as admin:
                        tid = admin.create_topic(name, 1)
                    c0 = broker.cpu()
                    nbytes, wall = ingest(broker.bootstrap, tid, sizes["ingest_bytes"])
                    cpu = broker.cpu() - c0
                    results["ingest"].setdefault(b, []).append(
                        {"mb_s": nbytes / wall / 1e6, "cpu_s_gb": cpu / (nbytes / GB)}
                    )
                    print(f"  round {rnd + 1}: {b} ingest {nbytes / wall / 1e6:,.0f} MB/s", flush=True)
                    if "fetch" in only:
                        end = nbytes // VALUE_BYTES
                        c0, k0 = broker.cpu(), client_cpu()
                        fbytes, _, fwall = fetch_loop(
                            broker.bootstrap, tid, end, args.fetch_max_bytes, FETCH_MIN_S
                        )
                        cpu, kcpu = broker.cpu() - c0, client_cpu() - k0
                        results["fetch"].setdefault(b, []).append(
                            {
                                "gb_s": fbytes / fwall / GB,
                                "cpu_s_gb": cpu / (fbytes / GB),
                                "client": kcpu / fwall,
                            }
                        )
                        print(f"  round {rnd + 1}: {b} fetch {fbytes / fwall / GB:.2f} GB/s", flush=True)
                    with Admin(broker.bootstrap) as admin:
                        admin.delete_topic(name)
                measure_floors(floors, sizes["ingest_bytes"], args.fetch_max_bytes, results["floors"])
            # The handlers alone, in this process (its CPU is the client's, idle meanwhile).
            results["handlers"] = handler_floor.measure(workdir, args.rounds)
    finally:
        for server in started:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def measure_floors(floors: dict[str, Floor], nbytes: int, chunk: int, into: dict[str, list[float]]) -> None:
    """One round of the floors: CPU-seconds per GB of the floor server over the same client work
    as the broker's ingest (the same client) and fetch (`chunk`-byte reads of a warm file)."""
    for how in ("ingest", "ingest-crc"):
        if how in floors:
            f = floors[how]
            c0 = f.cpu()
            written, _ = ingest(f"127.0.0.1:{f.port}", 0, nbytes)
            into.setdefault(how, []).append((f.cpu() - c0) / (written / GB))
    for how in FETCH_FLOORS:
        if how in floors:
            f = floors[how]
            c0 = f.cpu()
            sent, _ = floor_fetch(f.port, nbytes, chunk, FETCH_MIN_S)
            into.setdefault(how, []).append((f.cpu() - c0) / (sent / GB))


def report(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": {}, "ingest": {}, "fetch": {}, "targets": []}
    lat = results["lat"]
    rows = []
    for key, pairs in lat.items():
        p50 = summary([p for p, _ in pairs])
        p99 = summary([q for _, q in pairs])
        out["latency"][key] = {"p50": p50, "p99": p99}
        rows.append([key, fmt_spread(p50), fmt_spread(p99)])
    if rows:
        print("\n1-2. Single record, acked, one at a time (µs; median of rounds, min..max)")
        table(["what", "p50", "p99"], rows, labels=1)
    rows = []
    for b, rs in results["ingest"].items():
        mb = summary([r["mb_s"] for r in rs])
        cpu = summary([r["cpu_s_gb"] for r in rs])
        out["ingest"][b] = {"mb_s": mb, "cpu_s_gb": cpu}
        rows.append([b, fmt_spread(mb), fmt_spread(cpu, 2)])
    if rows:
        print("\n3. Ingest: pre-encoded 64 KiB batches, acks=1, 8 in flight")
        table(["backend", "MB/s", "broker CPU s/GB"], rows, labels=1)
    rows = []
    for b, rs in results["fetch"].items():
        gb = summary([r["gb_s"] for r in rs])
        cpu = summary([r["cpu_s_gb"] for r in rs])
        client = summary([r["client"] for r in rs])
        out["fetch"][b] = {"gb_s": gb, "cpu_s_gb": cpu, "client_cpu": client}
        rows.append([b, fmt_spread(gb, 2), fmt_spread(cpu, 2), f"{client['median']:.0%}"])
    if rows:
        print(f"\n4. Fetch: raw fetch loop, max_bytes {args.fetch_max_bytes // KIB} KiB, page cache warm")
        table(["backend", "GB/s", "broker CPU s/GB", "client CPU"], rows, labels=1)

    floors = results.get("floors", {})
    labels = {
        "ingest": "produce: recv_into + pwrite to a fresh file + a reply per frame",
        "ingest-crc": "produce: the same + crc32c of each batch (what a broker must check)",
        "copy": "fetch: pread + send",
        "sendfile": "fetch: sendfile",
        "sendfile-crc": "fetch: crc32c of the mapped extent + sendfile (ringlog's checks)",
    }
    rows = []
    for how, values in floors.items():
        cpu = summary(values)
        out.setdefault("floors", {})[how] = cpu
        rows.append([labels[how], fmt_spread(cpu, 2)])
    if rows:
        print("\n   Floors: the same bytes through a server that only moves them (bench/floor_server.py)")
        table(["floor", "server CPU s/GB"], rows, labels=1)

    targets: list[list[str]] = []
    beside: list[list[str]] = []
    out["beside"] = []
    skip_unmeasured = args.only != "latency,durable,ingest,fetch"

    def target(
        name: str, value: float | None, goal: float, below: bool, unit: str = "x", is_target: bool = True
    ) -> None:
        """A row of section 5. `is_target`: one of the targets; else a figure printed beside them
        against the same goal, which no target sets (uvloop's latency, the baseline io_uring must
        beat; the blocking Producer, a client beyond the targets' AsyncProducer)."""
        rows, into = (targets, out["targets"]) if is_target else (beside, out["beside"])
        if value is None:  # not measured in this run (--only, --variants) or no Redis
            if not skip_unmeasured:
                rows.append([name, "n/a", f"{'<=' if below else '>='} {goal}{unit}", "n/a"])
            return
        met = value <= goal if below else value >= goal
        rows.append(
            [
                name,
                f"{value:.2f}{unit}",
                f"{'<=' if below else '>='} {goal}{unit}",
                ("met" if met else "MISSED") if is_target else ("under" if met else "over"),
            ]
        )
        into.append({"name": name, "value": value, "goal": goal, "met": met})

    def med(key: str, q: str) -> float | None:
        v = out["latency"].get(key)
        return v[q]["median"] if v else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    backends = args.variants.split(",")
    for b in backends:
        for client in ("Producer", "AsyncProducer", "raw socket"):
            ref = "redis everysec XADD"
            is_target = b == "io_uring" and client != "Producer"
            target(
                f"{b} acks=1 p50 / Redis everysec ({client})",
                ratio(med(f"{b} acks=1 {client}", "p50"), med(ref, "p50")),
                GOAL_P50_VS_REDIS,
                True,
                is_target=is_target,
            )
            target(
                f"{b} acks=1 p99 / Redis everysec ({client})",
                ratio(med(f"{b} acks=1 {client}", "p99"), med(ref, "p99")),
                GOAL_P99_VS_REDIS,
                True,
                is_target=is_target,
            )
        for client in ("Producer", "raw socket"):
            ref = "redis always XADD"
            target(
                f"{b} acks=2 p50 / Redis always ({client})",
                ratio(med(f"{b} acks=2 {client}", "p50"), med(ref, "p50")),
                GOAL_DURABLE_P50_VS_REDIS,
                True,
                is_target=b == "io_uring",
            )
    ing = out["ingest"]
    if "io_uring" in ing and "uvloop" in ing:
        target(
            "io_uring / uvloop ingest throughput",
            ing["io_uring"]["mb_s"]["median"] / ing["uvloop"]["mb_s"]["median"],
            GOAL_URING_THROUGHPUT,
            False,
        )
        target(
            "io_uring / uvloop ingest CPU per GB",
            ing["io_uring"]["cpu_s_gb"]["median"] / ing["uvloop"]["cpu_s_gb"]["median"],
            GOAL_URING_CPU,
            True,
        )
    if {"io_uring", "uvloop"} <= set(backends):
        for client in ("raw socket", "Producer"):
            u, v = med(f"io_uring acks=1 {client}", "p50"), med(f"uvloop acks=1 {client}", "p50")
            target(f"io_uring / uvloop acks=1 p50 ({client})", ratio(u, v), 1.0, True)
    handlers = results.get("handlers")
    if handlers:
        rows = []
        for what, unit in (("produce", "64 KiB batch"), ("fetch", "1 MiB fetch")):
            us = summary(handlers[f"{what}_us"])
            gb = summary(handlers[f"{what}_s_gb"])
            out.setdefault("handlers", {})[what] = {"us": us, "s_gb": gb}
            rows.append([f"{what} (µs per {unit})", fmt_spread(us), fmt_spread(gb, 2)])
        print("\n   The Python handlers alone (bench/handler_floor.py: in process, no loop, no socket)")
        table(["request", "µs per request", "CPU s/GB"], rows, labels=1)

    floor_of = {k: v["median"] for k, v in out.get("floors", {}).items()}
    alone = {k: v["s_gb"]["median"] for k, v in out.get("handlers", {}).items()}
    above: list[list[str]] = []

    def over_floor(path: str, cpu: float, floor: str, request: str) -> None:
        """The broker's CPU per GB beside its floor and the least a backend with Python handlers
        can reach (the floor plus the handlers alone)."""
        if floor in floor_of:
            least = floor_of[floor] + alone.get(request, 0.0)
            above.append([path, f"{cpu:.2f}", f"{floor_of[floor]:.2f}", f"{least:.2f}", f"{cpu - least:.2f}"])

    for b, v in ing.items():
        cpu = v["cpu_s_gb"]["median"]
        target(f"{b} produce CPU-s per GB", cpu, GOAL_PRODUCE_CPU_S_PER_GB, True, " s")
        over_floor(f"{b} produce", cpu, "ingest-crc", "produce")
    for b, v in out["fetch"].items():
        cpu = v["cpu_s_gb"]["median"]
        target(f"{b} fetch CPU-s per GB", cpu, GOAL_FETCH_CPU_S_PER_GB, True, " s")
        target(f"{b} fetch GB/s", v["gb_s"]["median"], GOAL_FETCH_GB_S, False, " GB/s")
        over_floor(f"{b} fetch", cpu, "sendfile-crc", "fetch")
    print("\n5. The targets (medians of the rounds above)")
    table(["target", "measured", "goal", ""], targets, labels=1)
    if beside:
        print(
            "\n   Beside them, against the same goals, figures no target is set for: uvloop's latency"
            "\n   (the baseline io_uring must beat) and the blocking Producer's acks=1 (the targets' client"
            "\n   is the AsyncProducer; the Producer adds a hand-off to its loop thread and back)"
        )
        table(["figure", "measured", "goal", ""], beside, labels=1)
    clients = []
    for b in backends:
        for client in ("raw socket", "asyncio floor", "AsyncProducer", "Producer"):
            r = ratio(med(f"{b} acks=1 {client}", "p50"), med("redis everysec XADD", "p50"))
            if r is not None:
                clients.append([f"{b} {client}", f"{r:.2f}x"])
    if clients:
        print(
            "\n   acks=1 p50 against Redis XADD by client: a blocking socket and an asyncio protocol"
            "\n   sending a pre-encoded frame are the floors under the Producer and the AsyncProducer"
        )
        table(["client", "p50 / Redis"], clients, labels=1)
        out["clients_vs_redis"] = clients
    if above:
        print(
            "\n   CPU per GB against the floor that checks, and that floor plus the Python handlers alone"
            "\n   (the least with handlers in Python; above it: the loop, the backend, the replies)"
        )
        table(["path", "broker s/GB", "floor s/GB", "+ handlers", "above"], above, labels=1)
        out["above_floor"] = above
    return out


def in_netns(argv: list[str], congestion: str | None) -> int:
    """Re-run this script inside a fresh network namespace, with `congestion` as its TCP congestion
    control if given; always delete it."""
    name = f"rl-perf-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        if congestion:
            sysctl = ["sysctl", "-q", "-w", f"net.ipv4.tcp_congestion_control={congestion}"]
            subprocess.run(["ip", "netns", "exec", name, *sysctl], check=True)
        cmd = ["ip", "netns", "exec", name, sys.executable, __file__, *argv, "--no-netns", "--in-netns", name]
        return subprocess.run(cmd, check=False).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


# The guest's idle governor (cpuidle-haltpoll) polls this long before halting a vCPU; this VM
# boots with 0, so every wake-up of an idle CPU is an IPI to a halted vCPU, which the waker pays
# for inside its send (`sock_def_readable` in a broker's profile) and which costs 40-600 us a round
# trip here. `--guest-halt-poll-ns N` sets it for the run and puts the old value back at exit:
# every server and client is measured under it, Redis too, so the figures show each one's own
# work instead of the VM's wake-ups.
HALT_POLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


# A new network namespace starts with the machine's TCP congestion control, on this VM BBR. BBR
# paces its sends (without the fq qdisc the kernel does it, with a timer), on loopback too where
# there is no queue to spare. In one profile of the fetch loop an io_uring worker's kernel samples
# per GB were 2.7x cubic's (`perf record -a` on CPU 0, most of the difference under
# `tcp_write_xmit`); alternated whole runs of this bench show less: io_uring fetch 0.42-0.47
# CPU-s/GB with BBR against 0.36-0.42 with cubic (two runs each). `--tcp-congestion NAME` sets it
# in the bench's namespace only (the sysctl is per namespace), for every server and client alike,
# Redis too; the header prints the one in use.
CONGESTION = Path("/proc/sys/net/ipv4/tcp_congestion_control")


def halt_poll_ns() -> str:
    try:
        return HALT_POLL_NS.read_text().strip()
    except OSError:
        return "n/a (no cpuidle-haltpoll)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples and 300 MB per ingest round (~3 min)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="latency,durable,ingest,fetch")
    ap.add_argument("--variants", default="uvloop,io_uring", help="broker backends")
    ap.add_argument("--broker-args", default="", help="extra `broker serve` arguments for every broker")
    ap.add_argument("--fetch-max-bytes", type=int, default=MIB)
    ap.add_argument("--dir", default=str(REPO / ".bench-tmp"))
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--no-netns", action="store_true", help="use the machine's loopback")
    ap.add_argument(
        "--guest-halt-poll-ns",
        type=int,
        help="set the guest's halt polling (cpuidle-haltpoll) for the run, restored at exit (root)",
    )
    ap.add_argument(
        "--tcp-congestion",
        help="TCP congestion control (e.g. cubic) in the bench's network namespace, for every server "
        "and client; the machine's own is not touched (root, not with --no-netns)",
    )
    ap.add_argument(
        "--page-reporting-min-free-ms",
        type=int,
        help="keep freed guest pages from the host this long (free page reporting's min_free_ms) for "
        "the run, restored at exit (root; where the guest kernel has it)",
    )
    ap.add_argument("--in-netns", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if not args.in_netns:
            if args.guest_halt_poll_ns is not None:
                stack.enter_context(knob_for_the_run(HALT_POLL_NS, args.guest_halt_poll_ns))
            if args.page_reporting_min_free_ms is not None:
                knob = PAGE_REPORTING / "min_free_ms"
                stack.enter_context(knob_for_the_run(knob, args.page_reporting_min_free_ms))
        return run(args, argv)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if not args.no_netns and os.geteuid() == 0 and shutil.which("ip"):
        return in_netns(argv, args.tcp_congestion)
    if args.tcp_congestion and not args.in_netns:
        print("--tcp-congestion sets the bench's own network namespace: it needs root and no --no-netns")
        return 2
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        print("needs 2 CPUs (servers on CPU 0, the client on CPU 1)")
        return 1
    print(f"bench/perf.py: {code_version()}")
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    netns = args.in_netns or "none (the machine's loopback)"
    print(f"  {os.cpu_count()} CPUs; data on {fs_of(args.dir)}; netns: {netns}; rounds {args.rounds}")
    extra = args.broker_args or "(defaults)"
    print(f"  servers on CPU {SERVER_CPU}, this client on CPU {CLIENT_CPU}; broker args: {extra}")
    congestion = CONGESTION.read_text().strip()
    print(f"  guest halt polling: {halt_poll_ns()} ns; TCP congestion control: {congestion}")
    reporting, reported_before = page_reporting()
    print(f"  free page reporting: {reporting}")
    for w in warn_if_noisy():
        print(f"  WARNING: {w}")
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    results = measure(args)
    reported_after = page_reporting()[1]
    if reported_before is not None and reported_after is not None:
        print(
            f"\n  guest memory reported free to the host during the run: "
            f"{(reported_after - reported_before) / 1024:,.0f} MiB"
        )
    out = report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
