"""The cost of scale: replication against one copy, a node holding many partitions, produce spread
over partitions, a large consumer group, and how each figure grows with its size. One table.

Run: `.venv/bin/python bench/scale.py [--quick | --smoke] [--only R1,R5,...] [--backends B,...]
     [--max-scale N] [--cores N] [--no-tansu] [--dir DIR] [--page-reporting-min-free-ms MS]`
     (`make bench-scale`, `make bench-scale QUICK=1`).
`--max-scale N` sets the partition count of R5-R10 (and the largest size of R15's partition
column) so a bigger machine runs 100k and more; `--cores N` the workers of every single-node
broker; `--only` runs some rows (a developer's one row); `--smoke` is the test suite's tiny run
(every row, uvloop, no Tansu, seconds: tests/integration/test_bench_scale_smoke.py).

What runs (everything on loopback, on this machine's CPUs, shared with the client):
- Brokers: `broker serve` through labkit/brokerproc.py on fresh data dirs under `--dir` (default
  `.bench-tmp/scale/`), removed at the end; the three-node cluster of bench/cluster.py
  (`start_cluster`: etcd, one core per node, eBPF off); Tansu (bench/kafka_clients.py `Tansu`,
  memory storage, every CPU) where it can run the same work. Every process started is stopped
  (SIGTERM, then SIGKILL) in a `finally`, and its data dir removed, that of a broker of many
  partitions and little data (R5-R10, R14, R15's rounds) at the run's end: for minutes after
  many files were deleted, ext4 makes new ones several times slower, and a row would pay for the
  one before (`Started`).
- Clients: librdkafka (confluent-kafka) and our client (`broker.client`), in this process.

Rows (values per backend; "ratio" is the one the goal names, measured in this run, or ringlog over
Tansu where Tansu ran the same work; verdict PASS/FAIL against the goal, or "reported"):
- R1 replication, librdkafka: 1 KiB values, 3 partitions; the cluster with replication 3, acks=all,
  idempotent, against one node (no etcd) with acks=1; produce for `repl_s` a run, in the order
  one node, cluster, cluster, one node (`one_many_one` says why), each run on a topic of its own
  deleted after it (`spread_pairs` says why), MB/s from the first produce to flush() returning,
  over both runs of each. Goal: cluster / one node >= 0.5. Beside it the
  client's CPU per second (this process) in each, on the same 2 CPUs as the nodes, and the
  seconds a second the nodes spent runnable but waiting for a CPU (`benchlib.tree_waited`, all
  nodes summed). librdkafka's idempotent producer keeps one produce request in flight per
  partition (it counts the messages in flight against its limit of 5 requests: librdkafka pull
  request 4989), and its broker threads spin while one is out (the partition's next batch is
  ready, so its wake-up is "now"), so the cluster's figure is a ~1 MB batch's acks=all round
  trip, made while the nodes wait for the CPUs those threads hold.
- R2 replication, our client: the same with `Producer` (acks=DURABLE, idempotent / acks=WRITTEN;
  64 KiB batches, linger 5 ms). Goal >= 0.5.
- R3 CPU per replicated GB: broker CPU-seconds (supervisor and workers, benchlib.tree_cpu) per GB
  of values acknowledged: all three nodes during R1, and a one-partition run of R1's shape (leader
  on one node, followers on two) split into the leader's and the followers' share; beside it the
  one node's CPU-s/GB at acks=1 from R1. Reported.
- R4 acked latency of one record at a time (our client, topic r partition 0): p50 with 3 replicas
  acks=all against one node acks=1, alternated twice (median, min-max), the difference being what
  replication adds; beside it that wait's stages from the nodes' metrics (broker/core/metrics.py,
  means): the leader's produce written -> HW passes it (`replica_ack_us`), of which the follower's
  answer received -> next fetch sent (`replica_append_us`); the rest is the link both ways and the
  leader's wake, answer and HW move. Goal on io_uring < 0.5 ms (uvloop shown beside). Last, the
  machine's share: the same trips between bare processes placed as the nodes are, which do
  nothing but pass the bytes (bench/hops_floor.py: five hops with 3 replicas, two for one node).
- R5 create / first touch: CreateTopics (librdkafka AdminClient) of P partitions in topics of 1000,
  until Metadata names a leader for each; then one record to each partition (acks=1, linger 5 ms)
  until flush() returns. Tansu beside. Reported, seconds.
- R6 restart: SIGTERM until exited (capped: quick 30 s, then SIGKILL, and the cell says so), then
  start until the broker accepts; then kill -9 and the same. A start that fails (the supervisor
  gives its workers 60 s and 2 ms a stored partition to open them) is shown with the last line
  of its log. Reported.
- R7 RSS per idle partition: (Pss of the workers after the touch - before the create) / P, from
  /proc/<pid>/smaps_rollup (Tansu: its one process). Goal <= 10 KB.
- R8 descriptors: the most any worker holds (`/proc/<w>/fd`) after the touch, against the segment
  descriptor cache as the broker sized it (its log: half the open-file room by default) plus the
  fixed ones (64) and 64 connections. Goal: within.
- R9 Metadata: librdkafka `list_topics()` of every topic, wall time, median of 3. Tansu beside.
- R10 passes don't stall: a probe (our client, acks=WRITTEN, one record every 10 ms to a partition
  of its own) for `probe_s` while retention passes run every second (`--producer-id-expiration-ms
  1000`); its p99 acknowledged latency. Goal < 10 ms. Beside it the worker's longest pause of
  Python's cyclic collector since it started (its metrics, broker/core/heap.py: the create and
  the touch included) and how many full collections it made.
- R11 the partition limit a broker with default flags logs at start on this machine (nofile,
  memory). Printed.
The brokers of R5-R10 run under `prlimit --nofile` sized for P partitions, with `--max-partitions`
raised to P + 1000. Before, the free disk is checked: the first append to a partition
preallocates 64 KiB (broker/storage/log_config.py PREALLOCATE_BYTES); P is lowered to what fits
with a margin (at least 20 GiB or 30% of the free space left free), and the header says so.
- R12 spread, librdkafka: produce for `spread_s` to 1 partition and to 1000 (round robin by explicit
  partition; linger 5 ms), acks=all and acks=1, each in the order 1, 1000, 1000, 1, each run on
  a topic of its own deleted after it (`spread_pairs` says why); rate over 1000 / rate over 1.
  Tansu beside. Goal >= 0.7 (both acks). Beside them the rates over 1000 and the client's CPU per
  second then, and librdkafka's own p50s over 1000 (`queue_waits`): how long a record waited in
  its queue before a request took it, and a request's round trip.
- R13 spread, our client: the same with `Producer`. Goal >= 0.7.
- R14 group: 50 librdkafka consumers (threads of this process, roundrobin assignment) subscribe to a
  topic of 10 000 partitions (2 000 quick): time until every member holds partitions and together
  all of them; then one closes (LeaveGroup): time until the 49 left hold all again. ringlog runs
  with `--group-initial-rebalance-delay-ms 0` (the time is the protocol's, not a wait), and the
  partitions are touched first (one record each, as R5): a partition's files are made on its first
  use, which would otherwise be the members' ListOffsets, made while the group settles (R5 times
  that; docs/LIMITS.md "Many partitions at once"). Tansu beside, the same way.
- R15 growth (first backend only): R5-R10 and R12 (acks=1, N / 1 partition) at each partition size
  up to `--max-scale`; idle connections 1 -> 10k (10 -> 10k quick): worker Pss per connection and the
  probe's p99 beside them; replicas 1 -> 3 from R1/R3. Printed as its own table below.

The VM is shared: the header prints the load average before and after, and the free page
reporting that makes a page-cache write into a page the guest gave back a host fault (how much was
given back during the run is printed at the end; `--page-reporting-min-free-ms` holds freed pages
in the guest for the run). Replication writes each byte three times, so R1-R3 meet it three times
as often as one node. docs/PERFORMANCE.md, "Measuring on this machine", says how to read a figure
from it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from benchlib import (
    PAGE_REPORTING,
    REPO,
    code_version,
    fs_of,
    knob_for_the_run,
    page_reporting,
    table,
    tree_cpu,
    tree_waited,
)
from cluster import start_cluster, states
from kafka_clients import Tansu, tansu_binary

from broker.client.admin import Admin
from broker.client.blocking_producer import Producer
from broker.core.limits import FIXED_FDS_PER_WORKER, Limits, partition_limit
from broker.core.metrics import read_snapshots
from broker.node.supervisor import STOP_TIMEOUT_PER_PARTITION_S
from broker.storage.log_config import PREALLOCATE_BYTES
from labkit.brokerproc import BrokerProcess, wait_for
from labkit.etcdproc import EtcdCluster
from ringlog_proto import messages as m

GiB = 1 << 30
MiB = 1 << 20
VALUE = os.urandom(1024)
PREALLOCATED_PER_PARTITION = PREALLOCATE_BYTES + 64 * 1024  # first append's preallocation, index, directory
DISK_MARGIN_MIN = 20 * GiB
ROWS = [f"R{i}" for i in range(1, 16)]
BACKENDS = ("uvloop", "io_uring")
TOPIC_PARTITIONS = 1000  # partitions per topic of R5 (--max-partitions-per-topic's default)
NOFILE_CEILING = [0]  # nofile_ceiling(), found once by main()


@dataclass
class Sizes:
    repl_s: float  # R1/R2: seconds per variant
    cpu_s: float  # R3's one-partition run
    partitions: int  # R5-R10
    probe_s: float  # R10
    spread_s: float  # R12/R13 per variant
    spread_partitions: int
    group_partitions: int  # R14
    group_members: int
    growth: tuple[int, ...]  # R15 partition sizes (those <= partitions)
    connections: tuple[int, ...]  # R15 idle connections
    step_timeout_s: float  # the longest any wait (a start, a rebalance) may take
    growth_restarts: bool = True  # R15 restarts each size (quick and smoke leave them to R6)
    stop_cap_s: float = 600  # R6: a SIGTERM'd broker not gone by then is killed, and the row says so


FULL = Sizes(
    10, 5, 100_000, 20, 10, 1000, 10_000, 50, (1, 100, 1000, 10_000, 100_000), (1, 100, 1000, 10_000), 900
)
QUICK = Sizes(2, 1.5, 20_000, 4, 1.5, 1000, 2_000, 50, (100, 1000), (10, 1000, 10_000), 300, False, 30)
SMOKE = Sizes(0.3, 0.2, 40, 0.3, 0.2, 10, 20, 3, (10,), (10,), 60, False, 20)


# ------------------------------------------------------------------------------------------ results


@dataclass
class Row:
    name: str
    what: str
    goal: str
    check: Callable[[float], bool] | None  # on the figure each backend cell carries; None: reported
    cells: dict[str, str] = field(default_factory=dict)  # column -> text
    figures: dict[str, float] = field(default_factory=dict)  # backend -> the figure the goal reads
    ratio: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def verdict(self, backends: list[str]) -> str:
        if any(c.startswith("error") for c in self.cells.values()):
            return "error"
        if self.check is None:
            return "reported" if self.cells else "not run"
        judged = [b for b in backends if b in self.figures]
        if not judged:  # R4 without io_uring: shown, not judged
            return "reported" if self.cells else "not run"
        return "PASS" if all(self.check(self.figures[b]) for b in judged) else "FAIL"


def make_rows() -> dict[str, Row]:
    rows = [
        Row(
            "R1", "replication, librdkafka: 3 replicas acks=all / 1 node acks=1", ">= 0.5", lambda x: x >= 0.5
        ),
        Row("R2", "replication, our client: the same", ">= 0.5", lambda x: x >= 0.5),
        Row("R3", "broker CPU-s per replicated GB (leader / followers; 1 node)", "reported", None),
        Row(
            "R4",
            "acked p50 one at a time, 3 replicas acks=all (our client)",
            "< 0.5 ms io_uring",
            lambda x: x < 0.5,
        ),
        Row("R5", "create / first touch of P partitions", "reported, s", None),
        Row("R6", "restart: SIGTERM (stop + start) / kill -9 + start, to ready", "reported, s", None),
        Row("R7", "RSS (Pss) per idle partition", "<= 10 KB", lambda x: x <= 10_000),
        Row("R8", "descriptors, busiest worker", "<= cache+fixed", lambda x: x <= 0),
        Row("R9", "Metadata of every partition (librdkafka list_topics)", "reported, ms", None),
        Row("R10", "probe p99 (acks=1 every 10 ms) under retention passes", "< 10 ms", lambda x: x < 10),
        Row("R11", "partition limit logged at start (default flags)", "printed", None),
        Row(
            "R12", "spread, librdkafka: 1000 partitions / 1 (acks=all, acks=1)", ">= 0.7", lambda x: x >= 0.7
        ),
        Row("R13", "spread, our client: the same", ">= 0.7", lambda x: x >= 0.7),
        Row("R14", "group: N members over P partitions: join / one leaves", "reported, s", None),
        Row("R15", "growth: each figure against its size", "table below", None),
    ]
    return {r.name: r for r in rows}


def fmt_s(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


# ------------------------------------------------------------------------------------------ processes


class Started:
    """Every process this run starts, stopped and its data removed whatever happens.

    The data of a broker that made many partitions stays until the run ends (`keep_data`): for
    minutes after many files were deleted, ext4 makes new ones several times slower (it passes
    over recently freed inodes when it picks one: a partition's directory and two files took
    0.07-0.15 ms here, 0.73-0.90 ms right after 10 000 such partitions were deleted), so a row would
    pay for the one before it. R5's first touch on the second backend did (io_uring 31 s against
    uvloop's 10 s in one run). Only brokers of many partitions and little data keep theirs (R5-R10,
    R14, R15's rounds): what R12/R13 wrote (GBs) held in the page cache sent the next rows' writes
    to memory the guest had given back to the host, a host fault a page (io_uring's one node at
    acks=1 173-184 MB/s and 4.6 CPU-s per GB after, against 556-562 and 0.8 alone)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.dirs: list[Path] = []

    def add(self, proc: Any, data: Path | None = None) -> Any:
        self.items.append(proc)
        if data is not None:
            self.dirs.append(data)
        return proc

    def stop(self, proc: Any, keep_data: bool = False) -> None:
        """Stop `proc`; a broker's data is removed now, or at `close` when `keep_data` (a broker
        that made many partitions: the class's docstring says why)."""
        with contextlib.suppress(Exception):
            if isinstance(proc, BrokerProcess):
                if proc.running():
                    proc.stop(30)
            elif isinstance(proc, EtcdCluster):
                proc.close()
            else:
                proc.stop()
        if proc in self.items:
            self.items.remove(proc)
        if isinstance(proc, BrokerProcess):
            if keep_data:
                self.dirs.append(proc.data_dir)
            else:
                shutil.rmtree(proc.data_dir, ignore_errors=True)

    def close(self) -> None:
        for proc in reversed(list(self.items)):
            self.stop(proc)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def nofile_for(partitions: int, connections: int = 0) -> int:
    """An open-file limit under which broker/core/limits.py `fit_to_descriptors` leaves
    `connections` (and a segment cache as large): partitions cost no descriptor of their own
    (the cache bounds them), so `partitions` does not count."""
    need = 2 * (connections + 1024) + FIXED_FDS_PER_WORKER + 2048
    return min(math.ceil(need * 32 / 31) + 1024, NOFILE_MAX)


