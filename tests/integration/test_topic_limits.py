"""Topics, partitions and descriptors against a real broker.

- The segment attack: tiny segments rolled thousands of times, and many partitions within the
  caps, leave a worker with a bounded count of open descriptors (/proc/<pid>/fd); new connections
  still work; the broker restarts on that data dir and serves what it holds.
- CreateTopic over the partition caps (per topic, per broker across cores) gets LIMIT_EXCEEDED,
  under the segment floors INVALID_CONFIG; `broker serve` refuses defaults under the floors.
- CreateTopic of thousands of partitions does not stall the other clients of that core.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from broker.core.limits import FIXED_FDS_PER_WORKER, Limits, fit_to_descriptors
from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch

BACKENDS = [
    pytest.param("uvloop", id="uvloop-1core"),
    pytest.param("io_uring", id="io_uring-1core"),
]

ROLLS = 1000  # tiny segments rolled; on main this leaves ~2000 descriptors open in the worker
PARTITIONS = 150  # partitions of a second topic, each used once (2 descriptors each, by design)
FD_CACHE = 16
FIXED_FDS_MARGIN = 40  # listeners, ring, pipes, sockets of the test's connections, a read in flight


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def nofile_limit(pid: int) -> int:
    """The soft RLIMIT_NOFILE of process `pid`."""
    with open(f"/proc/{pid}/limits") as f:
        line = next(line for line in f if line.startswith("Max open files"))
    value = line.split()[3]
    return resource.RLIM_INFINITY if value == "unlimited" else int(value)


def start(tmp_path: Path, backend: str, *flags: str, cores: int = 1) -> BrokerProcess:
    return BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", extra=flags, cores=cores, backend=backend
    ).start()


def produce_pipelined(wire: Wire, topic_id: int, batches: list[tuple[int, bytes]]) -> None:
    """Produce (partition, batch) pairs, 250 requests in flight at a time."""
    for i in range(0, len(batches), 250):
        chunk = batches[i : i + 250]
        for partition, batch in chunk:
            wire.send(m.ProduceRequest(topic_id, partition, m.Acks.WRITTEN, 1000, batch))
        for _ in chunk:
            resp = wire.recv()
            assert resp.error == m.ErrorCode.NONE, resp


def first_record(wire: Wire, topic_id: int, partition: int, offset: int) -> bytes:
    resp = wire.rpc(m.FetchRequest(topic_id, partition, offset, 1 << 16, 0))
    assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
    records = [r for r in decode_batches(resp.records) if r.offset >= offset]
    return records[0].value


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_segment_attack_leaves_descriptors_bounded_and_the_broker_restarts(
    tmp_path: Path, backend: str
) -> None:
    # The floor is lowered so that the attack can be made at all (by default CreateTopic refuses
    # segments under 1 MiB); the descriptor cache is small so that the bound is tight.
    flags = ("--min-segment-bytes", "100", "--segment-fd-cache", str(FD_CACHE))
    flags += ("--max-partitions-per-topic", str(PARTITIONS))
    # A soft open-file limit as low as many systems' default (1024): the supervisor raises it to
    # the hard limit for itself and its workers (and without the cache 512 would be exhausted).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(512, hard), hard))
    try:
        broker = start(tmp_path, backend, *flags)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        pid = broker.worker_pids[0]
        assert nofile_limit(pid) == hard and f"raised from {min(512, hard)}" in broker.log()
        wire = Wire(broker.port)
        baseline = open_fds(pid)
        resp = wire.rpc(m.CreateTopicRequest("tiny", 1, -1, -1, 200))
        assert isinstance(resp, m.CreateTopicResponse), resp
        tiny = resp.topic_id
        # Batches over half a segment: each one rolls a new segment.
        values = [f"{i:06d}".encode() + b"x" * 60 for i in range(ROLLS)]
        produce_pipelined(wire, tiny, [(0, encode_batch([v])) for v in values])
        many = wire.create_topic("many", PARTITIONS)
        produce_pipelined(wire, many, [(p, encode_batch([b"p%d" % p])) for p in range(PARTITIONS)])
        # Old segments are read through the cache, from the first to the last.
        for offset in (0, ROLLS // 3, ROLLS // 2, ROLLS - 1, 7, ROLLS - 100):
            assert first_record(wire, tiny, 0, offset) == values[offset]
        after = open_fds(pid)
        bound = baseline + 2 * (1 + PARTITIONS) + FD_CACHE + FIXED_FDS_MARGIN
        print(
            f"\n{backend}: worker fds {baseline} at start, {after} after {ROLLS} rolls"
            f" and {PARTITIONS} partitions"
        )
        assert after <= bound, f"{after} descriptors open after the attack (bound {bound})"
        # New connections still work.
        other = Wire(broker.port)
        meta = other.rpc(m.MetadataRequest(("tiny",)))
        assert isinstance(meta, m.MetadataResponse) and meta.topics[0].error == m.ErrorCode.NONE
        other.close()
        wire.close()
        # A restart on that data dir (after a crash: recovery) opens the closed segments only to
        # check them, and serves them all.
        broker.kill()
        broker.start()
        pid = broker.worker_pids[0]
        assert open_fds(pid) <= bound
        wire = Wire(broker.port)
        assert first_record(wire, tiny, 0, 0) == values[0]
        assert first_record(wire, tiny, 0, ROLLS - 1) == values[-1]
        assert first_record(wire, many, PARTITIONS - 1, 0) == b"p%d" % (PARTITIONS - 1)
        resp = wire.rpc(m.ProduceRequest(tiny, 0, m.Acks.DURABLE, 1000, encode_batch([b"after"])))
        assert isinstance(resp, m.ProduceResponse) and resp.base_offset == ROLLS, resp
        assert open_fds(pid) <= bound
        wire.close()
    finally:
        if broker.running():
            assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize("backend", [pytest.param("uvloop", id="uvloop-2core")])
def test_create_topic_over_the_caps_or_under_the_floors_is_refused(tmp_path: Path, backend: str) -> None:
    flags = ("--max-partitions", "100", "--max-partitions-per-topic", "64", "--min-segment-bytes", "65536")
    broker = start(tmp_path, backend, *flags, cores=2)
    try:
        core0, core1 = Wire(broker.core_ports[0]), Wire(broker.core_ports[1])
        E = m.ErrorCode
        # Per topic.
        resp = core0.rpc(m.CreateTopicRequest("wide", 65))
        assert resp.error == E.LIMIT_EXCEEDED and "--max-partitions-per-topic" in resp.message, resp
        assert "64" in resp.message
        assert core0.rpc(m.CreateTopicRequest("none", 0)).error == E.INVALID_TOPIC
        # Per broker, across cores: 60 made through core 0, then 50 more through core 1.
        core0.create_topic("a", 60)
        resp = core1.rpc(m.CreateTopicRequest("b", 50))
        assert resp.error == E.LIMIT_EXCEEDED and "(--max-partitions)" in resp.message, resp
        assert "100" in resp.message
        core1.create_topic("b", 40)  # exactly at the cap
        assert core0.rpc(m.CreateTopicRequest("c", 1)).error == E.LIMIT_EXCEEDED
        # A delete gives its partitions back.
        assert core1.rpc(m.DeleteTopicRequest("a")).error == E.NONE
        core0.create_topic("c", 60)
        assert core0.rpc(m.DeleteTopicRequest("c")).error == E.NONE
        # Floors.
        resp = core0.rpc(m.CreateTopicRequest("small", 1, -1, -1, 4096))
        assert resp.error == E.INVALID_CONFIG and "--min-segment-bytes" in resp.message, resp
        assert "65536" in resp.message
        core0.create_topic("at-floor", 1)  # the default (128 MiB) is above the floor
        resp = core0.rpc(m.CreateTopicRequest("floor", 1, -1, -1, 65536))
        assert isinstance(resp, m.CreateTopicResponse), resp
        core0.close()
        core1.close()
    finally:
        assert broker.stop() == 0, broker.log()
    # `broker serve` refuses defaults under the floors, naming the flag.
    for flags, name in (
        (("--segment-bytes", "4096"), "--min-segment-bytes"),
        (("--segment-ms", "1000"), "--min-segment-ms"),
    ):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "broker.cli",
                "serve",
                "--data-dir",
                str(tmp_path / "d2"),
                "--port",
                "0",
                *flags,
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 2 and name in out.stderr, out


STALL_PARTITIONS = 3000


@pytest.mark.parametrize("backend", BACKENDS)
def test_creating_thousands_of_partitions_does_not_stall_other_clients(tmp_path: Path, backend: str) -> None:
    """Before: CreateTopic made every partition in one handler call, 7-8 s for 3000 here, and every
    client of that core waited as long. Now partitions are made on first use."""
    flags = ("--max-partitions", "10000", "--max-partitions-per-topic", "10000")
    broker = start(tmp_path, backend, *flags)
    stop = threading.Event()
    gaps: list[float] = []
    errors: list[BaseException] = []
    try:
        wire = Wire(broker.port)
        wire.sock.settimeout(60)
        small = wire.create_topic("small")

        def ping() -> None:
            try:
                w = Wire(broker.port)
                w.sock.settimeout(60)
                last = time.monotonic()
                while not stop.is_set():
                    resp = w.rpc(m.ListOffsetsRequest(small, 0, m.OffsetSpec.LATEST))
                    assert resp.error == m.ErrorCode.NONE
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
                w.close()
            except BaseException as exc:
                errors.append(exc)

        pinger = threading.Thread(target=ping)
        pinger.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        resp = wire.rpc(m.CreateTopicRequest("big", STALL_PARTITIONS))
        took = time.monotonic() - t0
        assert isinstance(resp, m.CreateTopicResponse), resp
        big = resp.topic_id
        # First uses make partitions one by one, each within its own request.
        for p in (0, STALL_PARTITIONS // 2, STALL_PARTITIONS - 1):
            r = wire.rpc(m.ProduceRequest(big, p, m.Acks.DURABLE, 1000, encode_batch([b"v%d" % p])))
            assert isinstance(r, m.ProduceResponse) and r.base_offset == 0, r
        time.sleep(0.3)
        stop.set()
        pinger.join(30)
        assert not errors, errors
        worst = max(gaps)
        print(
            f"\n{backend}: CreateTopic of {STALL_PARTITIONS} answered in {took:.3f}s, max stall {worst:.3f}s"
        )
        assert worst < 0.5, f"another client waited {worst:.2f}s"
        meta = wire.rpc(m.MetadataRequest(("big",)))
        assert isinstance(meta, m.MetadataResponse) and len(meta.topics[0].partitions) == STALL_PARTITIONS
        wire.close()
        # A crash now (some partitions made, most not) leaves a data dir that starts.
        broker.kill()
        broker.start()
        wire = Wire(broker.port)
        assert first_record(wire, big, STALL_PARTITIONS - 1, 0) == b"v%d" % (STALL_PARTITIONS - 1)
        r = wire.rpc(m.ProduceRequest(big, 7, m.Acks.WRITTEN, 1000, encode_batch([b"late"])))
        assert isinstance(r, m.ProduceResponse) and r.base_offset == 0, r
        wire.close()
    finally:
        stop.set()
        if broker.running():
            assert broker.stop() == 0, broker.log()


@pytest.mark.parametrize("backend", BACKENDS)
def test_partitions_are_capped_by_the_open_file_limit_and_the_broker_restarts_at_it(
    tmp_path: Path, backend: str
) -> None:
    """At a hard open-file limit of 1024 the default --max-partitions (then a fixed 4000)
    let a client create 3000 partitions; using them exhausted the worker's descriptors (produces
    to other topics failed, new connections were reset) and the broker could not restart. Now
    the limits are sized from the open-file limit at start: creating partitions beyond what fits
    gets LIMIT_EXCEEDED naming the limit, and with every admitted partition in use new
    connections are served, and the broker restarts at the same limit and serves them all."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", backend=backend)
    broker.wrapper = ("prlimit", "--nofile=1024:1024", "--")  # soft and hard: no raising it
    broker.start()
    try:
        pid = broker.worker_pids[0]
        assert nofile_limit(pid) == 1024
        wire = Wire(broker.port)
        other = wire.create_topic("other", 1)
        topics: list[tuple[int, int]] = []  # (topic id, partitions)
        refused = None
        for i in range(30):  # 3000 partitions asked for, 100 at a time
            resp = wire.rpc(m.CreateTopicRequest(f"t{i}", 100))
            if resp.error != m.ErrorCode.NONE:
                refused = resp
                break
            assert isinstance(resp, m.CreateTopicResponse)
            topics.append((resp.topic_id, 100))
        assert refused is not None, "3000 partitions admitted at an open-file limit of 1024"
        assert refused.error == m.ErrorCode.LIMIT_EXCEEDED, refused
        assert "--max-partitions" in refused.message and "open-file limit" in refused.message, refused
        # Kafka's CreateTopics: POLICY_VIOLATION with the same message.
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        with pytest.raises(KafkaException) as ei:
            admin.create_topics([NewTopic("kafka-wide", 100)])["kafka-wide"].result(15)
        error = ei.value.args[0]
        assert error.code() == KafkaError.POLICY_VIOLATION and "open-file limit" in error.str(), error
        del admin  # before the restart below: it would reconnect meanwhile
        # What is left below the cap is admitted: the cap is what fits, not a round guess.
        for partitions in (10, 1):
            while True:
                resp = wire.rpc(m.CreateTopicRequest(f"t{len(topics)}", partitions))
                if resp.error != m.ErrorCode.NONE:
                    break
                topics.append((resp.topic_id, partitions))
        admitted = 1 + sum(n for _t, n in topics)
        print(f"\n{backend}: {admitted} partitions admitted at an open-file limit of 1024")
        for tid, n in topics:  # every partition opened: 2 descriptors each
            produce_pipelined(wire, tid, [(p, encode_batch([b"p%d" % p])) for p in range(n)])
        # Others still work: produce elsewhere, 20 new connections.
        resp = wire.rpc(m.ProduceRequest(other, 0, m.Acks.WRITTEN, 1000, encode_batch([b"other"])))
        assert resp.error == m.ErrorCode.NONE, resp
        clients = [Wire(broker.port) for _ in range(20)]
        for c in clients:
            assert c.rpc(m.MetadataRequest(("other",))).error == m.ErrorCode.NONE
            c.close()
        wire.close()
        # A restart (after a crash: recovery) at the same limit opens them all and serves them.
        broker.kill()
        broker.start()
        wire = Wire(broker.port)
        tid, n = topics[-1]
        assert first_record(wire, tid, n - 1, 0) == b"p%d" % (n - 1)
        tid, n = topics[0]
        assert first_record(wire, tid, n - 1, 0) == b"p%d" % (n - 1)
        resp = wire.rpc(m.ProduceRequest(other, 0, m.Acks.DURABLE, 1000, encode_batch([b"after"])))
        assert isinstance(resp, m.ProduceResponse) and resp.base_offset == 1, resp
        clients = [Wire(broker.port) for _ in range(20)]
        for c in clients:
            assert c.rpc(m.MetadataRequest(("other",))).error == m.ErrorCode.NONE
            c.close()
        wire.close()
    finally:
        if broker.running():
            assert broker.stop() == 0, broker.log()


