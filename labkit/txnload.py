"""The nemesis's transactional workload: one confluent-kafka transactional producer and one
read_committed consumer on a replicated topic while faults are applied, and the final verdict of
`clusterchecker.check_transactions` over what the client knows, what it read and what every
replica holds.

Test and bench harness, not broker code, used by tests/cluster/test_nemesis.py.

Rules this module keeps:
- Transaction n writes `TXN_RECORDS` records `<tag>-t<n>-<i>`, record i to partition i mod the
  topic's partitions, and is committed, or aborted on purpose when n % `ABORT_EVERY` is
  `ABORT_EVERY - 1`. Payloads are unique, so the checker tells records apart by them.
- The producer handles errors as an application following librdkafka's transactional API does:
  an abortable error aborts the transaction and goes on with a new one (new payloads: the
  aborted ones must stay invisible); a retriable error of the commit calls the commit again; a
  fatal error (fencing among them) or a commit whose outcome stays unknown drops the producer
  and makes a new one with the same transactional id (its init aborts or completes what the
  old one left). What the client knows is kept per transaction: committed (the commit
  returned), aborted (never asked to commit, or the abort returned) or unknown (a commit asked
  that raised).
- The consumer is a read_committed consumer assigned every partition from the earliest offset,
  replaced (reading from the earliest again) when it fails; every record it is handed is kept.
- The verdict waits for the cluster to be quiet (every in-sync set whole, every replica at the
  high watermark, the last stable offset at the high watermark), reads a final read_committed
  pass to the end, then every replica's records and markers, and runs the checker.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Final

import confluent_kafka
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from labkit.clusterchecker import (
    ABORTED,
    COMMITTED,
    UNKNOWN,
    Read,
    Replica,
    Txn,
    Violation,
    check_transactions,
    read_replica,
)
from labkit.clusterlab import ClusterLab, Node, wait_until
from labkit.nemesisload import SETTLE_S, bootstrap, describe, node_id, whole

TXN_RECORDS: Final = 6
ABORT_EVERY: Final = 4
TXN_TIMEOUT_S: Final = 30.0  # a client call's timeout: a coordinator's failover fits well inside
PAUSE_S: Final = 0.01  # between transactions


@dataclass(frozen=True)
class TxnVerdict:
    violations: list[Violation]
    outcomes: dict[str, int]
    reads: int
    restarts: int


class TxnWorkload:
    """The transactional producer and the read_committed consumer on `topic` (module rules)."""

    def __init__(self, lab: ClusterLab, topic: str, txn_id: str, tag: str, partitions: int = 3) -> None:
        self.lab = lab
        self.topic = topic
        self.txn_id = txn_id
        self.tag = tag
        self.partitions = partitions
        self.txns: list[Txn] = []
        self.reads: list[Read] = []
        self.errors: list[str] = []  # every error the producer handled, for the summary
        self.restarts = 0  # producers made again after a fatal error or an unknown commit
        self.failures: list[BaseException] = []  # what stopped a thread
        self.mid = threading.Event()  # set while a transaction is open, not yet ended
        self.committing = threading.Event()  # set while a commit is asked, not yet answered
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_reading = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, name="txn-producer", daemon=True),
            threading.Thread(target=self._consume, name="txn-consumer", daemon=True),
        ]

    def __enter__(self) -> TxnWorkload:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._stop_reading.set()
        for t in self._threads:
            t.join(2 * TXN_TIMEOUT_S)

    # ----------------------------------------------------------------------------- producer

    def _producer(self) -> confluent_kafka.Producer:
        """A transactional producer, initialised (a new coordinator may need a few tries)."""
        while True:
            p = confluent_kafka.Producer(
                {
                    "bootstrap.servers": bootstrap(self.lab),
                    "transactional.id": self.txn_id,
                    "linger.ms": 1,
                    "transaction.timeout.ms": 60_000,
                    "socket.timeout.ms": 3000,
                }
            )
            try:
                p.init_transactions(TXN_TIMEOUT_S)
                return p
            except confluent_kafka.KafkaException as exc:
                self.errors.append(f"init: {exc.args[0]}")
                if self._stop.is_set():
                    raise

    def _produce(self) -> None:
        try:
            p = self._producer()
            n = 0
            while not self._stop.is_set():
                outcome = self._one(p, n)
                n += 1
                if outcome is None:  # fatal, or a commit of unknown outcome: a new producer
                    self.restarts += 1
                    with contextlib.suppress(Exception):
                        p.flush(0)
                    p = self._producer()
                time.sleep(PAUSE_S)
        except BaseException as exc:
            self.failures.append(exc)

    def _one(self, p: confluent_kafka.Producer, n: int) -> str | None:
        """Transaction n, start to end; its outcome is recorded. None: the producer must go."""
        records = tuple((i % self.partitions, f"{self.tag}-t{n}-{i}".encode()) for i in range(TXN_RECORDS))
        commit = n % ABORT_EVERY != ABORT_EVERY - 1
        state = ABORTED  # until the commit is asked
        try:
            p.begin_transaction()
            self.mid.set()
            for partition, value in records:
                p.produce(self.topic, value, partition=partition)
                p.poll(0)
            if not commit:
                p.flush(TXN_TIMEOUT_S)  # the aborted records reach the log: the markers must hide them
                p.abort_transaction(TXN_TIMEOUT_S)
            else:
                state = UNKNOWN
                self.committing.set()
                while True:
                    try:
                        p.commit_transaction(TXN_TIMEOUT_S)
                        break
                    except confluent_kafka.KafkaException as exc:
                        err = exc.args[0]
                        if not err.retriable() or err.fatal() or err.txn_requires_abort():
                            raise
                        self.errors.append(f"commit t{n} retried: {err}")
                state = COMMITTED
            self._record(n, records, state)
            return state
        except confluent_kafka.KafkaException as exc:
            err = exc.args[0]
            self.errors.append(f"t{n} ({state}): {err}")
            if not err.fatal() and err.txn_requires_abort():
                try:
                    p.abort_transaction(TXN_TIMEOUT_S)
                    self._record(n, records, ABORTED)  # the abort returned: whatever was asked
                    return ABORTED
                except confluent_kafka.KafkaException as again:
                    self.errors.append(f"t{n} abort: {again.args[0]}")
            self._record(n, records, state)
            return None
        finally:
            self.mid.clear()
            self.committing.clear()

    def _record(self, n: int, records: tuple[tuple[int, bytes], ...], outcome: str) -> None:
        with self._lock:
            self.txns.append(Txn(n, records, outcome))

    def committed(self) -> int:
        with self._lock:
            return sum(t.outcome == COMMITTED for t in self.txns)

    def wait_committed(self, more: int, timeout: float = 60.0) -> None:
        target = self.committed() + more
        wait_until(lambda: self.committed() >= target, timeout, f"{more} more committed transactions")

    def wait_mid(self, commit: bool = False, timeout: float = 30.0) -> None:
        """Wait until a transaction is open (`commit`: its commit asked and not yet answered, so
        the end itself is struck: markers to write, or the coordinator's answer lost)."""
        event = self.committing if commit else self.mid
        wait_until(event.is_set, timeout, "a transaction in flight", step=0.0005)

    # ----------------------------------------------------------------------------- consumer

    def _consumer(self) -> confluent_kafka.Consumer:
        c = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap(self.lab),
                "group.id": f"txn-{self.tag}-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 200,
                "socket.timeout.ms": 3000,
            }
        )
        c.assign(
            [
                confluent_kafka.TopicPartition(self.topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(self.partitions)
            ]
        )
        return c

    def _consume(self) -> None:
        while not self._stop_reading.is_set():
            try:
                c = self._consumer()
                try:
                    while not self._stop_reading.is_set():
                        msg = c.poll(0.2)
                        if msg is None:
                            continue
                        if msg.error():
                            if msg.error().fatal():
                                raise confluent_kafka.KafkaException(msg.error())
                            continue
                        with self._lock:
                            self.reads.append(
                                Read(self.topic, msg.partition(), msg.offset(), msg.value(), "live")
                            )
                finally:
                    c.close()
            except Exception as exc:
                self.failures.append(exc)
                time.sleep(0.2)

    # ----------------------------------------------------------------------------- verdict

    def offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        """(high watermarks, last stable offsets) per partition, as ListOffsets answers them."""
        admin = AdminClient({"bootstrap.servers": bootstrap(self.lab), "socket.timeout.ms": 3000})
        out = []
        levels = confluent_kafka.IsolationLevel
        for level in (levels.READ_UNCOMMITTED, levels.READ_COMMITTED):
            asked = {TopicPartition(self.topic, p): OffsetSpec.latest() for p in range(self.partitions)}
            futures = admin.list_offsets(asked, isolation_level=level, request_timeout=10)
            out.append({tp.partition: f.result().offset for tp, f in futures.items()})
        return out[0], out[1]

    def _read_to(self, ends: dict[int, int]) -> list[Read]:
        """A last read_committed pass from the earliest offset to `ends` (the stable offsets): done
        when nothing more comes and every partition's position is at least its end less one (its
        last offset is a marker, which librdkafka's position passes or not as its fetch fell)."""
        got: list[Read] = []
        c = self._consumer()
        asked = [TopicPartition(self.topic, p) for p in ends]
        try:
            deadline = time.monotonic() + TXN_TIMEOUT_S
            while time.monotonic() < deadline:
                msg = c.poll(0.2)
                if msg is None:
                    if all(max(tp.offset, 0) >= ends[tp.partition] - 1 for tp in c.position(asked)):
                        break
                elif not msg.error():
                    got.append(Read(self.topic, msg.partition(), msg.offset(), msg.value(), "final"))
        finally:
            c.close()
        return got

    def verdict(self) -> TxnVerdict:
        """Stop the producer, wait for quiet, read to the end, judge (module rules)."""
        self._stop.set()
        self._threads[0].join(4 * TXN_TIMEOUT_S)
        lab, topic = self.lab, self.topic
        hws: dict[int, int] = {}
        lsos: dict[int, int] = {}
        replicas: list[Replica] = []
        markers: list[Replica] = []

        def quiet() -> bool:
            nonlocal hws, lsos, replicas, markers
            if not whole(lab, topic):
                return False
            try:
                hws, lsos = self.offsets()
            except Exception:  # a node not answering yet: ask again
                return False
            isr = {p.partition: {n for n, _ in p.isr} for p in describe(lab, topic).partitions}
            where = [(node, p) for node in lab.nodes for p in range(self.partitions)]

            def replica(node: Node, p: int, marks: bool) -> Replica:
                in_sync = node_id(node.index) in isr[p]
                return read_replica(node.data_dir, topic, p, node_id(node.index), in_sync, marks)

            replicas = [replica(node, p, False) for node, p in where]
            markers = [replica(node, p, True) for node, p in where]
            ends = {r.partition: max(r.end, m.end) for r, m in zip(replicas, markers, strict=True)}
            return lsos == hws and all(e == hws[p] for p, e in ends.items())

        with contextlib.suppress(TimeoutError):  # judged anyway: the checker names what is wrong
            wait_until(quiet, SETTLE_S, f"{topic}: quiet, stable offsets at the high watermarks", step=0.5)
        if not hws or not replicas:
            raise TimeoutError(f"{topic}: never described and listed whole, nothing to judge")
        final = self._read_to(lsos or hws)
        self._stop_reading.set()
        self._threads[1].join(TXN_TIMEOUT_S)
        with self._lock:
            txns, reads = list(self.txns), [*self.reads, *final]
        violations = check_transactions(topic, txns, reads, replicas, markers, hws, lsos)
        outcomes = {k: sum(t.outcome == k for t in txns) for k in (COMMITTED, ABORTED, UNKNOWN)}
        return TxnVerdict(violations, outcomes, len(reads), self.restarts)