NOFILE_MAX = 1 << 20


def nofile_ceiling() -> int:
    """The highest open-file limit a broker can be started under here: `prlimit` raises the
    hard limit when this process may (CAP_SYS_RESOURCE), else the hard limit it has."""
    if shutil.which("prlimit"):
        tried = subprocess.run(
            ["prlimit", f"--nofile={NOFILE_MAX}:{NOFILE_MAX}", "true"], capture_output=True, check=False
        )
        if tried.returncode == 0:
            return NOFILE_MAX
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def partitions_allowed() -> int:
    """The partitions the broker allows here by default (`--max-partitions auto`: the memory)."""
    return partition_limit(Limits())


def broker(
    started: Started,
    root: Path,
    name: str,
    backend: str,
    cores: int,
    extra: tuple[str, ...] = (),
    nofile: int | None = None,
    timeout_s: float = 120,
) -> BrokerProcess:
    data = root / name
    shutil.rmtree(data, ignore_errors=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    raise_to = nofile and hard < nofile <= NOFILE_CEILING[0]  # else the broker raises its soft limit to hard
    wrapper = ("prlimit", f"--nofile={nofile}:{nofile}") if raise_to else ()
    proc = BrokerProcess(
        data, root / f"{name}.log", ("--ebpf", "off", *extra), cores=cores, backend=backend, wrapper=wrapper
    )
    started.add(proc)
    proc.start(timeout_s)
    return proc


def workers(b: BrokerProcess) -> list[int]:
    return list(b.worker_pids.values())


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total


def max_fds(pids: list[int]) -> int:
    n = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            n = max(n, len(os.listdir(f"/proc/{pid}/fd")))
    return n


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------ librdkafka


def kconf(bootstrap: str, **kw: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "log_level": 2, **kw}


SOCKET_TIMEOUT_MS_MAX = 300_000  # librdkafka refuses more (a full run waits up to 900 s a step)


def admin_conf(bootstrap: str, timeout_s: float) -> dict[str, Any]:
    """An admin client's config whose requests may take up to `timeout_s` (or librdkafka's most)."""
    return kconf(bootstrap, **{"socket.timeout.ms": min(int(timeout_s * 1000), SOCKET_TIMEOUT_MS_MAX)})


def k_create(bootstrap: str, topics: dict[str, int], timeout_s: float) -> float:
    """CreateTopics of `topics` (name -> partitions) until Metadata names a leader for each: s."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(admin_conf(bootstrap, timeout_s))
    t0 = time.perf_counter()
    names = list(topics)
    for i in range(0, len(names), 10):  # ten topics a request: each answer within the socket timeout
        futures = admin.create_topics(
            [NewTopic(t, topics[t], 1) for t in names[i : i + 10]], operation_timeout=timeout_s
        )
        for f in futures.values():
            f.result(timeout_s)

    def all_led() -> bool:
        md = admin.list_topics(timeout=timeout_s).topics
        return all(
            t in md and md[t].error is None and len(md[t].partitions) == n
            and all(p.leader >= 0 for p in md[t].partitions.values())
            for t, n in topics.items()
        )  # fmt: skip

    wait_for(all_led, timeout_s, 0.1)
    return time.perf_counter() - t0


TOUCH_SLICE = 10_000  # partitions per librdkafka producer of `k_touch`


def k_touch(bootstrap: str, topics: dict[str, int], timeout_s: float) -> float:
    """One record to each partition, until every one is acknowledged: s. librdkafka's cost per
    partition grows with the partitions one producer holds (its broker thread walks them all),
    so each slice of ~TOUCH_SLICE partitions has its own producer, all at once on threads."""
    from confluent_kafka import Producer as KProducer

    slices: list[dict[str, int]] = [{}]
    for t, n in topics.items():
        if sum(slices[-1].values()) + n > TOUCH_SLICE and slices[-1]:
            slices.append({})
        slices[-1][t] = n
    errors: list[Any] = []
    conf = {"linger.ms": 5, "message.timeout.ms": int(timeout_s * 1000), **_only_errors(errors)}
    producers = [KProducer(kconf(bootstrap, acks="1", **conf)) for _ in slices]
    for p in producers:
        p.list_topics(timeout=timeout_s)  # connections and metadata: untimed
    left = [0] * len(slices)

    def touch(i: int) -> None:
        p = producers[i]
        for t, n in slices[i].items():
            for k in range(n):
                _produce(p, t, VALUE[:100], k)
        left[i] = p.flush(timeout_s)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=touch, args=(i,)) for i in range(len(slices))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    took = time.perf_counter() - t0
    if sum(left) or errors:
        raise RuntimeError(f"touch: {sum(left)} unacknowledged, errors {errors[:3]}")
    return took


def k_metadata(bootstrap: str, timeout_s: float, times: int = 3) -> float:
    """librdkafka's Metadata of every topic (list_topics()), median wall seconds of `times`."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kconf(bootstrap))
    admin.list_topics("__nothing__", timeout=timeout_s)  # the connection: untimed
    walls = []
    for _ in range(times):
        t0 = time.perf_counter()
        admin.list_topics(timeout=timeout_s)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def _only_errors(errors: list[Any]) -> dict[str, Any]:
    """librdkafka's delivery reports of failed records only, into `errors` (a report per record
    costs the client's Python thread more than the produce itself)."""

    def delivered(err: Any, _msg: Any) -> None:
        errors.append(err)

    return {"delivery.report.only.error": True, "on_delivery": delivered}


def _produce(p: Any, topic: str, value: bytes, partition: int) -> None:
    while True:
        try:
            p.produce(topic, value, partition=partition)
            return
        except BufferError:  # librdkafka's queue is full: let it drain
            p.poll(0.005)


def k_produce_for(
    bootstrap: str,
    topic: str,
    partitions: int,
    seconds: float,
    acks: str,
    idempotent: bool = False,
    stats: list[dict[str, Any]] | None = None,
) -> tuple[int, float]:
    """Produce 1 KiB records round robin over `partitions` for `seconds`, then flush: (records, wall s).
    With `stats`, librdkafka's statistics of each second spent producing (not the flush's) are
    added to it (`queue_waits` reads them)."""
    from confluent_kafka import Producer as KProducer

    errors: list[Any] = []
    extra: dict[str, Any] = {}
    got: list[str] = []  # librdkafka's statistics, as it delivers them (in poll and flush)
    if stats is not None:
        extra = {"statistics.interval.ms": 1000, "stats_cb": got.append}
    p = KProducer(
        kconf(
            bootstrap,
            acks=acks,
            **{"enable.idempotence": idempotent, "linger.ms": 5, **_only_errors(errors), **extra},
        )
    )
    for k in range(partitions):  # metadata and each leader's connection: untimed
        _produce(p, topic, VALUE, k)
    if p.flush(60) or errors:
        raise RuntimeError(f"warm-up produce to {topic}: {errors[:3]}")
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        _produce(p, topic, VALUE, n % partitions)
        n += 1
        if n & 255 == 0:
            p.poll(0)
            if time.perf_counter() >= end:
                break
    producing = len(got)
    left = p.flush(120)
    wall = time.perf_counter() - t0
    if stats is not None:
        stats.extend(json.loads(doc) for doc in got[:producing])
    if left or errors:
        raise RuntimeError(f"produce acks={acks} to {topic}: {left} unacknowledged, errors {errors[:3]}")
    return n, wall


def queue_waits(stats: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(ms a record waited in librdkafka's queue before its request was made, ms from a request
    sent to its answer read): the p50s of the last second of a run's producing (`k_produce_for`'s
    `stats`), over the brokers it produced to; None for a run shorter than a second. Little's
    law over librdkafka's 100 000-message window: when the first is many times the second, the
    records wait in the client, not in the broker."""
    if not stats:
        return None
    brokers = [b for b in stats[-1]["brokers"].values() if b.get("req", {}).get("Produce")]
    if not brokers:
        return None
    queued = statistics.median(b["int_latency"]["p50"] for b in brokers) / 1000
    rtt = statistics.median(b["rtt"]["p50"] for b in brokers) / 1000
    return queued, rtt


def r_produce_for(
    bootstrap: str, topic: str, partitions: int, seconds: float, durable: bool
) -> tuple[int, float]:
    """Our client's `Producer` (64 KiB batches, linger 5 ms), as `k_produce_for`."""
    acks = m.Acks.DURABLE if durable else m.Acks.WRITTEN
    with Producer(bootstrap, acks=acks, batch_bytes=64 * 1024, linger_ms=5, enable_idempotence=durable) as p:
        for k in range(partitions):
            p.send(topic, VALUE, partition=k)
        p.flush(60)
        n = 0
        t0 = time.perf_counter()
        end = t0 + seconds
        while True:
            p.send(topic, VALUE, partition=n % partitions)
            n += 1
            if n & 255 == 0 and time.perf_counter() >= end:
                break
        p.flush(120)
        return n, time.perf_counter() - t0


def probe_p99(bootstrap: str, seconds: float) -> tuple[float, float]:
    """Our client, acks=WRITTEN, one record every 10 ms to topic `probe` partition 0 for
    `seconds`: (p50, p99) acknowledged latency in ms."""
    with Producer(bootstrap, acks=m.Acks.WRITTEN, linger_ms=0) as p:
        for _ in range(10):
            p.send("probe", VALUE[:100], partition=0).result(30)
        samples = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            p.send("probe", VALUE[:100], partition=0).result(30)
            took = time.perf_counter() - t0
            samples.append(took * 1000)
            time.sleep(max(0.0, 0.01 - took))
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


# ------------------------------------------------------------------------------------------ R1-R4


def snapshots(nodes: list[BrokerProcess]) -> list[dict[str, Any]]:
    """The published metrics of every core of `nodes` (broker/core/metrics.py), those readable."""
    return [dict(snap) for n in nodes for snap in read_snapshots(str(n.data_dir), n.cores)]


def metrics_hist(nodes: list[BrokerProcess], key: str) -> list[int]:
    total: list[int] = []
    for snap in snapshots(nodes):
        hist: list[int] = snap.get(key) or []
        total = [a + b for a, b in zip(total, hist, strict=True)] if total else list(hist)
    return total


def one_at_a_time(bootstrap: str, acks: int, n: int) -> list[float]:
    """Our client, one record at a time to topic `r` partition 0: acknowledged latencies in µs."""
    with Producer(bootstrap, acks=acks, linger_ms=0) as p:
        for _ in range(20):
            p.send("r", VALUE, partition=0).result(30)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            p.send("r", VALUE, partition=0).result(30)
            samples.append((time.perf_counter_ns() - t0) / 1e3)
    return sorted(samples)


def metrics_total(nodes: list[BrokerProcess], key: str) -> int:
    return sum(snap.get(key, 0) for snap in snapshots(nodes))


def r4_latency(
    row: Row, backend: str, single: BrokerProcess, cluster: str, nodes: list[BrokerProcess], n: int
) -> None:
    """R4: what an acks=all produce sent alone waits for. The acked p50 (our client, one record at
    a time) with 3 replicas acks=all and with one node acks=1, alternated twice; their difference
    is the replication's share. Beside it, its stages from the nodes' metrics over the cluster
    runs (means): the leader's wait from the produce written to the HW passing it
    (`replica_ack_us`), of which the follower's answer received -> next fetch sent
    (`replica_append_us`, its append); the rest is the link both ways and the leader's wake,
    answer and HW move."""
    keys = ("replica_ack_us_total", "replica_append_us_total")
    hists = ("replica_ack_us_log2", "replica_append_us_log2")
    ones: list[float] = []
    threes: list[float] = []
    sums = dict.fromkeys(keys, 0)
    counts = dict.fromkeys(hists, 0)
    for _ in range(2):
        ones.append(statistics.median(one_at_a_time(single.bootstrap, m.Acks.WRITTEN, n)))
        time.sleep(1.2)  # the nodes' metrics as they were before the run, published
        before = {k: metrics_total(nodes, k) for k in keys} | {h: sum(metrics_hist(nodes, h)) for h in hists}
        threes.append(statistics.median(one_at_a_time(cluster, m.Acks.DURABLE, n)))
        time.sleep(1.2)
        for k in keys:
            sums[k] += metrics_total(nodes, k) - before[k]
        for h in hists:
            counts[h] += sum(metrics_hist(nodes, h)) - before[h]
    p3, p1 = statistics.median(threes), statistics.median(ones)
    span = f"{min(threes):.0f}-{max(threes):.0f}"
    cell = f"{p3 / 1000:.2f} ms ({span} µs); 1 node acks=1 {p1:.0f} µs: replication +{p3 - p1:.0f} µs"
    acks, appends = counts["replica_ack_us_log2"], counts["replica_append_us_log2"]
    if acks and appends:
        ack = sums["replica_ack_us_total"] / acks
        append = sums["replica_append_us_total"] / appends
        cell += (
            f"; stages: HW wait {ack:.0f} = follower append {append:.0f}"
            f" + link and leader {ack - append:.0f} µs"
        )
    else:
        cell += "; no stage metrics (replica_ack_us / replica_append_us missing)"
    floor = hops_floor(n)
    if floor is not None:
        cell += (
            f"; the same hops between bare processes (bench/hops_floor.py): {floor['replicated']:.0f}"
            f" µs with 3 replicas, {floor['one']:.0f} µs one node"
        )
    row.cells[backend] = cell
    row.figures[backend] = p3 / 1000


def hops_floor(records: int) -> dict[str, float] | None:
    """bench/hops_floor.py's p50s (µs) of R4's two trips between processes that do nothing else,
    run in a process of its own (it forks, and this one holds librdkafka's threads); None, and
    why on stderr, if it fails: R4's own figures stand without it."""
    try:
        run = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("hops_floor.py")), "--records", str(records)],
            capture_output=True,
            text=True,
            timeout=60 + records * 0.01,
            check=True,
        )
        got = json.loads(run.stdout)
        return {shape: float(got[shape]["p50_us"]) for shape in ("replicated", "one")}
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        print(f"R4: bench/hops_floor.py failed: {exc}", file=sys.stderr)
        return None