def test_limits_fit_the_open_file_limit_with_room_for_connections_and_a_reserve() -> None:
    """`fit_to_descriptors`: at this machine's 20 000 an explicit 4000 partitions (the fixed
    default before `auto`) and the cache default stand, and auto is held to half the room; at
    1024 every descriptor-consuming limit is lowered and their sum leaves the reserve free; at a
    limit a broker cannot run under, a clear error (the supervisor prints it and exits 1)."""
    fitted, lowered = fit_to_descriptors(Limits(max_partitions=4000), 20_000)
    assert (fitted.max_partitions, fitted.segment_fd_cache) == (4000, 1000)
    fitted, lowered = fit_to_descriptors(Limits(), 20_000)
    assert 4000 < fitted.max_partitions < 5000 and fitted.segment_fd_cache == 1000
    for nofile in (1024, 4096, 20_000, 1 << 20):
        fitted, lowered = fit_to_descriptors(Limits(max_connections_per_core=0), nofile)
        used = 2 * fitted.max_partitions + fitted.segment_fd_cache + fitted.max_connections_per_core
        assert fitted.max_connections_per_core > 0 and used + FIXED_FDS_PER_WORKER + 64 <= nofile
    fitted, lowered = fit_to_descriptors(Limits(max_partitions=4000), 1024)
    assert fitted.max_partitions < 300 and fitted.max_connections_per_core >= 300
    assert any(line.startswith("--max-partitions 4000 lowered to") for line in lowered), lowered
    with pytest.raises(ValueError, match="open-file limit"):
        fit_to_descriptors(Limits(), 150)
