"""The sizes and limits of the io_uring bindings and of the broker's ring loop, each with the
reason for its value, and the relations between them checked at import.

Rules this module keeps:
- Every number the bindings or the io_uring backend choose (rather than the kernel) lives here
  and nowhere else: the bindings' defaults (`Ring`, `BufferRing`, `probe`) and the backend's ring,
  loop and buffer limits (broker/backends/uring.py, uring_stream.py, uring_loop.py).
- The kernel's own values that the loop needs without the compiled module (`CQE_F_MORE`, ...) are
  written here once; native/ring.py checks them against the compiled UAPI header at import.
- Pure Python, importable without the compiled `native._uring` (`native/__init__.py` loads the
  bindings only when a name of theirs is used; the setup stamp hashes this file).
- The relations between the numbers (an iovec count below IOV_MAX, powers of two where the kernel
  wants them, a minimum below its maximum) are asserted below: a change that breaks one fails at
  import, not in production.
"""

from __future__ import annotations

# --- the kernel's values (include/uapi/linux/io_uring.h, uio.h) ------------------------------------

CQE_F_BUFFER = 1 << 0  # IORING_CQE_F_BUFFER: the upper 16 bits of flags name a provided buffer
CQE_F_MORE = 1 << 1  # IORING_CQE_F_MORE: not the final CQE of its SQE (multishot accept, recv)
CQE_F_SOCK_NONEMPTY = 1 << 2  # IORING_CQE_F_SOCK_NONEMPTY: more data waits in the socket
CQE_BUFFER_SHIFT = 16  # IORING_CQE_BUFFER_SHIFT: where the buffer id sits in a CQE's flags
IOV_MAX = 1024  # UIO_MAXIOV: most iovecs one readv/writev/sendmsg takes (else EINVAL)
RING_ENTRIES_KERNEL_MAX = 32768  # IORING_MAX_ENTRIES: most SQ entries io_uring_setup accepts

# --- the bindings (native/ring.py) -----------------------------------------------------------------

# SQ entries of a Ring made without saying. 256 SQEs cover a loop turn of a few hundred operations
# in one io_uring_enter, and a fuller SQ is submitted by the prep call itself, so this bounds batch
# size, not concurrency. Also the CQ below scales with it. (The broker's ring: `RING_ENTRIES`.)
RING_ENTRIES_DEFAULT = 256

# CQ entries = this times SQ entries. Multishot accept and recv post many CQEs per SQE, so the
# kernel's default of 2x overflows sooner; an overflow is not lost on 5.5+ (IORING_FEAT_NODROP)
# but costs the kernel an allocation per CQE and an extra enter to flush.
CQ_ENTRIES_FACTOR = 4

# Most CQEs `Ring.completions()` returns per call by default. One batch per call amortises the
# Python call; 256 matches a full default SQ's worth of completions. (The broker's loop reaps up
# to `COMPLETIONS_PER_PASS_MAX` per pass with `Ring.run_completions`.)
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
# ring at 32768 entries (and wants a power of two).
BUFFER_RING_ENTRIES_MAX = 32768

# --- the broker's ring loop (broker/backends/uring.py, uring_stream.py, uring_loop.py) -------------

