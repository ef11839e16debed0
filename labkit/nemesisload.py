"""The nemesis's workload and cluster helpers: a ringlog cluster started in a ClusterLab, two
idempotent acks=all producers (ours, and confluent-kafka's) and two consumers (ours, assigned, and
a confluent-kafka consumer group, long-polling and committing) on a replicated topic while faults
are applied, and the final verdict of the checker over every replica.

Test and bench harness, not broker code, used by tests/cluster/test_nemesis*.py,
scripts/cluster_demo.py and bench/failover.py.

Rules this module keeps:
- Payloads are unique per run (`<tag>-<n>`), so the checker tells records apart by them.
- The producer sends at a steady pace (one record per `SEND_EVERY_S`, partitions in turn), never
  waiting for an answer, with at most `MAX_OUTSTANDING` records unanswered (then it waits): a
  fault shows as a gap in acknowledgements, not as a producer that stopped sending. Every
  acknowledged record is kept with the offset its RecordMetadata names, and every send as an
  `Attempt` (sent, answered, ok) per partition, for failover times.
- The Kafka producer (confluent-kafka, enable.idempotence, acks=all) sends its own payloads
  (`<tag>-k<n>`) at half that pace, partitions in turn; every record it sends must be delivered
  (its message timeout outlasts any fault). Both producers' acks carry their send order (`seq`), so
  the checker also finds records acknowledged out of their producer's order.
- Our consumer reads every partition from the earliest offset (assigned) and keeps every record it
  is handed; the Kafka consumer is a group member (subscribed, long polls of `fetch.wait.max.ms`,
  offsets auto-committed every second), the case that once failed stored produces. Each
  must end up having read every acknowledged record.
- Replicas are read from the running nodes' data dirs only once the cluster is quiet: the workload
  stopped, every partition's in-sync set whole and every replica's log ending at the high
  watermark (nothing is being written, so the files are stable; the reader stops at a torn tail
  anyway).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Final

import confluent_kafka

from broker.client.admin import Admin, TopicDescription
from broker.client.blocking_consumer import Consumer
from broker.client.blocking_producer import Producer
from broker.client.records import RecordMetadata
from labkit.clusterchecker import Ack, Attempt, Read, Replica, Violation, check, failover_time, read_replica
from labkit.clusterlab import MEMBERSHIP_PORT, ClusterLab, wait_until
from ringlog_proto import messages as m

SEND_EVERY_S: Final = 0.002
KAFKA_SEND_EVERY_S: Final = 0.004
MAX_OUTSTANDING: Final = 3000
SETTLE_S: Final = 60.0  # every ISR whole and every replica caught up after the last fault
CLUSTER_NAME: Final = "nemesis"
# few transaction coordinator partitions: made at once by the first transactional client, and
# each node leads about one, so a fault on a node takes a coordinator with it
TXN_STATE_PARTITIONS: Final = 3
# a paused or cut-off node accepts connections (the kernel does) and answers nothing: the clients
# give up on a request after this and ask another node (their default, 30 s, outlasts any fault)
REQUEST_TIMEOUT_MS: Final = 3000


def node_id(index: int) -> int:
    """The lab's node index -> its cluster node id (ids start at 1)."""
    return index + 1


def cluster_args(lab: ClusterLab, index: int) -> list[str]:
    """`broker serve` cluster flags for lab node `index`."""
    peers = ",".join(f"{n.ip}:{MEMBERSHIP_PORT}" for n in lab.nodes if n.index != index)
    return [
        "--node-id", str(node_id(index)), "--etcd", lab.etcd_endpoints, "--join", peers,
        "--cluster-name", CLUSTER_NAME, "--min-insync-replicas", "2",
        "--default-replication-factor", "3", "--replica-lag-time-max-ms", "10000",
        "--transaction-state-partitions", str(TXN_STATE_PARTITIONS),
    ]  # fmt: skip


def bootstrap(lab: ClusterLab) -> str:
    return ",".join(n.bootstrap for n in lab.nodes)


def start_cluster(lab: ClusterLab) -> None:
    lab.start_nodes(lambda i: cluster_args(lab, i))


