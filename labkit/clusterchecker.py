"""The nemesis's checker: what a cluster run promised (acknowledged produces), what its consumers
saw, and what every replica holds at the end, turned into the list of broken promises.

Test and bench harness, not broker code, like labkit/clusterlab.py. A pure library: no network,
no broker; `read_replica` reads a node's data dir offline, without opening (and so without
repairing) the log.

Rules this module keeps:
- Records are told apart by their payload (the record's value): a producer under test writes a
  unique payload per record of a partition, so "the same record" means "the same payload".
- The truth of a partition at the end is its in-sync replicas (the replicas the caller names
  in-sync, from the final metadata). Offset by offset, the reference is the value most in-sync
  replicas hold there (the first one named wins a tie; a tie is itself a divergence).
- The high watermark of a partition is the caller's (from the final metadata), or else the
  smallest end offset among its in-sync replicas: what every in-sync replica holds.
- Offsets below a replica's first offset (removed by retention) are not judged on that replica.

Violations (`Violation.kind`):
- conflicting-acks: two produces acknowledged at the same offset with different payloads.
- lost: an acknowledged record is nowhere in an in-sync replica.
- moved: an acknowledged record is in an in-sync replica, but not at the offset acknowledged.
- duplicated: an acknowledged record is at more than one offset of an in-sync replica.
- read-conflict: two reads of one offset returned different payloads.
- read-changed: a consumer read a record at an offset that, at the end, holds a different
  record or none (a dirty read of something later truncated, or a rewrite).
- divergent: below the high watermark a replica (in-sync or not) holds a different record, or
  no record where the reference has one: a suffix left untruncated after a leader change.
- no-in-sync-replica: acknowledged records of a partition that ends with no in-sync replica.
- reordered: two records one producer sent to a partition (`Ack.seq` given) were acknowledged at
  offsets in the other order (an idempotent producer keeps its order per partition).

Transactions (`check_transactions`, one transactional producer's history read `read_committed`;
Kafka's guarantees of KIP-98 as its clients see them) add:
- aborted-visible: a record of a transaction the client aborted, or never asked to commit, was read.
- lost: a committed transaction of which no record was read.
- partial: a transaction of which some records but not all were read (committed, or one whose
  commit raised, so the client does not know: that one must be all or nothing).
- duplicated: a record read at more than one offset.
- foreign: a record read that no transaction of the history wrote.
- reordered: in a partition, a record of a later transaction (or later in its own) read at a
  smaller offset than one of an earlier (one producer's transactions follow each other).
- unstable: once quiet, a partition's last stable offset is not its high watermark (a
  transaction left open, or a marker never written, holds read_committed readers back).
- markers-divergent: below the high watermark a replica's transaction markers differ from the
  in-sync replicas' (read with `read_replica(..., markers=True)`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from broker.storage import layout
from ringlog_proto.batch import (
    CONTROL_BIT,
    BatchError,
    control_of,
    decode_records,
    invalid_stored_batch,
    iter_batches,
)

Payload = bytes | None  # a record's value (None: a tombstone)
Key = tuple[str | int, int]  # (topic, partition)
MISSING: Final = object()


@dataclass(frozen=True)
class Ack:
    """A produce the cluster acknowledged: `payload` at `offset` of topic/partition; `seq`: the
    order in which `producer` sent it (-1: not judged for order)."""

    topic: str | int
    partition: int
    offset: int
    payload: Payload
    producer: str = ""
    seq: int = -1


@dataclass(frozen=True)
class Read:
    """A record a consumer was handed."""

    topic: str | int
    partition: int
    offset: int
    payload: Payload
    consumer: str = ""


@dataclass(frozen=True)
class Replica:
    """One replica's final log of a partition: (offset, payload) in offset order."""

    node: str | int
    topic: str | int
    partition: int
    records: Sequence[tuple[int, Payload]]
    in_sync: bool = True

    @property
    def start(self) -> int:
        return self.records[0][0] if self.records else 0

    @property
    def end(self) -> int:
        """The offset after the last record (its log end offset, as far as records show)."""
        return self.records[-1][0] + 1 if self.records else 0


@dataclass(frozen=True)
class Violation:
    kind: str
    topic: str | int
    partition: int
    offset: int
    detail: str
    node: str | int | None = None

    def __str__(self) -> str:
        where = f"{self.topic}/{self.partition}@{self.offset}"
        on = f" on node {self.node}" if self.node is not None else ""
        return f"{self.kind}: {where}{on}: {self.detail}"


