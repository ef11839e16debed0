"""The metadata store on a real etcd: every call, txn branches, leases, watches across restarts and
compaction, and a 3-member cluster losing its raft leader to kill -9."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from broker.cluster.store import (
    Delete,
    EtcdStore,
    Event,
    Get,
    LeaseNotFound,
    Put,
    StoreUnavailable,
    StoreUncertain,
    WatchCompacted,
    absent,
    create_revision_is,
    mod_revision_is,
    value_is,
    version_is,
)
from labkit.etcdproc import EtcdCluster, free_port


@pytest.fixture
def store(etcd: EtcdCluster) -> Iterator[EtcdStore]:
    s = EtcdStore(etcd.endpoints)
    yield s
    s.close()


class Collector:
    """Events a watch delivered, and a way to wait for some."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.errors: list[Exception] = []
        self.cond = threading.Condition()

    def __call__(self, ev: Event) -> None:
        with self.cond:
            self.events.append(ev)
            self.cond.notify_all()

    def error(self, exc: Exception) -> None:
        with self.cond:
            self.errors.append(exc)
            self.cond.notify_all()

    def wait(self, pred: Callable[[Collector], bool], timeout: float = 5) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self), timeout), (self.events, self.errors)

    def wait_count(self, n: int, timeout: float = 5) -> None:
        self.wait(lambda c: len(c.events) >= n, timeout)


def test_kv_calls(store: EtcdStore) -> None:
    assert store.get("/t/kv/a") is None
    rev = store.put("/t/kv/a", json.dumps({"x": 1}))
    kv = store.get(b"/t/kv/a")
    assert kv is not None and json.loads(kv.value) == {"x": 1}
    assert kv.key == b"/t/kv/a" and kv.create_revision == kv.mod_revision == rev and kv.version == 1
    rev2 = store.put("/t/kv/a", b"\xff\x00binary")
    kv2 = store.get("/t/kv/a")
    assert kv2 is not None and kv2.value == b"\xff\x00binary" and kv2.mod_revision == rev2 > rev
    assert kv2.create_revision == rev and kv2.version == 2
    store.put("/t/kv/b", "2")
    store.put("/t/kvz", "not under the prefix /t/kv/")
    r = store.get_prefix("/t/kv/")
    assert [kv.key for kv in r.kvs] == [b"/t/kv/a", b"/t/kv/b"] and r.revision >= rev2
    assert store.delete("/t/kv/a") == 1 and store.delete("/t/kv/a") == 0
    store.put("/t/kv/c", "3")
    assert store.delete("/t/kv/", prefix=True) == 2
    assert store.get_prefix("/t/kv/").kvs == [] and store.get("/t/kvz") is not None


def test_txn_branches_and_compares(store: EtcdStore) -> None:
    k = "/t/txn/k"
    created = store.txn([absent(k)], [Put(k, "v1")], [Get(k)])
    assert created.succeeded and created.results == [None]
    again = store.txn([absent(k)], [Put(k, "other")], [Get(k)])
    assert not again.succeeded
    [kvs] = again.results
    assert isinstance(kvs, list) and kvs[0].value == b"v1" and kvs[0].create_revision == created.revision
    kv = kvs[0]
    # each target, each way: a stale mod revision is refused, the current one passes
    assert not store.txn([mod_revision_is(k, kv.mod_revision - 1)], [Put(k, "x")]).succeeded
    assert store.txn([mod_revision_is(k, kv.mod_revision), value_is(k, "v1")], [Put(k, "v2")]).succeeded
    assert store.txn([create_revision_is(k, kv.create_revision), version_is(k, 2)], [Put(k, "v3")]).succeeded
    assert store.txn([version_is(k, 3, ">")], [Put(k, "no")], [Put(k, "v4")]).succeeded is False
    assert store.get(k).value == b"v4"  # the failure branch ran
    assert store.txn([value_is(k, "v4", "!="), version_is(k, 10, "<")], [Put(k, "no")]).succeeded is False
    store.put("/t/txn/other", "o")
    both = store.txn([value_is(k, "v4")], [Delete("/t/txn/", prefix=True), Get(k)])
    assert both.succeeded and both.results == [2, []]
    assert store.get_prefix("/t/txn/").kvs == []


