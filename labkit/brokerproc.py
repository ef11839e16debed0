"""A real `broker serve` subprocess for integration tests and benchmarks, and a minimal blocking
wire client. Its netns twin for eBPF is labkit/netlab.py.

The one launcher of a broker on loopback: the tests' `broker` fixture (tests/conftest.py) and
every benchmark start theirs here; what a benchmark needs beyond a test (a CPU to run on, a
profiler, a slower stop) it asks for with `wrapper`, `python_args` and the timeouts.
"""

from __future__ import annotations

import json
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ringlog_proto import messages as m
from ringlog_proto.batch import Record, decode_batches
from ringlog_proto.frames import NEED_DATA, Frame, FrameDecoder
from ringlog_proto.membership import Keyring

READY_RE = re.compile(r"serving on [\d.]+:(\d+)")
CORE_RE = re.compile(r"core (\d+): pid (\d+), cpu (\d+), direct port (\d+)")


def free_udp_port() -> int:
    """A UDP port free on loopback now (a node's membership port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PORT_ATTEMPTS = 5
ADDRESS_IN_USE = "Address already in use"


class PortTaken(RuntimeError):
    """The broker exited because another process holds its port."""


def unclaimed_port() -> int:
    """A TCP port free on loopback now, below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range) when there is room below it: no client connection is ever given
    it as its local port, so a broker restarted on it finds it free; 0 (any port) otherwise."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    first = max(1024, low - 16384)
    if low - first < 1024:
        return 0
    for _ in range(100):
        port = random.randrange(first, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return 0


TEST_MEMBERSHIP_KEY = "5a" * 32  # the tests' cluster key (hex, as in a --membership-key-file)
TEST_KEYRING = Keyring([bytes.fromhex(TEST_MEMBERSHIP_KEY)])


def membership_key_file(directory: Path) -> Path:
    """The tests' cluster key in `directory`, as `--membership-key-file` takes it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "membership.key"
    path.write_text(TEST_MEMBERSHIP_KEY + "\n")
    path.chmod(0o600)
    return path


def wait_for(what: Callable[[], object], timeout: float = 20.0, step: float = 0.05) -> object:
    """`what()`'s first truthy answer within `timeout` (an exception counts as a falsy answer);
    else AssertionError with the last answer."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = what()
        except Exception as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(step)
    raise AssertionError(f"timed out: last answer {last!r}")


class BrokerProcess:
    """`broker serve` with `cores` workers on `backend` (the existing suite runs one uvloop core;
    tests of several cores parametrize the `broker` fixture, see conftest.py).

    `wrapper`: a command the broker runs under (`prlimit --nofile=...`, `taskset -c 0`);
    `python_args`: the interpreter's arguments before `-m broker.cli` (`-m cProfile -o F`);
    `cwd`: where it runs (`python -m` imports the broker from there first: a benchmark passes its
    checkout)."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        extra: tuple[str, ...] = (),
        cores: int = 1,
        backend: str = "uvloop",
        wrapper: tuple[str, ...] = (),
        python_args: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra = extra
        self.cores = cores
        self.backend = backend
        self.wrapper = wrapper
        self.python_args = python_args
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.core_ports: dict[int, int] = {}  # core -> direct port, from the supervisor's log
        self.worker_pids: dict[int, int] = {}  # core -> pid at the last start
        self.worker_cpus: dict[int, int] = {}  # core -> the CPU its supervisor pinned it to

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The supervisor's pid (its workers are `worker_pids`)."""
        assert self.proc is not None
        return self.proc.pid

    def backend_in_use(self) -> str:
        """The backend the broker says it serves on ("io_uring" or "uvloop")."""
        return "io_uring" if "backend io_uring" in self.log() else "uvloop"

    def fell_back(self) -> bool:
        """Whether it was asked for io_uring and serves on uvloop: the kernel refused a ring, and
        the broker said so in its log."""
        return self.backend == "io_uring" and self.backend_in_use() != "io_uring"

    def skip_if_fell_back(self) -> None:
        """Skip the test, stopping this broker, when it fell back from io_uring."""
        if self.fell_back():
            self.stop()
            import pytest  # only a test calls this; benchmarks import this module too

            pytest.skip("io_uring unavailable here: the broker fell back to uvloop")

    @property
    def argv(self) -> list[str]:
        """The command `start()` runs."""
        args = [*self.wrapper, sys.executable, *self.python_args, "-m", "broker.cli", "serve"]
        args += ["--data-dir", str(self.data_dir), "--port", str(self.port)]
        args += ["--cores", str(self.cores), "--backend", self.backend]
        if self.cores > 1:
            args.append("--oversubscribe")  # the multi-core tests must run on 1-CPU CI machines too
        return [*args, *self.extra]

    def start(self, timeout_s: float = 45.0) -> BrokerProcess:
        """Start (or restart) the broker. The first start takes a port free now and outside the
        kernel's ephemeral range (`unclaimed_port`); a restart keeps it, so clients holding the
        bootstrap address find the broker again. A port from the ephemeral range (--port 0) was
        taken in the second between a stop and a restart by another test's client connection,
        and the restart failed with "address already in use"; outside it only another first start
        can take it, and one that loses that race picks again (a restart tries again for a few
        seconds). A quiet start takes about a second; the timeout is for a loaded machine (loading
        the eBPF programs alone has taken 8 s there), and a broker that misses it is killed, not
        left running."""
        first = self.port == 0
        for attempt in range(PORT_ATTEMPTS):
            if first:
                self.port = unclaimed_port()
            try:
                return self._start_once(timeout_s)
            except PortTaken:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                if not first:  # whoever holds it may let go (a lingering process of this broker's)
                    time.sleep(1)
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> BrokerProcess:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, cwd=self.cwd)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text()[offset:]  # this start's lines only
            found = READY_RE.findall(text)
            if found:
                self.port = int(found[-1])
                for core, pid, cpu, port in CORE_RE.findall(text):
                    self.core_ports[int(core)] = int(port)
                    self.worker_pids[int(core)] = int(pid)
                    self.worker_cpus[int(core)] = int(cpu)
                if self._accepts():
                    return self
            if self.proc.poll() is not None:
                error = PortTaken if ADDRESS_IN_USE in text else RuntimeError
                raise error(f"broker exited with {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait(10)
        raise RuntimeError(f"broker did not start in {timeout_s:.0f} s:\n{self.log_path.read_text()}")

    def _accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (the broker answers what is in flight, flushes and exits 0), then SIGKILL after
        `timeout_s`; the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log().splitlines()[-lines:]) or "(no log)"

    def counter(self, key: str, core: int = 0, timeout: float = 5) -> int:
        """A counter of core `core`'s metrics snapshot (published about once a second), waiting up
        to `timeout` for it to be nonzero."""
        path = self.data_dir / "run" / f"metrics-core-{core}.json"
        deadline = time.monotonic() + timeout
        n = 0
        while time.monotonic() < deadline:
            try:
                n = int(json.loads(path.read_text()).get(key, 0))
            except (OSError, ValueError):
                n = 0
            if n:
                return n
            time.sleep(0.2)
        return n

    def wait_for_log(self, text: str, timeout: float = 5) -> bool:
        """Whether `text` appears in the broker's log within `timeout` (events on other
        connections are logged asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return True
            time.sleep(0.02)
        return False


class Wire:
    """A blocking connection speaking frames: enough to test the server without the client library."""

    def __init__(self, port: int, rcvbuf: int = 0) -> None:
        """`rcvbuf`: a receive buffer this small (set before connecting), for a client whose
        window fills at once when it does not read."""
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self.decoder = FrameDecoder()
        self.next_id = 1

    def send(self, req: m.Request) -> int:
        cid = self.next_id
        self.next_id += 1
        self.sock.sendall(b"".join(m.encode_request(req, cid)))
        return cid

    def recv_frame(self) -> Frame:
        while True:
            f = self.decoder.next_frame()
            if f is not NEED_DATA:
                assert isinstance(f, Frame)
                return f
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("broker closed the connection")
            self.decoder.feed(data)

    def recv(self) -> m.Response:
        return m.decode_response(self.recv_frame())

    def rpc(self, req: m.Request) -> m.Response:
        cid = self.send(req)
        frame = self.recv_frame()
        assert frame.correlation_id == cid
        return m.decode_response(frame)

    def closed_by_peer(self, timeout: float = 5) -> bool:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()

    def fetch_all(self, topic_id: int, partition: int, start: int = 0) -> list[Record]:
        """Every record of the partition from `start` to its end, fetch by fetch."""
        out: list[Record] = []
        offset = start
        while True:
            resp = self.rpc(m.FetchRequest(topic_id, partition, offset, 1 << 20, 0))
            assert isinstance(resp, m.FetchResponse) and resp.error == m.ErrorCode.NONE, resp
            recs = [r for r in decode_batches(resp.records) if r.offset >= offset]
            if not recs:
                return out
            out.extend(recs)
            offset = recs[-1].offset + 1

    def create_topic(self, name: str, partitions: int = 1) -> int:
        resp = self.rpc(m.CreateTopicRequest(name, partitions))
        assert resp.error == m.ErrorCode.NONE, resp
        assert isinstance(resp, m.CreateTopicResponse)
        return resp.topic_id


def values_after_restart(broker: BrokerProcess, topic_id: int, kill: bool = False) -> list[bytes | None]:
    """The values partition 0 of `topic_id` holds once `broker` has stopped (SIGTERM, or with
    `kill` SIGKILL: no shutdown flush, recovery alone) and started again."""
    if kill:
        broker.kill()
    else:
        broker.stop()
    broker.start()
    w = Wire(broker.port)
    try:
        return [r.value for r in w.fetch_all(topic_id, 0)]
    finally:
        w.close()


def own_snapshot(port: int) -> dict:
    """The stats snapshot of the core listening on `port` (its direct port), taken by that core
    as it answers: the way to read one core's counters (forwards, requests by API)."""
    w = Wire(port)
    try:
        resp = w.rpc(m.StatsRequest())
    finally:
        w.close()
    assert isinstance(resp, m.StatsResponse) and resp.error == m.ErrorCode.NONE, resp
    doc = json.loads(resp.stats_json)
    assert doc["answered_by"] == resp.core
    return next(s for s in doc["snapshots"] if s["core"] == resp.core)
