"""ringlog's io_uring bindings: cffi API-mode `native._uring` over liburing, and the `Ring` wrapper.

Rules this package keeps:
- Built by `make setup` only (`pip install -e .` runs setup.py's cffi_modules); the compiled
  `native/_uring*.so` is a build artefact, never committed.
- `native.constants` (sizes, limits and the few UAPI values the broker's loop needs) is pure Python
  and imports without the build. Every other name here (`Ring`, `probe`, ...) loads the compiled
  module on first use and raises ImportError if it is not built: callers that must run without
  io_uring use them inside a try and call `probe()` to say why it is unavailable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from native.constants import (
    CQE_BATCH_MAX,
    CQE_BUFFER_SHIFT,
    CQE_F_BUFFER,
    CQE_F_MORE,
    CQE_F_SOCK_NONEMPTY,
    RING_ENTRIES_DEFAULT,
)

if TYPE_CHECKING:
    from native.ring import (
        SETUP_FLAGS_DEFAULT,
        SETUP_FLAGS_SINGLE_THREAD,
        SPLICE_F_MORE,
        SPLICE_F_MOVE,
        SPLICE_F_NONBLOCK,
        BufferRing,
        Ring,
        RingUnavailable,
        fdatasync_polled,
        is_mapped,
        map_file,
        probe,
        resident,
        splice_to_socket,
        vmsplice,
    )


def __getattr__(name: str) -> object:
    """The bindings' names, loaded on first use (ImportError when `native._uring` is not built)."""
    if name in __all__:  # not found among the constants above: one of the bindings' names
        from native import ring  # noqa: PLC0415 - the compiled module, only when asked for

        return getattr(ring, name)
    raise AttributeError(f"module 'native' has no attribute {name!r}")


__all__ = [
    "CQE_BATCH_MAX",
    "CQE_BUFFER_SHIFT",
    "CQE_F_BUFFER",
    "CQE_F_MORE",
    "CQE_F_SOCK_NONEMPTY",
    "RING_ENTRIES_DEFAULT",
    "SETUP_FLAGS_DEFAULT",
    "SETUP_FLAGS_SINGLE_THREAD",
    "SPLICE_F_MORE",
    "SPLICE_F_MOVE",
    "SPLICE_F_NONBLOCK",
    "BufferRing",
    "Ring",
    "RingUnavailable",
    "fdatasync_polled",
    "is_mapped",
    "map_file",
    "probe",
    "resident",
    "splice_to_socket",
    "vmsplice",
]
