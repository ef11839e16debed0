"""The nemesis suite: a three-node cluster in network namespaces (labkit/clusterlab.py)
broken while two producers (ours and confluent-kafka's, both acks=all and idempotent, unique
payloads) and two consumers (ours, and a confluent-kafka group member long-polling and
committing) run on a topic of 3 partitions, 3 replicas each (labkit/nemesisload.py); after each
fault the cluster must settle (every in-sync set whole) and the checker (labkit/clusterchecker.py)
must find nothing wrong in what was acknowledged, what was read and what every replica holds: no
acknowledged record lost, duplicated or out of its producer's order, and each consumer has read
every one.

Faults: kill -9 of a partition's leader node then restart (`KILL_ROUNDS` times, partitions in
turn), SIGTERM to a leader (a controlled shutdown: its leaderships move before it exits; the
summary gives the produce gap on the partitions it led), SIGSTOP of a leader past its session
(then SIGCONT: it returns as a follower, truncates, rejoins), isolation of a leader from the
network (then heal), etcd's only member killed for 5 s then started (leaders keep serving), a
rolling restart (each node stopped gracefully and started again in turn), and kill -9 of etcd's
raft leader (3 members) while producing. And transactions (labkit/txnload.py, judged by
`check_transactions`): the coordinator core's worker, the coordinator's node and a data leader
killed -9 and the coordinator's node isolated, each mid-transaction. Each prints one summary
line with its failover times (fault to the first acknowledged produce sent after it, on the
partitions whose leader the fault took): run with `pytest -s` to see them.

The faults are shared with test_nemesis_restarts.py (isolation, etcd's restarts, the rolling
restart), on a lab of its own: one file each for pytest-xdist's two workers (nemesis_kit.py).

Root-required (CI is root); skipped, with the reason, otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import confluent_kafka
import pytest
from nemesis_kit import (
    FAILOVER_MAX_S,
    KILL_ROUNDS,
    PAUSE_S,
    STOP_GAP_MAX_S,
    STOP_WATCH_S,
    TXN_ROUNDS,
    finish,
    interrupt_leaders,
    led_by,
    open_lab,
    restore,
    topic,
)

from broker.client.admin import Admin
from labkit.clusterchecker import report, spread
from labkit.clusterlab import BROKER_PORT, ClusterLab, lab_unavailable, wait_until
from labkit.nemesisload import (
    TXN_STATE_PARTITIONS,
    Workload,
    describe,
    leader_of,
    node_id,
    wait_new_leader,
    wait_whole,
)
from labkit.txnload import TxnWorkload
from ringlog_proto import messages as m
from ringlog_proto.frames import NEED_DATA, FrameDecoder
from ringlog_proto.routing import txn_partition

REASON = lab_unavailable()
# One scenario on one lab: its faults run in the order written here, whatever order pytest-randomly
# gives the rest of the suite (tests/conftest.py). Each fault still starts from a whole cluster.
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"{REASON}"), pytest.mark.written_order]


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterLab]:
    """Three clustered nodes and one etcd member, shared by this module's tests of one-node faults
    (each leaves every node running, resumed and healed)."""
    with open_lab(tmp_path_factory.mktemp("nemesis")) as lab:
        yield lab


@pytest.fixture
def lab(shared_lab: ClusterLab) -> Iterator[ClusterLab]:
    """The shared lab, made whole again after a test that failed midway (`restore`)."""
    yield shared_lab
    restore(shared_lab)


def coordinator_of(lab: ClusterLab, txn_id: str) -> int:
    """The lab index of the node leading `txn_id`'s __transaction_state partition."""
    p = txn_partition(txn_id, TXN_STATE_PARTITIONS)
    return describe(lab, "__transaction_state").partitions[p].leader_node - 1


def kill_worker(lab: ClusterLab, i: int) -> None:
    """kill -9 of node i's worker alone (one core in the lab): its supervisor stays in the
    cluster and starts the worker again at once (docs/LIMITS.md, worker restart back-off)."""
    proc = lab.nodes[i].proc
    assert proc is not None
    workers = [pid for pid in proc.group_pids() if pid != proc.pid]
    assert workers, f"node {i} has no worker"
    lab._event(f"kill worker of node {i}")
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    restarted = lambda: [p for p in proc.group_pids() if p not in (proc.pid, *workers)]  # noqa: E731
    wait_until(lambda: bool(restarted()), 10, f"node {i}'s supervisor to start its worker again")


