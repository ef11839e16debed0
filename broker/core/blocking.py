"""Blocking calls from the core: the one way core code waits on something slow without blocking
its loop (a topic created in the metadata store, an in-sync-set change proposed to the controller).

Rules this module keeps:
- The core never imports a backend: it is handed `run_blocking` (a `RunBlocking`) at
  construction, as it is handed `call_later`, and writes `self.run_blocking(fn, done)`.
- `fn()` runs on a thread of the worker's small pool (made on first use: a core that never calls
  it starts no thread), so it must not touch the core's state: it gets what it needs as arguments
  and returns a value. `done(result)`, or `done(exception)` when `fn` raised, then runs on the
  loop thread in a later loop turn, never inside `run_blocking` and never on the pool's thread;
  `done` is called exactly once. A request that answers after such a call returns a `Later`
  outcome (broker/core/outcomes.py) and answers from `done`.
- Shutdown does not wait for a call in flight (a store that does not answer may hold it for its
  whole timeout): when the core begins stopping, each call still in flight gets
  `done(BlockingCallAbandoned())` at once, on the loop, so a request waiting on it answers; its
  real result, if it ever comes, is dropped, and its thread dies with the process. A call made
  while stopping is abandoned the same way, in a later turn, without running. Whatever such a
  call did to the outside world may or may not have happened: as with any timeout, the caller's
  successor finds out from the store.
- `fn` must not return an exception object as its value: `done` could not tell it from a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class BlockingCallAbandoned(Exception):
    """The core stopped before the blocking call finished; its result, if any, is dropped."""


class RunBlocking(Protocol):
    """`run_blocking(fn, done)`: `fn()` on a pool thread, then `done(result or exception)` on the
    loop thread, in a later turn (the module's rules)."""

    def __call__(self, fn: Callable[[], T], done: Callable[[T | BaseException], None]) -> None: ...


def no_threads(fn: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
    """The `run_blocking` of a core without a loop (handlers built by tests)."""
    raise RuntimeError("these handlers have no event loop: blocking calls need one")
