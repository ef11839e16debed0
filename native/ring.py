"""A Pythonic io_uring `Ring` over liburing (cffi API mode, `native._uring`), for the broker's loop.

Rules this module keeps:
- Memory safety first: every buffer, iovec array, msghdr and timespec handed to the kernel stays
  referenced by the ring, keyed by user_data, until the *final* CQE of that user_data has been
  reaped (final = without IORING_CQE_F_MORE). `close()` cancels what is in flight and waits for it
  (bounded); what the kernel still holds then is leaked on purpose, never freed under it.
- user_data is the caller's u64 and names one operation: reusing one still in flight is a bug
  (asserted). The top value (`CLOSE_CANCEL_USER_DATA`) is reserved.
- Callers never see "SQ full": a prep that finds the SQ full submits it first. A prep with
  link=True leaves room for the SQE it links to, so an op + link timeout pair is never split
  across two submits (longer chains: check `sq_space_left` first).
- Errors of operations come back as negative errno in the CQE's res, never as exceptions. Only
  failures of the ring itself raise: `RingUnavailable` at creation, `OSError` from submit.
- Hot path cost: one C call per prep (get SQE, prep, flags, user_data together) and one per batch
  of CQEs (native/loop.c reaps them, for `completions` and `run_completions` alike); lib
  functions are module globals; nothing builds cffi types per call except the memory the kernel
  must read later (ffi.from_buffer views, iovec/timespec blocks).
- One thread per Ring: no locks. A Ring is not inherited usefully across fork.
"""

from __future__ import annotations

import errno
import os
import resource
import socket
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from native._loop import Completions
from native._uring import ffi, lib
from native.constants import (
    BUFFER_RING_ENTRIES_MAX,
    CLOSE_CANCEL_USER_DATA,
    CLOSE_DRAIN_SECONDS,
    COMPLETIONS_PER_PASS_MAX,
    CQ_ENTRIES_FACTOR,
    CQE_BATCH_MAX,
    CQE_BUFFER_SHIFT,
    CQE_F_BUFFER,
    CQE_F_MORE,
    CQE_F_SOCK_NONEMPTY,
    PROBE_ENTRIES,
    RING_ENTRIES_DEFAULT,
)

# The UAPI values native/constants.py writes down (for code that runs without the build) must be
# the ones this build's header has.
for _name, _ours, _header in (
    ("IORING_CQE_F_BUFFER", CQE_F_BUFFER, lib.IORING_CQE_F_BUFFER),
    ("IORING_CQE_F_MORE", CQE_F_MORE, lib.IORING_CQE_F_MORE),
    ("IORING_CQE_F_SOCK_NONEMPTY", CQE_F_SOCK_NONEMPTY, lib.IORING_CQE_F_SOCK_NONEMPTY),
    ("IORING_CQE_BUFFER_SHIFT", CQE_BUFFER_SHIFT, lib.IORING_CQE_BUFFER_SHIFT),
):
    if _ours != _header:
        raise ImportError(f"native/constants.py has {_name} = {_ours}, the header {_header}")
SPLICE_F_MOVE: int = lib.SPLICE_F_MOVE
SPLICE_F_NONBLOCK: int = lib.SPLICE_F_NONBLOCK
SPLICE_F_MORE: int = lib.SPLICE_F_MORE

# Setup flags tried first. SUBMIT_ALL (5.18): one SQE failing its prep does not stop the rest of
# the batch. COOP_TASKRUN + TASKRUN_FLAG (5.19): completions are not pushed to this task with an
# IPI while it runs Python; they run at its next kernel entry, which the loop makes anyway, and
# the flag lets `completions()` enter once when the kernel has completions pending for us.
SETUP_FLAGS_DEFAULT: int = (
    lib.IORING_SETUP_SUBMIT_ALL | lib.IORING_SETUP_COOP_TASKRUN | lib.IORING_SETUP_TASKRUN_FLAG
)
# The same, plus SINGLE_ISSUER + DEFER_TASKRUN (6.1): cheaper still, but completions become
# visible only inside `submit_and_wait` (an enter with GETEVENTS), never by `submit()` alone, and
# only the creating thread may submit. Opt in with Ring(entries, flags=SETUP_FLAGS_SINGLE_THREAD).
SETUP_FLAGS_SINGLE_THREAD: int = (
    lib.IORING_SETUP_SUBMIT_ALL | lib.IORING_SETUP_SINGLE_ISSUER | lib.IORING_SETUP_DEFER_TASKRUN
)