def describe(lab: ClusterLab, topic: str) -> TopicDescription:
    """The topic as a live node describes it (nodes that do not answer are skipped)."""
    last: BaseException | None = None
    for node in lab.nodes:
        if not node.running() or node.host.isolated or (node.proc and node.proc.paused):
            continue
        try:
            with Admin(node.bootstrap, request_timeout_ms=3000) as admin:
                return admin.describe_topic(topic)
        except Exception as exc:  # that node is down or busy: ask the next
            last = exc
    raise RuntimeError(f"no node described {topic!r}: {last!r}")


def leader_of(lab: ClusterLab, topic: str, partition: int) -> tuple[int, int]:
    """(lab index of the leader node, leader epoch) of a partition."""
    p = describe(lab, topic).partitions[partition]
    return p.leader_node - 1, p.leader_epoch


def wait_new_leader(lab: ClusterLab, topic: str, partition: int, old: int, fault_at: float) -> float:
    """Wait until a node other than lab index `old` leads the partition; seconds since the fault
    (the cluster's part of a failover: the rest is the clients noticing)."""

    def moved() -> bool:
        # Right after a kill no node may answer within the describe's 3 s (the killed one not yet
        # reaped, the others electing): that is "not yet", and the wait's 30 s bound it.
        try:
            return leader_of(lab, topic, partition)[0] not in (old, -2)
        except RuntimeError:
            return False

    wait_until(moved, 30, "a new leader", step=0.05)
    return time.monotonic() - fault_at


def whole(lab: ClusterLab, topic: str) -> bool:
    """Every partition led by a live node, with all its replicas in sync."""
    try:
        d = describe(lab, topic)
    except RuntimeError:
        return False
    return all(p.leader_node > 0 and len(p.isr) == len(p.replicas) == len(lab.nodes) for p in d.partitions)


def wait_whole(lab: ClusterLab, topic: str, timeout: float = SETTLE_S) -> float:
    """Wait until `whole`; the seconds it took."""
    started = time.monotonic()
    wait_until(lambda: whole(lab, topic), timeout, f"every in-sync set of {topic} whole", step=0.1)
    return time.monotonic() - started


def known_everywhere(lab: ClusterLab, topic: str) -> bool:
    """Every node describes the topic with a leader for each partition."""
    for node in lab.nodes:
        try:
            with Admin(node.bootstrap, request_timeout_ms=3000) as admin:
                d = admin.describe_topic(topic)
        except Exception:
            return False
        if not all(p.leader_node > 0 for p in d.partitions):
            return False
    return True


def create_topic(lab: ClusterLab, topic: str, partitions: int = 3) -> None:
    """Create it and wait until every node knows it (a node that has not learnt of it yet answers
    UNKNOWN_TOPIC_OR_PARTITION, which a producer does not retry) and every ISR is whole."""
    with Admin(bootstrap(lab), request_timeout_ms=10_000) as admin:
        admin.create_topic(topic, partitions, replication=3)
    wait_until(lambda: known_everywhere(lab, topic), 30, f"every node to know {topic}", step=0.1)
    wait_whole(lab, topic, 30)


@dataclass
class Verdict:
    violations: list[Violation]
    acks: int
    reads: int
    high_watermarks: dict[int, int]


