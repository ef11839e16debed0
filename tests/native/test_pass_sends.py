"""The end of a pass's sends on a real ring (`PassSends`, broker/backends/uring_stream.py): one
stream written outside its receive is sent by a `sendmsg` on the loop before the pass ends;
several are prepared as SQEs and leave together in the next pass's one submission, each whole
and in order."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from broker.backends.uring_loop import Loop
from broker.backends.uring_stream import PassSends, RingStream, SplicePipes
from native import Ring, probe

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")


class _Host:
    """What a stream uses of its worker: the ring, its loop, the (unused) splice pipes and the
    pass's sends."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.loop = Loop(ring)
        self.pipes = SplicePipes(lambda _: False, _never, _never, on=False)
        self.pass_sends = PassSends(self.loop)


def _never(*_: object) -> int:
    raise AssertionError("nothing is spliced with the pipes off")


class _Stream(RingStream):
    def received(self, data: memoryview) -> None:
        raise AssertionError("the tests never send to the stream")


@pytest.fixture
def host() -> Iterator[_Host]:
    with Ring(64) as ring:
        yield _Host(ring)


def _pairs(host: _Host, n: int) -> list[tuple[_Stream, socket.socket]]:
    """`n` streams on the ring, each with the socket at its other end (non-blocking)."""
    out = []
    for _ in range(n):
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        out.append((_Stream(host, ours.detach()), theirs))
    return out


def _pending(peer: socket.socket) -> bytes:
    """Everything the socket holds now."""
    got = bytearray()
    while True:
        try:
            chunk = peer.recv(1 << 16)
        except BlockingIOError:
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk


def _write_in_a_pass(host: _Host, writes: list[tuple[_Stream, bytes]]) -> None:
    """One loop pass in which `writes` are made outside any receive (as a woken long poll's
    answers are), then its end: what `PassSends` does with them."""
    host.loop.call_soon(lambda: [s.write([data]) for s, data in writes])
    host.loop.run_once()


def _close(host: _Host, pairs: list[tuple[_Stream, socket.socket]]) -> None:
    for stream, peer in pairs:
        stream.close()
        peer.close()
    while host.loop.pending_ops:
        host.loop.run_once()


def test_one_stream_is_sent_on_the_loop_before_the_pass_ends(host: _Host) -> None:
    pairs = _pairs(host, 1)
    (stream, peer), *_ = pairs
    _write_in_a_pass(host, [(stream, b"answer")])
    assert not stream.sending  # no sendmsg SQE: a sendmsg on the loop, done
    assert _pending(peer) == b"answer"
    _close(host, pairs)


def test_several_streams_leave_together_in_the_next_submission(host: _Host) -> None:
    pairs = _pairs(host, 3)
    writes = [(stream, f"answer {i}".encode() * 100) for i, (stream, _) in enumerate(pairs)]
    _write_in_a_pass(host, writes)
    # Prepared, not yet submitted: no peer has a byte, and each stream waits for its send.
    assert all(stream.sending for stream, _ in pairs)
    assert [_pending(peer) for _, peer in pairs] == [b"", b"", b""]
    host.loop.run_once()  # one io_uring_enter submits the three
    assert not any(stream.sending for stream, _ in pairs)
    assert all(stream.unsent_bytes == 0 for stream, _ in pairs)
    assert [_pending(peer) for _, peer in pairs] == [data for _, data in writes]
    _close(host, pairs)


def test_a_stream_written_twice_in_a_pass_sends_both_in_order(host: _Host) -> None:
    pairs = _pairs(host, 2)
    (a, pa), (b, pb) = pairs
    _write_in_a_pass(host, [(a, b"first "), (b, b"other"), (a, b"second")])
    host.loop.run_once()
    assert _pending(pa) == b"first second"
    assert _pending(pb) == b"other"
    _close(host, pairs)


def test_what_a_send_leaves_goes_next_in_order(host: _Host) -> None:
    """A peer that does not read: the socket's buffer takes part of a large answer, the rest
    follows as the peer reads, nothing lost or reordered."""
    pairs = _pairs(host, 2)
    (a, pa), (b, pb) = pairs
    big = bytes(range(256)) * 8192  # 2 MiB: more than a socketpair's buffer
    _write_in_a_pass(host, [(a, big), (b, b"small")])
    got = bytearray()
    for _ in range(10_000):
        got += _pending(pa)  # room for the rest, whose send completes in a next pass
        if not a.sending:
            break
        host.loop.run_once()
    got += _pending(pa)
    assert bytes(got) == big
    assert _pending(pb) == b"small"
    _close(host, pairs)
