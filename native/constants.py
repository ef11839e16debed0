"""The sizes and limits of the io_uring bindings, each with the reason for its value.

Rules this module keeps:
- Every number the bindings choose (rather than the kernel) lives here and nowhere else.
- Pure Python, importable without the compiled `native._uring` (the setup stamp hashes this file).
"""

from __future__ import annotations

# SQ entries of a Ring. One broker core keeps a multishot recv per connection plus the writes,
# sends and fsyncs of one loop turn in flight; 256 SQEs cover a turn of that size in one
# io_uring_enter, and a fuller SQ is submitted by the prep call itself, so this bounds batch size,
# not concurrency. Also the CQ below scales with it.
RING_ENTRIES_DEFAULT = 256

# CQ entries = this times SQ entries. Multishot accept and recv post many CQEs per SQE, so the
# kernel's default of 2x overflows sooner; an overflow is not lost on 5.5+ (IORING_FEAT_NODROP)
# but costs the kernel an allocation per CQE and an extra enter to flush.
CQ_ENTRIES_FACTOR = 4

# Most CQEs `Ring.completions()` returns per call, and the size of its preallocated arrays. One
# batch per loop turn amortises the Python call; 256 matches a full SQ's worth of completions.
CQE_BATCH_MAX = 256

# Entries of the tiny ring `probe()` creates: the smallest the kernel accepts, so the probe
# measures only whether io_uring works here, not memory limits.
PROBE_ENTRIES = 2

# user_data of the cancel-everything SQE that `Ring.close()` submits before io_uring_queue_exit.
# The top u64 value, which callers are told not to use.
CLOSE_CANCEL_USER_DATA = (1 << 64) - 1

# How long `Ring.close()` waits for cancelled operations to complete. A buffer is released only
# after the kernel is done with it; a regular-file read on an io-wq worker cannot be cancelled and
# may take a disk round trip, so wait up to a second; what is still in flight then is kept
# referenced for the life of the process (leaked) rather than freed under the kernel.
CLOSE_DRAIN_SECONDS = 1.0

# Largest `count` of a BufferRing: buffer ids are 16 bits and the kernel caps a provided-buffer
# ring at 32768 entries.
BUFFER_RING_ENTRIES_MAX = 32768
