"""The io_uring bindings (`native.ring`) against the real thing: files in tmp_path, pipes, TCP and
Unix sockets, on the running kernel.

Every test drives its operations through a `Ring` and checks both the CQE (res, flags) and the
effect outside the ring (bytes in the file or on the peer socket, a closed fd). `reap` waits for
the final CQE of each named user_data and returns every CQE seen, in order, per user_data.
"""

from __future__ import annotations

import errno
import gc
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from native import CQE_F_BUFFER, CQE_F_MORE, BufferRing, Ring, RingUnavailable, probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")


@pytest.fixture
def ring() -> Iterator[Ring]:
    with Ring(64) as r:
        yield r


def reap(ring: Ring, user_datas: Iterable[int], timeout: float = 5.0) -> dict[int, list[tuple[int, int]]]:
    """Submit and collect CQEs until each of `user_datas` had its final CQE (no CQE_F_MORE)."""
    pending = set(user_datas)
    seen: dict[int, list[tuple[int, int]]] = {}
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        assert left > 0, f"no final CQE for {sorted(pending)} within {timeout}s; seen {seen}"
        ring.submit_and_wait(1, timeout=min(left, 0.5))
        for ud, res, flags in ring.completions():
            seen.setdefault(ud, []).append((res, flags))
            if not flags & CQE_F_MORE:
                pending.discard(ud)
    return seen


def final(seen: dict[int, list[tuple[int, int]]], ud: int) -> int:
    """The res of `ud`'s final CQE."""
    res, flags = seen[ud][-1]
    assert not flags & CQE_F_MORE
    return res


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nop_round_trip(ring: Ring) -> None:
    for ud in (1, 2, 3):
        ring.prep_nop(ud)
    assert ring.inflight == 3
    assert ring.submit_and_wait(3) == 3
    assert sorted(ring.completions()) == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]
    assert ring.inflight == 0


def test_full_sq_is_submitted_by_prep() -> None:
    with Ring(4) as ring:
        for ud in range(10):
            ring.prep_nop(ud)
        seen = reap(ring, range(10))
    assert sorted(seen) == list(range(10))


