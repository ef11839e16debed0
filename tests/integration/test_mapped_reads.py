"""io_uring fetches from the page cache's pages (a mapping of the segment, asked with mincore)
and from the ring when they are not there: both serve the same records; damage is caught on
either path; and a store cut short under the broker is an error, not a SIGBUS that kills the
worker (pages past the file's end are never resident, so they are read, short, on the ring).
Mapped records are copied to the socket (`--fetch-sends copy`, the default) or spliced
(`--fetch-sends splice`): the tests of a slow reader run both ways."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from broker.storage.layout import store_file_name
from labkit.brokerproc import BrokerProcess, Wire
from native import map_file, probe, resident
from native.constants import SPLICE_PIPES_MAX
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")

BATCHES = 40
VALUES = [[bytes([i]) * 3000 + bytes([j]) for j in range(8)] for i in range(BATCHES)]  # ~24 KiB each
STORED = sum(len(encode_batch(values)) for values in VALUES)  # the store's batches (then preallocated)


class Served(NamedTuple):
    broker: BrokerProcess
    wire: Wire
    topic_id: int


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    """An io_uring broker with `VALUES` produced to topic "a" (one partition), and a connection;
    `--fetch-sends` as the test's parameter says (default copy)."""
    sends = getattr(request, "param", "copy")
    broker = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", backend="io_uring", extra=("--fetch-sends", sends)
    ).start()
    try:
        broker.skip_if_fell_back()
        w = Wire(broker.port)
        tid = w.create_topic("a", 1)
        for values in VALUES:
            resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch(values)))
            assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp
        yield Served(broker, w, tid)
        w.close()
    finally:
        broker.stop()


def _store(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "data").rglob(store_file_name(0))
    return path


def _resident(path: Path, length: int) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return resident(map_file(fd, length)[:length])
    finally:
        os.close(fd)


def _reads(w: Wire, total: int) -> tuple[int, int]:
    """(reads from the page cache's pages, reads of the file) once the core's published snapshot
    counts `total` reads (it publishes about once a second)."""
    deadline = time.monotonic() + 10
    while True:
        resp = w.rpc(m.StatsRequest())
        assert isinstance(resp, m.StatsResponse)
        (snap,) = json.loads(resp.stats_json)["snapshots"]
        got = (snap.get("reads_mapped", 0), snap.get("reads_file", 0))
        if sum(got) >= total or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)  # written back: clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_fetches_serve_the_same_records_from_the_page_cache_and_from_the_ring(
    tmp_path: Path, served: Served
) -> None:
    _, w, tid = served
    want = [v for values in VALUES for v in values]
    store = _store(tmp_path)
    _evict(store)  # before the broker maps the store: pages it maps stay until it unmaps
    assert not _resident(store, STORED), "eviction did not take: the ring path would go untested"
    assert [r.value for r in w.fetch_all(tid, 0)] == want  # read on the ring
    assert _reads(w, 1) == (0, 1)
    assert _resident(store, STORED)  # ... which brought the pages back
    assert [r.value for r in w.fetch_all(tid, 0)] == want  # now from the page cache
    assert _reads(w, 2) == (1, 1)


@pytest.mark.parametrize("evicted", [False, True], ids=["cached", "evicted"])
def test_damage_on_disk_is_an_error_on_either_path(tmp_path: Path, served: Served, evicted: bool) -> None:
    _, w, tid = served
    store = _store(tmp_path)
    fd = os.open(store, os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff" * 8, 200)  # inside the first batch's records
    finally:
        os.close(fd)
    if evicted:
        _evict(store)
        assert not _resident(store, STORED)
    resp = w.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, 0))
    assert resp.error == m.ErrorCode.STORAGE_ERROR, resp
    assert _reads(w, 1) == ((0, 1) if evicted else (1, 0))
    second = w.rpc(m.FetchRequest(tid, 0, 8, 1 << 20, 0))  # the batches after it are intact
    assert isinstance(second, m.FetchResponse) and second.error == m.ErrorCode.NONE, second
    assert [r.value for r in decode_batches(second.records)][:8] == VALUES[1]


