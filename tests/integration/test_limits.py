"""Memory and connection limits against a real broker (docs/LIMITS.md).

Each test attacks a `broker serve` subprocess the way a hostile or careless client would, with
small limit flags so that the attack is quick, and asserts the bound from the worker's RSS
(/proc/<pid>/status) and what the client sees.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.backends.backend_core import BackendCore
from broker.backends.rate_limited_log import RateLimitedLog
from broker.core.config import BrokerConfig
from broker.core.limits import FETCH_MAX_BYTES_MAX, Limits
from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import FRAME_VERSION, MAGIC
from ringlog_proto.routing import shard_for

MiB = 1024 * 1024
BACKENDS = ["uvloop", "io_uring"]
SUPPRESSED = re.compile(r"(\d+) more suppressed")  # broker/backends/rate_limited_log.py
SUMMARY = re.compile(r": \d+ more suppressed")  # a line that only counts, not an event of its own


def events_logged(lines: list[str]) -> int:
    """How many events `lines` stand for: one per event line plus every count of suppressed ones."""
    counted = sum(int(n) for line in lines for n in SUPPRESSED.findall(line))
    return counted + sum(1 for line in lines if not SUMMARY.search(line))


@contextlib.contextmanager
def serve(tmp_path: Path, backend: str, *flags: str) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", extra=flags, backend=backend).start()
    try:
        yield proc
    finally:
        if proc.running():
            assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fill_partition(w: Wire, topic: str, mib: int) -> int:
    """A topic whose partition 0 holds `mib` batches of about 1 MB each."""
    tid = w.create_topic(topic, 1)
    for i in range(mib):
        resp = w.rpc(
            m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([bytes([65 + i]) * 1_000_000]))
        )
        assert resp.error == m.ErrorCode.NONE, resp
    return tid


class Hostile:
    """A raw socket that pipelines fetches of 4 MiB and never reads a reply (a small receive
    buffer, so that replies pile up in the broker, not in this process's kernel buffers)."""

    def __init__(self, port: int, tid: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.request = b"".join(m.encode_request(m.FetchRequest(tid, 0, 0, FETCH_MAX_BYTES_MAX, 0), 1)) * 100
        self.sent = 0
        self._stop = False
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while not self._stop:
            try:
                self.sock.sendall(self.request)
                self.sent += 100
            except TimeoutError:
                pass  # the broker stopped reading: TCP pushes back
            except OSError:
                return

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.sock.close()


def served_quickly(port: int, tid: int, timeout: float = 5.0) -> bool:
    """Another client on the same core gets a fetch and a produce answered within `timeout`."""
    w = Wire(port)
    w.sock.settimeout(timeout)
    try:
        fetched = w.rpc(m.FetchRequest(tid, 0, 0, 1000, 0))
        produced = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"still served"])))
        return fetched.error == m.ErrorCode.NONE and produced.error == m.ErrorCode.NONE
    except OSError:
        return False
    finally:
        w.close()


