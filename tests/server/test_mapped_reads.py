"""io_uring fetches from the page cache's pages (a mapping of the segment, asked with mincore)
and from the ring when they are not there: both serve the same records; damage is caught on
either path; and a store cut short under the broker is an error, not a SIGBUS that kills the
worker (pages past the file's end are never resident, so they are read, short, on the ring)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from brokerproc import BrokerProcess, Wire

from broker.storage.layout import store_file_name
from native import map_file, probe, resident
from ringlog_proto import messages as m
from ringlog_proto.batch import decode_batches, encode_batch

pytestmark = pytest.mark.skipif(probe() is not None, reason=f"io_uring unavailable: {probe()}")

BATCHES = 40
VALUES = [[bytes([i]) * 3000 + bytes([j]) for j in range(8)] for i in range(BATCHES)]  # ~24 KiB each
STORED = sum(len(encode_batch(values)) for values in VALUES)  # the store's batches (then preallocated)


def _start(tmp_path: Path) -> BrokerProcess:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", backend="io_uring").start()
    if "backend io_uring" not in broker.log():
        broker.stop()
        pytest.skip("io_uring unavailable here: the broker fell back to uvloop")
    return broker


def _store(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "data").rglob(store_file_name(0))
    return path


def _produce_all(w: Wire, tid: int) -> None:
    for values in VALUES:
        resp = w.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch(values)))
        assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE, resp


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


def test_fetches_serve_the_same_records_from_the_page_cache_and_from_the_ring(tmp_path: Path) -> None:
    broker = _start(tmp_path)
    try:
        w = Wire(broker.port)
        tid = w.create_topic("a", 1)
        _produce_all(w, tid)
        want = [v for values in VALUES for v in values]
        store = _store(tmp_path)
        _evict(store)  # before the broker maps the store: pages it maps stay until it unmaps
        assert not _resident(store, STORED), "eviction did not take: the ring path would go untested"
        assert [r.value for r in w.fetch_all(tid, 0)] == want  # read on the ring
        assert _reads(w, 1) == (0, 1)
        assert _resident(store, STORED)  # ... which brought the pages back
        assert [r.value for r in w.fetch_all(tid, 0)] == want  # now from the page cache
        assert _reads(w, 2) == (1, 1)
        w.close()
    finally:
        broker.stop()


@pytest.mark.parametrize("evicted", [False, True], ids=["cached", "evicted"])
def test_damage_on_disk_is_an_error_on_either_path(tmp_path: Path, evicted: bool) -> None:
    broker = _start(tmp_path)
    try:
        w = Wire(broker.port)
        tid = w.create_topic("a", 1)
        _produce_all(w, tid)
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
        w.close()
    finally:
        broker.stop()


def test_a_store_cut_short_under_the_broker_is_an_error_not_a_dead_worker(tmp_path: Path) -> None:
    broker = _start(tmp_path)
    try:
        w = Wire(broker.port)
        tid = w.create_topic("a", 1)
        _produce_all(w, tid)
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
        w.close()
    finally:
        broker.stop()
