"""What a core drops is freed by reference counting, on either backend, and what it opens is out
of the cyclic collector's walk (broker/core/heap.py, whose freeze relies on the first):
- a parked fetch, woken by a produce, timed out, or on a connection closed while it waits. Its
  wake, unpark and timer were closures naming each other: every parked fetch (two a replicated
  produce on the leader with RF 3) became ~40 objects of cyclic garbage, holding the request and
  the view of its body until the collector ran, usually once promoted to the oldest generation;
- a durable produce's wait for its flush, and a deleted topic's partitions, logs and segments;
- the partitions a core opens from its data dir at start are frozen (`gc.freeze`), and those it
  opens while serving are, `FREEZE_EVERY` at a time.

The server runs in this process (tests/inprocess.py), the client on a thread; the cyclic
collector is off while they run, and what it then finds unreachable is inspected."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import BACKENDS, Post, on_loop, served

from broker.backends.backend_core import BackendCore
from broker.client.admin import Admin
from broker.core.heap import FREEZE_EVERY
from broker.core.partition import Partition
from labkit.brokerproc import Wire
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch

ROUNDS = 20
SERVER_MODULES = ("broker.backends", "broker.core", "broker.ringlog", "broker.kafka", "ringlog_proto")


def _owner(obj: object) -> str:
    """The module an unreachable object comes from: a function's own, else its type's."""
    module = getattr(obj, "__module__", None) if callable(obj) else type(obj).__module__
    return module if isinstance(module, str) else ""


def _servers_garbage() -> list[str]:
    """What the cyclic collector finds unreachable now that the server made: `repr`s of the
    objects of its modules. Then it is freed (kept for inspection, it would be found again)."""
    gc.collect()
    found = [repr(o)[:120] for o in gc.garbage if _owner(o).startswith(SERVER_MODULES)]
    gc.garbage.clear()
    gc.set_debug(0)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    return found


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Cyclic garbage kept for inspection (`gc.garbage`) instead of freed, and no automatic
    collection meanwhile; restored whatever happens."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _ok(resp: m.Response) -> m.Response:
    assert resp.error == m.ErrorCode.NONE, resp
    return resp


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parked_fetch_leaves_no_reference_cycle(tmp_path: Path, backend: str, collector_off: None) -> None:
    found: dict[str, list[str]] = {}

    def client(port: int, server: BackendCore, post: Post) -> None:
        producer, consumer = Wire(port), Wire(port)
        tid = producer.create_topic("t", 1)
        _ok(producer.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"first"]))))
        _ok(consumer.rpc(m.FetchRequest(tid, 0, 0, 1 << 20, 0)))  # the partition opened, its reads warm
        _servers_garbage()  # what opening made is not the parked fetches'

        for offset in range(1, ROUNDS + 1):  # woken: each parks, then a produce grows the partition
            consumer.send(m.FetchRequest(tid, 0, offset, 1 << 20, 5000))
            time.sleep(0.005)
            _ok(producer.rpc(m.ProduceRequest(tid, 0, m.Acks.WRITTEN, 5000, encode_batch([b"v"]))))
            resp = _ok(consumer.recv())
            assert isinstance(resp, m.FetchResponse) and resp.records
        found["woken"] = _servers_garbage()

        for _ in range(ROUNDS // 4):  # timed out: nothing arrives within its wait
            resp = _ok(consumer.rpc(m.FetchRequest(tid, 0, ROUNDS + 1, 1 << 20, 20)))
            assert isinstance(resp, m.FetchResponse) and not resp.records
        found["timed out"] = _servers_garbage()

        for _ in range(ROUNDS // 4):  # the connection closed while its fetch waits
            gone = Wire(port)
            gone.send(m.FetchRequest(tid, 0, ROUNDS + 1, 1 << 20, 100))
            time.sleep(0.01)
            gone.close()
        time.sleep(0.3)  # every deadline passed: the server let go of each
        found["closed"] = _servers_garbage()
        producer.close()
        consumer.close()

    served(backend, tmp_path, client)
    assert found == {"woken": [], "timed out": [], "closed": []}


def _partitions(server: BackendCore) -> list[Partition]:
    return list(server.core.partitions.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_durable_produces_and_a_deleted_topic_are_freed_by_reference_counting(
    tmp_path: Path, backend: str, collector_off: None
) -> None:
    found: dict[str, Any] = {}

    def client(port: int, server: BackendCore, post: Post) -> None:
        w = Wire(port)
        tid = w.create_topic("t", 4)
        for i in range(4):
            _ok(w.rpc(m.ProduceRequest(tid, i, m.Acks.WRITTEN, 5000, encode_batch([b"v"]))))
        _servers_garbage()  # what opening made is not the produces'
        for round_ in range(ROUNDS):  # each waits for its flush (io_uring's ran as closures in a cycle)
            _ok(w.rpc(m.ProduceRequest(tid, round_ % 4, m.Acks.DURABLE, 5000, encode_batch([b"v"] * 3))))
        time.sleep(0.1)  # the last flush's completion let go of
        found["durable produces"] = _servers_garbage()
        w.close()
        assert len(on_loop(post, lambda: _partitions(server))) == 4
        with Admin(f"127.0.0.1:{port}") as admin:
            admin.delete_topic("t")
        found["left open"] = on_loop(post, lambda: _partitions(server))
        found["in cycles"] = _servers_garbage()

    served(backend, tmp_path, client)
    assert found == {"durable produces": [], "left open": [], "in cycles": []}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_partitions_a_core_opens_at_start_are_frozen(tmp_path: Path, backend: str) -> None:
    def write(port: int, server: BackendCore, post: Post) -> None:
        w = Wire(port)
        tid = w.create_topic("t", 3)
        for i in range(3):
            _ok(w.rpc(m.ProduceRequest(tid, i, m.Acks.DURABLE, 5000, encode_batch([b"v"]))))
        w.close()

    served(backend, tmp_path, write)
    seen: dict[str, Any] = {}

    def after_restart(port: int, server: BackendCore, post: Post) -> None:
        opened = on_loop(post, lambda: {id(p) for p in _partitions(server)})
        seen["opened"] = len(opened)
        seen["walked"] = sum(id(o) in opened for o in gc.get_objects())  # the permanent generation's are not
        w = Wire(port)  # and they serve as before
        seen["records"] = [r.value for r in w.fetch_all(1, 2)]
        w.close()

    try:
        served(backend, tmp_path, after_restart)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this test process's objects back in the collector's walk
    assert seen == {"opened": 3, "walked": 0, "records": [b"v"]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_partitions_opened_while_serving_are_frozen_a_few_hundred_at_a_time(
    tmp_path: Path, backend: str
) -> None:
    """The first `FREEZE_EVERY` partitions a serving core opens are frozen together when the last
    of them opens; the next ones are walked until their own count comes round."""
    opened = FREEZE_EVERY + 3
    seen: dict[str, Any] = {}

    def client(port: int, server: BackendCore, post: Post) -> None:
        w = Wire(port)
        tid = w.create_topic("t", opened)
        for i in range(opened):
            _ok(w.rpc(m.ProduceRequest(tid, i, m.Acks.WRITTEN, 5000, encode_batch([b"v%d" % i]))))
        parts = on_loop(post, lambda: {p.index: id(p) for p in _partitions(server)})
        tracked = {id(o) for o in gc.get_objects()}  # the permanent generation's are not
        seen["opened"] = len(parts)
        seen["walked"] = sorted(i for i, ident in parts.items() if ident in tracked)
        seen["records"] = [w.fetch_all(tid, i)[0].value for i in (0, opened - 1)]  # they serve as before
        w.close()

    try:
        served(backend, tmp_path, client)
    finally:
        gc.unfreeze()  # this test process's objects back in the collector's walk
    assert seen == {
        "opened": opened,
        "walked": list(range(FREEZE_EVERY, opened)),
        "records": [b"v0", b"v%d" % (opened - 1)],
    }