def test_a_store_cut_short_under_the_broker_is_an_error_not_a_dead_worker(
    tmp_path: Path, served: Served
) -> None:
    broker, w, tid = served
    assert len(w.fetch_all(tid, 0)) == BATCHES * 8
    assert _reads(w, 1) == (1, 0)  # the store is mapped now
    store = _store(tmp_path)
    page = os.sysconf("SC_PAGESIZE")
    cut = 2 * page + 100  # inside the first batch (~6 pages), whose pages are mapped
    os.truncate(store, cut)
    resp = w.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, 0))
    assert resp.error == m.ErrorCode.STORAGE_ERROR, resp
    resp = w.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, 0))  # the same connection: the worker lives
    assert resp.error == m.ErrorCode.STORAGE_ERROR, resp
    assert _reads(w, 3) == (1, 2)  # past the cut, the pages are not resident: read, short
    assert "SIGBUS" not in broker.log() and "exited" not in broker.log()


def _pipes(pid: int) -> int:
    """Pipes the worker holds open (its pool for splicing, and a few of its own)."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("pipe:"))


@pytest.mark.parametrize("served", ["copy", "splice"], indirect=True)
def test_records_sent_to_a_client_that_reads_late_arrive_whole_and_in_order(served: Served) -> None:
    """A client with a small window asks for far more than its socket holds: what does not fit
    waits (in a sendmsg SQE, or in a pipe for a poll SQE to say the socket has room), the worker
    serves others meanwhile, and the replies, read at last, are every record in order, with
    produce replies in between."""
    broker, w, tid = served
    want = [v for values in VALUES for v in values]
    slow = Wire(broker.port, rcvbuf=16 * 1024)
    asks = 12  # 12 x ~1 MiB: far beyond what the two sockets' buffers take
    for i in range(asks):
        slow.send(m.FetchRequest(tid, 0, 0, 1 << 20, 0))
        if i == asks // 2:  # a small reply queued between two spliced ones
            slow.send(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"mid"])))
    time.sleep(0.5)
    # the loop is free: another connection is served while `slow` does not read
    assert [r.value for r in w.fetch_all(tid, 0)][: len(want)] == want
    replies = [slow.recv() for _ in range(asks + 1)]
    produced = [r for r in replies if isinstance(r, m.ProduceResponse)]
    fetched = [r for r in replies if isinstance(r, m.FetchResponse)]
    assert replies.index(produced[0]) == asks // 2 + 1
    assert produced[0].error == m.ErrorCode.NONE and produced[0].base_offset == len(want)
    for r in fetched:
        assert r.error == m.ErrorCode.NONE, r
        assert [rec.value for rec in decode_batches(r.records)][: len(want)] == want
    assert _reads(w, asks + 1)[0] >= asks  # from the page cache: the mapped path
    slow.close()


def test_copied_fetches_make_no_pipes(served: Served) -> None:
    broker, w, tid = served
    pid = broker.worker_pids[0]
    before = _pipes(pid)
    want = [v for values in VALUES for v in values]
    for _ in range(3):
        assert [r.value for r in w.fetch_all(tid, 0)] == want
    assert _reads(w, 3)[0] >= 3  # from the page cache, where splice would have taken them
    assert _pipes(pid) == before


@pytest.mark.parametrize("served", ["splice"], indirect=True)
def test_clients_that_vanish_mid_splice_leave_no_pipe_behind(tmp_path: Path, served: Served) -> None:
    broker, w, tid = served
    pid = broker.worker_pids[0]
    assert len(w.fetch_all(tid, 0)) == BATCHES * 8  # the pool has its first pipe
    before = _pipes(pid)
    for _ in range(6):
        gone = Wire(broker.port, rcvbuf=16 * 1024)
        for _ in range(12):  # the second half: not what is checked below
            gone.send(m.FetchRequest(tid, 0, BATCHES * 4, 1 << 20, 0))
        time.sleep(0.2)  # splices wait for room that never comes
        gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()  # a reset: the splice in flight fails, and its pipe is closed
    time.sleep(0.5)
    want = [v for values in VALUES for v in values]
    for _ in range(2 * SPLICE_PIPES_MAX):  # through every pipe of the pool: none holds a stale byte
        assert [r.value for r in w.fetch_all(tid, 0)] == want
    assert _pipes(pid) <= before + SPLICE_PIPES_MAX - 1