@dataclass(frozen=True)
class Ran:
    """What a run of R1-R3 wrote and cost; two runs of a variant add up."""

    gb: float
    wall_s: float
    cpu_s: list[float]  # per broker process (its tree), in the order given
    client_s: float  # this process's CPU meanwhile: the client's
    waited_s: float  # the brokers' time runnable but waiting for a CPU (`tree_waited`), summed
    leader: int = 1  # the node leading its topic's first partition (R3's one-partition run)

    @property
    def mbs(self) -> float:
        return self.gb * 1000 / self.wall_s

    def __add__(self, other: Ran) -> Ran:
        cpu = [a + b for a, b in zip(self.cpu_s, other.cpu_s, strict=True)]
        return Ran(
            self.gb + other.gb,
            self.wall_s + other.wall_s,
            cpu,
            self.client_s + other.client_s,
            self.waited_s + other.waited_s,
            self.leader,
        )


def phase_replication(
    rows: dict[str, Row], only: set[str], root: Path, backend: str, sizes: Sizes, started: Started
) -> dict[str, float]:
    """R1-R4 on `backend`; returns the figures R15's replicas column reads."""
    out: dict[str, float] = {}
    etcd = started.add(EtcdCluster(root / f"etcd-{backend}", 1).start())
    single = broker(started, root, f"single-{backend}", backend, 1)
    nodes = start_cluster(root / f"cluster-{backend}", etcd, backend, started.items)
    cluster = ",".join(n.bootstrap for n in nodes.values())
    with Admin(single.bootstrap) as a:
        a.create_topic("r", 3)
    with Admin(cluster) as a:
        tid = a.create_topic("r", 3, replication=3)

    def in_sync(topic_id: int, count: int) -> bool:
        got = states(nodes[1], topic_id)
        return len(got) == count and all(len(s["isr"]) == 3 for s in got.values())

    wait_for(lambda: in_sync(tid, 3), sizes.step_timeout_s)
    node_list = list(nodes.values())
    made = [0]

    def run(replicated: bool, partitions: int, produce: Callable[[str, int], tuple[int, float]]) -> Ran:
        """`produce(topic, partitions)` on a topic of its own (R4's "r" aside), deleted after it:
        what a run writes leaves the page cache with it (`spread_pairs` says why)."""
        made[0] += 1
        topic = f"r-{made[0]}"
        procs = node_list if replicated else [single]
        bootstrap = cluster if replicated else single.bootstrap
        with Admin(bootstrap) as a:
            topic_id = a.create_topic(topic, partitions, replication=3 if replicated else 1)
        if replicated:
            wait_for(lambda: in_sync(topic_id, partitions), sizes.step_timeout_s)
        cpu0 = [tree_cpu(p.pid) for p in procs]
        waited0 = sum(tree_waited(p.pid) for p in procs)
        client0 = time.process_time()
        records, wall = produce(topic, partitions)
        cpu = [tree_cpu(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
        client = time.process_time() - client0
        waited = sum(tree_waited(p.pid) for p in procs) - waited0
        leader = states(nodes[1], topic_id)[0]["leader"] if replicated else 1
        with Admin(bootstrap) as a:
            a.delete_topic(topic)
        return Ran(records * len(VALUE) / 1e9, wall, cpu, client, waited, leader)

    def alternated(
        one: Callable[[str, int], tuple[int, float]], three: Callable[[str, int], tuple[int, float]]
    ) -> tuple[Ran, Ran]:
        """The one node's runs and the cluster's, each summed (`one_many_one`'s order)."""
        ones, threes = one_many_one(lambda: run(False, 3, one), lambda: run(True, 3, three))
        return ones[0] + ones[1], threes[0] + threes[1]

    def clients(one: Ran, three: Ran) -> str:
        """The client's CPU, and the nodes' wait for one, per second of each side's runs."""
        return (
            f"client {three.client_s / three.wall_s:.1f}/{one.client_s / one.wall_s:.1f} CPU, "
            f"nodes waiting for a CPU {three.waited_s / three.wall_s:.1f}/{one.waited_s / one.wall_s:.1f}"
        )

    if only & {"R1", "R3"}:
        one, three = alternated(
            lambda t, n: k_produce_for(single.bootstrap, t, n, sizes.repl_s, "1"),
            lambda t, n: k_produce_for(cluster, t, n, sizes.repl_s, "all", idempotent=True),
        )
        ratio = three.mbs / one.mbs
        rows["R1"].cells[backend] = f"{ratio:.2f} ({three.mbs:.0f}/{one.mbs:.0f} MB/s; {clients(one, three)})"
        rows["R1"].figures[backend] = ratio
        out.update(one_mbs=one.mbs, three_mbs=three.mbs)
        one_cpu_gb = sum(one.cpu_s) / one.gb
        all_cpu_gb = sum(three.cpu_s) / three.gb
        out.update(one_cpu_gb=one_cpu_gb, three_cpu_gb=all_cpu_gb)
        if "R3" in only:
            r3 = run(True, 1, lambda t, n: k_produce_for(cluster, t, n, sizes.cpu_s, "all", idempotent=True))
            lead = r3.cpu_s[r3.leader - 1] / r3.gb
            follow = (sum(r3.cpu_s) - r3.cpu_s[r3.leader - 1]) / r3.gb
            rows["R3"].cells[backend] = (
                f"{all_cpu_gb:.1f} all (1 partition: {lead:.1f} leader + {follow:.1f} followers); "
                f"1 node {one_cpu_gb:.1f}"
            )
    if "R4" in only:
        r4_latency(rows["R4"], backend, single, cluster, node_list, max(50, int(sizes.repl_s * 500)))
    if "R2" in only:
        one, three = alternated(
            lambda t, n: r_produce_for(single.bootstrap, t, n, sizes.repl_s, False),
            lambda t, n: r_produce_for(cluster, t, n, sizes.repl_s, True),
        )
        ratio = three.mbs / one.mbs
        rows["R2"].cells[backend] = f"{ratio:.2f} ({three.mbs:.0f}/{one.mbs:.0f} MB/s; {clients(one, three)})"
        rows["R2"].figures[backend] = ratio
    for n in [*node_list, single]:
        started.stop(n)
    started.stop(etcd)
    return out


# ------------------------------------------------------------------------------------------ R5-R11


def fit_to_disk(partitions: int, where: Path, copies: int = 1, others: int = 0) -> tuple[int, str]:
    """The partition count whose first touch fits the free disk with a margin, and why if lowered:
    `copies` brokers of that many (one a backend) and `others` partitions more, all kept until the
    run ends (`Started`)."""
    free = shutil.disk_usage(where).free
    margin = max(DISK_MARGIN_MIN, int(free * 0.3))
    fits = max(0, ((free - margin) // PREALLOCATED_PER_PARTITION - others) // copies)
    if partitions <= fits:
        return partitions, ""
    lowered = max(1, fits // 1000 * 1000 if fits >= 1000 else fits)
    return lowered, (
        f"{partitions:,} partitions lowered to {lowered:,}: touching one preallocates "
        f"~{PREALLOCATED_PER_PARTITION // 1024} KiB and "
        f"{free / GiB:.0f} GiB are free (kept free: {margin / GiB:.0f} GiB)"
    )


def topics_for(partitions: int, prefix: str = "t") -> dict[str, int]:
    out = {}
    for i in range(0, partitions, TOPIC_PARTITIONS):
        out[f"{prefix}{i // TOPIC_PARTITIONS}"] = min(TOPIC_PARTITIONS, partitions - i)
    return out


def partitions_round(
    root: Path, backend: str, cores: int, partitions: int, sizes: Sizes, started: Started,
    restart: bool = True, spread: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """R5-R10 at `partitions` on one fresh broker: a dict of figures."""
    nofile = nofile_for(partitions)
    extra = ("--max-partitions", str(partitions + 1000), "--producer-id-expiration-ms", "1000")
    b = broker(
        started, root, f"parts-{backend}-{partitions}", backend, cores, extra, nofile, sizes.step_timeout_s
    )
    res: dict[str, Any] = {}
    try:
        pss0 = pss_bytes(workers(b))
        topics = topics_for(partitions)
        res["create_s"] = k_create(b.bootstrap, topics, sizes.step_timeout_s)
        res["touch_s"] = k_touch(b.bootstrap, topics, sizes.step_timeout_s)
        time.sleep(0.5)
        res["pss_per_partition"] = (pss_bytes(workers(b)) - pss0) / partitions
        res["fds"] = max_fds(workers(b))
        cache = re.search(r"the segment fd cache \((\d+)\)", b.log())
        res["cache"] = int(cache.group(1)) if cache else Limits().segment_fd_cache
        res["metadata_s"] = k_metadata(b.bootstrap, sizes.step_timeout_s)
        with Admin(b.bootstrap) as a:
            a.create_topic("probe", 1)
        res["probe_p50_ms"], res["probe_p99_ms"] = probe_p99(b.bootstrap, sizes.probe_s)
        time.sleep(1.2)  # the workers' metrics as they are now, published
        snaps = snapshots([b])
        res["gc_pause_max_ms"] = max((s.get("gc_pause_us_max", 0) for s in snaps), default=0) / 1000
        res["gc_full"] = max((s.get("gc_collections", [0, 0, 0])[2] for s in snaps), default=0)
        if spread:  # acks=1: over the first topic's partitions (up to 1000) against one partition
            with Admin(b.bootstrap) as a:
                a.create_topic("one", 1)
            first, n = next(iter(topics.items()))
            ones, manys = one_many_one(
                lambda: k_produce_for(b.bootstrap, "one", 1, sizes.spread_s, "1"),
                lambda: k_produce_for(b.bootstrap, first, n, sizes.spread_s, "1"),
            )
            res["spread"] = per_second(manys) / per_second(ones)
        if restart:
            t0 = time.perf_counter()
            # the supervisor's own wait grows with the partitions: the cap grows as it does
            res["stop_killed"] = b.stop(sizes.stop_cap_s + STOP_TIMEOUT_PER_PARTITION_S * partitions) != 0
            res["stop_s"] = time.perf_counter() - t0
            res["start_s"] = started_in(b, sizes.step_timeout_s)
            if isinstance(res["start_s"], float):
                t0 = time.perf_counter()
                b.kill()
                res["restart_kill_s"] = started_in(b, sizes.step_timeout_s)
    finally:
        started.stop(b, keep_data=True)
    return res


def tansu_partitions(root: Path, partitions: int, sizes: Sizes, started: Started) -> dict[str, float]:
    t = started.add(Tansu(root, "tansu"))
    t.start()
    try:
        pss0 = pss_bytes(t.pids())
        topics = topics_for(partitions)
        res = {"create_s": k_create(t.bootstrap, topics, sizes.step_timeout_s)}
        res["touch_s"] = k_touch(t.bootstrap, topics, sizes.step_timeout_s)
        time.sleep(0.5)
        res["pss_per_partition"] = (pss_bytes(t.pids()) - pss0) / partitions
        res["metadata_s"] = k_metadata(t.bootstrap, sizes.step_timeout_s)
        return res
    finally:
        started.stop(t)


def limit_at_start(root: Path, backend: str, started: Started) -> str:
    b = broker(started, root, f"limit-{backend}", backend, 1)
    try:
        text = b.log()
    finally:
        started.stop(b)
    limit = re.search(r"partition limit (\d+) \((.*)\)\"?$", text, re.M)
    nofile = re.search(r"open-file limit \(RLIMIT_NOFILE\) (\d+|unlimited)", text)
    where = f"nofile {nofile.group(1)}" if nofile else "nofile ?"
    if limit:
        return f"{int(limit.group(1)):,} ({where}; {limit.group(2)})"
    return f"? ({where}: no partition limit line in the log)"


def started_in(b: BrokerProcess, timeout_s: float) -> float | str:
    """Seconds from now until `b` serves again, or why it did not (the last line of its log: a
    start that fails at scale is a figure of R6, not an error of the run)."""
    t0 = time.perf_counter()
    try:
        b.start(timeout_s)
    except RuntimeError as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return f"failed after {time.perf_counter() - t0:.0f} s: {lines[-1][:70] if lines else exc}"
    return time.perf_counter() - t0


def restart_cell(res: dict[str, Any]) -> str:
    def figure(x: float | str) -> str:
        return fmt_s(x) if isinstance(x, float) else x

    stop = f"> {fmt_s(res['stop_s'])} (killed)" if res["stop_killed"] else fmt_s(res["stop_s"])
    kill = figure(res["restart_kill_s"]) if "restart_kill_s" in res else "-"
    return f"stop {stop} + start {figure(res['start_s'])} / {kill}"


def phase_partitions(
    rows: dict[str, Row], only: set[str], root: Path, backend: str, cores: int, partitions: int,
    sizes: Sizes, started: Started,
) -> dict[str, float]:  # fmt: skip
    res = partitions_round(root, backend, cores, partitions, sizes, started, restart="R6" in only)
    cache = res["cache"]  # as the broker sized it (0, the default: half the open-file room)
    rows["R5"].cells[backend] = f"{fmt_s(res['create_s'])} / {fmt_s(res['touch_s'])}"
    rows["R5"].figures[backend] = res["create_s"] + res["touch_s"]
    if "start_s" in res:
        rows["R6"].cells[backend] = restart_cell(res)
    rows["R7"].cells[backend] = f"{res['pss_per_partition'] / 1000:.1f} KB"
    rows["R7"].figures[backend] = res["pss_per_partition"]
    rows["R8"].cells[backend] = f"{res['fds']:.0f} (cache {cache})"
    rows["R8"].figures[backend] = res["fds"] - (cache + FIXED_FDS_PER_WORKER + 64)
    rows["R9"].cells[backend] = f"{res['metadata_s'] * 1000:.0f}"
    rows["R9"].figures[backend] = res["metadata_s"]
    rows["R10"].cells[backend] = (
        f"{res['probe_p99_ms']:.1f} ms (p50 {res['probe_p50_ms']:.1f}; longest GC pause since start"
        f" {res['gc_pause_max_ms']:.0f} ms, {res['gc_full']} full)"
    )
    rows["R10"].figures[backend] = res["probe_p99_ms"]
    return res


# ------------------------------------------------------------------------------------------ R12-R14


T = TypeVar("T")


def one_many_one(one: Callable[[], T], many: Callable[[], T]) -> tuple[tuple[T, T], tuple[T, T]]:
    """The two runs of `one` and the two of `many`, made in the order one, many, many, one: each
    variant as late in the row as the other on average, for what grows over a row (the page
    cache: `spread_pairs`)."""
    first = one()
    many_runs = (many(), many())
    return (first, one()), many_runs


def per_second(runs: Sequence[tuple[float, ...]], what: int = 0) -> float:
    """Field `what` of `runs` (each (records, wall s, ...)) summed, per second of their walls."""
    return sum(r[what] for r in runs) / sum(r[1] for r in runs)


def k_delete(bootstrap: str, topic: str, timeout_s: float) -> None:
    """DeleteTopics of `topic`: ringlog answers once its files are gone, their page cache with them
    (broker/core/core.py `delete_topic`)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(admin_conf(bootstrap, timeout_s))
    for f in admin.delete_topics([topic], operation_timeout=timeout_s).values():
        f.result(timeout_s)


def spread_pairs(bootstrap: str, many: int, seconds: float, ours: bool, timeout_s: float) -> dict[str, float]:
    """Rate over `many` partitions / rate over 1, per acks (`one_many_one`); beside them the
    rates and the client's CPU (this process: the producer and, for librdkafka, its threads) per
    second over `many`, which says when the client, on the broker's CPUs, is the limit.

    Each run writes a topic of its own, deleted after it. Records kept in the page cache send
    the runs after them to guest memory the host has taken back, a host fault a page (a broker
    there spent 34-54% of its samples in the page-cache copy, `copy_folio_from_iter_atomic`, ~3
    us a KiB against ~0.3): with two topics kept for the whole row, R12 read 0.31-0.82 in runs
    of one tree, with a topic a run 0.40-0.58 (docs/PERFORMANCE.md, "The guest's free memory
    goes back to the host")."""
    out = {}
    runs = [0]
    for acks in ("all", "1"):
        waits_many: list[tuple[float, float]] = []  # `queue_waits` of the runs over `many`

        def produce(
            n: int, acks: str = acks, waits_many: list[tuple[float, float]] = waits_many
        ) -> tuple[int, float, float]:
            """(records, wall s, this process's CPU s meanwhile) of one run."""
            runs[0] += 1
            topic = f"spread-{runs[0]}"
            k_create(bootstrap, {topic: n}, timeout_s)
            try:
                cpu0 = time.process_time()
                if ours:
                    records, wall = r_produce_for(bootstrap, topic, n, seconds, acks == "all")
                else:
                    stats: list[dict[str, Any]] | None = [] if n == many else None
                    records, wall = k_produce_for(bootstrap, topic, n, seconds, acks, stats=stats)
                    if stats is not None and (waits := queue_waits(stats)) is not None:
                        waits_many.append(waits)
                return records, wall, time.process_time() - cpu0
            finally:
                k_delete(bootstrap, topic, timeout_s)

        ones, manys = one_many_one(lambda: produce(1), lambda: produce(many))
        rate1, rate_many = per_second(ones), per_second(manys)
        out[f"client_cpu_{acks}"] = per_second(manys, 2)
        if waits_many:
            out[f"queued_ms_{acks}"] = statistics.median(w[0] for w in waits_many)
            out[f"rtt_ms_{acks}"] = statistics.median(w[1] for w in waits_many)
        out[acks] = rate_many / rate1
        out[f"rate1_{acks}"] = rate1
        out[f"rate_many_{acks}"] = rate_many
    return out


def spread_cell(s: dict[str, float]) -> str:
    """R12/R13's cell: the ratios, then the rates over many (thousands of records a second) and
    the client's CPU meanwhile."""
    rates = " / ".join(f"{s[f'rate_many_{a}'] / 1000:.0f}k" for a in ("all", "1"))
    cpu = " / ".join(f"{s[f'client_cpu_{a}']:.1f}" for a in ("all", "1"))
    cell = f"{s['all']:.2f} / {s['1']:.2f} ({rates} rec/s; client {cpu} CPU"
    if all(f"queued_ms_{a}" in s for a in ("all", "1")):
        queued = " / ".join(f"{s[f'queued_ms_{a}']:.0f}" for a in ("all", "1"))
        rtt = " / ".join(f"{s[f'rtt_ms_{a}']:.0f}" for a in ("all", "1"))
        cell += f"; queued in librdkafka {queued} ms p50, round trip {rtt} ms"
    return cell + ")"


def sync_floor(where: Path, files: int, seconds: float) -> dict[str, float] | None:
    """bench/sync_floor.py's rates (records a second over one file and over `files`) of R12's
    acks=all writes and syncs with no broker, run in a process of its own on the broker's disk;
    None, and why on stderr, if it fails: R12's own figures stand without it."""
    script = Path(__file__).with_name("sync_floor.py")
    args = ["--dir", str(where), "--files", str(files), "--seconds", str(seconds)]
    try:
        run = subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            timeout=120 + 8 * seconds,
            check=True,
        )
        got = json.loads(run.stdout)
        return {shape: float(got[shape]) for shape in ("one", "many")}
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        print(f"R12: bench/sync_floor.py failed: {exc}", file=sys.stderr)
        return None


def phase_spread(
    rows: dict[str, Row], only: set[str], root: Path, backend: str, cores: int, sizes: Sizes, started: Started
) -> dict[str, float]:
    many = sizes.spread_partitions
    extra = ("--max-partitions-per-topic", str(max(1000, many)))
    b = broker(started, root, f"spread-{backend}", backend, cores, extra, nofile_for(many + 10))
    out: dict[str, float] = {}
    try:
        for row, ours in (("R12", False), ("R13", True)):
            if row not in only:
                continue
            s = spread_pairs(b.bootstrap, many, sizes.spread_s, ours, sizes.step_timeout_s)
            rows[row].cells[backend] = spread_cell(s)
            if not ours and (disk := sync_floor(root, many, sizes.spread_s)) is not None:
                rows[row].cells[backend] += (
                    f"; acks=all's writes and syncs alone (bench/sync_floor.py): {disk['many'] / 1000:.0f}k"
                    f" / {disk['one'] / 1000:.0f}k rec/s over {many} files / one"
                )
                s.update({f"disk_{k}": v for k, v in disk.items()})
            rows[row].figures[backend] = min(s["all"], s["1"])
            out.update({f"{row}_{k}": v for k, v in s.items()})
    finally:
        started.stop(b)
    return out


def group_times(
    bootstrap: str, topic: str, partitions: int, members: int, timeout_s: float
) -> tuple[float, float]:
    """(seconds until `members` consumers hold all `partitions`, seconds until the rest do after
    one leaves)."""
    from confluent_kafka import Consumer

    held: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    leave = threading.Event()
    errors: list[BaseException] = []

    def member(i: int) -> None:
        try:
            c = Consumer(
                kconf(
                    bootstrap,
                    **{
                        "group.id": "scale",
                        "session.timeout.ms": 30_000,
                        "heartbeat.interval.ms": 1000,
                        "partition.assignment.strategy": "roundrobin",
                        "enable.auto.commit": False,
                        "auto.offset.reset": "latest",
                    },
                )
            )

            def assigned(_c: Any, parts: list[Any]) -> None:
                with lock:
                    held[i] = len(parts)

            def revoked(_c: Any, _parts: list[Any]) -> None:
                with lock:
                    held[i] = 0

            c.subscribe([topic], on_assign=assigned, on_revoke=revoked)
            while not stop.is_set():
                if i == 0 and leave.is_set():
                    c.close()
                    with lock:
                        held.pop(i, None)
                    return
                c.poll(0.05)
            c.close()
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    try:
        t0 = time.perf_counter()
        for t in threads:
            t.start()

        def all_held(n: int) -> bool:
            if errors:
                raise errors[0]
            with lock:
                return len(held) == n and all(held.values()) and sum(held.values()) == partitions

        wait_for(lambda: all_held(members), timeout_s, 0.02)
        joined = time.perf_counter() - t0
        t0 = time.perf_counter()
        leave.set()
        wait_for(lambda: 0 not in held and all_held(members - 1), timeout_s, 0.02)
        left = time.perf_counter() - t0
        return joined, left
    finally:
        stop.set()
        deadline = time.monotonic() + 60
        for t in threads:  # daemon threads: one still closing at the deadline does not hold the run
            t.join(max(0.0, deadline - time.monotonic()))


def phase_group(
    rows: dict[str, Row], root: Path, backend: str, cores: int, sizes: Sizes, started: Started
) -> None:
    p = sizes.group_partitions
    extra = ("--max-partitions-per-topic", str(max(1000, p)), "--group-initial-rebalance-delay-ms", "0")
    b = broker(started, root, f"group-{backend}", backend, cores, extra, nofile_for(p + 10, 1000))
    try:
        k_create(b.bootstrap, {"g": p}, sizes.step_timeout_s)
        k_touch(b.bootstrap, {"g": p}, sizes.step_timeout_s)  # the files made: the times are the group's
        joined, left = group_times(b.bootstrap, "g", p, sizes.group_members, sizes.step_timeout_s)
        rows["R14"].cells[backend] = f"{fmt_s(joined)} / {fmt_s(left)}"
        rows["R14"].figures[backend] = joined
    finally:
        started.stop(b, keep_data=True)


# ------------------------------------------------------------------------------------------ R15


CONNECTIONS_FD_CACHE = 1024


def connections_round(
    root: Path, backend: str, cores: int, count: int, sizes: Sizes, started: Started
) -> dict[str, float]:
    # A small segment cache leaves the open-file room to connections (the default takes half:
    # 10k connections would not fit this machine's 20 000), and the per-core limit (10 000 by
    # default) leaves room for the probe and the admin client beside `count` idle ones.
    extra = (
        "--segment-fd-cache", str(CONNECTIONS_FD_CACHE), "--max-connections-per-core", str(count + 100),
    )  # fmt: skip
    b = broker(started, root, f"conns-{backend}-{count}", backend, cores, extra, nofile_for(10, count + 100))
    socks: list[socket.socket] = []
    try:
        with Admin(b.bootstrap) as a:
            a.create_topic("probe", 1)
        time.sleep(0.3)
        pss0 = pss_bytes(workers(b))
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", b.port), timeout=10))
        time.sleep(0.5)
        per = (pss_bytes(workers(b)) - pss0) / count
        _, p99 = probe_p99(b.bootstrap, sizes.probe_s)
        return {"pss_per_connection": per, "probe_p99_ms": p99, "fds": max_fds(workers(b))}
    finally:
        for s in socks:
            s.close()
        started.stop(b)


# ------------------------------------------------------------------------------------------ main


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM to the bench runs its `finally` blocks (every broker stopped) as Ctrl-C does."""

    def handler(_sig: int, _frame: Any) -> None:
        raise SystemExit(143)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def guarded(rows: dict[str, Row], names: list[str], column: str, fn: Callable[[], Any]) -> Any:
    """Run one phase; an exception marks its rows' `column` as an error instead of ending the run."""
    t0 = time.perf_counter()
    try:
        got = fn()
        print(f"  {'/'.join(names)} {column}: {time.perf_counter() - t0:.0f} s", flush=True)
        return got
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the table says what failed
        text = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"
        print(f"  {'/'.join(names)} {column}: {text}", flush=True)
        tail = str(exc).splitlines()[1:][-12:]  # a broker's exit: the end of its log
        print("".join(f"    | {line}\n" for line in tail), end="", flush=True)
        for n in names:
            rows[n].cells.setdefault(column, text)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few minutes: 20k partitions, short runs")
    mode.add_argument("--smoke", action="store_true", help="the test suite's seconds-long run of every row")
    ap.add_argument("--only", default=",".join(ROWS), help="rows to run, e.g. R1,R5 (default all)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--max-scale", type=int, help="partitions of R5-R10 and R15's largest (100k; 20k quick)")
    ap.add_argument("--cores", type=int, default=1, help="workers of each single-node broker (default 1)")
    ap.add_argument("--no-tansu", action="store_true", help="leave Tansu out")
    ap.add_argument("--dir", default=str(REPO / ".bench-tmp"))
    ap.add_argument(
        "--page-reporting-min-free-ms",
        type=int,
        help="keep freed guest pages from the host this long (free page reporting's min_free_ms) for "
        "the run, restored at exit (root; where the guest kernel has it: bench/benchlib.py)",
    )
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.page_reporting_min_free_ms is not None:
            knob = PAGE_REPORTING / "min_free_ms"
            stack.enter_context(knob_for_the_run(knob, args.page_reporting_min_free_ms))
        return run(args, ap)


def run(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    sizes = dataclasses.replace(SMOKE if args.smoke else QUICK if args.quick else FULL)
    only = {r.strip().upper() for r in args.only.split(",") if r.strip()}
    if unknown := sorted(only - set(ROWS)):
        ap.error(f"unknown rows {unknown}")
    backends = [b for b in args.backends.split(",") if b]
    if args.smoke:
        backends = backends[:1]
    if bad := [b for b in backends if b not in BACKENDS]:
        ap.error(f"unknown backends {bad}")
    tansu = not (args.no_tansu or args.smoke)
    if tansu:
        try:
            tansu_binary()
        except RuntimeError as exc:
            print(f"  Tansu left out: {exc}")
            tansu = False
    asked = args.max_scale or sizes.partitions
    root = Path(args.dir) / "scale" / f"run-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    NOFILE_CEILING[0] = nofile_ceiling()
    others = sum(g for g in sizes.growth if g < asked) + len(backends) * sizes.group_partitions  # R15, R14
    partitions, why = fit_to_disk(asked, root, len(backends), others)
    allowed = partitions_allowed()
    if partitions > allowed - 50:
        lowered = (allowed - 50) // 1000 * 1000 if allowed >= 1050 else allowed - 50
        why = (why + "; " if why else "") + (
            f"{partitions:,} partitions lowered to {lowered:,}: the broker's --max-partitions auto allows "
            f"{allowed:,} with this machine's memory"
        )
        partitions = lowered
    sizes.growth = tuple(sorted({s for s in sizes.growth if s < partitions}))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # R15's idle connections are this process's sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    import confluent_kafka

    rows = make_rows()
    load0 = loadavg()
    print(f"ringlog bench/scale.py: {code_version()}")
    print(
        f"  {len(os.sched_getaffinity(0))} CPUs, load average {load0}; data on {fs_of(str(root))}; "
        f"confluent-kafka {confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}; "
        f"nofile {soft}/{hard}, vm.max_map_count {Path('/proc/sys/vm/max_map_count').read_text().strip()}"
    )
    print(
        f"  mode {'smoke' if args.smoke else 'quick' if args.quick else 'full'}; "
        f"backends {','.join(backends)}; single-node brokers --cores {args.cores}; "
        f"partitions {partitions:,} (R5-R10), {sizes.group_partitions:,} (R14, {sizes.group_members} "
        f"members), {sizes.spread_partitions} (R12/R13); Tansu {'beside' if tansu else 'left out'}; "
        f"rows {','.join(r for r in ROWS if r in only)}"
    )
    reporting, reported_before = page_reporting()
    print(
        f"  free page reporting: {reporting} (a page-cache write into a page given back costs a host fault)"
    )
    if why:
        print(f"  {why}")
    started = Started()
    t_start = time.perf_counter()
    repl: dict[str, dict[str, float]] = {}
    growth: list[list[str]] = []
    cores = args.cores
    phases: list[tuple[list[str], str, Callable[[str], Any]]] = [
        (["R1", "R2", "R3", "R4"], "repl", lambda b: phase_replication(rows, only, root, b, sizes, started)),
        (["R5", "R6", "R7", "R8", "R9", "R10"], "parts",
         lambda b: phase_partitions(rows, only, root, b, cores, partitions, sizes, started)),
        (["R12", "R13"], "spread", lambda b: phase_spread(rows, only, root, b, cores, sizes, started)),
        (["R14"], "group", lambda b: phase_group(rows, root, b, cores, sizes, started)),
    ]  # fmt: skip
    first = backends[0]
    try:
        with terminated_as_exit():
            for backend in backends:
                for names, kind, phase in phases:
                    if only & set(names):
                        got = guarded(rows, names, backend, lambda p=phase, b=backend: p(b))
                        if kind in ("repl", "parts"):
                            repl[f"{kind}-{backend}"] = got or {}
                print(f"  {backend} done at {time.perf_counter() - t_start:.0f} s", flush=True)
            if "R11" in only:
                limit = guarded(rows, ["R11"], first, lambda: limit_at_start(root, first, started))
                if limit:
                    rows["R11"].cells[first] = limit
            if tansu:
                tansu_rows(rows, only, root, partitions, sizes, started)
            if "R15" in only:
                growth = (
                    guarded(
                        rows,
                        ["R15"],
                        first,
                        lambda: growth_table(root, first, cores, partitions, sizes, started, repl),
                    )
                    or []
                )
                if growth:
                    rows["R15"].cells[first] = f"{len(growth)} rows below"
    finally:
        started.close()
        shutil.rmtree(root, ignore_errors=True)
    ratios(rows, backends)
    print()
    print(f"  took {time.perf_counter() - t_start:.0f} s; load average {load0} before, {loadavg()} after")
    reported_after = page_reporting()[1]
    if reported_before is not None and reported_after is not None:
        mib = (reported_after - reported_before) / 1024
        print(f"  guest memory reported free to the host during the run: {mib:,.0f} MiB")
    header = ["row", "what", "goal", *backends, "tansu", "ratio", "verdict"]
    lines = []
    for r in rows.values():
        judged = [b for b in backends if b == "io_uring"] if r.name == "R4" else backends
        cells = [r.cells.get(b, "-") for b in backends]
        lines.append(
            [
                r.name,
                r.what,
                r.goal,
                *cells,
                r.cells.get("tansu", "-"),
                "; ".join(r.ratio) or "-",
                r.verdict(judged),
            ]
        )
    table(header, lines, labels=3)
    print(
        "  R1/R2: ratio (cluster/single MB/s); R3: CPU-s/GB; R4: ms, then µs; R5: create / touch s; "
        "R6: s; R12/R13: acks=all / acks=1; R14: join / leave s"
    )
    if growth:
        print()
        print(f"  R15 growth ({backends[0]}, --cores {args.cores}):")
        table(["size", "create s", "touch s", "restart s", "Pss/part.", "fds", "metadata ms", "probe p99 ms",
               "spread N/1"], growth, labels=1)  # fmt: skip
    return 0


def ratios(rows: dict[str, Row], backends: list[str]) -> None:
    """Tansu's figure over ringlog's for the rows both ran (times and bytes: above 1 = ringlog
    better), and the goal's ratio itself for the ratio rows."""
    for name in ("R5", "R7", "R9", "R14"):
        row = rows[name]
        t = row.figures.get("tansu")
        if t is None:
            continue
        for b in backends:
            mine = row.figures.get(b)
            if mine:
                row.ratio.append(f"{b} {t / mine:.2f}x Tansu")
    for name in ("R1", "R2", "R12", "R13"):
        for b in backends:
            if b in rows[name].figures and not any(r.startswith(b) for r in rows[name].ratio):
                rows[name].ratio.append(f"{b} {rows[name].figures[b]:.2f}")


def tansu_rows(
    rows: dict[str, Row], only: set[str], root: Path, partitions: int, sizes: Sizes, started: Started
) -> None:
    if only & {"R5", "R7", "R9"}:
        res = guarded(
            rows, ["R5", "R7", "R9"], "tansu", lambda: tansu_partitions(root, partitions, sizes, started)
        )
        if res:
            rows["R5"].cells["tansu"] = f"{fmt_s(res['create_s'])} / {fmt_s(res['touch_s'])}"
            rows["R5"].figures["tansu"] = res["create_s"] + res["touch_s"]
            rows["R7"].cells["tansu"] = f"{res['pss_per_partition'] / 1000:.1f} KB"
            rows["R7"].figures["tansu"] = res["pss_per_partition"]
            rows["R9"].cells["tansu"] = f"{res['metadata_s'] * 1000:.0f}"
            rows["R9"].figures["tansu"] = res["metadata_s"]
    for name in ("R1", "R2", "R3", "R4", "R6", "R8", "R10", "R11", "R13", "R15"):
        rows[name].cells.setdefault("tansu", "n/a")
    if only & {"R12"}:

        def spread() -> None:
            t = started.add(Tansu(root, "tansu"))
            t.start()
            try:
                s = spread_pairs(
                    t.bootstrap, sizes.spread_partitions, sizes.spread_s, False, sizes.step_timeout_s
                )
                rows["R12"].cells["tansu"] = spread_cell(s)
            finally:
                started.stop(t)

        guarded(rows, ["R12"], "tansu", spread)
    if "R14" in only:

        def group() -> None:
            t = started.add(Tansu(root, "tansu"))
            t.start()
            try:
                k_create(t.bootstrap, {"g": sizes.group_partitions}, sizes.step_timeout_s)
                k_touch(t.bootstrap, {"g": sizes.group_partitions}, sizes.step_timeout_s)
                joined, left = group_times(
                    t.bootstrap, "g", sizes.group_partitions, sizes.group_members, sizes.step_timeout_s
                )
                rows["R14"].cells["tansu"] = f"{fmt_s(joined)} / {fmt_s(left)}"
                rows["R14"].figures["tansu"] = joined
            finally:
                started.stop(t)

        guarded(rows, ["R14"], "tansu", group)


def growth_table(
    root: Path, backend: str, cores: int, partitions: int, sizes: Sizes, started: Started,
    repl: dict[str, dict[str, float]],
) -> list[list[str]]:  # fmt: skip
    out = []
    for size in sizes.growth:
        r = partitions_round(root, backend, cores, size, sizes, started, sizes.growth_restarts, spread=True)
        out.append([
            f"partitions {size:,}", fmt_s(r["create_s"]), fmt_s(r["touch_s"]),
            restart_cell(r) if "start_s" in r else "-",
            f"{r['pss_per_partition'] / 1000:.1f} KB", f"{r['fds']:.0f}", f"{r['metadata_s'] * 1000:.0f}",
            f"{r['probe_p99_ms']:.1f}", f"{r['spread']:.2f} ({min(size, TOPIC_PARTITIONS)})",
        ])  # fmt: skip
        print(f"  R15 {size} partitions done", flush=True)
    for count in sizes.connections:
        r = connections_round(root, backend, cores, count, sizes, started)
        out.append([
            f"idle connections {count:,}", "-", "-", "-", f"{r['pss_per_connection'] / 1000:.1f} KB/conn",
            f"{r['fds']:.0f}", "-", f"{r['probe_p99_ms']:.1f}", "-",
        ])  # fmt: skip
    main = repl.get(f"parts-{backend}") or {}
    if main:  # R5-R10's own size, from their run
        out.append([
            f"partitions {partitions:,} (R5-R10)", fmt_s(main["create_s"]), fmt_s(main["touch_s"]),
            restart_cell(main) if "start_s" in main else "-",
            f"{main['pss_per_partition'] / 1000:.1f} KB", f"{main['fds']:.0f}",
            f"{main['metadata_s'] * 1000:.0f}", f"{main['probe_p99_ms']:.1f}", "-",
        ])  # fmt: skip
    got = repl.get(f"repl-{backend}") or {}
    if got:
        out.append(["replicas 1 (acks=1)", "-", "-", "-", "-", "-", "-", "-",
                    f"{got['one_mbs']:.0f} MB/s, {got['one_cpu_gb']:.1f} CPU-s/GB"])  # fmt: skip
        out.append(["replicas 3 (acks=all)", "-", "-", "-", "-", "-", "-", "-",
                    f"{got['three_mbs']:.0f} MB/s, {got['three_cpu_gb']:.1f} CPU-s/GB"])  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