def _short(payload: object) -> str:
    if payload is MISSING:
        return "nothing"
    text = repr(payload)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class _Partition:
    acks: list[Ack] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)


def check(
    acks: Iterable[Ack],
    reads: Iterable[Read],
    replicas: Iterable[Replica],
    high_watermarks: Mapping[Key, int] | None = None,
) -> list[Violation]:
    """Every violation of the history (see the module's rules), ordered by partition and offset."""
    parts: dict[Key, _Partition] = defaultdict(_Partition)
    for a in acks:
        parts[(a.topic, a.partition)].acks.append(a)
    for r in reads:
        parts[(r.topic, r.partition)].reads.append(r)
    for rep in replicas:
        parts[(rep.topic, rep.partition)].replicas.append(rep)
    out: list[Violation] = []
    for key in sorted(parts, key=lambda k: (str(k[0]), k[1])):
        hw = None if high_watermarks is None else high_watermarks.get(key)
        out += _check_partition(key, parts[key], hw)
    return sorted(out, key=lambda v: (str(v.topic), v.partition, v.offset, v.kind, str(v.node)))


def _check_partition(key: Key, part: _Partition, hw: int | None) -> list[Violation]:
    topic, partition = key
    out: list[Violation] = []

    def add(kind: str, offset: int, detail: str, node: str | int | None = None) -> None:
        out.append(Violation(kind, topic, partition, offset, detail, node))

    acked: dict[int, set[Payload]] = defaultdict(set)
    for a in part.acks:
        acked[a.offset].add(a.payload)
    for offset, payloads in acked.items():
        if len(payloads) > 1:
            add("conflicting-acks", offset, "acknowledged with " + ", ".join(map(_short, payloads)))

    by_producer: dict[str, list[Ack]] = defaultdict(list)
    for a in part.acks:
        if a.seq >= 0:
            by_producer[a.producer].append(a)
    for producer, sent in by_producer.items():
        sent.sort(key=lambda a: a.seq)
        for before, after in itertools.pairwise(sent):
            if after.offset < before.offset:
                add(
                    "reordered",
                    after.offset,
                    f"{producer}: {_short(after.payload)} sent after {_short(before.payload)}, "
                    f"acknowledged before it (at {before.offset})",
                )

    in_sync = [r for r in part.replicas if r.in_sync]
    logs = {id(r): dict(r.records) for r in part.replicas}
    if not in_sync:
        if part.acks:
            first = min(a.offset for a in part.acks)
            add("no-in-sync-replica", first, f"{len(part.acks)} acknowledged records, no in-sync replica")
        return out

    # acknowledged records on every in-sync replica
    for rep in in_sync:
        log = logs[id(rep)]
        where: dict[Payload, list[int]] = defaultdict(list)
        for offset, payload in rep.records:
            where[payload].append(offset)
        for a in part.acks:
            if a.offset < rep.start:
                continue  # removed by retention
            found = where.get(a.payload, [])
            if len(found) > 1:
                add("duplicated", a.offset, f"{_short(a.payload)} at offsets {found}", rep.node)
            if a.offset in found:
                continue
            if found:
                add("moved", a.offset, f"{_short(a.payload)} at offset {found[0]} instead", rep.node)
            else:
                held = _short(log.get(a.offset, MISSING))
                add("lost", a.offset, f"{_short(a.payload)} missing (the offset holds {held})", rep.node)

    # the reference log: per offset, the value most in-sync replicas hold
    reference: dict[int, object] = {}
    for offset in sorted({o for r in in_sync for o, _ in r.records}):
        votes = Counter((logs[id(r)].get(offset, MISSING),) for r in in_sync if r.start <= offset < r.end)
        reference[offset] = votes.most_common(1)[0][0][0] if votes else MISSING
    high = min(r.end for r in in_sync) if hw is None else hw

    # what consumers read
    seen: dict[int, set[Payload]] = defaultdict(set)
    for r in part.reads:
        seen[r.offset].add(r.payload)
    for offset, payloads in sorted(seen.items()):
        if len(payloads) > 1:
            add("read-conflict", offset, "read as " + ", ".join(map(_short, payloads)))
        if all(offset < rep.start for rep in in_sync):
            continue  # removed by retention everywhere
        now = reference.get(offset, MISSING)
        for payload in payloads:
            if now is MISSING or now != payload:
                add("read-changed", offset, f"read {_short(payload)}, the log now holds {_short(now)}")

    # divergence below the high watermark, on every replica
    for rep in part.replicas:
        log = logs[id(rep)]
        bad = [
            o
            for o in range(rep.start, min(high, rep.end))
            if o in reference and log.get(o, MISSING) != reference[o]
        ]
        if bad:
            o = bad[0]
            add(
                "divergent",
                o,
                f"{len(bad)} offsets below the high watermark {high} differ from the in-sync replicas "
                f"(first: {_short(log.get(o, MISSING))}, reference {_short(reference[o])})",
                rep.node,
            )
    return out