# SQ entries of a worker's ring: enough for a pass over hundreds of busy connections (a recv, a
# sendmsg, a writev and an fsync each) in one submit.
RING_ENTRIES = 4096
# Completions reaped, and continuations run, per pass before the loop submits again.
COMPLETIONS_PER_PASS_MAX = 4096
# Rounds of end-of-pass callbacks per pass: those an end-of-pass callback queues (the replies of
# the store writes it completed, their group commit) run in the same pass, this many deep.
END_OF_PASS_ROUNDS_MAX = 4
# Each connection owns its recv buffer (single-shot recvs: not re-arming is the exact pause of a
# connection over its budget; docs/ARCHITECTURE.md). It starts small, so that thousands of idle
# connections cost little, and grows by `RECV_BUFFER_GROWTH` whenever a recv fills it, up to the
# size where a stream of 1 MiB produce batches needs only a few recvs per frame; a connection
# quiet for a sweep gets a small one back. The one count of recv buffers is one per connection:
# the backend uses no provided-buffer ring (`BufferRing` is the bindings', tested, unused).
RECV_BUFFER_BYTES_MIN = 4 * 1024
RECV_BUFFER_BYTES_MAX = 256 * 1024
RECV_BUFFER_GROWTH = 4
SEND_IOVECS_MAX = 512  # buffers per sendmsg (a reply is 1-3 buffers; more replies go next time)
WRITEV_IOVECS_MAX = 512  # buffers per gathered store writev (2 per batch appended)
# `--append-writes auto`: a gathered store write up to this size is a pwritev on the loop, above it
# a writev SQE. ext4 hands every buffered ring write to an io-wq thread, and that thread runs on the
# worker's own CPU (io-wq inherits the pinned worker's affinity): the hand-off buys no parallelism,
# only a context switch per write and a slower copy (perf, pre-encoded 64 KiB ingest: the io-wq
# thread's copy_folio_from_iter_atomic was 38% of the worker's samples). bench/cores.py ingest,
# 5 alternating rounds: 461k records/s at 2.12 CPU-s/GB with 64 KiB here, 496k at 1.95 with 1 MiB.
# A pass gathers at most a recv buffer's worth per connection (`RECV_BUFFER_BYTES_MAX`); above
# 1 MiB (one pass of many connections, a multi-MiB batch) the copy would hold the loop for
# hundreds of microseconds, and the ring takes it.
APPEND_INLINE_BYTES_MAX = 1024 * 1024
# With `--fetch-sends splice` (uring_options.py; the default copies them), a fetch reply's records
# from the page cache (a mapped segment, `native.map_file`) of at least this size go to the socket
# by reference: vmsplice into a pipe, then splice from the pipe to the socket without waiting
# (what finds no room waits in the pipe for a poll SQE); neither copies. Bare floor servers
# favour it (1 MiB chunks with the crc check: 0.41-0.46 CPU-s/GB sending the mapped bytes,
# 0.25-0.28 splicing them); the broker itself does not (uring_options.py, FETCH_SENDS_DEFAULT). Smaller
# ones are copied with the rest of the reply: the extra system calls cost more than their copy.
SPLICE_MIN_BYTES = 64 * 1024
# Pipes a worker keeps for that, each holding one reply's records at a time (when all are busy,
# records are copied like smaller ones); one reply's worth each (the most a pipe may hold for
# anyone by default, /proc/sys/fs/pipe-max-size).
SPLICE_PIPES_MAX = 4
SPLICE_PIPE_BYTES = 1024 * 1024
ACCEPT_RETRY_S = 0.1  # after EMFILE/ENFILE/ENOBUFS/ENOMEM: accept again later instead of spinning


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# The relations the values above must keep. Plain `if`s, not asserts: they hold under -O too.
_CHECKS = (
    (
        all(map(_power_of_two, (CQE_F_BUFFER, CQE_F_MORE, CQE_F_SOCK_NONEMPTY)))
        and len({CQE_F_BUFFER, CQE_F_MORE, CQE_F_SOCK_NONEMPTY}) == 3
        and CQE_F_SOCK_NONEMPTY < 1 << CQE_BUFFER_SHIFT,
        "each CQE flag is its own bit, below the buffer id",
    ),
    (_power_of_two(RING_ENTRIES) and RING_ENTRIES <= RING_ENTRIES_KERNEL_MAX, "RING_ENTRIES"),
    (
        _power_of_two(RING_ENTRIES_DEFAULT) and RING_ENTRIES_DEFAULT <= RING_ENTRIES_KERNEL_MAX,
        "default entries",
    ),
    (_power_of_two(PROBE_ENTRIES), "PROBE_ENTRIES"),
    (_power_of_two(CQ_ENTRIES_FACTOR), "the CQ is a power of two times the SQ"),
    (0 < CQE_BATCH_MAX <= RING_ENTRIES_DEFAULT * CQ_ENTRIES_FACTOR, "a batch fits the default CQ"),
    (0 < COMPLETIONS_PER_PASS_MAX <= RING_ENTRIES * CQ_ENTRIES_FACTOR, "a pass reaps at most a CQ"),
    (_power_of_two(BUFFER_RING_ENTRIES_MAX) and BUFFER_RING_ENTRIES_MAX <= 1 << 16, "buffer ids are 16 bits"),
    (0 < SEND_IOVECS_MAX < IOV_MAX, "SEND_IOVECS_MAX below IOV_MAX"),
    (0 < WRITEV_IOVECS_MAX < IOV_MAX, "WRITEV_IOVECS_MAX below IOV_MAX"),
    (0 < RECV_BUFFER_BYTES_MIN <= RECV_BUFFER_BYTES_MAX, "recv buffer min <= max"),
    (RECV_BUFFER_GROWTH > 1, "a full recv buffer grows"),
    (ACCEPT_RETRY_S > 0, "ACCEPT_RETRY_S"),
    (0 < SPLICE_MIN_BYTES <= SPLICE_PIPE_BYTES and SPLICE_PIPES_MAX > 0, "splice sizes"),
    (APPEND_INLINE_BYTES_MAX >= RECV_BUFFER_BYTES_MAX, "one connection's pass of appends goes inline"),
)
for _ok, _what in _CHECKS:
    if not _ok:
        raise AssertionError(f"native/constants.py: {_what} does not hold")