_IO_URING_DISABLED = "/proc/sys/kernel/io_uring_disabled"

# Hot-path C functions as module globals: one global lookup instead of two attribute lookups.
_NULL = ffi.NULL
_NOT_ERRORS = (-errno.ETIME, -errno.EINTR)  # of a wait: it timed out or a signal came
_from_buffer = ffi.from_buffer
_new = ffi.new
_prep_nop = lib.rl_prep_nop
_prep_accept = lib.rl_prep_accept
_prep_recv = lib.rl_prep_recv
_prep_recv_multishot = lib.rl_prep_recv_multishot
_prep_send = lib.rl_prep_send
_prep_sendmsg = lib.rl_prep_sendmsg
_prep_writev = lib.rl_prep_writev
_prep_read = lib.rl_prep_read
_prep_fsync = lib.rl_prep_fsync
_prep_splice = lib.rl_prep_splice
_prep_timeout = lib.rl_prep_timeout
_prep_link_timeout = lib.rl_prep_link_timeout
_prep_cancel = lib.rl_prep_cancel
_prep_poll_add = lib.rl_prep_poll_add
_prep_close = lib.rl_prep_close
_prep_connect = lib.rl_prep_connect
_SOCKADDR_BYTES: int = lib.rl_sockaddr_bytes()
_msg_bytes = lib.rl_msg_bytes
_iov_bytes = lib.rl_iov_bytes
_submit = lib.rl_submit
_submit_and_wait = lib.rl_submit_and_wait
_submit_and_wait_timeout = lib.rl_submit_and_wait_timeout
_bufring_give = lib.rl_bufring_give

# References the kernel may still use after a Ring was closed without its operations completing.
_LEAKED: list[object] = []


class RingUnavailable(OSError):
    """io_uring ring creation failed here; the message names the errno and its likely cause."""


def _errno_name(err: int) -> str:
    return f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"


def _io_uring_disabled() -> str | None:
    try:
        with open(_IO_URING_DISABLED) as f:
            return f.read().strip()
    except OSError:
        return None


def _unavailable(err: int, entries: int) -> RingUnavailable:
    """Build the exception for a failed io_uring_queue_init, with the likely cause spelled out."""
    disabled = _io_uring_disabled()
    sysctl = f"{_IO_URING_DISABLED}={disabled}" if disabled is not None else f"{_IO_URING_DISABLED} absent"
    if err == errno.EPERM:
        cause = f"io_uring is disabled ({sysctl}) or blocked by seccomp (containers)"
    elif err == errno.ENOSYS:
        cause = f"kernel without io_uring (older than 5.1 or CONFIG_IO_URING off; {sysctl})"
    elif err == errno.ENOMEM:
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"
        cause = f"locked-memory/memcg limit (ulimit -l is {limit}) too small for {entries} entries"
    elif err == errno.EINVAL:
        cause = f"invalid entries ({entries}: 1..32768) or setup flags this kernel lacks"
    else:
        cause = f"unexpected ({sysctl})"
    return RingUnavailable(err, f"io_uring_queue_init failed: {_errno_name(err)}: {cause}")


def _raise(rc: int, what: str) -> None:
    raise OSError(-rc, f"{what}: {_errno_name(-rc)}")


def _seconds(seconds: float) -> tuple[int, int]:
    if seconds < 0:
        seconds = 0.0
    sec = int(seconds)
    return sec, int((seconds - sec) * 1e9)


def probe() -> str | None:
    """None if an io_uring ring can be created here, else why not (for startup checks and skips)."""
    try:
        Ring(PROBE_ENTRIES).close()
    except RingUnavailable as e:
        return str(e)
    return None


