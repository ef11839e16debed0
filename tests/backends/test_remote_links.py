"""TCP links from a core to another broker's core (broker/core/remote.py over each backend's
`open_remote`), against a real `broker serve` subprocess.

Replication's follower fetches are what the links carry in a cluster; here each backend's core
runs alone, in the test process, so that a test sees the link itself: a `UringServer` on a ring
of its own or an asyncio `Server` on a uvloop loop, without listeners, its loop driven by the
test (`LocalCore.run_until`). The remote end is an ordinary broker's direct core port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.backends.backend_core import BackendCore
from broker.core.config import BrokerConfig
from broker.core.forwarding import PeerLinkError
from broker.core.remote import REMOTE_RETRY_S_MIN
from broker.node.worker import serving_adapters
from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch
from ringlog_proto.frames import LENDING_DECODER, Frame

BACKENDS = ("io_uring", "uvloop")


def _nothing() -> None:
    pass


class LocalCore:
    """One backend core in this process; the test runs its loop."""

    def __init__(self, backend: str, data_dir: Path) -> None:
        config = BrokerConfig(data_dir=str(data_dir), backend=backend, make_adapters=serving_adapters)
        self.backend = backend
        self.server: BackendCore
        if backend == "io_uring":
            from broker.backends.uring import UringServer  # needs the compiled bindings
            from native.ring import Ring, probe

            why = probe()
            if why is not None:
                pytest.skip(f"io_uring unavailable: {why}")
            self.ring = Ring(256)
            self.server = self.uring = UringServer(config, self.ring, [])
        else:
            from broker.backends.aio import Server

            try:
                import uvloop

                self.loop = uvloop.new_event_loop()
            except ImportError:
                self.loop = asyncio.new_event_loop()

            async def make() -> Server:
                return Server(config, [])

            self.aio = self.loop.run_until_complete(make())
            self.server = self.aio

    def request(self, *args: object, **kwargs: object) -> None:
        """`remote_links.request` from the core's loop, as core code calls it."""
        if self.backend == "io_uring":
            self.server.remote_links.request(*args, **kwargs)  # type: ignore[arg-type]
            return

        async def call() -> None:
            self.server.remote_links.request(*args, **kwargs)  # type: ignore[arg-type]

        self.loop.run_until_complete(call())

    def run_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Run the loop until `done()` (fails after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"not done within {timeout}s"
            if self.backend == "io_uring":
                self.uring.loop.call_later(0.005, _nothing)  # one pass waits at most that long
                self.uring.loop.run_once()
            else:
                self.loop.run_until_complete(asyncio.sleep(0.005))

    def close(self) -> None:
        """The backend's own shutdown sequence (it closes the remote links too)."""
        if self.backend == "io_uring":
            for wait_s in self.server.shutdown():
                self.uring.loop.call_later(wait_s, _nothing)
                self.uring.loop.run_once()
            self.ring.close()
        else:

            async def stop() -> None:
                for wait_s in self.server.shutdown():
                    await asyncio.sleep(wait_s)

            self.loop.run_until_complete(stop())
            self.aio.close_threads()
            self.loop.close()


class Answers:
    """`done` callbacks that record each result and when it came, and fail on a second call."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[Frame | BaseException, float]] = {}

    def done(self, name: str) -> Callable[[Frame | BaseException], None]:
        def done(result: Frame | BaseException) -> None:
            assert name not in self.results, f"{name} answered twice"
            self.results[name] = (result, time.monotonic())

        return done

    def has(self, *names: str) -> Callable[[], bool]:
        return lambda: all(n in self.results for n in names)

    def frame(self, name: str) -> Frame:
        result = self.results[name][0]
        assert isinstance(result, Frame), result
        return result

    def error(self, name: str) -> BaseException:
        result = self.results[name][0]
        assert isinstance(result, BaseException), result
        return result


def frame_of(request: m.Request) -> Frame:
    return m.request_frame(request, 0)


@pytest.fixture(params=BACKENDS)
def core(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalCore]:
    local = LocalCore(request.param, tmp_path / "local")
    yield local
    local.close()


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("remote")
    proc = BrokerProcess(tmp / "data", tmp / "broker.log").start()
    yield proc
    assert proc.stop() == 0


def test_metadata_answers_while_a_long_poll_waits_then_the_long_poll_gets_the_records(
    core: LocalCore, remote: BrokerProcess
) -> None:
    wire = Wire(remote.port)
    topic = f"links-{core.backend}"
    tid = wire.create_topic(topic)
    links = core.server.remote_links
    address = ("127.0.0.1", remote.core_ports[0])
    answers = Answers()
    start = time.monotonic()
    fetch = frame_of(m.FetchRequest(tid, 0, offset=0, max_wait_ms=5000))
    core.request(address, fetch, start + 10, answers.done("fetch"), long_poll=True)
    core.request(address, frame_of(m.MetadataRequest()), start + 5, answers.done("metadata"))
    core.run_until(answers.has("metadata"), 3)
    assert "fetch" not in answers.results  # parked at the remote, on a link of its own
    metadata = m.decode_response(answers.frame("metadata"))
    assert isinstance(metadata, m.MetadataResponse) and metadata.error == m.ErrorCode.NONE
    assert metadata.core_ports == (remote.core_ports[0],)
    assert topic in [t.name for t in metadata.topics]

    produced = time.monotonic()
    wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch([b"over tcp"])))
    core.run_until(answers.has("fetch"), 3)
    assert answers.results["fetch"][1] - produced < 1.0  # woken by the append, not by max_wait
    answer = m.decode_response(answers.frame("fetch"))
    assert isinstance(answer, m.FetchResponse) and answer.error == m.ErrorCode.NONE
    assert [r.value for r in decode_batches(answer.records)] == [b"over tcp"]
    assert links.pending == 0
    wire.close()


def test_a_large_answer_arrives_whole_and_stays_where_it_was_received(
    core: LocalCore, remote: BrokerProcess
) -> None:
    """A follower's fetch answers are most of what a link carries: the link receives them
    straight into its decoder's space, and the answer's body is a view of it, not a copy."""
    wire = Wire(remote.port)
    tid = wire.create_topic(f"large-{core.backend}")
    values = [bytes([i % 251]) * 1000 for i in range(1500)]  # ~1.5 MB: many receives
    for start in range(0, len(values), 250):
        wire.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 1000, encode_batch(values[start : start + 250])))
    answers = Answers()
    fetch = frame_of(m.FetchRequest(tid, 0, offset=0, max_bytes=4 << 20))
    core.request(("127.0.0.1", remote.core_ports[0]), fetch, time.monotonic() + 10, answers.done("fetch"))
    core.run_until(answers.has("fetch"), 5)
    frame = answers.frame("fetch")
    answer = m.decode_response(frame)
    assert isinstance(answer, m.FetchResponse) and answer.error == m.ErrorCode.NONE
    assert [r.value for r in decode_batches(answer.records)] == values
    if LENDING_DECODER is not None:
        assert isinstance(frame.body, memoryview), type(frame.body)
    wire.close()


def test_a_refused_connection_fails_promptly_and_backs_off(core: LocalCore) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there once it is closed
    answers = Answers()
    start = time.monotonic()
    core.request(("127.0.0.1", port), frame_of(m.MetadataRequest()), start + 5, answers.done("first"))
    core.run_until(answers.has("first"), 2)
    assert isinstance(answers.error("first"), PeerLinkError)
    assert answers.results["first"][1] - start < 0.5
    # Retried at once: it waits for the back-off, then fails again on a new link (no spinning).
    retried = time.monotonic()
    core.request(("127.0.0.1", port), frame_of(m.MetadataRequest()), retried + 5, answers.done("again"))
    core.run_until(answers.has("again"), 2)
    assert isinstance(answers.error("again"), PeerLinkError)
    assert REMOTE_RETRY_S_MIN * 0.9 <= answers.results["again"][1] - retried < 1.0


def test_a_connect_that_gets_no_answer_fails_at_the_connect_timeout(
    core: LocalCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listener whose accept queue is full drops SYNs: the connect hangs, as to a vanished host.
    # The timeout is the backend's constant, shortened here to keep the test quick.
    module = "broker.backends.uring_connections" if core.backend == "io_uring" else "broker.backends.aio"
    monkeypatch.setattr(f"{module}.REMOTE_CONNECT_TIMEOUT_S", 0.2)
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.connect(listener.getsockname())  # the one connection the queue holds
        answers = Answers()
        start = time.monotonic()
        core.request(listener.getsockname(), frame_of(m.MetadataRequest()), start + 5, answers.done("hung"))
        core.run_until(answers.has("hung"), 2)
        assert isinstance(answers.error("hung"), PeerLinkError)
        assert "within 0.2 s" in str(answers.error("hung"))
        assert 0.18 <= answers.results["hung"][1] - start < 1.0


def test_a_remote_killed_mid_request_fails_it_promptly_and_the_link_comes_back_after_restart(
    core: LocalCore, tmp_path: Path
) -> None:
    remote = BrokerProcess(tmp_path / "remote", tmp_path / "remote.log").start()
    try:
        wire = Wire(remote.port)
        tid = wire.create_topic("killed")
        wire.close()
        links = core.server.remote_links
        address = ("127.0.0.1", remote.core_ports[0])
        answers = Answers()
        deadline = time.monotonic() + 30
        core.request(address, frame_of(m.MetadataRequest()), deadline, answers.done("before"))
        fetch = frame_of(m.FetchRequest(tid, 0, offset=0, max_wait_ms=20_000))
        core.request(address, fetch, deadline, answers.done("fetch"), long_poll=True)
        core.run_until(answers.has("before"), 3)
        core.run_until(lambda: links.pending == 1, 1)  # only the long poll, parked at the remote

        killed = time.monotonic()
        os.kill(remote.worker_pids[0], signal.SIGKILL)  # the core holding our connections
        remote.kill()
        core.run_until(answers.has("fetch"), 2)
        assert isinstance(answers.error("fetch"), PeerLinkError)
        assert answers.results["fetch"][1] - killed < 0.5

        # While it is down: refused, after the back-off the loss started (the caller need not wait).
        down = time.monotonic()
        core.request(address, frame_of(m.MetadataRequest()), down + 5, answers.done("down"))
        core.run_until(answers.has("down"), 2)
        assert isinstance(answers.error("down"), PeerLinkError)
        assert answers.results["down"][1] - down < 0.5

        remote.start()  # same ports: the direct port is remembered in the data dir
        assert remote.core_ports[0] == address[1]
        restarted = time.monotonic()
        attempt = 0
        while True:  # what a caller does: retry on failure (the links back off meanwhile)
            attempt += 1
            name = f"after {attempt}"
            core.request(address, frame_of(m.MetadataRequest()), time.monotonic() + 5, answers.done(name))
            core.run_until(answers.has(name), 6)
            if isinstance(answers.results[name][0], Frame):
                break
        metadata = m.decode_response(answers.frame(name))
        assert isinstance(metadata, m.MetadataResponse) and "killed" in [t.name for t in metadata.topics]
        assert time.monotonic() - restarted < 3.0
    finally:
        if remote.running():
            remote.stop()
