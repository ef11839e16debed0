"""The per-group offsets store (one durable file per group, offsets under topic ids) and the
one-time move of the old per-partition offsets files into it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from broker.core.groups import Committed, GroupOffsetStore, migrate_partition_offsets
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