def settle_rss(pid: int, below: int, timeout: float) -> int:
    """The worker's RSS once it is below `below`, or the last reading after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        rss = rss_bytes(pid)
        if rss < below or time.monotonic() > deadline:
            return rss
        time.sleep(0.2)


# ---------------------------------------------------------------------- memory in flight


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipelined_fetches_never_read_are_bounded_by_the_connection_budget(
    tmp_path: Path, backend: str
) -> None:
    """Today's main grew a worker past 2 GB here; the budget stops reading the socket instead."""
    budget = 8 * MiB
    with serve(tmp_path, backend, "--connection-memory-bytes", str(budget)) as b:
        pid = b.worker_pids[0]
        w = Wire(b.port)
        tid = fill_partition(w, "big", 6)
        w.fetch_all(tid, 0)  # the allocator has seen replies of this size once
        w.close()
        baseline = rss_bytes(pid)
        hostile = Hostile(b.port, tid)
        try:
            peak = baseline
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                peak = max(peak, rss_bytes(pid))
                time.sleep(0.05)
            assert served_quickly(b.port, tid), "another client of the core was not served meanwhile"
            peak = max(peak, rss_bytes(pid))
            assert hostile.sent >= 1000  # it did pipeline: thousands of 4 MiB fetches asked for
            # The budget, one fetch admitted below it, and the allocator's slack.
            bound = baseline + budget + FETCH_MAX_BYTES_MAX + 24 * MiB
            assert peak < bound, f"RSS {peak / MiB:.0f} MiB under the attack (bound {bound / MiB:.0f} MiB)"
        finally:
            hostile.close()
        after = settle_rss(pid, baseline + 8 * MiB, timeout=10)  # the sweep trims at most every 5 s
        assert after < baseline + 8 * MiB, (
            f"RSS {after / MiB:.0f} MiB after the connection closed (baseline {baseline / MiB:.0f} MiB)"
        )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_core_budget_bounds_many_connections_and_releases_waiters(tmp_path: Path, backend: str) -> None:
    """Several hostile connections together hit the core's budget: the core stops reading every
    connection (a new client waits, TCP pushes back) until memory is released, then serves it;
    and a request larger than both budgets still goes through when nothing else is in flight."""
    connection_budget, core_budget = 4 * MiB, 6 * MiB
    flags = ("--connection-memory-bytes", str(connection_budget), "--core-memory-bytes", str(core_budget))
    with serve(tmp_path, backend, *flags) as b:
        pid = b.worker_pids[0]
        w = Wire(b.port)
        tid = fill_partition(w, "big", 6)
        w.fetch_all(tid, 0)
        baseline = rss_bytes(pid)
        hostiles = [Hostile(b.port, tid) for _ in range(5)]
        try:
            time.sleep(1)
            peak = rss_bytes(pid)
            # The core's budget, one fetch admitted below it, and the allocator's slack.
            bound = baseline + core_budget + FETCH_MAX_BYTES_MAX + 24 * MiB
            assert peak < bound, f"RSS {peak / MiB:.0f} MiB under 5 connections (bound {bound / MiB:.0f})"
            waiter = Wire(b.port)
            cid = waiter.send(m.FetchRequest(tid, 0, 0, 1000, 0))
        finally:
            for h in hostiles:
                h.close()
        waiter.sock.settimeout(10)
        frame = waiter.recv_frame()  # answered once the hostile connections' memory is released
        assert frame.correlation_id == cid and m.decode_response(frame).error == m.ErrorCode.NONE
        waiter.close()
        # One request of 7 batches, larger than both budgets: admitted when it is all in flight.
        batches = b"".join(encode_batch([bytes([97 + i]) * 1_000_000]) for i in range(7))
        assert len(batches) > core_budget
        resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, batches))
        assert resp.error == m.ErrorCode.NONE, resp
        w.close()


# ---------------------------------------------------------- connections: cap and timeouts