def map_file(fd: int, length: int) -> memoryview:
    """A read-only view of the first `length` bytes of file `fd`, mapped shared: the page cache's
    own pages, not a copy. Unmapped when the last view of it is released (the file may be closed
    meanwhile: a mapping holds no descriptor). `length` may pass the file's end, but a page past
    it must not be touched (SIGBUS): `resident` is False for those. Raises OSError."""
    err = _new("int *")
    addr = lib.rl_map_file(fd, length, err)
    if addr == ffi.NULL:
        _raise(err[0], "mmap")
    unmap = lib.rl_unmap
    owned = ffi.gc(addr, lambda a: unmap(a, length), size=length)
    return memoryview(ffi.buffer(owned, length)).toreadonly()


_MAPPED = type(ffi.buffer(ffi.new("char[1]")))  # what `map_file`'s views are views of


def is_mapped(buf: object) -> bool:
    """Whether `buf` is a view of a `map_file` mapping (so `vmsplice` can hand its pages on)."""
    return type(buf) is memoryview and type(buf.obj) is _MAPPED


def vmsplice(pipe_fd: int, view: memoryview) -> int:
    """Put `view`'s pages in the pipe by reference, not by copy (vmsplice(2), non-blocking): the
    bytes moved, as many as the pipe has room for; raises OSError. The pages must stay as they are
    until read out of the pipe: a mapping of committed segment bytes does."""
    n = lib.rl_vmsplice(pipe_fd, ffi.from_buffer(view), len(view), lib.SPLICE_F_NONBLOCK)
    if n < 0:
        _raise(n, "vmsplice")
    return n


def splice_to_socket(pipe_fd: int, sock_fd: int, length: int) -> int:
    """Move up to `length` bytes from the pipe to the socket, without waiting for room in the
    socket (which is blocking for everyone else): the bytes moved, 0 if it is full; raises OSError."""
    n = lib.rl_splice_to_socket(pipe_fd, sock_fd, length)
    if n < 0:
        _raise(n, "splice")
    return n


def fdatasync_polled(fd: int) -> None:
    """fdatasync(fd), with this CPU kept busy meanwhile by a thread that yields to anything else
    (on a VM, a halted vCPU is slow to wake for the disk's completion: see native/_build.py);
    raises OSError. For the io_uring loop's own syncs, when it busy-polls anyway."""
    rc = lib.rl_fdatasync_polled(fd)
    if rc < 0:
        _raise(rc, "fdatasync")


def resident(view: memoryview) -> bool:
    """Whether every page under `view` (of a `map_file` mapping) is in memory (mincore(2)): reading
    it then cannot wait for the disk, and cannot pass the file's end. A failure says no."""
    return lib.rl_resident(ffi.from_buffer(view), len(view)) == 1


