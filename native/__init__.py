"""ringlog's io_uring bindings: cffi API-mode `native._uring` over liburing, and the `Ring` wrapper.

Rules this package keeps:
- Built by `make setup` only (`pip install -e .` runs setup.py's cffi_modules); the compiled
  `native/_uring*.so` is a build artefact, never committed.
- Importing `native` needs the compiled module; callers that must run without io_uring import it
  inside a try and use `probe()` to say why it is unavailable.
"""

from native.constants import CQE_BATCH_MAX, RING_ENTRIES_DEFAULT
from native.ring import (
    CQE_BUFFER_SHIFT,
    CQE_F_BUFFER,
    CQE_F_MORE,
    CQE_F_SOCK_NONEMPTY,
    SETUP_FLAGS_DEFAULT,
    SETUP_FLAGS_SINGLE_THREAD,
    SPLICE_F_MORE,
    SPLICE_F_MOVE,
    SPLICE_F_NONBLOCK,
    BufferRing,
    Ring,
    RingUnavailable,
    probe,
)

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
    "probe",
]
