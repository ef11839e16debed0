"""`run_blocking` on both backends (broker/core/blocking.py): calls run on the worker's threads,
their `done` on the loop thread in the order they finished, the loop serving meanwhile, and a
worker stopped while a call runs exits at once.

The backends run in this process (tests/inprocess.py) so that the test reaches
`run_blocking` from the loop thread; the SIGTERM test runs the same server as its own process.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from inprocess import BACKENDS, io_uring_missing, serve_in_process

from broker.backends.backend_core import BackendCore
from broker.backends.blocking import BLOCKING_THREADS
from broker.core.blocking import BlockingCallAbandoned
from labkit.brokerproc import Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

CALLS = 100


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "io_uring" and (why := io_uring_missing()):
        pytest.skip(why)
    return str(request.param)


def test_calls_finish_on_the_loop_thread_in_the_order_they_finished_with_results_or_errors(
    tmp_path: Path, backend: str
) -> None:
    """100 calls, each held until a releaser lets one of the running ones go (at random). For the
    first 90 it waits for that call's `done` before letting the next go; the last 10 finish while
    the loop is held up (by the 90th `done`), so their results wait together and are taken in
    one wake-up. `done` must come in exactly the order of release, on the loop thread, with the
    call's value or the very exception it raised."""
    rng = random.Random(12)
    one_by_one = CALLS - 10
    started: queue.SimpleQueue[int] = queue.SimpleQueue()
    gates = [threading.Event() for _ in range(CALLS)]
    delivered = [threading.Event() for _ in range(CALLS)]
    batch_released = threading.Event()
    posted = threading.Condition()
    posts = [0]  # results the pool has handed to the loop
    raised = {i: ValueError(f"call {i} failed") for i in range(3, CALLS, 10)}
    released: list[int] = []
    dones: list[tuple[int, object, int]] = []
    seen: dict[str, object] = {}

    def call(i: int) -> int:
        started.put(i)
        assert gates[i].wait(10)
        if i in raised:
            raise raised[i]
        return i * i

    def releaser() -> None:
        running: list[int] = []
        for n in range(CALLS):
            if not running:
                running.append(started.get(timeout=10))
            while True:
                try:
                    running.append(started.get_nowait())
                except queue.Empty:
                    break
            i = running.pop(rng.randrange(len(running)))
            released.append(i)
            gates[i].set()
            if n < one_by_one:
                if not delivered[i].wait(10):
                    return
            else:  # the loop is held up: wait until the result is handed to it
                with posted:
                    if not posted.wait_for(lambda n=n: posts[0] == n + 1, 10):  # type: ignore[misc]
                        return
        batch_released.set()

    def on_ready(server: BackendCore, port: int) -> None:
        seen["loop"] = threading.get_ident()
        seen["pool before"] = server._blocking
        server.call_later(20, server.request_stop)  # a watchdog: the test fails, it does not hang
        threadsafe_post = server.threadsafe_post

        def counting_post() -> Callable[[Callable[[], None]], None]:  # the real one, counted
            post = threadsafe_post()

            def counted(callback: Callable[[], None]) -> None:
                post(callback)
                with posted:
                    posts[0] += 1
                    posted.notify()

            return counted

        server.threadsafe_post = counting_post  # type: ignore[method-assign]

        def done(i: int, result: object) -> None:
            dones.append((i, result, threading.get_ident()))
            delivered[i].set()
            if len(dones) == one_by_one:
                batch_released.wait(10)  # holds the loop while the last calls finish
            if len(dones) == CALLS:
                seen["threads"] = list(server._blocking.threads)  # type: ignore[union-attr]
                server.request_stop()

        for i in range(CALLS):
            server.run_blocking(lambda i=i: call(i), lambda result, i=i: done(i, result))  # type: ignore[misc]
        seen["done at once"] = len(dones)
        threading.Thread(target=releaser, daemon=True).start()

    serve_in_process(backend, str(tmp_path / "data"), on_ready)
    assert seen["pool before"] is None and seen["done at once"] == 0
    assert batch_released.is_set() and len(dones) == CALLS
    assert [i for i, _, _ in dones] == released  # the order the calls finished in
    assert {ident for _, _, ident in dones} == {seen["loop"]} == {threading.get_ident()}
    for i, result, _ in dones:
        assert result is raised[i] if i in raised else result == i * i, (i, result)
    threads = seen["threads"]
    assert isinstance(threads, list) and 1 < len(threads) <= BLOCKING_THREADS
    assert all(t.daemon for t in threads)


def test_the_loop_serves_while_a_call_sleeps_and_wakes_at_once_when_it_returns(
    tmp_path: Path, backend: str
) -> None:
    """A call sleeps 1 s: a produce is answered meanwhile; then the loop, idle, wakes for the
    call's `done` within milliseconds (no polling timer: the sweep's is 1 s)."""
    seen: dict[str, float | object] = {}
    client_done = threading.Event()

    def sleep() -> float:
        time.sleep(1.0)
        return time.monotonic()

    def client(port: int) -> None:
        wire = Wire(port)
        try:
            topic_id = wire.create_topic("t")
            sent = time.monotonic()
            resp = wire.rpc(m.ProduceRequest(topic_id, 0, m.Acks.WRITTEN, 1000, encode_batch([b"meanwhile"])))
            seen["produce s"] = time.monotonic() - sent
            seen["produced at"] = time.monotonic()
            seen["produce error"] = resp.error
        finally:
            wire.close()
            client_done.set()

    def on_ready(server: BackendCore, port: int) -> None:
        server.call_later(10, server.request_stop)  # watchdog
        seen["called at"] = time.monotonic()

        def stop_when_client_done() -> None:
            if client_done.is_set():
                server.request_stop()
            else:
                server.call_later(0.05, stop_when_client_done)

        def done(result: float | BaseException) -> None:
            now = time.monotonic()
            seen["done at"] = now
            seen["wake s"] = now - result if isinstance(result, float) else result
            seen["done thread"] = threading.get_ident()
            stop_when_client_done()

        server.run_blocking(sleep, done)
        threading.Thread(target=client, args=(port,), daemon=True).start()

    serve_in_process(backend, str(tmp_path / "data"), on_ready)
    assert seen["produce error"] == m.ErrorCode.NONE
    assert seen["produced at"] < seen["done at"], seen  # type: ignore[operator]
    assert seen["produce s"] < 0.5, seen  # type: ignore[operator]
    assert seen["done at"] - seen["called at"] >= 1.0, seen  # type: ignore[operator]
    assert seen["done thread"] == threading.get_ident()
    assert isinstance(seen["wake s"], float) and seen["wake s"] < 0.2, seen


def test_a_worker_stopped_while_a_call_sleeps_exits_at_once(tmp_path: Path, backend: str) -> None:
    """SIGTERM while a call sleeps 60 s: the call's `done` gets BlockingCallAbandoned on the loop,
    and the process exits at once (its pool's threads do not hold it)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(root / "tests" / "inprocess.py"), backend, str(tmp_path / "data"), "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n", proc.stderr.read() if proc.stderr else ""
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        exited_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.splitlines() == [
        f"done {BlockingCallAbandoned('the core stopped before the call finished')!r}",
        "served",
    ]
    assert exited_s < 3.0, (exited_s, err)  # measured 0.05-0.25 s; a held exit is 60 s