def test_writev_at_offset_read_back_and_sync(ring: Ring, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        parts = [b"hello ", bytearray(b"io_uring "), memoryview(b"world")]
        ring.prep_writev(fd, parts, 4096, 1, link=True)
        ring.prep_fsync(fd, 2, datasync=True, link=True)
        ring.prep_fsync(fd, 3, datasync=False)
        seen = reap(ring, (1, 2, 3))
        assert final(seen, 1) == 20
        assert final(seen, 2) == 0
        assert final(seen, 3) == 0
        assert os.pread(fd, 20, 4096) == b"hello io_uring world"
        assert os.pread(fd, 4096, 0) == bytes(4096)  # the hole before the offset

        buf = bytearray(20)
        ring.prep_read(fd, buf, 4096, 4)
        past_eof = bytearray(8)
        ring.prep_read(fd, past_eof, 1 << 20, 5)
        seen = reap(ring, (4, 5))
        assert final(seen, 4) == 20
        assert buf == b"hello io_uring world"
        assert final(seen, 5) == 0
        assert past_eof == bytes(8)
    finally:
        os.close(fd)


def test_accept_multishot_accepts_several_connections(ring: Ring) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    clients = []
    accepted: list[int] = []
    try:
        ring.prep_accept(listener.fileno(), 7)
        ring.submit()
        for _ in range(3):
            clients.append(socket.create_connection(listener.getsockname()))
        deadline = time.monotonic() + 5
        while len(accepted) < 3:
            assert time.monotonic() < deadline, f"accepted only {accepted}"
            ring.submit_and_wait(1, timeout=0.5)
            for ud, res, flags in ring.completions():
                assert ud == 7
                assert res >= 0, os.strerror(-res)
                assert flags & CQE_F_MORE  # still armed for the next connection
                accepted.append(res)
        peers = {socket.socket(fileno=os.dup(fd)).getpeername() for fd in accepted}
        assert peers == {c.getsockname() for c in clients}
        assert ring.inflight == 1  # the multishot accept stays armed
        ring.prep_cancel(7, 8)
        seen = reap(ring, (7, 8))
        assert final(seen, 8) == 0
        assert final(seen, 7) == -errno.ECANCELED
        assert ring.inflight == 0
    finally:
        for fd in accepted:
            os.close(fd)
        for c in clients:
            c.close()
        listener.close()


def test_recv_single_shot_and_eof(ring: Ring, pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    buf = bytearray(64)
    ring.prep_recv(a.fileno(), buf, 1)
    ring.submit()
    b.sendall(b"ping")
    assert final(reap(ring, (1,)), 1) == 4
    assert buf[:4] == b"ping"
    ring.prep_recv(a.fileno(), memoryview(buf)[8:], 2)
    b.shutdown(socket.SHUT_WR)
    assert final(reap(ring, (2,)), 2) == 0  # EOF


def test_recv_multishot_reuses_provided_buffers(
    ring: Ring, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    with BufferRing(ring, group_id=1, count=4, size=16) as group:
        ring.prep_recv_multishot(a.fileno(), group, 9)
        ring.submit()
        got: list[bytes] = []
        bids: list[int] = []
        for i in range(10):  # more messages than buffers: only reuse makes this work
            msg = f"message-{i}".encode()
            b.sendall(msg)
            deadline = time.monotonic() + 5
            received = b""
            while received != msg:
                assert time.monotonic() < deadline
                ring.submit_and_wait(1, timeout=0.5)
                for ud, res, flags in ring.completions():
                    assert (ud, res > 0) == (9, True), (ud, res)
                    assert flags & CQE_F_BUFFER
                    assert flags & CQE_F_MORE
                    bids.append(group.buffer_id(flags))
                    received += group.take(flags, res)
            got.append(received)
        assert got == [f"message-{i}".encode() for i in range(10)]
        assert set(bids) <= {0, 1, 2, 3}
        assert len(bids) > 4
        assert ring.inflight == 1
        b.shutdown(socket.SHUT_WR)
        seen = reap(ring, (9,))
        assert final(seen, 9) == 0  # EOF ends the multishot
        assert ring.inflight == 0


def test_recv_multishot_out_of_buffers_ends_with_enobufs_and_rearms(
    ring: Ring, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    payload = bytes(range(64))  # 4x what the buffer ring holds
    b.sendall(payload)
    with BufferRing(ring, group_id=3, count=2, size=8) as group:
        ring.prep_recv_multishot(a.fileno(), group, 1)
        seen = reap(ring, (1,))[1]
        # What 6.18 does: fill every free buffer, then end the multishot with -ENOBUFS (no F_MORE);
        # the rest stays in the socket.
        data = [(res, flags) for res, flags in seen if res > 0]
        assert [res for res, _ in data] == [8, 8]
        assert all(flags & CQE_F_BUFFER and flags & CQE_F_MORE for _, flags in data)
        assert seen[-1] == (-errno.ENOBUFS, 0)
        received = b"".join(group.take(flags, res) for res, flags in data)
        # Buffers given back: re-arming continues where it stopped, until the payload is in.
        ud = 1
        while len(received) < len(payload):
            if not ring.is_inflight(ud):
                ud += 1
                assert ud < 10, "re-armed too often"
                ring.prep_recv_multishot(a.fileno(), group, ud)
            ring.submit_and_wait(1, timeout=1)
            for cud, res, flags in ring.completions():
                assert cud == ud
                if flags & CQE_F_BUFFER:
                    received += group.take(flags, res)
                else:
                    assert res == -errno.ENOBUFS
        ring.prep_cancel(ud, 100)
        reap(ring, (ud, 100))
        assert received == payload


def test_send_and_large_vectored_sendmsg_with_short_sends(
    ring: Ring, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    ring.prep_send(a.fileno(), b"small", 1)
    assert final(reap(ring, (1,)), 1) == 5
    assert b.recv(16) == b"small"

    parts = [os.urandom(1 << 20), bytearray(os.urandom(3 << 20)), memoryview(os.urandom(1 << 19)), b"end"]
    total = b"".join(parts)
    sink = bytearray()

    def drain() -> None:
        while len(sink) < len(total):
            chunk = b.recv(1 << 16)
            if not chunk:
                return
            sink.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    sent, sends, ud = 0, 0, 100
    view = memoryview(total)
    remaining: list[bytes | bytearray | memoryview] = list(parts)
    while sent < len(total):
        ring.prep_sendmsg(a.fileno(), remaining, ud)
        res = final(reap(ring, (ud,)), ud)
        assert res > 0, os.strerror(-res)
        sent += res
        sends += 1
        ud += 1
        remaining = [view[sent:]]  # a short send continues from where it stopped
    reader.join(10)
    assert bytes(sink) == total
    assert sends >= 1


def test_splice_file_to_pipe_to_socket(
    ring: Ring, tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    content = os.urandom(300_000)
    path = tmp_path / "data"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    pr, pw = os.pipe()
    sink = bytearray()

    def drain() -> None:
        while len(sink) < len(content):
            chunk = b.recv(1 << 16)
            if not chunk:
                return
            sink.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        pos, ud = 0, 1
        while pos < len(content):
            ring.prep_splice(fd, pos, pw, -1, min(1 << 16, len(content) - pos), ud)
            moved = final(reap(ring, (ud,)), ud)
            assert moved > 0, os.strerror(-moved)
            pos += moved
            ud += 1
            while moved:
                ring.prep_splice(pr, -1, a.fileno(), -1, moved, ud)
                out = final(reap(ring, (ud,)), ud)
                assert out > 0, os.strerror(-out)
                moved -= out
                ud += 1
        reader.join(10)
        assert bytes(sink) == content
    finally:
        for f in (fd, pr, pw):
            os.close(f)


def test_timeout_fires_with_etime(ring: Ring) -> None:
    start = time.monotonic()
    ring.prep_timeout(0.02, 1)
    assert final(reap(ring, (1,)), 1) == -errno.ETIME
    assert time.monotonic() - start >= 0.015


def test_link_timeout_cancels_a_recv_that_gets_nothing(
    ring: Ring, pair: tuple[socket.socket, socket.socket]
) -> None:
    a, b = pair
    ring.prep_recv(a.fileno(), bytearray(16), 1, link=True)
    ring.prep_link_timeout(0.02, 2)
    seen = reap(ring, (1, 2))
    assert final(seen, 1) == -errno.ECANCELED
    assert final(seen, 2) in (-errno.ETIME, 0)

    # Data in time: the recv completes and the timer is cancelled instead.
    b.sendall(b"x")
    ring.prep_recv(a.fileno(), bytearray(16), 3, link=True)
    ring.prep_link_timeout(5, 4)
    seen = reap(ring, (3, 4))
    assert final(seen, 3) == 1
    assert final(seen, 4) == -errno.ECANCELED


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_connect_ipv4_and_ipv6_then_refused(ring: Ring, family: int, host: str) -> None:
    try:
        listener = socket.create_server((host, 0), family=family)
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    with listener:
        port = listener.getsockname()[1]
        client = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        with client:
            # The sockaddr is built in C and held by the ring: nothing of the caller's is needed
            # once the prep returns (a collection here would free a buffer we failed to keep).
            ring.prep_connect(client.fileno(), (host, port), 1)
            gc.collect()
            assert final(reap(ring, (1,)), 1) == 0
            accepted, peer = listener.accept()
            with accepted:
                assert peer[:2] == client.getsockname()[:2]
                client.setblocking(True)
                client.sendall(b"hello")
                assert accepted.recv(16) == b"hello"
    # Nobody listens on that port now: the CQE says so, no exception is raised.
    refused = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    with refused:
        ring.prep_connect(refused.fileno(), (host, port), 2)
        assert final(reap(ring, (2,)), 2) == -errno.ECONNREFUSED


def test_connect_wants_an_ip_literal(ring: Ring) -> None:
    with socket.socket() as s:
        with pytest.raises(ValueError, match="not an IPv4 or IPv6 address"):
            ring.prep_connect(s.fileno(), ("localhost", 80), 1)
        assert not ring.is_inflight(1)


def test_cancel_of_an_inflight_recv(ring: Ring, pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    ring.prep_recv(a.fileno(), bytearray(16), 1)
    ring.submit()
    ring.prep_cancel(1, 2)
    seen = reap(ring, (1, 2))
    assert final(seen, 2) == 0
    assert final(seen, 1) == -errno.ECANCELED
    ring.prep_cancel(12345, 3)
    assert final(reap(ring, (3,)), 3) == -errno.ENOENT


def test_close_of_an_fd(ring: Ring, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "c", os.O_WRONLY | os.O_CREAT, 0o644)
    ring.prep_close(fd, 1)
    assert final(reap(ring, (1,)), 1) == 0
    with pytest.raises(OSError) as exc:
        os.fstat(fd)
    assert exc.value.errno == errno.EBADF


def test_errors_come_back_as_negative_errno(ring: Ring, tmp_path: Path) -> None:
    fd = os.open(tmp_path / "e", os.O_WRONLY | os.O_CREAT, 0o644)
    pr, pw = os.pipe()
    bad = os.dup(fd)
    os.close(bad)  # a number that is certainly not open (this test opens nothing after it)
    try:
        ring.prep_writev(bad, [b"x"], 0, 1)
        ring.prep_read(fd, bytearray(4), 0, 2)  # a write-only fd
        ring.prep_send(fd, b"x", 3)  # not a socket
        ring.prep_fsync(pr, 4)  # a pipe cannot be synced
        ring.prep_close(bad, 5)
        seen = reap(ring, range(1, 6))
        assert final(seen, 1) == -errno.EBADF
        assert final(seen, 2) == -errno.EBADF
        assert final(seen, 3) == -errno.ENOTSOCK
        assert final(seen, 4) == -errno.EINVAL
        assert final(seen, 5) == -errno.EBADF
    finally:
        for f in (fd, pr, pw):
            os.close(f)


class _Buf(bytearray):
    """A bytearray that can be weakly referenced, to see when the ring lets go of it."""


def test_buffers_are_held_until_the_final_cqe(ring: Ring, pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    buf = _Buf(16)
    alive = weakref.ref(buf)
    ring.prep_recv(a.fileno(), buf, 1)
    ring.submit()
    del buf
    gc.collect()
    assert alive() is not None  # the kernel may still write into it
    assert ring.inflight == 1
    b.sendall(b"data")
    assert final(reap(ring, (1,)), 1) == 4
    assert ring.inflight == 0
    gc.collect()
    assert alive() is None

    payload = os.urandom(100)
    before = sys.getrefcount(payload)
    ring.prep_sendmsg(a.fileno(), [payload, payload], 2)
    assert sys.getrefcount(payload) == before + 2
    assert final(reap(ring, (2,)), 2) == 200
    assert sys.getrefcount(payload) == before
    assert b.recv(256) == payload * 2

    # A multishot op keeps its user_data in flight across CQEs with F_MORE.
    with BufferRing(ring, group_id=5, count=2, size=32) as group:
        ring.prep_recv_multishot(a.fileno(), group, 3)
        ring.submit()
        b.sendall(b"one")
        ring.submit_and_wait(1, timeout=2)
        [(ud, res, flags)] = ring.completions()
        assert (ud, group.take(flags, res)) == (3, b"one")
        assert flags & CQE_F_MORE
        assert ring.inflight == 1
        ring.prep_cancel(3, 4)
        reap(ring, (3, 4))
        assert ring.inflight == 0


def test_user_data_in_flight_cannot_be_reused(ring: Ring) -> None:
    ring.prep_nop(5)
    with pytest.raises(AssertionError, match="already in flight"):
        ring.prep_nop(5)
    with pytest.raises(AssertionError, match="already in flight"):
        ring.prep_timeout(1, 5)
    reap(ring, (5,))
    ring.prep_nop(5)  # free again after its final CQE
    reap(ring, (5,))


def test_submit_and_wait_timeout_returns_zero_on_time(ring: Ring) -> None:
    start = time.monotonic()
    assert ring.submit_and_wait(1, timeout=0.02) == 0
    assert 0.015 <= time.monotonic() - start < 2
    assert ring.completions() == []


def test_close_cancels_what_is_in_flight_and_is_idempotent(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _b = pair
    ring = Ring(8)
    buf = _Buf(16)
    alive = weakref.ref(buf)
    ring.prep_recv(a.fileno(), buf, 1)
    ring.prep_timeout(60, 2)
    ring.submit()
    del buf
    start = time.monotonic()
    ring.close()
    assert time.monotonic() - start < 0.5  # cancelled, not waited out
    assert ring.inflight == 0
    gc.collect()
    assert alive() is None  # released only after the kernel finished with it
    ring.close()
    with pytest.raises(OSError) as exc:
        ring.prep_nop(1)
    assert exc.value.errno == errno.EBADF


@pytest.mark.exclusive
def test_ring_creation_failure_names_io_uring_disabled() -> None:
    path = Path("/proc/sys/kernel/io_uring_disabled")
    if not path.exists():
        pytest.skip(f"{path} does not exist on this kernel (older than 6.6)")
    if os.geteuid() != 0:
        pytest.skip("needs root to set /proc/sys/kernel/io_uring_disabled")
    old = path.read_text().strip()
    try:
        path.write_text("2")
        with pytest.raises(RingUnavailable) as exc:
            Ring(8)
        assert exc.value.errno == errno.EPERM
        assert "EPERM" in str(exc.value)
        assert "io_uring_disabled=2" in str(exc.value)
        reason = probe()
        assert reason is not None
        assert "io_uring_disabled=2" in reason
    finally:
        path.write_text(old)
    assert probe() is None


# --- run_completions: the loop's per-completion step in C (native/loop.c) ----------------------


def _nops(ring: Ring, user_datas: Iterable[int]) -> None:
    """Prep a NOP per user_data and wait until all of them have completed (none reaped)."""
    uds = list(user_datas)
    for ud in uds:
        ring.prep_nop(ud)
    ring.submit_and_wait(len(uds), timeout=5)
    assert not ring.cq_quiet


def test_run_completions_calls_each_continuation_in_order_and_pops_the_final_ones(ring: Ring) -> None:
    calls: list[tuple[str, int, int, int, int]] = []

    def continuation(name: str) -> object:
        def run(res: int, flags: int) -> None:
            # By now every final CQE of the batch has given its references back, and `unrun`
            # counts what is still to run after this one.
            calls.append((name, res, flags, ring.inflight, ring.unrun))

        return run

    ops = {1: continuation("a"), 2: continuation("b"), 3: continuation("c"), 9: continuation("not armed")}
    _nops(ring, (1, 2, 4, 3))  # 4 has no continuation: skipped
    assert ring.inflight == 4
    assert ring.run_completions(ops, 64) == 4
    assert calls == [("a", 0, 0, 0, 3), ("b", 0, 0, 0, 2), ("c", 0, 0, 0, 0)]
    assert set(ops) == {9}  # final CQEs pop their continuation; the one not completed stays
    assert ring.unrun == 0
    assert ring.run_completions(ops, 64) == 0  # nothing ready: nothing reaped or run


def test_run_completions_reaps_at_most_max_count(ring: Ring) -> None:
    ran: list[int] = []
    ops = {ud: (lambda res, flags, ud=ud: ran.append(ud)) for ud in range(1, 6)}
    _nops(ring, range(1, 6))
    assert ring.run_completions(ops, 2) == 2
    assert ran == [1, 2]
    assert ring.run_completions(ops, 64) == 3
    assert ran == [1, 2, 3, 4, 5]
    assert not ops and ring.inflight == 0


def test_run_completions_keeps_a_multishot_continuation_until_its_final_cqe(ring: Ring) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[tuple[int, int]] = []
    ops = {7: lambda res, flags: seen.append((res, flags))}
    clients = []
    try:
        ring.prep_accept(listener.fileno(), 7)
        ring.submit()
        for _ in range(2):
            clients.append(socket.create_connection(listener.getsockname()))
        deadline = time.monotonic() + 5
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"accepted only {seen}"
            ring.submit_and_wait(1, timeout=0.5)
            ring.run_completions(ops, 64)
        assert all(res >= 0 and flags & CQE_F_MORE for res, flags in seen)
        assert 7 in ops and ring.inflight == 1  # still armed: continuation and references kept
        ring.prep_cancel(7, 8)
        ops[8] = lambda res, flags: None
        deadline = time.monotonic() + 5
        while 7 in ops:
            assert time.monotonic() < deadline, "the cancelled accept never ended"
            ring.submit_and_wait(1, timeout=0.5)
            ring.run_completions(ops, 64)
        assert seen[-1] == (-errno.ECANCELED, 0)
        assert ring.inflight == 0 and not ops
    finally:
        for res, _ in seen[:-1]:
            os.close(res)
        for c in clients:
            c.close()
        listener.close()


def test_run_completions_stops_at_a_continuation_that_raises(ring: Ring) -> None:
    ran: list[int] = []

    def boom(res: int, flags: int) -> None:
        raise RuntimeError("continuation failed")

    ops = {1: lambda res, flags: ran.append(1), 2: boom, 3: lambda res, flags: ran.append(3)}
    _nops(ring, (1, 2, 3))
    with pytest.raises(RuntimeError, match="continuation failed"):
        ring.run_completions(ops, 64)
    assert ran == [1]  # the rest of the batch is not run, as the Python loop did not run it
    assert ring.inflight == 0  # but it was reaped: its references are given back all the same
    assert ring.unrun == 1


def test_run_completions_survives_a_continuation_that_closes_the_ring() -> None:
    r = Ring(16)
    ran: list[int] = []

    def close(res: int, flags: int) -> None:
        ran.append(1)
        r.close()

    ops = {1: close, 2: lambda res, flags: ran.append(2)}
    _nops(r, (1, 2))
    assert r.run_completions(ops, 64) == 2  # the batch was reaped before the ring was closed
    assert ran == [1, 2]
    assert r.address == 0 and r.run_completions(ops, 64) == 0  # a closed ring reaps nothing


def test_run_completions_takes_only_dicts(ring: Ring) -> None:
    with pytest.raises(TypeError, match="dicts"):
        ring.run_completions([], 64)  # type: ignore[arg-type]
