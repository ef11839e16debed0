"""Deleting groups and their offsets in the core (Kafka's DeleteGroups and OffsetDelete): the
store forgets them durably, the coordinator refuses a group with members and forgets a deleted
one, without a server."""

from __future__ import annotations

import os
from pathlib import Path

from test_coordinator import FakeLoop, join  # tests/core

from broker.core.coordinator import GroupCode, GroupCoordinator
from broker.core.groups import Committed, GroupOffsetStore
from broker.storage import layout


def test_the_store_deletes_a_group_and_some_offsets_durably(tmp_path: Path) -> None:
    store = GroupOffsetStore(str(tmp_path))
    store.commit("g", {(1, 0): Committed(5, ""), (1, 1): Committed(6, ""), (2, 0): Committed(7, "m")})
    store.delete_offsets("g", [(1, 1), (9, 9)])
    assert GroupOffsetStore(str(tmp_path)).offsets("g") == {(1, 0): (5, ""), (2, 0): (7, "m")}
    store.delete_offsets("g", [(1, 0), (2, 0)])  # the last ones: the file goes
    assert not os.path.exists(layout.group_file_path(str(tmp_path), "g"))
    assert not GroupOffsetStore(str(tmp_path)).has_offsets("g")
    store.commit("h", {(1, 0): Committed(1, "")})
    assert store.delete_group("h") is True
    assert GroupOffsetStore(str(tmp_path)).offsets("h") == {}
    assert store.delete_group("h") is False


def test_the_coordinator_refuses_a_group_with_members_and_forgets_a_deleted_one(tmp_path: Path) -> None:
    loop = FakeLoop()
    coord = GroupCoordinator(GroupOffsetStore(str(tmp_path)), loop.call_later, loop.clock)
    coord.commit("g", {(1, 0): Committed(3, "")})
    assert coord.check_delete("g") == GroupCode.NONE  # Empty, with offsets
    first = join(coord)
    loop.advance(10)
    assert first.one.code == GroupCode.NONE
    assert coord.check_delete("g") == GroupCode.NON_EMPTY_GROUP
    coord.leave("g", [(first.one.member_id, None)])
    assert coord.check_delete("g") == GroupCode.NONE
    coord.offsets.delete_group("g")
    coord.deleted("g")
    assert coord.view("g") is None and "g" not in coord.groups
    assert coord.check_delete("unknown") == GroupCode.NONE  # existence is the store's to tell
