"""The worker's pool of threads for blocking calls (broker/core/blocking.py says what they are for).

Rules this module keeps:
- Threads are made on demand, up to `BLOCKING_THREADS`: none before the first call, one more only
  when a call finds every thread busy. They are daemon threads and never joined (unlike
  `concurrent.futures`' threads, which the interpreter joins at exit): a call hanging on an
  unreachable store must not keep a worker alive after its loop ended, since the supervisor's
  restart waits for the worker to exit.
- A thread hands each result back through `post(callback)`, the backend's thread-safe way to run
  a callback on its loop thread in a later turn (asyncio's `call_soon_threadsafe`; the io_uring
  backend's eventfd). Results are posted in the order the calls finished.
- After `close()` nothing is posted any more (the backend closes the pool before it releases what
  `post` uses: a closed loop, an eventfd whose number may be reused); results still to come are
  dropped. `close()` and each post hold one lock, so no post is half done when `close()` returns.
  Idle threads end at `close()`, busy ones when their call returns.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

BLOCKING_THREADS = 4  # control-plane calls at once per worker (rare, slow, mostly waiting on a network)

Post = Callable[[Callable[[], None]], object]  # what it returns (asyncio's Handle) goes unused
Job = tuple[Callable[[], Any], Callable[[Any], None]] | None  # None: end the thread


class BlockingPool:
    """Runs `fn()` on a daemon thread, then posts `finished(result or exception)` to the loop."""

    def __init__(self, post: Post, threads: int = BLOCKING_THREADS, name: str = "blocking") -> None:
        self._post = post
        self._max = threads
        self._name = name
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # jobs submitted and not yet taken by a thread
        self._idle = 0  # threads waiting for a job
        self.threads: list[threading.Thread] = []
        self.closed = False

    def submit(self, fn: Callable[[], Any], finished: Callable[[Any], None]) -> None:
        with self._lock:
            if self.closed:
                return
            self._queued += 1
            spawn = self._queued > self._idle and len(self.threads) < self._max
            if spawn:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self.threads)}", daemon=True
                )
                self.threads.append(thread)
        self._jobs.put((fn, finished))
        if spawn:
            thread.start()

    def close(self) -> None:
        """Post nothing from now on; idle threads end now, busy ones after their call."""
        with self._lock:
            self.closed = True
            threads = len(self.threads)
        for _ in range(threads):
            self._jobs.put(None)

    def _work(self) -> None:
        jobs, lock = self._jobs, self._lock
        while True:
            with lock:
                self._idle += 1
            job = jobs.get()
            if job is None or self.closed:  # a call queued before `close()` does not start after it
                return
            fn, finished = job
            with lock:
                self._idle -= 1
                self._queued -= 1
            try:
                result = fn()
            except BaseException as exc:
                result = exc
            with lock:
                if self.closed:
                    return
                try:
                    self._post(functools.partial(finished, result))
                except Exception as exc:  # the loop is gone (closed before the pool was)
                    log.warning("a blocking call's result was dropped: %s", exc)
            del job, fn, finished, result  # nothing of a finished call is kept while waiting for the next