# First on the lab: its faults restart a worker and nodes, which reopen every topic the earlier
# tests filled (last in the file it took 62-67 s, against 25-31 s first)
def test_transactions_under_faults(lab: ClusterLab) -> None:
    """A transactional producer (confluent-kafka: transactions of 6 records over the 3 partitions,
    every 4th aborted on purpose) and a read_committed consumer (labkit/txnload.py) while, each
    mid-transaction: the worker of the coordinator's core is killed -9 (its supervisor restarts
    it), the coordinator's whole node is killed -9 then restarted (while a commit is asked), a data
    partition's leader (another node) is killed -9 then restarted, and the coordinator's node is
    cut off from the network (while a commit is asked) then healed. `check_transactions` then
    finds every committed transaction read whole and once, nothing aborted or unfinished visible,
    a commit of unknown outcome all or nothing, each partition in transaction order, the last
    stable offsets at the high watermarks and the replicas agreeing on records and markers."""
    name = topic(lab)
    txn_id = f"nemesis-txn-{name}"
    faults: list[str] = []  # each with the seconds from the fault to whole and committing again
    took: list[float] = []
    with TxnWorkload(lab, name, txn_id, tag=name) as w:
        w.wait_committed(5)

        def strike(what: str, fault: Callable[[int], None], victim: int, commit: bool = False) -> None:
            w.wait_mid(commit)
            fault(victim)
            faults.append(f"{what} {victim}" + (" at a commit" if commit else ""))
            took.append(time.monotonic())

        def recover() -> None:
            wait_whole(lab, name)
            wait_whole(lab, "__transaction_state")
            w.wait_committed(3)
            faults[-1] += f" {time.monotonic() - took[-1]:.1f} s"

        for rnd in range(TXN_ROUNDS):
            strike("kill worker", lambda i: kill_worker(lab, i), coordinator_of(lab, txn_id), rnd % 2 == 1)
            recover()
            victim = coordinator_of(lab, txn_id)
            strike("kill node", lab.kill, victim, commit=True)
            w.wait_committed(2)  # the next coordinator took the id over
            lab.restart(victim)
            recover()
            coordinator = coordinator_of(lab, txn_id)
            leaders = [i for i in range(3) if led_by(lab, name, i)]
            victim = next((i for i in leaders if i != coordinator), leaders[0])  # another, if any leads
            strike("kill data leader", lab.kill, victim, commit=rnd % 2 == 1)
            w.wait_committed(2)
            lab.restart(victim)
            recover()
            victim = coordinator_of(lab, txn_id)
            strike("isolate", lab.isolate, victim, commit=True)
            try:
                w.wait_committed(2)
            finally:
                lab.heal(victim)
            recover()
        judged = time.monotonic()
        verdict = w.verdict()
        judged = time.monotonic() - judged
    kinds = Counter(v.kind for v in verdict.violations)
    print(
        f"\nNEMESIS transactions ({', '.join(faults)}): {verdict.outcomes}, {verdict.reads} read, "
        f"{len(verdict.violations)} violations {dict(kinds)}; producers made again {verdict.restarts}; "
        f"errors handled {len(w.errors)} (first: {w.errors[:3]}); quiet, read and judged in {judged:.1f} s"
    )
    assert verdict.violations == [], report(verdict.violations)
    assert verdict.outcomes["committed"] >= 10, verdict.outcomes
    assert not [e for e in w.failures if not isinstance(e, confluent_kafka.KafkaException)], w.failures[:3]


def test_kill_the_leader_and_restart_it(lab: ClusterLab) -> None:
    name = topic(lab)
    failovers: list[float] = []
    elections: list[float] = []
    rejoins: list[float] = []
    with Workload(lab, name, tag="kill") as w:
        w.wait_acked(200)
        for rnd in range(KILL_ROUNDS):
            partition = rnd % 3
            victim, epoch = leader_of(lab, name, partition)
            hit = led_by(lab, name, victim)
            lab.kill(victim)
            fault_at = lab.last_fault()
            elections.append(wait_new_leader(lab, name, partition, victim, fault_at))
            failovers.append(w.wait_failover(fault_at, hit))
            new, new_epoch = leader_of(lab, name, partition)
            assert new != victim and new_epoch > epoch
            lab.restart(victim)
            rejoins.append(wait_whole(lab, name))
            w.wait_acked(50)
    assert max(failovers) < FAILOVER_MAX_S, failovers
    finish(
        w,
        f"kill -9 leader x{KILL_ROUNDS}",
        failovers,
        f"; new leader {spread(elections)}; restart to whole ISR {spread(rejoins)}",
    )