def test_lease_expiry_deletes_its_keys(store: EtcdStore) -> None:
    lease = store.lease_grant(1)  # the test etcd's minimum: 1.5 election timeouts of 500 ms, rounded up
    assert lease.ttl == 1
    store.put("/t/lease/a", "a", lease=lease.id)
    store.txn([absent("/t/lease/b")], [Put("/t/lease/b", "b", lease=lease.id)])
    assert store.get("/t/lease/a").lease == lease.id
    assert store.lease_ttl(lease.id) in (0, 1)
    seen = Collector()
    w = store.watch_prefix("/t/lease/", None, seen)
    t0 = time.monotonic()
    for _ in range(3):  # kept alive past its TTL
        assert store.lease_keepalive(lease.id) == 1
        time.sleep(0.4)
    assert store.get("/t/lease/a") is not None
    seen.wait_count(2, timeout=3)  # expiry deletes both keys (etcd checks leases every 500 ms)
    assert {(e.type, e.kv.key) for e in seen.events} == {("delete", b"/t/lease/a"), ("delete", b"/t/lease/b")}
    assert time.monotonic() - t0 < 1.2 + 1 + 0.7
    assert store.lease_ttl(lease.id) == -1
    with pytest.raises(LeaseNotFound):
        store.lease_keepalive(lease.id)
    with pytest.raises(LeaseNotFound):
        store.put("/t/lease/c", "c", lease=lease.id)
    revoked = store.lease_grant(5)
    store.put("/t/lease/d", "d", lease=revoked.id)
    store.lease_revoke(revoked.id)
    store.lease_revoke(revoked.id)  # already gone: not an error
    assert store.get("/t/lease/d") is None
    w.cancel()


def test_watch_sees_puts_and_deletes_in_order(store: EtcdStore) -> None:
    start = store.put("/t/w1/seed", "0")
    seen = Collector()
    w = store.watch_prefix("/t/w1/", start, seen)  # from a past revision: the seed is replayed
    store.put("/t/w1/a", "1")
    store.txn([], [Put("/t/w1/b", "2"), Put("/t/w1/c", "3")])  # one revision, two events
    store.delete("/t/w1/a")
    store.put("/t/w1x", "outside the prefix")
    store.put("/t/w1/a", "4")
    seen.wait_count(6)
    got = [(e.type, e.kv.key.decode(), e.kv.value.decode()) for e in seen.events]
    assert got == [
        ("put", "/t/w1/seed", "0"),
        ("put", "/t/w1/a", "1"),
        ("put", "/t/w1/b", "2"),
        ("put", "/t/w1/c", "3"),
        ("delete", "/t/w1/a", ""),
        ("put", "/t/w1/a", "4"),
    ]
    revs = [e.revision for e in seen.events]
    assert revs == sorted(revs) and revs[2] == revs[3]
    assert w.next_revision == revs[-1] + 1
    w.cancel()
    store.put("/t/w1/after", "cancelled")
    time.sleep(0.2)
    assert len(seen.events) == 6 and seen.errors == []


def test_watch_from_now_sees_a_write_made_right_after(store: EtcdStore) -> None:
    seen = Collector()
    w = store.watch_key("/t/now", None, seen)
    store.put("/t/now", "x")
    store.put("/t/now2", "not this key")
    seen.wait_count(1)
    time.sleep(0.1)
    assert [e.kv.value for e in seen.events] == [b"x"]
    w.cancel()