COMMITTED: Final = "committed"
ABORTED: Final = "aborted"  # aborted by the client, or never asked to commit
UNKNOWN: Final = "unknown"  # the commit was asked and raised: the client cannot tell


@dataclass(frozen=True)
class Txn:
    """One transaction a transactional producer began: its records (partition, payload) in the
    order sent, and its outcome as the client knows it (COMMITTED, ABORTED or UNKNOWN)."""

    number: int
    records: tuple[tuple[int, Payload], ...]
    outcome: str


def check_transactions(
    topic: str | int,
    txns: Iterable[Txn],
    reads: Iterable[Read],
    replicas: Iterable[Replica] = (),
    markers: Iterable[Replica] = (),
    high_watermarks: Mapping[int, int] | None = None,
    stable_offsets: Mapping[int, int] | None = None,
) -> list[Violation]:
    """Every violation (module rules) of one transactional producer's history on `topic`: `reads`
    are what read_committed consumers were handed; `replicas` and `markers` the final logs
    (records, and markers as `read_replica(..., markers=True)` gives them), judged as `check`
    judges them; `high_watermarks` and `stable_offsets` per partition once quiet."""
    txns = list(txns)
    reads = [r for r in reads if r.topic == topic]
    out: list[Violation] = []

    def add(kind: str, partition: int, offset: int, detail: str) -> None:
        out.append(Violation(kind, topic, partition, offset, detail))

    written: dict[Payload, tuple[Txn, int]] = {}
    for t in txns:
        for i, (_, payload) in enumerate(t.records):
            written[payload] = (t, i)
    offsets: dict[tuple[int, Payload], set[int]] = defaultdict(set)
    for r in reads:
        offsets[(r.partition, r.payload)].add(r.offset)
    for (partition, payload), where in sorted(offsets.items(), key=lambda kv: (kv[0][0], min(kv[1]))):
        if len(where) > 1:
            add("duplicated", partition, min(where), f"{_short(payload)} read at offsets {sorted(where)}")
        if payload not in written:
            add("foreign", partition, min(where), f"{_short(payload)} written by no transaction")
    for t in txns:
        seen = [(p, v) for p, v in t.records if (p, v) in offsets]
        if not seen:
            if t.outcome == COMMITTED and t.records:
                p, v = t.records[0]
                add("lost", p, -1, f"committed transaction {t.number}: none of {len(t.records)} read")
            continue
        p, v = seen[0]
        at = min(offsets[(p, v)])
        if t.outcome == ABORTED:
            add("aborted-visible", p, at, f"transaction {t.number}: {len(seen)} read, e.g. {_short(v)}")
        elif len(seen) < len(t.records):
            missing = next(r for r in t.records if r not in offsets)
            add(
                "partial",
                p,
                at,
                f"{t.outcome} transaction {t.number}: {len(seen)} of {len(t.records)} read "
                f"({_short(missing[1])} never)",
            )
    by_partition: dict[int, dict[int, Payload]] = defaultdict(dict)
    for r in reads:
        by_partition[r.partition][r.offset] = r.payload
    for partition, log in sorted(by_partition.items()):
        order = [(o, written[v][0].number, written[v][1], v) for o, v in sorted(log.items()) if v in written]
        for before, after in itertools.pairwise(order):
            if after[1:3] < before[1:3]:
                add(
                    "reordered",
                    partition,
                    after[0],
                    f"{_short(after[3])} (transaction {after[1]}) after {_short(before[3])} "
                    f"(transaction {before[1]}) at {before[0]}",
                )
    for partition, hw in sorted((high_watermarks or {}).items()):
        lso = (stable_offsets or {}).get(partition)
        if stable_offsets is not None and lso != hw:
            at = -1 if lso is None else lso
            add("unstable", partition, at, f"last stable offset {lso}, high watermark {hw}")
    hws = None if high_watermarks is None else {(topic, p): hw for p, hw in high_watermarks.items()}
    out += check([], reads, replicas, hws)
    out += [dataclasses.replace(v, kind=f"markers-{v.kind}") for v in check([], [], markers, hws)]
    return sorted(out, key=lambda v: (str(v.topic), v.partition, v.offset, v.kind, str(v.node)))