def closed_within(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize("backend", BACKENDS)
def test_connection_cap_idle_and_partial_frame_timeouts_logged_at_a_rate(
    tmp_path: Path, backend: str
) -> None:
    """One broker with a cap of 50 client connections, a frame deadline of 0.8 s and an idle timeout
    of 2.5 s: connections beyond the cap are closed at once while the others keep working;
    stalled partial frames are closed after the deadline, idle connections after the timeout,
    an active one never; and each kind of close is one log line with a count, not 30 or 40."""
    flags = ("--max-connections-per-core", "50", "--frame-timeout-ms", "800", "--connection-idle-ms", "2500")
    with serve(tmp_path, backend, *flags) as b:
        time.sleep(0.3)  # the connections BrokerProcess.start probed with are gone
        busy = Wire(b.port)  # sends a request every half second: never idle
        idle = socket.create_connection(("127.0.0.1", b.port))  # connected, never sends
        kept = [Wire(b.port) for _ in range(8)]
        stalled = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(40)]  # 50 in all
        for w in [busy, *kept]:
            assert w.rpc(m.MetadataRequest()).error == m.ErrorCode.NONE
        refused = [socket.create_connection(("127.0.0.1", b.port)) for _ in range(30)]
        assert all(closed_within(s, 3) for s in refused), "a connection beyond the cap stayed open"
        for w in [busy, *kept]:
            assert w.rpc(m.MetadataRequest()).error == m.ErrorCode.NONE
        for w in kept:
            w.close()
        for s in refused:
            s.close()

        started = time.monotonic()
        for s in stalled:
            s.sendall(b"\x00")  # one byte of a frame, then nothing
        assert all(closed_within(s, 5) for s in stalled), "a stalled partial frame was not closed"
        assert time.monotonic() - started < 5
        assert not closed_within(idle, 0.1), "an idle connection closed before its timeout"
        while time.monotonic() - started < 4:
            assert busy.rpc(m.MetadataRequest()).error == m.ErrorCode.NONE
            time.sleep(0.5)
        assert closed_within(idle, 3), "an idle connection was not closed"
        assert busy.rpc(m.MetadataRequest()).error == m.ErrorCode.NONE  # the active one is still served
        for s in [*stalled, idle]:
            s.close()
        again = Wire(b.port)  # places are free again
        assert again.rpc(m.MetadataRequest()).error == m.ErrorCode.NONE
        again.close()
        busy.close()

        assert b.wait_for_log("idle timeout")
        log = b.log().splitlines()
        for reason, count in (("connection refused", 30), ("partial frame timeout", 40)):
            lines = [line for line in log if reason in line]
            assert 1 <= len(lines) <= 5, "\n".join(lines)
            assert events_logged(lines) == count, "\n".join(lines)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stalled_connections_hold_what_they_sent_not_their_buffers(tmp_path: Path, backend: str) -> None:
    """200 connections each send 100 kB of a frame and stall. What each holds is bounded by what it
    sent (the io_uring backend on today's main kept a grown 256 KiB recv buffer besides)."""
    n, sent = 200, 100_000
    header = (8 * MiB - 4).to_bytes(4, "big") + bytes([MAGIC, FRAME_VERSION]) + bytes(18)
    with serve(tmp_path, backend) as b:
        pid = b.worker_pids[0]
        time.sleep(0.5)
        baseline = rss_bytes(pid)
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", b.port))
            s.sendall(header + b"x" * sent)
            socks.append(s)
        bound = baseline + n * (sent + 40 * 1024)
        time.sleep(3)  # every byte received (the RSS is not low for want of them), a sweep or two
        rss = settle_rss(pid, bound, timeout=6)
        per_connection = (rss - baseline) / n
        for s in socks:
            s.close()
        assert rss < bound, f"{per_connection / 1024:.0f} KiB per stalled connection"


@pytest.mark.parametrize("backend", BACKENDS)
def test_connections_between_cores_are_exempt_from_the_idle_timeout(tmp_path: Path, backend: str) -> None:
    """With an idle timeout of 0.6 s on two cores, a client that forwards once in a while keeps
    its own connection (it is never idle that long) and the cores' connection is never closed."""
    proc = BrokerProcess(
        tmp_path / "data",
        tmp_path / "broker.log",
        extra=("--connection-idle-ms", "600", "--oversubscribe"),
        cores=2,
        backend=backend,
    ).start()
    try:
        w = Wire(proc.core_ports[0])
        tid = w.create_topic("fwd", 8)
        theirs = [p for p in range(8) if shard_for(tid, p, 2) == 1]
        for i in range(5):
            resp = w.rpc(m.ProduceRequest(tid, theirs[0], m.Acks.WRITTEN, 1000, encode_batch([b"%d" % i])))
            assert resp.error == m.ErrorCode.NONE, resp
            time.sleep(0.4)  # the forwarding connection is quiet for longer than the idle timeout
        assert len(w.fetch_all(tid, theirs[0])) == 5
        w.close()
        idle = socket.create_connection(("127.0.0.1", proc.core_ports[0]))
        assert closed_within(idle, 3)  # the timeout works for clients
        idle.close()
        closes = [line for line in proc.log().splitlines() if "idle timeout" in line]
        assert closes and not any("core peer" in line for line in closes), "\n".join(closes)
    finally:
        if proc.running():
            assert proc.stop() == 0, proc.log()


# ------------------------------------------------------------------------------------- units


