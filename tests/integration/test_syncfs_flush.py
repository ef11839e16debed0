"""A group commit over many partitions syncs each file system once (syncfs) instead of each
partition's files, on both backends (broker/storage/fileio.py's `SYNCFS_MIN`): every
durable produce is answered and survives a restart; a syncfs that fails falls back to each
partition's own fdatasyncs, so a partition whose file fails gets the error and the others
succeed, and the core keeps their own syncs from then on; a turn over a few partitions keeps
their own syncs. A core served in this process, so
that its FileIO can fail and its counters be read; real files and real syncs."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from inprocess import BACKENDS, serve_with_wire

from broker.storage import layout
from broker.storage.fileio import SYNCFS_MIN, SyncFileIO
from labkit.brokerproc import Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

MANY = 80  # split over two turns, one of them still holds SYNCFS_MIN or more


class FailingSyncfs(SyncFileIO):
    """Every syncfs fails (EIO); so does the fdatasync of any file under `failing_dir`."""

    def __init__(self) -> None:
        self.syncfs_calls = 0
        self.failing_dir: str | None = None

    def syncfs(self, fd: int) -> None:
        self.syncfs_calls += 1
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def fdatasync(self, fd: int) -> None:
        if self.failing_dir is not None and os.readlink(f"/proc/self/fd/{fd}").startswith(self.failing_dir):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fdatasync(fd)


def _produce_together(w: Wire, tid: int, partitions: int, tag: bytes) -> list[m.ProduceResponse]:
    """One durable produce to each partition, all in one send; the replies, in order."""
    frames = [
        b"".join(
            m.encode_request(
                m.ProduceRequest(tid, p, m.Acks.DURABLE, 5000, encode_batch([tag + b"%d" % p])), 500 + p
            )
        )
        for p in range(partitions)
    ]
    w.sock.sendall(b"".join(frames))
    replies = []
    for _ in range(partitions):
        reply = w.recv()
        assert isinstance(reply, m.ProduceResponse)
        replies.append(reply)
    return replies


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_turn_over_many_partitions_syncs_the_file_system_once(tmp_path: Path, backend: str) -> None:
    seen: dict[str, object] = {}

    def client(w: Wire) -> None:
        tid = seen["tid"] = w.create_topic("many", MANY)
        seen["first"] = _produce_together(w, tid, MANY, b"a")
        seen["second"] = _produce_together(w, tid, MANY, b"b")

    server = serve_with_wire(backend, str(tmp_path / "data"), client)
    for key in ("first", "second"):
        replies = seen[key]
        assert [(r.error, r.base_offset) for r in replies] == [
            (m.ErrorCode.NONE, 0 if key == "first" else 1)
        ] * MANY  # type: ignore[attr-defined]
    metrics = server.core.metrics
    assert metrics.flush_syncfs >= 2 * SYNCFS_MIN, (metrics.flush_syncfs, metrics.flushes)
    assert metrics.flush_waiters == 2 * MANY

    def read_back(w: Wire) -> None:
        seen["log"] = [[r.value for r in w.fetch_all(seen["tid"], p)] for p in range(MANY)]  # type: ignore[arg-type]

    serve_with_wire(backend, str(tmp_path / "data"), read_back)  # a restart: what was acknowledged is there
    assert seen["log"] == [[b"a%d" % p, b"b%d" % p] for p in range(MANY)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_syncfs_answers_each_partition_by_its_own_syncs(tmp_path: Path, backend: str) -> None:
    io = FailingSyncfs()
    seen: dict[str, object] = {}

    def client(w: Wire) -> None:
        tid = w.create_topic("many", MANY)
        io.failing_dir = layout.partition_dir(str(tmp_path / "data"), tid, 7) + "/"
        seen["replies"] = _produce_together(w, tid, MANY, b"a")
        seen["syncfs"] = io.syncfs_calls
        io.failing_dir = None
        seen["again"] = _produce_together(w, tid, MANY, b"b")

    server = serve_with_wire(backend, str(tmp_path / "data"), client, io)
    replies = seen["replies"]
    assert io.syncfs_calls >= 1 and server.core.metrics.flush_syncfs >= SYNCFS_MIN
    errors = [r.error for r in replies]  # type: ignore[attr-defined]
    assert errors[7] != m.ErrorCode.NONE
    assert errors[:7] + errors[8:] == [m.ErrorCode.NONE] * (MANY - 1)
    # After a failed syncfs the core keeps each partition's own syncs (fileio.py's `FileSystems`):
    # every partition but the failed one is durable again, and no syncfs ran.
    again = [r.error for r in seen["again"]]  # type: ignore[attr-defined]
    assert again[:7] + again[8:] == [m.ErrorCode.NONE] * (MANY - 1) and again[7] != m.ErrorCode.NONE
    assert io.syncfs_calls == seen["syncfs"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_turn_over_a_few_partitions_keeps_their_own_syncs(tmp_path: Path, backend: str) -> None:
    io = FailingSyncfs()  # a syncfs would show
    seen: dict[str, object] = {}

    def client(w: Wire) -> None:
        tid = w.create_topic("few", 4)
        seen["replies"] = _produce_together(w, tid, 4, b"a")

    server = serve_with_wire(backend, str(tmp_path / "data"), client, io)
    assert [r.error for r in seen["replies"]] == [m.ErrorCode.NONE] * 4  # type: ignore[attr-defined]
    assert io.syncfs_calls == 0 and server.core.metrics.flush_syncfs == 0
    assert server.core.metrics.flush_waiters == 4