class Ring:
    """One io_uring instance: prep SQEs, submit, reap CQEs as (user_data, res, flags) tuples."""

    __slots__ = (
        "__weakref__",
        "_batch",
        "_refs",
        "_ring",
        "address",
        "entries",
        "flags",
    )

    def __init__(
        self, entries: int = RING_ENTRIES_DEFAULT, *, flags: int | None = None, cq_entries: int | None = None
    ) -> None:
        """io_uring_queue_init with `entries` SQEs and `cq_entries` (default 4x) CQEs.

        `flags` None means SETUP_FLAGS_DEFAULT, falling back to no flags on a kernel older than
        5.19 that rejects them. Raises RingUnavailable.
        """
        self._ring = _NULL
        self.address = 0  # of the struct io_uring, for native._loop; 0 once closed
        self._refs: dict[int, object] = {}
        ring = ffi.new("struct io_uring *")
        cq = cq_entries if cq_entries is not None else entries * CQ_ENTRIES_FACTOR
        rc = lib.rl_queue_init(entries, cq, SETUP_FLAGS_DEFAULT if flags is None else flags, ring)
        if rc == -errno.EINVAL and flags is None:
            rc = lib.rl_queue_init(entries, cq, 0, ring)
        if rc < 0:
            raise _unavailable(-rc, entries)
        self._ring = ring
        self.address = int(ffi.cast("uintptr_t", ring))
        self._batch = Completions(COMPLETIONS_PER_PASS_MAX)
        self.entries = entries
        self.flags: int = lib.rl_setup_flags(ring)

    # --- prep ------------------------------------------------------------------------------------
    # Each: check the user_data is free, one C call, then keep the memory the kernel will touch.

    def prep_nop(self, user_data: int, *, link: bool = False) -> None:
        """A no-op; its CQE has res 0. For measuring and for waking the loop."""
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_nop(self._ring, user_data, link)
        if rc:
            _raise(rc, "prep_nop")
        self._refs[user_data] = None

    def prep_accept(
        self, fd: int, user_data: int, multishot: bool = True, *, link: bool = False, sock_flags: int = 0
    ) -> None:
        """accept4(fd) (multishot: one CQE per connection, res = new fd, until an error or cancel)."""
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_accept(self._ring, fd, multishot, sock_flags, user_data, link)
        if rc:
            _raise(rc, "prep_accept")
        self._refs[user_data] = None

    def prep_recv(self, fd: int, buf: bytearray | memoryview, user_data: int, *, link: bool = False) -> None:
        """One recv(fd) into `buf` (writable); res = bytes received, 0 at EOF."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        cbuf = _from_buffer(buf, require_writable=True)
        rc = _prep_recv(self._ring, fd, cbuf, len(cbuf), user_data, link)
        if rc:
            _raise(rc, "prep_recv")
        refs[user_data] = cbuf

    def prep_recv_multishot(self, fd: int, group: BufferRing, user_data: int, *, link: bool = False) -> None:
        """recv(fd) repeatedly into buffers picked from `group`; each CQE with F_BUFFER names one.

        The kernel ends it (final CQE, no F_MORE) at EOF (res 0), on an error, on cancel, and with
        -ENOBUFS when `group` has no free buffer: give buffers back and prep it again.
        """
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        rc = _prep_recv_multishot(self._ring, fd, group.group_id, user_data, link)
        if rc:
            _raise(rc, "prep_recv_multishot")
        refs[user_data] = group

    def prep_send(
        self, fd: int, data: bytes | bytearray | memoryview, user_data: int, *, link: bool = False
    ) -> None:
        """send(fd, data, MSG_NOSIGNAL); res = bytes sent, which may be fewer than len(data)."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        cbuf = _from_buffer(data)
        rc = _prep_send(self._ring, fd, cbuf, len(cbuf), user_data, link)
        if rc:
            _raise(rc, "prep_send")
        refs[user_data] = cbuf

    def prep_sendmsg(
        self,
        fd: int,
        buffers: Sequence[bytes | bytearray | memoryview],
        user_data: int,
        *,
        link: bool = False,
    ) -> None:
        """sendmsg(fd) of `buffers` back to back (one iovec each); a short send is possible."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        cbufs = [_from_buffer(b) for b in buffers]
        n = len(cbufs)
        mem = _new("char[]", _msg_bytes(n))
        rc = _prep_sendmsg(self._ring, fd, mem, cbufs, [len(c) for c in cbufs], n, user_data, link)
        if rc:
            _raise(rc, "prep_sendmsg")
        refs[user_data] = (mem, cbufs)

    def prep_writev(
        self,
        fd: int,
        buffers: Sequence[bytes | bytearray | memoryview],
        offset: int,
        user_data: int,
        *,
        link: bool = False,
    ) -> None:
        """pwritev(fd, buffers, offset) (offset -1: the file position); res = bytes written."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        cbufs = [_from_buffer(b) for b in buffers]
        n = len(cbufs)
        mem = _new("char[]", _iov_bytes(n) or 1)
        rc = _prep_writev(self._ring, fd, mem, cbufs, [len(c) for c in cbufs], n, offset, user_data, link)
        if rc:
            _raise(rc, "prep_writev")
        refs[user_data] = (mem, cbufs)

    def prep_read(
        self, fd: int, buf: bytearray | memoryview, offset: int, user_data: int, *, link: bool = False
    ) -> None:
        """pread(fd, buf, offset) (offset -1: the file position); res = bytes read, 0 past EOF."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        cbuf = _from_buffer(buf, require_writable=True)
        rc = _prep_read(self._ring, fd, cbuf, len(cbuf), offset, user_data, link)
        if rc:
            _raise(rc, "prep_read")
        refs[user_data] = cbuf

    def prep_fsync(self, fd: int, user_data: int, datasync: bool = True, *, link: bool = False) -> None:
        """fdatasync(fd) (datasync=True) or fsync(fd); res 0 or -errno."""
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_fsync(self._ring, fd, datasync, user_data, link)
        if rc:
            _raise(rc, "prep_fsync")
        self._refs[user_data] = None

    def prep_splice(
        self,
        fd_in: int,
        off_in: int,
        fd_out: int,
        off_out: int,
        nbytes: int,
        user_data: int,
        flags: int = 0,
        *,
        link: bool = False,
    ) -> None:
        """splice(2) without the bytes passing through Python; one side must be a pipe.

        An offset of -1 means the current position (and must be -1 for a pipe).
        """
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_splice(self._ring, fd_in, off_in, fd_out, off_out, nbytes, flags, user_data, link)
        if rc:
            _raise(rc, "prep_splice")
        self._refs[user_data] = None

    def prep_timeout(self, seconds: float, user_data: int, *, link: bool = False) -> None:
        """A timer: its CQE comes after `seconds` with res -ETIME (or -ECANCELED if cancelled)."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        ts = _new("struct __kernel_timespec *")
        sec, nsec = _seconds(seconds)
        rc = _prep_timeout(self._ring, ts, sec, nsec, user_data, link)
        if rc:
            _raise(rc, "prep_timeout")
        refs[user_data] = ts

    def prep_link_timeout(self, seconds: float, user_data: int) -> None:
        """Cancel the previous SQE (prepped with link=True) if it has not completed in `seconds`.

        On expiry the op gets -ECANCELED and this CQE -ETIME; if the op completes first, this
        CQE has res -ECANCELED (the timer was cancelled); 0 is possible on races.
        """
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        ts = _new("struct __kernel_timespec *")
        sec, nsec = _seconds(seconds)
        rc = _prep_link_timeout(self._ring, ts, sec, nsec, user_data)
        if rc:
            _raise(rc, "prep_link_timeout")
        refs[user_data] = ts

    def prep_cancel(self, target_user_data: int, user_data: int, *, link: bool = False) -> None:
        """Cancel the op `target_user_data`: res 0 (it will end with -ECANCELED), -ENOENT, -EALREADY."""
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_cancel(self._ring, target_user_data, user_data, link)
        if rc:
            _raise(rc, "prep_cancel")
        self._refs[user_data] = None

    def prep_poll(self, fd: int, mask: int, user_data: int, *, link: bool = False) -> None:
        """Wait once until `fd` is ready for `mask` (select.POLLIN, POLLOUT...): res = the events
        that are (POLLERR and POLLHUP come whatever the mask), or -errno."""
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_poll_add(self._ring, fd, mask, user_data, link)
        if rc:
            _raise(rc, "prep_poll")
        self._refs[user_data] = None

    def prep_close(self, fd: int, user_data: int, *, link: bool = False) -> None:
        """close(fd) in the kernel's order of this ring's ops; res 0 or -errno."""
        assert user_data not in self._refs, f"user_data {user_data} already in flight"
        rc = _prep_close(self._ring, fd, user_data, link)
        if rc:
            _raise(rc, "prep_close")
        self._refs[user_data] = None

    def prep_connect(
        self,
        fd: int,
        address: tuple[str, int] | tuple[str, int, int, int],
        user_data: int,
        *,
        link: bool = False,
    ) -> None:
        """connect(fd, address) for a TCP socket: `address` as the socket module has it, (host,
        port) for IPv4 or (host, port[, flowinfo, scope_id]) for IPv6, the host an IP literal (no
        name lookup: that would block). res 0 once connected, or -errno (-ECONNREFUSED, ...).
        A non-blocking socket is fine: the kernel waits for the handshake, not the caller.
        Raises ValueError for a host that is not an IP address of either family."""
        refs = self._refs
        assert user_data not in refs, f"user_data {user_data} already in flight"
        host, port = address[0], address[1]
        flowinfo = scope_id = 0
        try:
            family, packed = socket.AF_INET, socket.inet_pton(socket.AF_INET, host)
        except OSError:
            try:
                family, packed = socket.AF_INET6, socket.inet_pton(socket.AF_INET6, host)
            except OSError:
                raise ValueError(f"not an IPv4 or IPv6 address: {host!r}") from None
            if len(address) == 4:
                flowinfo, scope_id = address[2], address[3]
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"not a port: {port}")
        mem = _new("char[]", _SOCKADDR_BYTES)  # the kernel reads it when the connect runs
        rc = _prep_connect(self._ring, fd, mem, family, packed, port, flowinfo, scope_id, user_data, link)
        if rc:
            _raise(rc, "prep_connect")
        refs[user_data] = mem

    # --- submit and reap -------------------------------------------------------------------------

    def submit(self) -> int:
        """Submit the prepped SQEs without waiting; returns how many the kernel took."""
        rc = _submit(self._ring)
        if rc < 0:
            if rc == -errno.EINTR:
                return 0
            _raise(rc, "io_uring_submit")
        return rc

    def submit_and_wait(self, wait_nr: int = 1, timeout: float | None = None) -> int:
        """Submit, then wait until `wait_nr` CQEs are ready or `timeout` seconds pass (None: block).

        Returns the number submitted; a timeout or a signal is not an error (returns 0).
        """
        if timeout is None:
            rc = _submit_and_wait(self._ring, wait_nr)
        else:
            sec, nsec = _seconds(timeout)
            rc = _submit_and_wait_timeout(self._ring, wait_nr, sec, nsec)
        if rc < 0:
            if rc in _NOT_ERRORS:
                return 0
            _raise(rc, "io_uring_submit_and_wait")
        return rc

    def completions(self, max_count: int = CQE_BATCH_MAX) -> list[tuple[int, int, int]]:
        """Reap up to `max_count` ready CQEs (at most `COMPLETIONS_PER_PASS_MAX`) as
        (user_data, res, flags), in one C call (native/loop.c, as `run_completions` reaps).

        Releases the references of every final CQE (no CQE_F_MORE): after this returns, the
        caller may reuse those user_datas and the kernel no longer touches their buffers.
        """
        return self._batch.reap(self.address, self._refs, max_count)

    def run_completions(self, continuations: dict[int, Callable[[int, int], None]], max_count: int) -> int:
        """Reap up to `max_count` ready CQEs, then call `continuations[user_data](res, flags)` for
        each in order, in one C call (native/loop.c): how many were reaped.

        The references of every final CQE are dropped before any continuation runs (as in
        `completions`); a final CQE's continuation is popped from `continuations`, one with
        CQE_F_MORE stays; a user_data with none is skipped. A continuation that raises ends the
        call (the rest of the batch does not run). `unrun` counts what is left meanwhile.
        """
        return self._batch.run(self.address, continuations, self._refs, max_count)

    @property
    def unrun(self) -> int:
        """Completions that the `run_completions` running now reaped and has not run yet."""
        return self._batch.rest

    @property
    def inflight(self) -> int:
        """Operations whose final CQE has not been reaped yet (their buffers are still held)."""
        return len(self._refs)

    def is_inflight(self, user_data: int) -> bool:
        """Whether `user_data` names an operation still in flight (so it cannot be reused yet)."""
        return user_data in self._refs

    @property
    def sq_space_left(self) -> int:
        """Free SQ slots before the next prep would submit on its own."""
        return lib.rl_sq_space_left(self._ring) if self._ring != _NULL else 0

    @property
    def cq_quiet(self) -> bool:
        """Whether nothing waits to be reaped: no CQE ready, none overflowed, and no task work
        (with COOP_TASKRUN, a completion such as a socket's data can be task work until the next
        enter: the TASKRUN flag says so; a ring set up with DEFER_TASKRUN does not flag it)."""
        return self._ring == _NULL or bool(lib.rl_cq_quiet(self._ring))

    @property
    def sq_ready(self) -> int:
        """SQEs prepped but not yet submitted."""
        return lib.rl_sq_ready(self._ring) if self._ring != _NULL else 0

    @property
    def closed(self) -> bool:
        return self._ring == _NULL

    # --- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what is in flight, wait for it (bounded), then io_uring_queue_exit. Idempotent."""
        ring = self._ring
        if ring == _NULL:
            return
        if self._refs:
            self._drain()
        self._ring = _NULL
        self.address = 0
        lib.rl_queue_exit(ring)
        if self._refs:
            _LEAKED.append(self._refs)
            self._refs = {}

    def _drain(self) -> None:
        """Cancel every op and reap until none is in flight or CLOSE_DRAIN_SECONDS pass."""
        ring = self._ring
        if lib.rl_prep_cancel_all(ring, CLOSE_CANCEL_USER_DATA) < 0:
            return
        deadline = time.monotonic() + CLOSE_DRAIN_SECONDS
        while self._refs:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sec, nsec = _seconds(min(left, 0.05))
            rc = _submit_and_wait_timeout(ring, 1, sec, nsec)
            if rc < 0 and rc not in _NOT_ERRORS:
                return
            self.completions()

    def __enter__(self) -> Ring:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_ring", _NULL) != _NULL:
            self.close()


