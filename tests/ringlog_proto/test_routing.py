"""The reference rendezvous hash: known vectors, balance, and minimal movement when cores change;
the group coordinator's hash (FNV-1a vectors, balance); in a cluster, node-core ids and the
coordinator node."""

from __future__ import annotations

from collections import Counter

import pytest

from broker.cluster.placement import Candidate, rank
from broker.core.views import kafka_broker_id
from ringlog_proto.routing import (
    coordinator_for,
    coordinator_node,
    group_key,
    mix64,
    node_core_id,
    owner,
    partition_key,
    port_core,
    port_owner,
    shard_for,
    source_ports,
    split_node_core_id,
)


def test_mix64_is_splitmix64() -> None:
    # splitmix64 seeded with 0 produces these first outputs (state += gamma, then mix):
    # an independent check that our constants and shifts are the published ones.
    assert mix64(0) == 0xE220A8397B1DCDAF
    assert mix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_partition_key_packs_topic_id_high() -> None:
    assert partition_key(1, 2) == (1 << 32) | 2
    with pytest.raises(AssertionError):
        partition_key(1 << 32, 0)


def test_one_core_owns_everything() -> None:
    assert {shard_for(t, p, 1) for t in range(5) for p in range(50)} == {0}


def test_balanced_over_cores() -> None:
    counts = Counter(shard_for(7, p, 4) for p in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(800 <= n <= 1200 for n in counts.values()), counts


def test_removing_a_core_moves_only_its_partitions() -> None:
    parts = [(t, p) for t in range(1, 4) for p in range(300)]
    before = {tp: owner(*tp, range(4)) for tp in parts}
    after = {tp: owner(*tp, [0, 1, 3]) for tp in parts}
    moved = [tp for tp in parts if before[tp] != after[tp]]
    assert moved, "core 2 owned something"
    assert all(before[tp] == 2 for tp in moved)


def test_adding_a_core_moves_about_one_in_n() -> None:
    parts = [(9, p) for p in range(3000)]
    moved = sum(shard_for(*tp, 3) != shard_for(*tp, 4) for tp in parts)
    assert 600 <= moved <= 900, moved  # expected 3000 / 4 = 750
    assert all(shard_for(*tp, 4) == 3 for tp in parts if shard_for(*tp, 3) != shard_for(*tp, 4))


def test_no_cores_is_an_error() -> None:
    with pytest.raises(ValueError, match="no live cores"):
        owner(1, 1, [])


def test_port_rule_names_port_mod_cores_when_live() -> None:
    assert port_core(40001, 4) == 1
    assert port_owner(40001, 4, 0b1111) == 1
    assert port_owner(40001, 4, 0b1101) == -1, "core 1 is not live: the kernel picks"
    assert port_owner(40001, 0, 0b1111) == -1, "no configured cores"
    assert port_owner(63, 64, 1 << 63) == 63
    assert port_owner(65535, 64, (1 << 64) - 1) == 65535 % 64


@pytest.mark.parametrize(("lo", "hi"), [(32768, 60999), (1024, 65535), (5, 5), (100, 102)])
def test_source_ports_are_exactly_the_ports_the_rule_sends_to_a_core(lo: int, hi: int) -> None:
    for cores in (1, 2, 3, 7, 64):
        seen: set[int] = set()
        for core in range(cores):
            ports = source_ports(core, cores, lo, hi)
            assert all(lo <= p <= hi and port_core(p, cores) == core for p in ports)
            seen.update(ports)
        assert seen == set(range(lo, hi + 1))


def test_group_key_is_fnv1a_64() -> None:
    # the published FNV-1a 64-bit test vectors
    assert group_key("") == 0xCBF29CE484222325
    assert group_key("a") == 0xAF63DC4C8601EC8C
    assert group_key("foobar") == 0x85944171F73967E8


def test_coordinator_for_is_stable_and_spread() -> None:
    groups = [f"group-{i}" for i in range(4000)]
    counts = Counter(coordinator_for(g, 4) for g in groups)
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 800
    assert all(coordinator_for(g, 1) == 0 for g in groups[:50])
    # a rendezvous: adding a fifth core moves only the groups it takes
    moved = [g for g in groups if coordinator_for(g, 5) != coordinator_for(g, 4)]
    assert all(coordinator_for(g, 5) == 4 for g in moved) and len(moved) < 1100


# ----------------------------------------------------------------------------------- a cluster


def test_node_core_ids_are_the_kafka_broker_ids() -> None:
    for node, core in ((0, 0), (0, 7), (3, 0), (12, 999)):
        key = node_core_id(node, core)
        assert key == kafka_broker_id(node, core) and split_node_core_id(key) == (node, core)
    assert node_core_id(0, 5) == 5, "one node: plain core ids"
    with pytest.raises(AssertionError):
        node_core_id(1, 1000)


def test_coordinator_node_is_placement_with_equal_weights() -> None:
    """The client's pure function and the cluster's placement rank nodes alike (the client may
    not import broker.cluster): the group key stands where a partition's key does."""
    nodes = [0, 1, 2, 5, 9]
    for i in range(300):
        group = f"orders-{i}"
        key = group_key(group)
        ranked = rank(key >> 32, key & 0xFFFFFFFF, [Candidate(n) for n in nodes])
        assert coordinator_node(group, nodes) == ranked[0].node_id


def test_coordinator_nodes_balance_and_move_only_from_a_lost_node() -> None:
    groups = [f"g{i}" for i in range(3000)]
    before = {g: coordinator_node(g, range(3)) for g in groups}
    counts = Counter(before.values())
    assert set(counts) == {0, 1, 2} and all(800 <= n <= 1200 for n in counts.values()), counts
    after = {g: coordinator_node(g, [0, 2]) for g in groups}
    assert all(before[g] == 1 for g in groups if before[g] != after[g])
    with pytest.raises(ValueError, match="no live nodes"):
        coordinator_node("g", [])