def test_watch_of_a_compacted_revision_says_so(store: EtcdStore) -> None:
    first = store.put("/t/compact/a", "1")
    last = store.put("/t/compact/a", "2")
    store.compact(last)
    seen = Collector()
    w = store.watch_prefix("/t/compact/", first, seen, on_error=seen.error)
    seen.wait(lambda c: bool(c.errors))
    [err] = seen.errors
    assert isinstance(err, WatchCompacted) and err.compact_revision == last and seen.events == []
    w.cancel()
    # the resync the error asks for: read, then watch from the revision read
    snap = store.get_prefix("/t/compact/")
    assert [kv.value for kv in snap.kvs] == [b"2"]
    again = Collector()
    w2 = store.watch_prefix("/t/compact/", snap.revision + 1, again)
    store.put("/t/compact/a", "3")
    again.wait_count(1)
    assert again.events[0].kv.value == b"3"
    w2.cancel()


def test_watch_resumes_after_etcd_restart_without_losing_events(etcd_cluster) -> None:
    cluster = etcd_cluster(1)
    store = EtcdStore(cluster.endpoints)
    seen = Collector()
    w = store.watch_prefix("/r/", None, seen)
    for i in range(3):
        store.put(f"/r/{i}", str(i))
    seen.wait_count(3)
    cluster.stop(0)
    with pytest.raises(StoreUnavailable):
        EtcdStore(cluster.endpoints, call_deadline=0.3).get("/r/0")
    cluster.restart(0)
    for i in range(3, 6):  # written before the watch has reconnected: replayed from its revision
        store.put(f"/r/{i}", str(i))
    seen.wait_count(6, timeout=5)
    cluster.kill(0)
    cluster.restart(0)
    store.put("/r/6", "6")
    seen.wait_count(7, timeout=5)
    time.sleep(0.2)
    assert [e.kv.value for e in seen.events] == [str(i).encode() for i in range(7)]
    assert seen.errors == []
    w.cancel()
    store.close()


def test_three_members_survive_kill_of_the_raft_leader(etcd_cluster) -> None:
    cluster = etcd_cluster(3)
    leader = cluster.leader()
    # the leader's endpoint first, so the store's calls and its watch are on the member that dies
    order = [leader] + [i for i in range(3) if i != leader]
    store = EtcdStore([cluster.endpoints[i] for i in order])
    seen = Collector()
    w = store.watch_prefix("/k/", None, seen)
    store.put("/k/0", "0")
    seen.wait_count(1)
    t0 = time.monotonic()
    cluster.kill(leader)
    store.put("/k/1", "1")  # moves to a live member; waits out the raft election if it must
    failover = time.monotonic() - t0
    assert store.get("/k/1").value == b"1"
    # a txn through the failed-over store, and reads of every key
    assert store.txn([absent("/k/2")], [Put("/k/2", "2")]).succeeded
    assert [kv.value for kv in store.get_prefix("/k/").kvs] == [b"0", b"1", b"2"]
    seen.wait_count(3, timeout=5)  # the watch moved over too, nothing lost
    assert [e.kv.value for e in seen.events] == [b"0", b"1", b"2"]
    assert failover < 3, failover
    print(f"raft leader killed: the store's next put took {failover:.3f} s")
    assert cluster.leader() != leader
    w.cancel()
    store.close()


def test_a_txn_with_no_answer_is_uncertain_never_retried(etcd_cluster) -> None:
    cluster = etcd_cluster(3)
    follower = next(i for i in range(3) if i != cluster.leader())
    others = [cluster.endpoints[i] for i in range(3) if i != follower]
    store = EtcdStore([cluster.endpoints[follower], *others], request_timeout=0.5)
    assert store.get("/u/x") is None  # the first endpoint works
    cluster.freeze(follower)  # a black hole: it accepts connections and answers nothing
    t0 = time.monotonic()
    with pytest.raises(StoreUncertain):
        store.txn([absent("/u/x")], [Put("/u/x", "1")])
    assert time.monotonic() - t0 < 1.5
    # an idempotent call moves on by itself (the store is on the next endpoint now)
    store.put("/u/y", "y")
    assert store.get("/u/y").value == b"y"
    cluster.thaw(follower)
    store.close()
    # a txn whose connection was refused never reached etcd: it goes to the next member
    dead_first = EtcdStore([f"http://127.0.0.1:{free_port()}", *others])
    assert dead_first.txn([absent("/u/z")], [Put("/u/z", "z")]).succeeded
    dead_first.close()