def test_rate_limited_log_gives_one_line_per_reason_and_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limited = RateLimitedLog(logging.getLogger("test.limits"), interval_s=0.2)
    with caplog.at_level(logging.WARNING, "test.limits"):
        for i in range(100):
            limited.warning("idle timeout", "closing %d", i)
        limited.warning("connection refused", "refusing %d", 0)
        limited.flush()  # too early: nothing more
        time.sleep(0.25)
        limited.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "idle timeout: closing 0",
        "connection refused: refusing 0",
        lines[2],
    ]
    assert lines[2].startswith("idle timeout: 99 more suppressed in the last 0.")


def test_timeouts_of_zero_disable_them_and_the_sweep_still_runs_each_second() -> None:
    admission = BackendCore(BrokerConfig(limits=Limits(connection_idle_ms=0, frame_timeout_ms=0))).admission
    assert admission.sweep_s == 1.0 and admission.idle_s == 0 and admission.frame_timeout_s == 0
    assert BackendCore(BrokerConfig(limits=Limits(frame_timeout_ms=800))).admission.sweep_s == 0.2


# ---------------------------------------------------------------- partial frames holding the budget


def stall_partial_frames(port: int, n: int, sent: int) -> list[socket.socket]:
    """`n` connections that each send `sent` bytes of an 8 MiB frame and stall."""
    header = (8 * MiB - 4).to_bytes(4, "big") + bytes([MAGIC, FRAME_VERSION]) + bytes(18)
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(header + b"x" * sent)
        socks.append(s)
    return socks


@pytest.mark.parametrize("backend", BACKENDS)
def test_stalled_partial_frames_holding_the_core_budget_time_out_and_closes_are_noticed(
    tmp_path: Path, backend: str
) -> None:
    """Partial frames that together hold the core's whole budget stop it reading any connection.
    Without the fix the io_uring core stayed wedged for good: the sweep restarted the frame clock
    of every connection waiting for the core's budget (the stalled ones included), and sockets it
    did not read never showed their EOF, so even closing the attackers did not free it. Now a
    core out of budget notices closed connections (within a sweep), and partial frames that alone
    hold its budget are closed by the frame timeout."""
    frame_timeout_s = 6.0
    flags = ("--core-memory-bytes", str(4 * MiB), "--frame-timeout-ms", str(int(frame_timeout_s * 1000)))
    with serve(tmp_path, backend, *flags) as b:
        time.sleep(0.3)
        # 1. Closing the stalled connections frees the core well before their frame timeout.
        started = time.monotonic()
        attackers = stall_partial_frames(b.port, 5, 3 * MiB // 2)
        time.sleep(0.5)
        waiter = Wire(b.port)
        cid = waiter.send(m.MetadataRequest())
        waiter.sock.settimeout(0.7)
        with pytest.raises(TimeoutError):
            waiter.recv_frame()  # the core is out of budget: nobody is read
        for s in attackers:
            s.close()
        closed = time.monotonic()
        waiter.sock.settimeout(frame_timeout_s + 5)
        frame = waiter.recv_frame()
        answered = time.monotonic()
        assert frame.correlation_id == cid
        assert answered - started < frame_timeout_s - 1, (
            f"answered {answered - closed:.1f}s after the attackers closed: only by the frame timeout"
        )
        waiter.close()

        # 2. Attackers that stay connected are closed by the frame timeout, and the core serves again.
        started = time.monotonic()
        attackers = stall_partial_frames(b.port, 5, 3 * MiB // 2)
        time.sleep(0.5)
        waiter = Wire(b.port)
        cid = waiter.send(m.MetadataRequest())
        waiter.sock.settimeout(frame_timeout_s + 5)
        try:
            frame = waiter.recv_frame()
        except TimeoutError:
            pytest.fail(f"the core was still wedged {time.monotonic() - started:.1f}s after the attack")
        assert frame.correlation_id == cid
        assert time.monotonic() - started < frame_timeout_s + 3
        # Those the core had not read when the first were closed are read then, and closed a
        # frame timeout after their first byte was.
        assert all(closed_within(s, frame_timeout_s + 3) for s in attackers), "a stalled frame stayed"
        for s in attackers:
            s.close()
        waiter.close()
