"""One core served in this process, on either backend: for tests that must reach the backend's own
primitives (run_blocking) from its loop thread, which a `broker serve` subprocess cannot offer.

`serve_in_process(backend, data_dir, on_ready)` builds the backend's server as its `run` does
(one listener on an ephemeral port, the worker's protocols, this thread as the loop thread) and serves until
`server.request_stop()` or SIGTERM/SIGINT; `on_ready(server, port)` runs on the loop once it
listens. Run as a script it is a worker whose one blocking call sleeps (the SIGTERM test's
subprocess): `python tests/inprocess.py BACKEND DATA_DIR SLEEP_S`.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.backends.backend_core import BackendCore
from broker.core.config import BrokerConfig
from broker.node.worker import serving_adapters
from broker.storage.fileio import SyncFileIO
from labkit.brokerproc import Wire

BACKENDS = ("uvloop", "io_uring")


def io_uring_missing() -> str | None:
    """Why this machine cannot run the io_uring backend, or None."""
    try:
        import native

        return native.probe()
    except ImportError as exc:
        return f"native bindings not built: {exc}"


def serve_in_process(
    backend: str, data_dir: str, on_ready: Callable[[BackendCore, int], None], **config: object
) -> BackendCore:
    """Serve one core on `backend` in this thread until it is stopped; returns the server."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    cfg = BrokerConfig(
        data_dir=data_dir,
        port=port,
        core_ports=(port,),
        backend=backend,
        make_adapters=serving_adapters,
        **config,  # type: ignore[arg-type]
    )
    server: BackendCore
    try:
        if backend == "io_uring":
            from broker.backends.uring import UringServer
            from native.constants import RING_ENTRIES
            from native.ring import Ring

            ring = Ring(RING_ENTRIES)
            try:
                server = uring = UringServer(cfg, ring, [listener])
                uring.serve(lambda: on_ready(uring, port))
            finally:
                ring.close()
        else:
            import uvloop

            from broker.backends.aio import Server

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                server = aio = Server(cfg, [listener])
                try:
                    runner.run(aio.serve(lambda: on_ready(aio, port)))
                finally:
                    aio.close_threads()
    finally:
        listener.close()
    return server


Post = Callable[[Callable[[], None]], object]  # a served core's threadsafe post


def served(backend: str, tmp_path: Path, client: Callable[[int, BackendCore, Post], None]) -> None:
    """One core of `backend` served in this thread, `client(port, server, post)` run against it
    on another (`post` runs a callable on the core's loop); raises what the client raised once
    the server stopped. Skips when the machine cannot run io_uring."""
    if backend == "io_uring" and (missing := io_uring_missing()):
        import pytest

        pytest.skip(f"io_uring unavailable: {missing}")
    raised: list[BaseException] = []

    def on_ready(server: BackendCore, port: int) -> None:
        post = server.threadsafe_post()  # (asked on the loop's thread)

        def run() -> None:
            try:
                client(port, server, post)
            except BaseException as exc:  # reported by the test, after the server stops
                raised.append(exc)
            finally:
                post(server.request_stop)

        threading.Thread(target=run, daemon=True).start()

    serve_in_process(backend, str(tmp_path / "data"), on_ready)
    if raised:
        raise raised[0]


def on_loop(post: Post, call: Callable[[], object]) -> Any:
    """`call()` run on a served core's loop (what the loop owns is read there); its result."""
    done = threading.Event()
    out: list[object] = []
    post(lambda: (out.append(call()), done.set()))
    assert done.wait(10), "the loop did not run it"
    return out[0]


def serve_with_wire(
    backend: str, data_dir: str, client: Callable[[Wire], None], io: SyncFileIO | None = None
) -> BackendCore:
    """A core on `backend` served in this thread (its loop's file calls through `io` when given:
    a test's counting or failing disk), `client` run against it on another thread over a `Wire`;
    raises what the client raised once the server has stopped; the server (its counters).
    Skips when the machine cannot run io_uring."""
    if backend == "io_uring" and (missing := io_uring_missing()):
        import pytest

        pytest.skip(f"io_uring unavailable: {missing}")
    raised: list[BaseException] = []

    def run(port: int, post: Callable[[Callable[[], None]], None], stop: Callable[[], None]) -> None:
        try:
            w = Wire(port)
            client(w)
            w.close()
        except BaseException as exc:  # reported by the test, after the server stops
            raised.append(exc)
        finally:
            post(stop)

    def on_ready(server: BackendCore, port: int) -> None:
        if io is not None:
            server.loop_io = io
        post = server.threadsafe_post()
        threading.Thread(target=run, args=(port, post, server.request_stop), daemon=True).start()

    server = serve_in_process(backend, data_dir, on_ready)
    if raised:
        raise raised[0]
    return server


def main(backend: str, data_dir: str, sleep_s: float) -> int:
    """A worker whose one blocking call sleeps `sleep_s`: says "started" once the call runs and
    "done <result>" when its `done` runs; serves until SIGTERM."""

    def sleep() -> str:
        print("started", flush=True)
        time.sleep(sleep_s)
        return "slept"

    def on_ready(server: BackendCore, port: int) -> None:
        server.run_blocking(sleep, lambda result: print(f"done {result!r}", flush=True))

    serve_in_process(backend, data_dir, on_ready)
    print("served", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