def leaders_seen_by(ip: str, name: str) -> dict[int, int]:
    """partition -> leader node as the broker at `ip` answers Metadata itself (our protocol, one
    plain request on a connection of its own: no client that would ask another node); {} when it
    does not answer (stopping, gone)."""
    try:
        with socket.create_connection((ip, BROKER_PORT), timeout=1.0) as sock:
            sock.sendall(b"".join(m.encode_request(m.MetadataRequest((name,)), 1)))
            decoder = FrameDecoder()
            while (frame := decoder.next_frame()) is NEED_DATA:
                data = sock.recv(1 << 16)
                if not data:
                    return {}
                decoder.feed(data)
    except OSError:
        return {}
    resp = m.decode_response(frame)  # type: ignore[arg-type]
    if not isinstance(resp, m.MetadataResponse):
        return {}
    return {p.index: p.leader_node for t in resp.topics if t.name == name for p in t.partitions}


def test_pause_the_leader_past_its_session(lab: ClusterLab) -> None:
    w, failovers, elections = interrupt_leaders(lab, "pause", (0, 1), lab.pause, lab.resume, PAUSE_S)
    finish(w, f"SIGSTOP leader {PAUSE_S:.0f} s x2", failovers, f"; new leader {spread(elections)}")


def test_sigterm_to_a_leader_moves_its_leaderships_before_it_exits(lab: ClusterLab) -> None:
    """Controlled shutdown (Kafka's): SIGTERM to a node leading partitions makes the controller
    move each of its leaderships to another in-sync replica while the node still runs and knows
    it (its own Metadata names the new leaders before it exits, so it answers its clients
    NOT_OWNER rather than taking produces it can no longer replicate); only then does it leave
    and exit 0. The producer's gap on those partitions stays under a second, and nothing
    acknowledged is lost or duplicated."""
    name = topic(lab)
    with Workload(lab, name, tag="term") as w:
        w.wait_acked(200)
        victim, epoch = leader_of(lab, name, 0)
        hit = led_by(lab, name, victim)
        observer = next(n for n in lab.nodes if n.index != victim)
        moved: dict[int, float] = {}  # partition -> when the observer first named another leader
        known: dict[int, float] = {}  # partition -> when the stopping node itself named another
        watching = threading.Event()

        def watch() -> None:
            with Admin(observer.bootstrap, request_timeout_ms=3000) as admin:
                while not watching.is_set() and len(moved) < len(hit):
                    try:
                        parts = admin.describe_topic(name).partitions
                    except Exception:  # a moment without an answer: ask again
                        continue
                    now = time.monotonic()
                    for p in parts:
                        if p.partition in hit and p.leader_node not in (node_id(victim), -1):
                            moved.setdefault(p.partition, now)
                    time.sleep(0.01)

        def ask_the_victim() -> None:
            while not watching.is_set() and len(known) < len(hit):
                for p, leader in leaders_seen_by(lab.nodes[victim].ip, name).items():
                    if p in hit and leader not in (node_id(victim), -1):
                        known.setdefault(p, time.monotonic())
                time.sleep(0.01)

        watchers = [threading.Thread(target=f, daemon=True) for f in (watch, ask_the_victim)]
        for t in watchers:
            t.start()
        rc = lab.stop(victim)
        exited = time.monotonic()
        fault_at = lab.last_fault()
        watching.set()
        for t in watchers:
            t.join(10)
        assert rc == 0, lab.nodes[victim].log()[-3000:]
        assert sorted(moved) == sorted(hit), (moved, hit)
        assert all(t < exited for t in moved.values()), (moved, exited)
        assert sorted(known) == sorted(hit), f"the stopping node never named the new leaders: {known}"
        new, new_epoch = leader_of(lab, name, 0)
        assert new != victim and new_epoch > epoch
        time.sleep(max(0.0, exited + STOP_WATCH_S - time.monotonic()))
        gaps = [w.longest_gap(fault_at, exited + STOP_WATCH_S, [p]) for p in hit]
        lab.restart(victim)
        wait_whole(lab, name)
        w.wait_acked(50)
    finish(
        w,
        "SIGTERM leader (the figure is the longest produce gap)",
        gaps,
        f"; partitions {hit} moved {spread([t - fault_at for t in moved.values()])} after the "
        f"SIGTERM, exit {exited - fault_at:.2f} s after it",
    )
    assert max(gaps) < STOP_GAP_MAX_S, gaps
