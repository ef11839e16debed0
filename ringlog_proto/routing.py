"""Partition ownership: the reference rendezvous hash, and the source-port steering rule.

Rules this module keeps:
- This is *the* ownership function. The client, the server and the BPF C (bpf/) compute exactly
  this, bit for bit; tests compare them over many (partition, core set) pairs.
- The port rule (`port_owner`) is the steering program's fallback for a connection whose first
  frame does not name a partition: core = source port mod the configured core count, if that core
  is live. The BPF C (bpf/steer_rules.h) transcribes it and tests/bpf compares them bit for bit;
  the client picks its source port from `source_ports` to reach a core.
- Only 64-bit additions, xors, shifts and multiplications modulo 2**64, so that the C version is a
  transcription (BPF has all of them) and no language's hashing library is involved.

The hash. A partition is identified by its numeric identity, the broker-assigned topic id and the
partition index, packed as `key = topic_id << 32 | partition` (both u32). Each core `c` scores
`mix64(key ^ mix64(c + 1))`, where `mix64` is the splitmix64 finalizer; the core with the highest
score owns the partition, ties going to the lower core id. Rendezvous hashing with equal weights:
removing a core moves only the partitions it owned, adding one moves about 1/N of them.

The group coordinator. A consumer group is coordinated by one core (its membership, generations
and committed offsets live there): `coordinator_for(group, cores)`, the same rendezvous over
`group_key(group)`, the 64-bit FNV-1a hash of the group id's UTF-8 bytes (offset basis
0xCBF29CE484222325, prime 0x100000001B3). Clients may compute it to reach the coordinator at
once; the broker forwards (our protocol) or answers NOT_COORDINATOR (Kafka's) when they do not.

A cluster (docs/CLUSTER.md). A core of a node is named by one integer, `node_core_id(node, core)
= node * 1000 + core`: the Kafka listener's broker id of that core (broker/core/views.py) and the
client's connection key, so one node (node 0) keeps plain core ids. A group's coordinator is then
one core of one node: the node is `coordinator_node(group, live node ids)`, rendezvous of
`group_key(group)` over the nodes with the score broker/cluster/placement.py gives a partition
over nodes (equal weights: Metadata carries no weights), and the core is `coordinator_for(group,
that node's cores)`. A client that computes it from a stale list of live nodes is answered
NOT_OWNER and asks Metadata again.
"""

from __future__ import annotations

from collections.abc import Iterable

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_MUL_1 = 0xBF58476D1CE4E5B9
MIX_MUL_2 = 0x94D049BB133111EB


def mix64(x: int) -> int:
    """splitmix64's output function: a bijection on u64 with good avalanche."""
    z = (x + GOLDEN_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * MIX_MUL_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_MUL_2) & MASK64
    return z ^ (z >> 31)


def partition_key(topic_id: int, partition: int) -> int:
    """The u64 numeric identity of a partition, as it sits in every partition request frame."""
    assert 0 <= topic_id <= 0xFFFFFFFF and 0 <= partition <= 0xFFFFFFFF
    return topic_id << 32 | partition


def score(key: int, core: int) -> int:
    return mix64(key ^ mix64(core + 1))


def owner(topic_id: int, partition: int, cores: Iterable[int]) -> int:
    """The core that owns the partition among the live `cores` (rendezvous hashing)."""
    key = partition_key(topic_id, partition)
    best_core = -1
    best_score = -1
    for core in cores:
        s = score(key, core)
        if s > best_score or (s == best_score and core < best_core):
            best_core, best_score = core, s
    if best_core < 0:
        raise ValueError("no live cores to own a partition")
    return best_core


def shard_for(topic_id: int, partition: int, core_count: int) -> int:
    """Owner among cores 0..core_count-1, the common case of a full worker set."""
    return owner(topic_id, partition, range(core_count))


FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3


def group_key(group: str) -> int:
    """The u64 identity of a consumer group: FNV-1a over its id's UTF-8 bytes."""
    h = FNV64_OFFSET
    for byte in group.encode():
        h = ((h ^ byte) * FNV64_PRIME) & MASK64
    return h


def txn_partition(txn_id: str, partitions: int) -> int:
    """The transaction state partition of a transactional id: FNV-1a of its UTF-8 bytes modulo
    the partition count (the id's coordinator is that partition's leader)."""
    return group_key(txn_id) % partitions


def coordinator_for(group: str, core_count: int) -> int:
    """The core among 0..core_count-1 that coordinates `group` (rendezvous on `group_key`)."""
    key = group_key(group)
    best_core = -1
    best_score = -1
    for core in range(core_count):
        s = score(key, core)
        if s > best_score:
            best_core, best_score = core, s
    if best_core < 0:
        raise ValueError("no cores to coordinate a group")
    return best_core


NODE_CORE_STRIDE = 1000  # node_core_id: room for 1000 cores per node
NODE_SEED = 0x5EED  # the node's salt in `node_hash`, placement's and the group coordinators' node hash


def node_core_id(node_id: int, core: int) -> int:
    """The one integer that names `core` of node `node_id` (node 0: the core id itself)."""
    assert node_id >= 0 and 0 <= core < NODE_CORE_STRIDE
    return node_id * NODE_CORE_STRIDE + core


def split_node_core_id(key: int) -> tuple[int, int]:
    """(node id, core) of a `node_core_id`."""
    assert key >= 0
    node_id, core = divmod(key, NODE_CORE_STRIDE)
    return node_id, core


def node_hash(key: int, node_id: int) -> int:
    """A node's 64-bit rendezvous hash for a u64 `key` (a partition's or a group's)."""
    return mix64(key ^ mix64((node_id + NODE_SEED) & MASK64))


def coordinator_node(group: str, node_ids: Iterable[int]) -> int:
    """The node among the live `node_ids` that coordinates `group`.

    Ranked as broker/cluster/placement.py ranks nodes for a partition with equal weights: its
    score -1/ln(u), u the top 53 bits of `node_hash` mapped into (0, 1), grows with those bits,
    so the highest `node_hash(key) >> 11` wins and ties go to the lower node id."""
    key = group_key(group)
    best_node = -1
    best = -1
    for node_id in node_ids:
        s = node_hash(key, node_id) >> 11
        if s > best or (s == best and node_id < best_node):
            best_node, best = node_id, s
    if best_node < 0:
        raise ValueError("no live nodes to coordinate a group")
    return best_node


def port_core(source_port: int, cores: int) -> int:
    """The core the port rule names for a connection from `source_port` (`cores` configured)."""
    return source_port % cores


def port_owner(source_port: int, cores: int, live: int) -> int:
    """The port rule as the steering program applies it: `port_core` when its bit is set in the
    `live` mask (a u64, bit c for core c), else -1 (the kernel's own reuseport hash picks)."""
    assert 0 <= source_port <= 0xFFFF and 0 <= live < 1 << 64
    if cores <= 0:
        return -1
    core = port_core(source_port, cores)
    return core if live >> core & 1 else -1


def source_ports(core: int, cores: int, lo: int, hi: int) -> range:
    """The source ports in [lo, hi] that the port rule sends to `core` (empty when none is)."""
    return range(lo + (core - lo) % cores, hi + 1, cores)