def report(violations: Sequence[Violation], limit: int = 20) -> str:
    """A readable summary: counts by kind, then the first `limit` violations."""
    if not violations:
        return "no violations"
    counts = Counter(v.kind for v in violations)
    lines = [", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))]
    lines += [f"  {v}" for v in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"  ... {len(violations) - limit} more")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- replicas on disk


def read_partition(directory: str, markers: bool = False) -> list[tuple[int, Payload]]:
    """(offset, payload) of every record in a partition directory, segment by segment, read
    without opening the log: nothing is repaired or truncated. Reading stops where the broker's
    recovery would cut (the first batch that is partial, fails its crc or does not frame); control
    batches (transaction markers) carry no payload and are skipped. `markers`: the control batches
    alone instead, each as (offset, b"commit <producer id>" or b"abort <producer id>")."""
    out: list[tuple[int, Payload]] = []
    bases = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            parsed = layout.parse_segment_name(name)
            if parsed is not None and parsed[1] == layout.STORE_SUFFIX:
                bases.append(parsed[0])
    for base in sorted(bases):
        with open(os.path.join(directory, layout.store_file_name(base)), "rb") as f:
            data = f.read()
        end = 0
        try:
            for pos, h in iter_batches(data):
                if invalid_stored_batch(data, pos) is not None:
                    return out
                end = pos + h.size
                if bool(h.attributes & CONTROL_BIT) != markers:
                    continue
                if markers:
                    kind = "commit" if control_of(data, pos).commit else "abort"
                    out.append((h.base_offset, f"{kind} {h.producer_id}".encode()))
                    continue
                out.extend((r.offset, r.value) for r in decode_records(data, pos))
        except BatchError:
            return out
        if end < len(data):
            return out  # a torn tail: what follows was never whole
    return out


def topic_ids(data_dir: str) -> dict[str, int]:
    """Topic name -> id from a data dir's registry ({} when it has none)."""
    try:
        with open(layout.topics_file_path(data_dir)) as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    return {t["name"]: int(t["topic_id"]) for t in doc.get("topics", [])}


def read_replica(
    data_dir: str | os.PathLike[str],
    topic: str | int,
    partition: int,
    node: str | int,
    in_sync: bool = True,
    markers: bool = False,
) -> Replica:
    """Node `node`'s replica of topic/partition (a topic name, resolved through the data dir's
    registry, or a topic id), read offline from its data dir. A partition the node never had
    reads as empty. `markers`: its transaction markers instead of its records (`read_partition`)."""
    data_dir = os.fspath(data_dir)
    topic_id = topic if isinstance(topic, int) else topic_ids(data_dir).get(topic)
    where = None if topic_id is None else layout.partition_dir(data_dir, topic_id, partition)
    records = [] if where is None else read_partition(where, markers)
    return Replica(node, topic, partition, tuple(records), in_sync)


# ----------------------------------------------------------------------------- availability


@dataclass(frozen=True)
class Attempt:
    """One produce: when it was sent and when it ended (time.monotonic()), and whether it was
    acknowledged."""

    started: float
    finished: float
    ok: bool


class Timeline:
    """The produce attempts of a run, for failover times: `with timeline.attempt(): produce()`
    records an attempt that succeeds unless the block raises (the exception propagates)."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []

    @contextlib.contextmanager
    def attempt(self) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        except BaseException:
            self.attempts.append(Attempt(started, time.monotonic(), False))
            raise
        self.attempts.append(Attempt(started, time.monotonic(), True))

    def failover_time(self, fault_at: float) -> float | None:
        return failover_time(self.attempts, fault_at)


def failover_time(attempts: Iterable[Attempt], fault_at: float) -> float | None:
    """Seconds from a fault (at `fault_at`, same clock as the attempts) to the first acknowledged
    produce sent at or after it; None when none was. A produce already in flight at the fault
    does not count: it may have been acknowledged by the old leader before it fell."""
    done = [a.finished for a in attempts if a.ok and a.started >= fault_at]
    return min(done) - fault_at if done else None


def spread(values: Sequence[float]) -> str:
    """Measured times as "median (min..max, n=count)", for reports."""
    if not values:
        return "no samples"
    return f"{statistics.median(values):.3f} s ({min(values):.3f}..{max(values):.3f}, n={len(values)})"
