"""Which backend a broker serves with: io_uring when it works here, else uvloop.

Its own module, light to import: the supervisor's process (`broker serve`) checks an explicit
`--backend io_uring` before it starts anything, and must not import what only a worker needs (the
protocols, the core) to do it. Each worker chooses again at its start (broker/node/worker.py).
"""

from __future__ import annotations

import importlib.util
import logging

# The worker's logger: the choice is made, and its reason logged, at every worker's start.
log = logging.getLogger("broker.node.worker")

BACKENDS = ("auto", "io_uring", "uvloop")


class BackendUnavailable(Exception):
    """`--backend io_uring` was asked for and cannot be had."""


def io_uring_unavailable() -> str | None:
    """Why the io_uring backend cannot run here, or None if it can.

    `native.probe()` (the liburing bindings, native/) returns None or True when io_uring works, a
    string saying why not (or False) when it does not, and may raise; either module may not be
    built yet.
    """
    try:
        import native  # noqa: PLC0415 - optional, built separately

        probe = native.probe()
    except ImportError as exc:
        return f"the native bindings are not built ({exc})"
    except Exception as exc:  # a probe that fails says io_uring cannot be used
        return f"native.probe() failed: {exc}"
    if isinstance(probe, str):
        return probe
    if probe is False:
        return "native.probe() says io_uring is not usable"
    if importlib.util.find_spec("broker.backends.uring") is None:
        return "broker/backends/uring.py is not built yet"
    return None


def choose_backend(requested: str) -> str:
    """The backend to serve with: "io_uring" or "uvloop". `requested` is auto, io_uring or uvloop;
    auto takes io_uring when it works and says why not otherwise. Raises `BackendUnavailable` when
    io_uring is requested explicitly and cannot run."""
    if requested not in BACKENDS:
        raise ValueError(f"backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "uvloop":
        return "uvloop"
    reason = io_uring_unavailable()
    if reason is None:
        return "io_uring"
    if requested == "io_uring":
        raise BackendUnavailable(f"io_uring unavailable: {reason}")
    log.info("io_uring unavailable: %s; serving with uvloop", reason)
    return "uvloop"
