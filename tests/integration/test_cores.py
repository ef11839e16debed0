"""Several cores: one worker process per core behind a supervisor, forwarding, shared topics,
restarts, graceful stop, stats. Parametrized by backend (`BACKENDS`)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from legacy_format import legacy_store

from broker.client import Admin, Consumer, Producer
from broker.storage import layout
from labkit.brokerproc import BrokerProcess, Wire, own_snapshot
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch
from ringlog_proto.routing import shard_for

BACKENDS = ["uvloop", "io_uring"]
CORES = 2
multicore = pytest.mark.parametrize(
    "broker",
    [pytest.param({"cores": CORES, "backend": b}, id=f"{CORES}cores-{b}") for b in BACKENDS],
    indirect=True,
)


def owned_by(core: int, topic_id: int, partitions: int) -> list[int]:
    return [p for p in range(partitions) if shard_for(topic_id, p, CORES) == core]


@multicore
def test_a_request_to_the_wrong_core_is_forwarded_answered_and_counted(broker: BrokerProcess) -> None:
    assert sorted(broker.core_ports) == [0, 1]
    w0 = Wire(broker.core_ports[0])
    tid = w0.create_topic("fwd", 8)
    theirs = owned_by(1, tid, 8)
    assert theirs, "some partition is core 1's"
    assert len(theirs) >= 2
    # A forwarded long poll parks at the owner without holding back the forwards behind it.
    poller = Wire(broker.core_ports[0])
    poller.send(m.FetchRequest(tid, theirs[-1], 0, 1 << 20, max_wait_ms=20_000))
    time.sleep(0.1)
    before0, before1 = own_snapshot(broker.core_ports[0]), own_snapshot(broker.core_ports[1])
    p = theirs[0]
    resp = w0.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 1000, encode_batch([b"a", b"b"])))
    assert isinstance(resp, m.ProduceResponse) and (resp.error, resp.base_offset) == (m.ErrorCode.NONE, 0)
    assert {r.offset: r.value for r in w0.fetch_all(tid, p)} == {0: b"a", 1: b"b"}
    latest = w0.rpc(m.ListOffsetsRequest(tid, p, m.OffsetSpec.LATEST))
    assert isinstance(latest, m.ListOffsetsResponse) and latest.offset == 2
    assert w0.rpc(m.OffsetCommitRequest(tid, p, "g", 2, "meta")).error == m.ErrorCode.NONE
    got = w0.rpc(m.OffsetFetchRequest(tid, p, "g"))
    assert isinstance(got, m.OffsetFetchResponse) and (got.offset, got.metadata) == (2, "meta")
    # Pipelined forwards keep request order on the client's connection.
    ids = [w0.send(m.ListOffsetsRequest(tid, q, m.OffsetSpec.LATEST)) for q in range(8)]
    assert [w0.recv_frame().correlation_id for _ in ids] == ids
    # The owner sees the same data on its own port.
    w1 = Wire(broker.core_ports[1])
    assert {r.offset: r.value for r in w1.fetch_all(tid, p)} == {0: b"a", 1: b"b"}
    after0, after1 = own_snapshot(broker.core_ports[0]), own_snapshot(broker.core_ports[1])
    assert after1["gauges"]["parked_long_polls"] == 1 and after0["gauges"]["pending_forwards"] == 1
    w0.rpc(m.ProduceRequest(tid, theirs[-1], m.Acks.WRITTEN, 1000, encode_batch([b"wake"])))
    woken = poller.recv()
    assert isinstance(woken, m.FetchResponse) and [r.value for r in decode_batches(woken.records)] == [
        b"wake"
    ]
    poller.close()
    sent = 5 + len(theirs)  # produce, fetch x2, list, commit, fetch offsets; the pipelined lists
    assert after0["forwarded"] - before0["forwarded"] >= sent
    assert after1["forwarded_in"] - before1["forwarded_in"] >= sent
    assert after1["forwarded"] == before1["forwarded"]  # core 1 served its own partition directly
    w0.close()
    w1.close()


@multicore
def test_a_routing_aware_client_causes_no_forwards(broker: BrokerProcess) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("routed", 8)
    with Producer(broker.bootstrap, linger_ms=1) as producer:
        futures = [producer.send("routed", f"v{i}".encode(), partition=i % 8) for i in range(800)]
        offsets = [f.result(timeout=30).offset for f in futures]
    assert all(o >= 0 for o in offsets)
    got = []
    with Consumer(broker.bootstrap, group="g", auto_offset_reset="earliest") as consumer:
        consumer.subscribe("routed")
        deadline = time.monotonic() + 20
        while len(got) < 800 and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=300))
        consumer.commit()
    assert sorted(r.value for r in got) == sorted(f"v{i}".encode() for i in range(800))
    with Admin(broker.bootstrap) as admin:  # offsets of every core's partitions, not just one's
        described = admin.describe_topic("routed")
    assert [p.end_offset - p.start_offset for p in described.partitions] == [100] * 8
    snaps = [own_snapshot(broker.core_ports[c]) for c in range(CORES)]
    assert all(s["requests"].get("PRODUCE", 0) > 0 for s in snaps), "both cores own partitions"
    assert [s["forwarded"] for s in snaps] == [0, 0]
    # nothing went from one core to the other: a client's request reaches its owner directly, and
    # a commit asks no other core anything (any offset is stored, as Kafka's coordinator does)
    assert [s["forwarded_in"] for s in snaps] == [0, 0]


@multicore
def test_sigkill_of_one_worker_it_restarts_the_other_serves_and_no_acked_record_is_lost(
    broker: BrokerProcess,
) -> None:
    w = Wire(broker.core_ports[0])
    tid = w.create_topic("survive", 8)
    w.close()
    victim = 1
    victim_pid = broker.worker_pids[victim]
    acked: dict[int, list[tuple[int, int, bytes]]] = {0: [], 1: []}  # core -> (partition, offset, value)
    errors: dict[int, int] = {0: 0, 1: 0}
    stop = threading.Event()

    def produce(core: int) -> None:
        parts = owned_by(core, tid, 8)
        conn: Wire | None = None
        i = 0
        while not stop.is_set():
            try:
                if conn is None:
                    conn = Wire(broker.core_ports[core])
                p = parts[i % len(parts)]
                value = f"c{core}-{i}".encode()
                resp = conn.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 5000, encode_batch([value])))
                assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
                acked[core].append((p, resp.base_offset, value))
                i += 1
            except OSError:
                errors[core] += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.02)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=produce, args=(c,)) for c in range(CORES)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    n0_at_kill = len(acked[0])
    n1_at_kill = len(acked[1])
    os.kill(victim_pid, signal.SIGKILL)
    assert broker.wait_for_log(f"worker core {victim} (pid {victim_pid}) died: killed by SIGKILL", 10)
    assert broker.wait_for_log(f"worker core {victim} restarted", 15)
    time.sleep(0.5)  # the producer of core 1 reconnects and goes on
    stop.set()
    for t in threads:
        t.join(15)
    assert errors[0] == 0, "the surviving core kept serving without an error"
    assert len(acked[0]) > n0_at_kill + 10
    assert len(acked[1]) > n1_at_kill, "the restarted core serves again"
    r = Wire(broker.port)  # any core: reads of core 1's partitions through core 0 are forwarded
    stored = {p: {rec.offset: rec.value for rec in r.fetch_all(tid, p)} for p in range(8)}
    r.close()
    for core in (0, 1):
        for p, offset, value in acked[core]:
            assert stored[p].get(offset) == value, f"acknowledged record {p}/{offset} lost"
    assert "Traceback" not in broker.log()


@multicore
def test_a_worker_that_keeps_dying_at_start_is_restarted_with_backoff_and_comes_back(
    broker: BrokerProcess,
) -> None:
    registry = broker.data_dir / "topics.json"
    w = Wire(broker.core_ports[0])
    w.create_topic("kept", 2)
    good = registry.read_text()
    registry.write_text(json.dumps({"version": 99}))  # the next worker to start cannot read it
    os.kill(broker.worker_pids[1], signal.SIGKILL)
    assert broker.wait_for_log("it keeps dying at start", 10)
    assert broker.wait_for_log("unknown registry version")
    assert w.rpc(m.MetadataRequest()).error == m.ErrorCode.NONE  # core 0 serves on
    registry.write_text(good)
    assert broker.wait_for_log("worker core 1 restarted", 15)
    w1 = Wire(broker.core_ports[1])  # connections queued while it was down are served now
    meta = w1.rpc(m.MetadataRequest(("kept",)))
    assert isinstance(meta, m.MetadataResponse) and meta.topics[0].error == m.ErrorCode.NONE
    w1.close()
    w.close()


@multicore
def test_sigterm_answers_long_polls_on_every_core_and_exits_zero(broker: BrokerProcess) -> None:
    w = Wire(broker.core_ports[0])
    tid = w.create_topic("bye", 8)
    w.close()
    polls = []
    for core in range(CORES):
        for p in (owned_by(core, tid, 8)[0], owned_by(1 - core, tid, 8)[0]):  # own, and forwarded
            c = Wire(broker.core_ports[core])
            c.send(m.FetchRequest(tid, p, 0, 1 << 20, max_wait_ms=30_000))
            polls.append(c)
    time.sleep(0.3)
    snaps = [own_snapshot(broker.core_ports[c]) for c in range(CORES)]
    assert sum(s["gauges"]["parked_long_polls"] for s in snaps) == len(polls)
    assert all(s["gauges"]["pending_forwards"] == 1 for s in snaps)
    t0 = time.monotonic()
    assert broker.stop() == 0
    for c in polls:
        resp = c.recv()
        assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE and resp.records == b""
        c.close()
    assert time.monotonic() - t0 < 5
    assert broker.log().count("stopped cleanly") == CORES + 1  # every worker, then the supervisor


@multicore
def test_a_topic_created_on_one_core_is_usable_on_the_other_and_a_deleted_one_on_neither(
    broker: BrokerProcess,
) -> None:
    w0, w1 = Wire(broker.core_ports[0]), Wire(broker.core_ports[1])
    tid = w0.create_topic("shared", 6)
    for p in range(6):  # through core 1: its own partitions (learned on the miss) and forwarded ones
        resp = w1.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 1000, encode_batch([b"x"])))
        assert resp.error == m.ErrorCode.NONE, resp
    meta = w1.rpc(m.MetadataRequest(("shared",)))
    assert isinstance(meta, m.MetadataResponse) and meta.topics[0].topic_id == tid
    assert meta.core_ports == (broker.core_ports[0], broker.core_ports[1])
    assert w1.rpc(m.CreateTopicRequest("shared", 1)).error == m.ErrorCode.TOPIC_ALREADY_EXISTS
    assert w1.rpc(m.DeleteTopicRequest("shared")).error == m.ErrorCode.NONE
    for w in (w0, w1):
        for p in range(6):
            resp = w.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 1000, encode_batch([b"y"])))
            assert resp.error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, (p, resp)
    assert not (broker.data_dir / "topics" / str(tid)).exists()
    again = w0.create_topic("shared", 2)
    assert again > tid  # ids are never reused, whichever core creates
    assert w1.rpc(m.MetadataRequest()).topics[0].topic_id == again  # type: ignore[union-attr]
    w0.close()
    w1.close()


def serve(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_more_cores_than_cpus_is_a_clear_error_without_oversubscribe(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    out = serve("--data-dir", str(tmp_path / "d"), "--cores", str(cpus + 1), "--backend", "uvloop")
    assert out.returncode == 2
    assert f"--cores {cpus + 1}" in out.stderr and "--oversubscribe" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_unusable_data_dir_or_a_worker_failing_at_start_is_a_clear_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    out = serve("--data-dir", str(not_a_dir), "--cores", "1", "--backend", "uvloop")
    assert out.returncode == 1 and "is unusable" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "topics.json").write_text(json.dumps({"version": 99}))
    out = serve("--data-dir", str(bad), "--cores", "2", "--oversubscribe", "--backend", "uvloop")
    assert out.returncode == 1
    assert "exited before it was ready" in out.stderr and "unknown registry version" in out.stderr


def test_a_second_broker_on_a_data_dir_in_use_is_a_clear_error(tmp_path: Path) -> None:
    """Two brokers writing one data dir would corrupt it: the second waits for the lock (a killed
    broker's dying workers release it within moments), then refuses, naming the holder."""
    first = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", cores=1, backend="uvloop").start()
    try:
        out = serve("--data-dir", str(tmp_path / "data"), "--cores", "1", "--backend", "uvloop")
        assert out.returncode == 1, out.stderr
        assert "in use by another broker" in out.stderr and str(first.proc.pid) in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        w = Wire(first.port)  # the first broker never noticed
        assert w.rpc(m.ApiVersionsRequest("t")).error == m.ErrorCode.NONE
        w.close()
    finally:
        assert first.stop() == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_broker_stats_and_the_prometheus_endpoint_show_every_core(tmp_path: Path, backend: str) -> None:
    metrics_port = free_port()
    broker = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", ("--metrics-port", str(metrics_port)), CORES, backend
    ).start()
    try:
        w = Wire(broker.port)
        tid = w.create_topic("seen", 4)
        for p in range(4):
            w.rpc(m.ProduceRequest(tid, p, m.Acks.WRITTEN, 1000, encode_batch([b"z"])))
        w.close()
        time.sleep(1.2)  # every core publishes its snapshot about once a second
        out = subprocess.run(
            [sys.executable, "-m", "broker.cli", "stats", "-b", broker.bootstrap],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "2 cores" in lines[0] and "p99_us" in lines[1]
        assert [line.split()[0] for line in lines[2:4]] == ["0", "1"]
        # Then the eBPF lines, from the STATS reply: steering on or off with the reason, whatever the
        # machine (as root with bcc, --ebpf auto loads it), then the membership endpoint's counters.
        assert lines[4].startswith("ebpf steering: "), out.stdout
        as_json = subprocess.run(
            [sys.executable, "-m", "broker.cli", "stats", "-b", broker.bootstrap, "--format", "json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        doc = json.loads(as_json.stdout)
        assert [s["core"] for s in doc["snapshots"]] == [0, 1]
        assert sum(s["requests"].get("PRODUCE", 0) for s in doc["snapshots"]) >= 4
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        for core in range(CORES):
            assert f'ringlog_bytes_in_total{{core="{core}"}}' in text
            assert f'ringlog_request_latency_us_bucket{{core="{core}",le="+Inf"}}' in text
        assert 'ringlog_requests_total{core="' in text and 'api="PRODUCE"' in text
    finally:
        assert broker.stop() == 0


def test_a_data_dir_of_the_old_batch_format_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """A data dir written before RecordBatch v2 (format 1): the broker exits 1 naming the segment
    and the format, and every byte stays: an older ringlog still opens it."""
    data = tmp_path / "data"
    broker = BrokerProcess(data, tmp_path / "broker.log", cores=1, backend="uvloop").start()
    try:
        w = Wire(broker.port)
        tid = w.create_topic("old")
        assert w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"x"]))).error == 0
        w.close()
    finally:
        broker.stop()
    store = Path(layout.partition_dir(str(data), tid, 0)) / layout.store_file_name(0)
    store.write_bytes(legacy_store([[b"a", b"bb"], [b"ccc"]]))
    before = {p: p.read_bytes() for p in store.parent.iterdir()}
    out = serve("--data-dir", str(data), "--cores", "1", "--backend", "uvloop")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "format 1" in out.stderr and "RecordBatch v2" in out.stderr and str(store) in out.stderr
    assert {p: p.read_bytes() for p in store.parent.iterdir()} == before


def test_a_restart_keeps_each_cores_direct_port(tmp_path: Path) -> None:
    """Stock Kafka clients (kafka-python, aiokafka) reconnect to the ports Metadata named, never
    to the bootstrap address: a restart on the same data dir must listen on them again."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", cores=2).start()
    try:
        before = dict(broker.core_ports)
        assert len(before) == 2
        broker.kill()
        broker.start()
        assert broker.core_ports == before
    finally:
        if broker.running():
            broker.stop()
