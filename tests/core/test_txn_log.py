"""The transaction state log's records and loader: what a coordinator writes reads back the same,
a tombstone forgets an id, and a record this version cannot read is refused, never guessed at."""

from __future__ import annotations

import json

import pytest

from broker.core.txn_log import (
    RECORD_VERSION,
    TxnLogLoader,
    TxnRecord,
    TxnRecordError,
    TxnState,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    load,
)

ONGOING = TxnRecord(
    7, 3, 7, 2, 60_000, TxnState.ONGOING, frozenset({(1, 0), (2, 5)}), frozenset({"g"}), 1000, 1500
)


def test_a_record_reads_back_as_written() -> None:
    for state in (TxnState.EMPTY, TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.COMPLETE_ABORT):
        record = TxnRecord(7, 3, 6, -1, 60_000, state, ONGOING.partitions, ONGOING.groups, 1000, 1500)
        assert decode_value(encode_value(record)) == record
    assert decode_key(encode_key("tx-é")) == "tx-é"
    assert encode_value(None) is None and decode_value(None) is None


def test_the_value_is_versioned_json_with_the_plans_fields() -> None:
    doc = json.loads(encode_value(ONGOING) or b"")
    assert doc == {
        "version": RECORD_VERSION,
        "pid": 7,
        "epoch": 3,
        "last_pid": 7,
        "last_epoch": 2,
        "timeout_ms": 60_000,
        "state": "Ongoing",
        "partitions": [[1, 0], [2, 5]],
        "groups": ["g"],
        "start_ms": 1000,
        "update_ms": 1500,
    }


def test_states_never_written_are_refused_both_ways() -> None:
    for state in (TxnState.DEAD, TxnState.PREPARE_EPOCH_FENCE):
        with pytest.raises(TxnRecordError):
            encode_value(TxnRecord(1, 0, -1, -1, 1000, state))
        bad = json.loads(encode_value(ONGOING) or b"")
        bad["state"] = state.value
        with pytest.raises(TxnRecordError):
            decode_value(json.dumps(bad).encode())


@pytest.mark.parametrize(
    "change",
    [
        {"version": RECORD_VERSION + 1},
        {"state": "Sleeping"},
        {"pid": "7"},
        {"epoch": True},
        {"partitions": [[1]]},
        {"partitions": [["t", 0]]},
        {"groups": [1]},
        {"groups": "g"},
    ],
)
def test_a_value_of_another_version_or_shape_is_refused(change: dict[str, object]) -> None:
    doc = json.loads(encode_value(ONGOING) or b"")
    doc.update(change)
    with pytest.raises(TxnRecordError):
        decode_value(json.dumps(doc).encode())


def test_damaged_bytes_and_keys_are_refused() -> None:
    for value in (b"not json", b"\xff\xfe", b"[1, 2]"):
        with pytest.raises(TxnRecordError):
            decode_value(value)
    for key in (None, b"", b"\xff"):
        with pytest.raises(TxnRecordError):
            decode_key(key)
    with pytest.raises(TxnRecordError):
        encode_key("")


def test_the_loader_keeps_each_ids_last_record_and_forgets_tombstoned_ids() -> None:
    empty = TxnRecord(7, 0, -1, -1, 60_000, TxnState.EMPTY, update_ms=1)
    prepared = TxnRecord(
        9, 0, -1, -1, 60_000, TxnState.PREPARE_ABORT, frozenset({(1, 1)}), start_ms=2, update_ms=3
    )
    loader = TxnLogLoader()
    loader.feed([(b"a", encode_value(empty)), (b"b", encode_value(prepared))])
    loader.feed([(b"a", encode_value(ONGOING)), (b"c", encode_value(empty)), (b"c", None)])
    assert loader.state() == {"a": ONGOING, "b": prepared}
    assert loader.unfinished() == ["b"]
    assert load([(b"c", encode_value(empty)), (b"c", None), (b"c", encode_value(empty))]) == {"c": empty}
