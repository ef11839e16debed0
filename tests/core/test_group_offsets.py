"""The per-group offsets store (one durable file per group, offsets under topic ids) and the
one-time move of the old per-partition offsets files into it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from broker.core.groups import (
    NOTHING_COMMITTED,
    Committed,
    GroupOffsetStore,
    StaleProducerEpoch,
    migrate_partition_offsets,
)
from broker.storage import layout


def test_a_commit_is_one_file_named_by_a_hash_with_the_id_inside(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    group = "a/../../weird group ✓"
    store.commit(group, {(3, 0): Committed(10, "x"), (3, 1): Committed(11, "")})
    path = layout.group_file_path(str(tmp_path), group)
    assert os.path.dirname(path) == layout.groups_dir(str(tmp_path))
    doc = json.loads(Path(path).read_text())
    assert doc == {"group": group, "offsets": [[3, 0, 10, "x"], [3, 1, 11, ""]]}
    assert GroupOffsetStore(str(tmp_path)).offsets(group) == {(3, 0): (10, "x"), (3, 1): (11, "")}


def test_old_partition_files_move_into_the_group_store_once(tmp_path: Path) -> None:
    data = str(tmp_path)
    for topic_id, index, doc in (
        (1, 0, {"g": [5, "m0"], "h": [1, ""]}),
        (1, 1, {"g": [6, ""]}),
        (2, 0, {"h": [9, "z"]}),
    ):
        d = layout.partition_dir(data, topic_id, index)
        os.makedirs(d)
        Path(layout.group_offsets_path(d)).write_text(json.dumps(doc))
    # an offset the store already has (an interrupted earlier run) is kept
    GroupOffsetStore(data).commit("h", {(2, 0): Committed(12, "newer")})
    assert migrate_partition_offsets(data) == 4
    store = GroupOffsetStore(data)
    assert store.offsets("g") == {(1, 0): (5, "m0"), (1, 1): (6, "")}
    assert store.offsets("h") == {(1, 0): (1, ""), (2, 0): (12, "newer")}
    assert not any(
        os.path.exists(layout.group_offsets_path(layout.partition_dir(data, t, i)))
        for t, i in ((1, 0), (1, 1), (2, 0))
    )
    assert migrate_partition_offsets(data) == 0  # nothing left to move


def test_offsets_of_deleted_topics_go_at_the_next_commit(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit("g", {(1, 0): Committed(4, ""), (2, 0): Committed(5, "")})
    store.commit("g", {(3, 0): Committed(6, "")}, live=lambda topic_id: topic_id != 1)
    assert GroupOffsetStore(str(tmp_path)).offsets("g") == {(2, 0): (5, ""), (3, 0): (6, "")}


# ----------------------------------------------------------------------------- transactional offsets


def test_pending_offsets_are_durable_but_not_committed_until_the_marker(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit("g", {(1, 0): Committed(3, "")})
    store.commit_pending("g", 7, 0, {(1, 0): Committed(10, "t"), (1, 1): Committed(11, "")})
    assert store.offsets("g") == {(1, 0): (3, "")}
    assert store.pending_for("g", [(1, 0), (1, 1), (1, 2)]) == {(1, 0), (1, 1)}
    reopened = GroupOffsetStore(str(tmp_path))  # a restart keeps them pending
    assert reopened.offsets("g") == {(1, 0): (3, "")}
    assert reopened.pending_for("g", [(1, 0), (1, 1)]) == {(1, 0), (1, 1)}
    assert reopened.complete_pending("g", 7, commit=True)
    assert reopened.offsets("g") == {(1, 0): (10, "t"), (1, 1): (11, "")}
    assert reopened.pending_for("g", [(1, 0), (1, 1)]) == set()
    doc = json.loads(Path(layout.group_file_path(str(tmp_path), "g")).read_text())
    assert doc == {"group": "g", "offsets": [[1, 0, 10, "t"], [1, 1, 11, ""]]}  # the form it always had
    assert not reopened.complete_pending("g", 7, commit=True)  # a second marker changes nothing


def test_an_aborted_transaction_drops_its_offsets_and_leaves_the_others(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit_pending("g", 7, 0, {(1, 0): Committed(10, "")})
    store.commit_pending("g", 8, 2, {(1, 1): Committed(20, "")})
    store.commit_pending("g", 7, 0, {(1, 0): Committed(12, "")})  # the later one of a producer wins
    assert store.complete_pending("g", 7, commit=False)
    reopened = GroupOffsetStore(str(tmp_path))
    assert reopened.offsets("g") == {}
    assert reopened.has_offsets("g")  # its pending ones count, as Kafka's hasOffsets
    assert reopened.pending_for("g", [(1, 0), (1, 1)]) == {(1, 1)}
    assert reopened.complete_pending("g", 8, commit=True)
    assert GroupOffsetStore(str(tmp_path)).offsets("g") == {(1, 1): (20, "")}


def test_a_plain_commit_after_a_pending_one_wins_when_the_transaction_commits(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit_pending("g", 7, 0, {(1, 0): Committed(10, ""), (1, 1): Committed(11, "")})
    store.commit("g", {(1, 0): Committed(50, "plain")})
    assert store.pending_for("g", [(1, 0)]) == {(1, 0)}  # still unstable until the marker
    store.commit_pending("g", 8, 0, {(1, 1): Committed(5, "")})
    store.commit("g", {(1, 1): Committed(6, "")})
    store.commit_pending("g", 8, 0, {(1, 1): Committed(9, "")})  # newer than the plain commit again
    reopened = GroupOffsetStore(str(tmp_path))
    assert reopened.complete_pending("g", 7, commit=True)
    # both of its partitions were committed plainly after its pending offsets: those stay
    assert reopened.offsets("g") == {(1, 0): (50, "plain"), (1, 1): (6, "")}
    assert reopened.complete_pending("g", 8, commit=True)
    assert GroupOffsetStore(str(tmp_path)).offsets("g") == {(1, 0): (50, "plain"), (1, 1): (9, "")}


def test_an_older_epoch_is_refused_and_a_newer_one_takes_over(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit_pending("g", 7, 3, {(1, 0): Committed(10, "")})
    with pytest.raises(StaleProducerEpoch):
        store.commit_pending("g", 7, 2, {(1, 0): Committed(99, "")})
    store.commit_pending("g", 7, 4, {(1, 1): Committed(11, "")})
    reopened = GroupOffsetStore(str(tmp_path))
    with pytest.raises(StaleProducerEpoch):
        reopened.commit_pending("g", 7, 3, {(1, 0): Committed(99, "")})
    reopened.complete_pending("g", 7, commit=True)
    assert reopened.offsets("g") == {(1, 0): (10, ""), (1, 1): (11, "")}


def test_deleting_offsets_or_the_group_drops_pending_ones_too(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit_pending("g", 7, 0, {(1, 0): Committed(10, ""), (2, 0): Committed(20, "")})
    store.delete_offsets("g", [(1, 0)])
    assert GroupOffsetStore(str(tmp_path)).pending_for("g", [(1, 0), (2, 0)]) == {(2, 0)}
    store.commit("g", {(3, 0): Committed(1, "")}, live=lambda topic_id: topic_id != 2)  # topic 2 deleted
    assert GroupOffsetStore(str(tmp_path)).pending_for("g", [(2, 0)]) == set()
    store.commit_pending("g", 8, 0, {(3, 0): Committed(30, "")})
    assert store.delete_group("g")
    assert not os.path.exists(layout.group_file_path(str(tmp_path), "g"))
    assert not GroupOffsetStore(str(tmp_path)).complete_pending("g", 8, commit=True)


def test_a_lookup_of_a_group_without_offsets_keeps_nothing_in_memory(tmp_path: Path) -> None:
    """Any name can be asked about (a lag monitor polling names, a group deleted): asking must not
    leave an entry behind for each name, and a group whose last offsets (committed or pending)
    are deleted or completed goes too."""
    store = GroupOffsetStore(str(tmp_path))
    for i in range(1000):
        name = f"nobody-{i}"
        assert store.offsets(name) == {}
        assert store.committed(name, 1, 0) == NOTHING_COMMITTED
        assert not store.has_offsets(name)
        assert store.pending_for(name, [(1, 0)]) == set()
    assert store._groups == {}  # the cache itself: what grew with every name asked
    store.commit("g", {(1, 0): Committed(5, "")})
    assert store.offsets("g") == {(1, 0): (5, "")} and set(store._groups) == {"g"}
    store.delete_offsets("g", [(1, 0)])
    assert store.offsets("g") == {} and store._groups == {}
    store.commit("h", {(1, 0): Committed(1, "")})
    store.delete_group("h")
    assert store.offsets("h") == {} and store._groups == {}
    store.commit_pending("t", 7, 0, {(1, 0): Committed(3, "")})
    assert set(store._groups) == {"t"}
    assert store.complete_pending("t", 7, commit=False)  # aborted: nothing left
    assert store.offsets("t") == {} and store._groups == {}
