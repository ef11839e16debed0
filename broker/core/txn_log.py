"""The transaction state log: the records a transaction coordinator writes, and the loader that
rebuilds a coordinator's state from them.

Rules this module keeps:
- One record per state change of a transactional id, as Kafka's `__transaction_state` holds
  (TransactionLog: key = the transactional id, value = the id's whole metadata after the change),
  so the last record of an id is its state and a compacted log loses nothing. A null value (a
  tombstone) says the id expired: the loader forgets it, and compaction later drops both.
- The key is the id's UTF-8 bytes. The value is versioned JSON (`RECORD_VERSION`): producer id
  and epoch, the last producer id and epoch (KIP-360: a retried InitProducerId after a bump is
  answered, not fenced), the timeout, the state, the data partitions and groups of the
  transaction under way, its start and last update (milliseconds of the wall clock: they outlive
  the node that wrote them, as Kafka's do). JSON rather than Kafka's binary schema: these records
  are read only by our coordinator, and a record is a few hundred bytes written a few times per
  transaction.
- Only the states a coordinator completes are written: Dead is a tombstone, and Kafka's
  PrepareEpochFence is never durable (the fence is written as PrepareAbort at the bumped epoch).
  A value that is not a record of this version is refused loudly (`TxnRecordError`), never
  guessed at: a coordinator answering from a state it misread could let a fenced producer commit.
- Loading is incremental (`TxnLogLoader.feed`, a chunk at a time, as the coordinator taking a
  partition over reads it across loop turns); `state()` is what the records say, and
  `unfinished()` the transactions found in PrepareCommit or PrepareAbort, whose markers the new
  coordinator must send again (Kafka's loadTransactionsForTxnTopicPartition).
- Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from broker.core.groups import PartitionId

RECORD_VERSION: Final = 1
TXN_ID_MAX: Final = 32_767  # characters: what a Kafka STRING (int16 length) carries


class TxnState(Enum):
    """Kafka's TransactionState; the values are the names DescribeTransactions shows."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"


# The states a record may carry (module rules).
STORED_STATES: Final = frozenset(
    {
        TxnState.EMPTY,
        TxnState.ONGOING,
        TxnState.PREPARE_COMMIT,
        TxnState.PREPARE_ABORT,
        TxnState.COMPLETE_COMMIT,
        TxnState.COMPLETE_ABORT,
    }
)
PREPARED: Final = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})


class TxnRecordError(ValueError):
    """A transaction state record this version cannot read."""


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """An id's metadata after one state change: the value of its record."""

    producer_id: int
    producer_epoch: int
    last_producer_id: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[PartitionId] = frozenset()
    groups: frozenset[str] = frozenset()
    start_ms: int = -1  # when the transaction under way added its first partition or group
    update_ms: int = -1


def encode_key(txn_id: str) -> bytes:
    if not txn_id:
        raise TxnRecordError("a transactional id is not empty")
    return txn_id.encode()


def decode_key(key: bytes | None) -> str:
    if not key:
        raise TxnRecordError("a transaction state record without a key")
    try:
        return key.decode()
    except UnicodeDecodeError as exc:
        raise TxnRecordError(f"a transaction state key that is not UTF-8: {exc}") from None


def encode_value(record: TxnRecord | None) -> bytes | None:
    """The record's value; None (a tombstone) for an id that expired."""
    if record is None:
        return None
    if record.state not in STORED_STATES:
        raise TxnRecordError(f"{record.state.value} is never written (module rules)")
    doc = {
        "version": RECORD_VERSION,
        "pid": record.producer_id,
        "epoch": record.producer_epoch,
        "last_pid": record.last_producer_id,
        "last_epoch": record.last_producer_epoch,
        "timeout_ms": record.timeout_ms,
        "state": record.state.value,
        "partitions": sorted([t, p] for t, p in record.partitions),
        "groups": sorted(record.groups),
        "start_ms": record.start_ms,
        "update_ms": record.update_ms,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode_value(value: bytes | None) -> TxnRecord | None:
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TxnRecordError(f"a transaction state value that is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
        raise TxnRecordError(f"not a transaction state record of version {RECORD_VERSION}")
    try:
        state = TxnState(doc["state"])
    except (KeyError, ValueError):
        raise TxnRecordError(f"unknown transaction state {doc.get('state')!r}") from None
    if state not in STORED_STATES:
        raise TxnRecordError(f"{state.value} is never written (module rules)")
    parts = _list(doc, "partitions")
    if not all(isinstance(x, list) and len(x) == 2 and all(_is_int(v) for v in x) for x in parts):
        raise TxnRecordError("partitions are [topic id, partition] pairs")
    groups = _list(doc, "groups")
    if not all(isinstance(g, str) for g in groups):
        raise TxnRecordError("groups are strings")
    return TxnRecord(
        producer_id=_int(doc, "pid"),
        producer_epoch=_int(doc, "epoch"),
        last_producer_id=_int(doc, "last_pid"),
        last_producer_epoch=_int(doc, "last_epoch"),
        timeout_ms=_int(doc, "timeout_ms"),
        state=state,
        partitions=frozenset((t, p) for t, p in parts),
        groups=frozenset(groups),
        start_ms=_int(doc, "start_ms"),
        update_ms=_int(doc, "update_ms"),
    )


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(doc: dict[str, Any], name: str) -> int:
    v = doc.get(name)
    if not _is_int(v):
        raise TxnRecordError(f"{name} is {v!r}, not an integer")
    assert isinstance(v, int)
    return v


def _list(doc: dict[str, Any], name: str) -> list[Any]:
    v = doc.get(name)
    if not isinstance(v, list):
        raise TxnRecordError(f"{name} is {v!r}, not a list")
    return v


class TxnLogLoader:
    """One partition's transaction state, rebuilt from its records in log order."""

    __slots__ = ("_txns",)

    def __init__(self) -> None:
        self._txns: dict[str, TxnRecord] = {}

    def feed(self, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """The next (key, value) records of the log, in log order."""
        for key, value in records:
            txn_id = decode_key(key)
            record = decode_value(value)
            if record is None:
                self._txns.pop(txn_id, None)
            else:
                self._txns[txn_id] = record

    def state(self) -> dict[str, TxnRecord]:
        return dict(self._txns)

    def unfinished(self) -> list[str]:
        """The ids whose transaction was being committed or aborted: their markers go again."""
        return sorted(i for i, r in self._txns.items() if r.state in PREPARED)


def load(records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[str, TxnRecord]:
    """The state a partition's records say, in one go."""
    loader = TxnLogLoader()
    loader.feed(records)
    return loader.state()