class Workload:
    """One producer thread and one consumer thread on `topic` (see the module's rules)."""

    def __init__(self, lab: ClusterLab, topic: str, partitions: int = 3, tag: str = "r") -> None:
        self.lab = lab
        self.topic = topic
        self.partitions = partitions
        self.tag = tag
        self.acks: list[Ack] = []
        # Kafka's acknowledgements that came without an offset: librdkafka's implicit ack (a
        # request whose outcome it could not know, timed out on a leader cut off, is counted
        # persisted once a later request of the partition succeeds, and its records are delivered
        # with offset -1001). Judged by their unique payload, placed at the offset the replicas
        # hold them at the verdict.
        self.offsetless: list[Ack] = []
        self.reads: list[Read] = []
        self.attempts: dict[int, list[Attempt]] = {p: [] for p in range(partitions)}
        self.errors: list[BaseException] = []
        self.consumer_failures: list[BaseException] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_reading = threading.Event()
        self._outstanding = threading.Semaphore(MAX_OUTSTANDING)
        self.kafka_errors: list[str] = []  # the group consumer's non-fatal errors (reconnections)
        self._producers = [
            threading.Thread(target=self._produce, name="nemesis-producer", daemon=True),
            threading.Thread(target=self._produce_kafka, name="nemesis-kafka-producer", daemon=True),
        ]
        self._consumers = [
            threading.Thread(target=self._consume, name="nemesis-consumer", daemon=True),
            threading.Thread(target=self._consume_kafka, name="nemesis-kafka-consumer", daemon=True),
        ]
        self._threads = self._producers + self._consumers

    def start(self) -> Workload:
        for t in self._threads:
            t.start()
        return self

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------------------- producer

    def _produce(self) -> None:
        try:
            with Producer(
                bootstrap(self.lab),
                acks=m.Acks.DURABLE,
                linger_ms=1,
                enable_idempotence=True,
                request_timeout_ms=REQUEST_TIMEOUT_MS,
            ) as p:
                n = 0
                while not self._stop.is_set():
                    if not self._outstanding.acquire(timeout=0.1):
                        continue
                    partition = n % self.partitions
                    payload = f"{self.tag}-{n}".encode()
                    started = time.monotonic()
                    fut = p.send(self.topic, payload, partition=partition)
                    fut.add_done_callback(
                        lambda f, pl=payload, pa=partition, s=started, q=n: self._answered(f, pl, pa, s, q)
                    )
                    n += 1
                    self.sent = n
                    time.sleep(SEND_EVERY_S)
                p.flush(120)
        except BaseException as exc:
            self.errors.append(exc)

    def _answered(
        self, fut: Future[RecordMetadata], payload: bytes, partition: int, started: float, seq: int
    ) -> None:
        self._outstanding.release()
        finished = time.monotonic()
        exc = fut.exception()
        with self._lock:
            self.attempts[partition].append(Attempt(started, finished, exc is None))
            if exc is None:
                md = fut.result()
                self.acks.append(Ack(self.topic, md.partition, md.offset, payload, "ours", seq))
            else:
                self.errors.append(exc)

    def _produce_kafka(self) -> None:
        def delivered(err: object, msg: confluent_kafka.Message, seq: int) -> None:
            with self._lock:
                if err is not None:
                    self.errors.append(confluent_kafka.KafkaException(err))
                else:
                    offset = msg.offset()
                    ack = Ack(
                        self.topic,
                        msg.partition(),
                        -1 if offset is None else offset,
                        msg.value(),
                        "kafka",
                        seq,
                    )
                    (self.offsetless if offset is None else self.acks).append(ack)

        try:
            config: dict[str, object] = {
                "bootstrap.servers": bootstrap(self.lab),
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 1,
                "request.timeout.ms": REQUEST_TIMEOUT_MS,
                "message.timeout.ms": 120_000,
            }
            debug = os.environ.get("NEMESIS_RDKAFKA_DEBUG")  # e.g. "eos": librdkafka's log to a file
            if debug:
                handler = logging.FileHandler(f"/tmp/nemesis-rdkafka-{self.tag}.log")
                rdlog = logging.getLogger(f"rdkafka.{self.tag}")
                rdlog.addHandler(handler)
                rdlog.setLevel(logging.DEBUG)
                config |= {"debug": debug, "logger": rdlog}
            p = confluent_kafka.Producer(config)
            n = 0
            while not self._stop.is_set():
                payload = f"{self.tag}-k{n}".encode()
                p.produce(
                    self.topic,
                    payload,
                    partition=n % self.partitions,
                    on_delivery=lambda err, msg, q=n: delivered(err, msg, q),
                )
                n += 1
                p.poll(KAFKA_SEND_EVERY_S)
            left = p.flush(150)
            if left:
                self.errors.append(RuntimeError(f"{left} Kafka records never answered"))
        except BaseException as exc:
            self.errors.append(exc)

    # ----------------------------------------------------------------------------- consumer

    def _consume(self) -> None:
        """Read until told to stop. A consumer that fails (e.g. its first ListOffsets answered
        NOT_OWNER past its request timeout by a node that has not learnt of the new topic yet)
        is replaced by a new one reading from the earliest offset again, as an application
        would; the failures are kept in `consumer_failures`."""
        while not self._stop_reading.is_set():
            try:
                with Consumer(
                    bootstrap(self.lab),
                    auto_offset_reset="earliest",
                    fetch_max_wait_ms=200,
                    request_timeout_ms=REQUEST_TIMEOUT_MS,
                ) as c:
                    c.assign([(self.topic, p) for p in range(self.partitions)])
                    while not self._stop_reading.is_set():
                        for r in c.poll(200):
                            with self._lock:
                                self.reads.append(Read(r.topic, r.partition, r.offset, r.value, "c"))
            except Exception as exc:
                self.consumer_failures.append(exc)
                time.sleep(0.2)

    def _consume_kafka(self) -> None:
        """A confluent-kafka group member, subscribed: the broker parks its fetches (long polls)
        on the partitions it leads while the producers write to them."""
        c = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap(self.lab),
                "group.id": f"nemesis-{self.tag}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000,
                "fetch.wait.max.ms": 500,
                # short: a rejoin under a new member id (its sync lost to a coordinator's death)
                # leaves the old id in the group until its session ends, and the group waits
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
            }
        )
        try:
            c.subscribe([self.topic])
            while not self._stop_reading.is_set():
                msg = c.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().fatal():
                        self.consumer_failures.append(confluent_kafka.KafkaException(msg.error()))
                        return
                    self.kafka_errors.append(str(msg.error()))
                    continue
                with self._lock:
                    self.reads.append(Read(self.topic, msg.partition(), msg.offset(), msg.value(), "k"))
        except Exception as exc:
            self.consumer_failures.append(exc)
        finally:
            c.close()

    # ----------------------------------------------------------------------------- control

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acks)

    def wait_acked(self, more: int, timeout: float = 30.0) -> None:
        """Wait until `more` further records are acknowledged."""
        target = self.acked_count() + more
        wait_until(lambda: self.acked_count() >= target, timeout, f"{more} more acknowledged records")

    def failover(self, fault_at: float, partitions: Sequence[int]) -> float | None:
        """Seconds from the fault to the first acknowledged produce sent after it, on the slowest of
        `partitions` (the ones the fault took the leader of); None if one never recovered."""
        with self._lock:
            times = [failover_time(list(self.attempts[p]), fault_at) for p in partitions]
        if any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    def wait_failover(self, fault_at: float, partitions: Sequence[int], timeout: float = 30.0) -> float:
        wait_until(lambda: self.failover(fault_at, partitions) is not None, timeout, "produce to resume")
        t = self.failover(fault_at, partitions)
        assert t is not None
        return t

    def longest_gap(self, since: float, until: float, partitions: Sequence[int] | None = None) -> float:
        """The longest time between two consecutive acknowledgements in [since, until] (on any
        of `partitions`; None: any partition): how long the producer saw nothing acknowledged."""
        with self._lock:
            chosen = self.attempts.keys() if partitions is None else partitions
            done = sorted(a.finished for p in chosen for a in self.attempts[p] if a.ok)
        times = [since, *(t for t in done if since < t < until), until]
        return max(b - a for a, b in itertools.pairwise(times))

    def stop(self, timeout: float = 150.0) -> None:
        """Stop producing (every send answered), then read until the consumer has every
        acknowledged record or `timeout` passes."""
        self._stop.set()
        for t in self._producers:
            t.join(timeout)

        def caught_up() -> bool:
            return not any(self.unread().values()) or not all(t.is_alive() for t in self._consumers)

        try:
            wait_until(caught_up, 30, "the consumers to read every acknowledged record", step=0.1)
        except TimeoutError as exc:
            raise TimeoutError(
                f"{exc}: unread per consumer {self.unread()}; first unread {self.unread_detail()}; "
                f"Kafka consumer's errors {self.kafka_errors[-5:]}; consumer failures "
                f"{self.consumer_failures[-3:]}"
            ) from exc
        finally:
            self._stop_reading.set()
            for t in self._consumers:
                t.join(timeout)

    def unread_detail(self, limit: int = 5) -> list[str]:
        """The first acknowledged records a consumer never read, each with the highest offset
        that consumer read of its partition: to tell a stuck consumer or high watermark from an
        acknowledgement naming an offset the log does not hold."""
        with self._lock:
            got = self._read_by_consumer()
            top: dict[tuple[str, int], int] = {}
            for r in self.reads:
                top[(r.consumer, r.partition)] = max(top.get((r.consumer, r.partition), -1), r.offset)
            out = [
                f"{who}: {a.producer} {a.payload!r} at {a.partition}/{a.offset} (read to "
                f"{top.get((who, a.partition), -1)})"
                for a in (*self.acks, *self.offsetless)
                for who, seen in got.items()
                if _key(a) not in seen
            ]
        return out[:limit]

    def unread(self) -> dict[str, int]:
        """Per consumer ("c": ours, "k": the Kafka group member), the acknowledged records it
        never read."""
        with self._lock:
            acked = {_key(a) for a in (*self.acks, *self.offsetless)}
            got = self._read_by_consumer()
        return {who: len(acked - seen) for who, seen in got.items()}

    def _read_by_consumer(self) -> dict[str, set[tuple[int, object]]]:
        """What each consumer read, as `_key`s: (partition, offset), and (partition, payload) for
        matching the acknowledgements that came without an offset."""
        got: dict[str, set[tuple[int, object]]] = {"c": set(), "k": set()}
        for r in self.reads:
            got[r.consumer].add((r.partition, r.offset))
            got[r.consumer].add((r.partition, r.payload))
        return got

    # ----------------------------------------------------------------------------- verdict

    def verdict(self) -> Verdict:
        """Once the cluster is quiet (every ISR whole, every replica at the high watermark), every
        replica read from its node's data dir and the checker run over the whole history."""
        lab, topic = self.lab, self.topic
        hws: dict[int, int] = {}
        replicas: list[Replica] = []

        def quiet() -> bool:
            nonlocal replicas, hws
            if not whole(lab, topic):
                return False
            d = describe(lab, topic)
            hws = {p.partition: p.end_offset for p in d.partitions}
            isr = {p.partition: {n for n, _ in p.isr} for p in d.partitions}
            replicas = [
                read_replica(node.data_dir, topic, p, node_id(node.index), node_id(node.index) in isr[p])
                for node in lab.nodes
                for p in range(self.partitions)
            ]
            return all(r.end == hws[r.partition] for r in replicas)

        wait_until(quiet, SETTLE_S, f"{topic}: every replica at the high watermark", step=0.2)
        placed = [_placed(a, replicas) for a in self.offsetless]
        acks = [*self.acks, *(a for a in placed if a.offset >= 0)]
        violations = check(acks, self.reads, replicas, {(topic, p): hw for p, hw in hws.items()})
        violations += [
            Violation(
                "lost",
                topic,
                a.partition,
                -1,
                f"{a.payload!r} (acked, no offset) on no replica",
            )
            for a in placed
            if a.offset < 0
        ]
        return Verdict(violations, len(self.acks) + len(placed), len(self.reads), hws)


def _key(a: Ack) -> tuple[int, object]:
    """How a consumer's reads are searched for an acknowledgement: by its offset, or by its
    (unique) payload when the client gave no offset."""
    return (a.partition, a.payload) if a.offset < 0 else (a.partition, a.offset)


def _placed(a: Ack, replicas: Sequence[Replica]) -> Ack:
    """An acknowledgement without an offset, given the offset an in-sync replica holds its payload
    at (the checker then judges it as any other: on every replica once, in its producer's order);
    -1 when no replica holds it."""
    for r in replicas:
        if r.partition == a.partition and r.in_sync:
            for offset, payload in r.records:
                if payload == a.payload:
                    return dataclasses.replace(a, offset=offset)
    return a