class BufferRing:
    """A provided-buffer ring: `count` buffers of `size` bytes the kernel picks from for recv.

    liburing 2.3 offers io_uring_register_buf_ring (not setup_buf_ring, which is 2.4): the ring
    entries and buffers are one page-aligned mmap made in C, registered as group `group_id`.
    A CQE with CQE_F_BUFFER names the buffer holding its data; it stays the caller's until
    `take()` (or `give_back()`) returns it to the kernel.
    """

    __slots__ = ("_b", "_mem", "_ring", "count", "group_id", "size")

    def __init__(self, ring: Ring, group_id: int, count: int, size: int) -> None:
        """Register `count` (a power of two) buffers of `size` bytes as buffer group `group_id`."""
        if count <= 0 or count & (count - 1) or count > BUFFER_RING_ENTRIES_MAX:
            raise ValueError(f"count must be a power of two up to {BUFFER_RING_ENTRIES_MAX}, got {count}")
        if not 0 <= group_id < 1 << 16:
            raise ValueError(f"group_id must fit 16 bits, got {group_id}")
        err = ffi.new("int *")
        b = lib.rl_bufring_new(ring._ring, group_id, count, size, err)
        if b == ffi.NULL:
            raise OSError(-err[0], f"io_uring_register_buf_ring(group {group_id}): {_errno_name(-err[0])}")
        self._b = b
        self._ring = ring
        self._mem = ffi.buffer(b.base, count * size)
        self.group_id = group_id
        self.count = count
        self.size = size

    @staticmethod
    def buffer_id(cqe_flags: int) -> int:
        """The buffer id a CQE names (valid when cqe_flags has CQE_F_BUFFER)."""
        return cqe_flags >> CQE_BUFFER_SHIFT

    def take(self, cqe_flags: int, length: int) -> bytes:
        """Copy `length` bytes out of the CQE's buffer and give the buffer back to the kernel."""
        bid = cqe_flags >> CQE_BUFFER_SHIFT
        start = bid * self.size
        data = self._mem[start : start + length]
        _bufring_give(self._b, bid)
        return data

    def view(self, cqe_flags: int, length: int) -> memoryview:
        """The CQE's bytes without a copy; valid only until `give_back(cqe_flags)`."""
        start = (cqe_flags >> CQE_BUFFER_SHIFT) * self.size
        return memoryview(self._mem)[start : start + length]

    def give_back(self, cqe_flags: int) -> None:
        """Return the CQE's buffer to the kernel (after `view`); do not use its view afterwards."""
        _bufring_give(self._b, cqe_flags >> CQE_BUFFER_SHIFT)

    def close(self) -> None:
        """Unregister the group and unmap its memory. No recv may still be armed on it. Idempotent."""
        b = self._b
        if b is None:
            return
        self._b = None
        self._mem = None
        lib.rl_bufring_free(self._ring._ring, b)

    def __del__(self) -> None:
        if getattr(self, "_b", None) is not None:
            self.close()

    def __enter__(self) -> BufferRing:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
