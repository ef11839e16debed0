"""The control plane end to end on a real etcd, without brokers: three nodes' agents register,
elect one controller, create a topic whose partitions are placed over them, publish the view each
node's workers read, and fail partitions over when a node's session lapses or SWIM says it died."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.cluster.agent import AgentConfig, ClusterAgent
from broker.cluster.records import NodeRecord
from broker.core.cluster_view import NO_LEADER, ClusterView, ViewFile
from broker.core.topics import TopicError, TopicRegistry
from broker.storage.log import LogConfig

_names = itertools.count()


def wait_for(what: Callable[[], object], timeout: float = 10.0, step: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    def __init__(self, root: Path, node_id: int, endpoints: list[str], cluster: str) -> None:
        self.dir = root / f"node{node_id}"
        (self.dir / "run").mkdir(parents=True)
        self.registry = TopicRegistry(str(self.dir), LogConfig())
        record = NodeRecord(node_id, "127.0.0.1", 9000 + node_id, (9100 + node_id,), rack="")
        self.agent = ClusterAgent(
            AgentConfig(record, tuple(endpoints), cluster, session_ttl_s=1),
            str(self.dir / "run"),
            self.registry,
        )
        self.views = ViewFile(str(self.dir / "run"))
        self.view: ClusterView | None = None

    def latest(self) -> ClusterView | None:
        v = self.views.poll()
        if v is not None:
            self.view = v
        return self.view


@pytest.fixture
def nodes(etcd, tmp_path: Path) -> Iterator[list[Node]]:
    cluster = f"agent{next(_names)}"
    made = [Node(tmp_path, i, etcd.endpoints, cluster) for i in (1, 2, 3)]
    for n in made:
        n.agent.start()
    try:
        yield made
    finally:
        for n in made:
            n.agent.stop()


def test_three_nodes_place_a_topic_and_fail_over(nodes: list[Node]) -> None:
    a, b, c = nodes
    wait_for(lambda: all((n.latest() or ClusterView.single()).live == {1, 2, 3} for n in nodes))
    controller = wait_for(lambda: a.latest() and a.view.controller != NO_LEADER and a.view.controller)
    assert all(n.latest().controller == controller for n in nodes)

    topic = a.agent.admin.create_topic(a.registry, "orders", 6, replication=3)
    with pytest.raises(TopicError, match="already exists"):
        b.agent.admin.create_topic(b.registry, "orders", 6, replication=3)
    with pytest.raises(TopicError, match="replication factor 4"):
        b.agent.admin.create_topic(b.registry, "big", 1, replication=4)

    def placed(n: Node) -> bool:
        v = n.latest()
        return v is not None and all(v.state_of(topic.topic_id, p) for p in range(6))

    wait_for(lambda: all(placed(n) for n in nodes))
    view = c.latest()
    leaders = {view.state_of(topic.topic_id, p).leader for p in range(6)}
    assert leaders <= {1, 2, 3}
    for p in range(6):
        s = view.state_of(topic.topic_id, p)
        assert sorted(s.replicas) == [1, 2, 3] and s.isr == s.replicas and s.leader_epoch == 0
    # every node's registry copies the topic, under the cluster's id
    wait_for(lambda: all((n.registry.refresh() or True) and "orders" in n.registry.by_name for n in nodes))
    assert {n.registry.by_name["orders"].topic_id for n in nodes} == {topic.topic_id}

    # node 3's session lapses (its agent stops renewing without leaving): after the TTL its
    # partitions are led by others, from the in-sync set, one epoch later
    led_by_3 = [p for p in range(6) if view.state_of(topic.topic_id, p).leader == 3]
    c.agent._stop.set()
    t0 = time.monotonic()

    def failed_over() -> bool:
        v = a.latest()
        return (
            v is not None
            and 3 not in v.live
            and all(
                v.state_of(topic.topic_id, p).leader in (1, 2) and 3 not in v.state_of(topic.topic_id, p).isr
                for p in range(6)
            )
        )

    wait_for(failed_over, timeout=10)
    took = time.monotonic() - t0
    v = a.latest()
    for p in led_by_3:
        assert v.state_of(topic.topic_id, p).leader_epoch == 1
    assert took < 5, took


def test_membership_signal_revokes_a_dead_nodes_session(nodes: list[Node]) -> None:
    a, b, c = nodes
    wait_for(lambda: all((n.latest() or ClusterView.single()).live == {1, 2, 3} for n in nodes))
    c.agent._stop.set()
    for n in (a, b):
        n.agent.member_dead(3)  # SWIM confirmed it: the controller revokes the lease at once
    wait_for(lambda: 3 not in a.latest().live, timeout=3)


def test_a_node_that_cannot_reach_etcd_keeps_leading(etcd_cluster, tmp_path: Path) -> None:
    """etcd down (killed, restarted) for twice the TTL: the node goes on leading what the store last
    named it leader of (no view it publishes meanwhile says otherwise), as a Kafka broker does
    while its controller quorum is away (it fenced itself after 3/4 of the
    TTL, and every partition went without acks for the whole outage). Its session then lapses
    for real (revoked, as the controller does for a node confirmed dead): the store answers
    LeaseNotFound and the node leads nothing until it has registered again."""
    etcd = etcd_cluster(1)
    node = Node(tmp_path, 1, etcd.endpoints, f"fence{next(_names)}")
    node.agent.start()
    try:
        topic = node.agent.admin.create_topic(node.registry, "solo", 2, replication=1)
        wait_for(lambda: node.latest() and all(node.view.state_of(topic.topic_id, p) for p in range(2)))
        assert {node.view.state_of(topic.topic_id, p).leader for p in range(2)} == {1}
        seen: list[ClusterView] = []
        node.agent.on_view = seen.append
        etcd.kill(0)
        time.sleep(2.0 + 0.5)  # TTL 1 s in these tests
        etcd.restart(0)  # a new etcd leader extends every lease by its TTL
        time.sleep(1.0)
        v = node.latest()
        assert 1 in v.live and {v.state_of(topic.topic_id, p).leader for p in range(2)} == {1}
        assert all(1 in s.live for s in seen), "a view published while etcd was away left out this node"
        node.agent.store.lease_revoke(node.agent._lease)
        wait_for(lambda: any(1 not in s.live for s in seen), timeout=5)
        wait_for(lambda: node.latest().state_of(topic.topic_id, 0).leader == 1, timeout=10)
    finally:
        node.agent.stop()


def test_a_draining_node_hands_its_leaderships_over_before_it_leaves(nodes: list[Node]) -> None:
    """Controlled shutdown at the agent: `drain` returns once this node's own published view has
    another in-sync replica leading each partition it led (it still runs, still in sync, still
    live, no longer offered to clients); `stop` then leaves and waits until it is out of every
    in-sync set. A partition with no other replica does not hold the drain up."""
    a, _b, c = nodes
    wait_for(lambda: all((n.latest() or ClusterView.single()).live == {1, 2, 3} for n in nodes))
    topic = a.agent.admin.create_topic(a.registry, "drained", 6, replication=3)
    wait_for(lambda: all(c.latest() and c.view.state_of(topic.topic_id, p) for p in range(6)))
    solo = a.agent.admin.create_topic(a.registry, "solo", 6, replication=1)  # some on node 3
    wait_for(lambda: all(c.latest() and c.view.state_of(solo.topic_id, p) for p in range(6)))
    before = c.latest()
    led = [p for p in range(6) if before.state_of(topic.topic_id, p).leader == 3]
    assert led, "placement gave node 3 no leadership of 6 partitions"
    assert 3 in {before.state_of(solo.topic_id, p).leader for p in range(6)}

    t0 = time.monotonic()
    assert c.agent.drain(timeout_s=5.0) == []
    took = time.monotonic() - t0
    assert took < 2.0, took  # no wait for the replication-1 partitions, which cannot move
    view = c.latest()  # what node 3's workers read when drain returned
    assert 3 in view.live and view.draining == {3} and view.serving == {1, 2}
    for p in range(6):
        s = view.state_of(topic.topic_id, p)
        assert s.leader in (1, 2) and set(s.isr) == {1, 2, 3}, s
        if p in led:
            assert s.leader_epoch == before.state_of(topic.topic_id, p).leader_epoch + 1
    assert wait_for(lambda: a.latest().draining == {3} and a.view.serving == {1, 2})

    c.agent.stop()  # leaves; the controller (1 or 2, or a new one) drops it from the in-sync sets
    view = c.latest()
    assert 3 not in view.live
    assert all(3 not in view.state_of(topic.topic_id, p).isr for p in range(6))


def test_a_leaving_node_is_not_proposed_back_into_an_in_sync_set(nodes: list[Node]) -> None:
    """A leader that sees a draining or departed follower caught up must not get it back into
    the in-sync set (Kafka refuses such an AlterPartition, KIP-841): acks=all would then wait
    for a node about to vanish. The store answers with the set as it stands."""
    a, _b, c = nodes
    wait_for(lambda: all((n.latest() or ClusterView.single()).live == {1, 2, 3} for n in nodes))
    topic = a.agent.admin.create_topic(a.registry, "rejoin", 1, replication=3)
    s = wait_for(lambda: a.latest() and a.view.state_of(topic.topic_id, 0))
    if s.leader == 3:
        c.agent.drain(timeout_s=5.0)
        s = wait_for(lambda: (v := a.latest().state_of(topic.topic_id, 0)).leader != 3 and v)
    others = tuple(r for r in s.isr if r != 3)
    s = a.agent.admin.alter_isr(topic.topic_id, 0, s.leader, s.leader_epoch, others)  # 3 fell behind
    assert 3 not in s.isr
    c.agent.drain(timeout_s=5.0)
    back = a.agent.admin.alter_isr(topic.topic_id, 0, s.leader, s.leader_epoch, (*others, 3))
    assert back == s  # draining: not added
    c.agent.stop()
    wait_for(lambda: 3 not in a.latest().live)
    back = a.agent.admin.alter_isr(topic.topic_id, 0, s.leader, s.leader_epoch, (*others, 3))
    assert back == s  # gone: not added


def test_a_topics_unclean_leader_election_overrides_the_clusters(nodes: list[Node]) -> None:
    """With every in-sync replica gone, the controller elects an out-of-sync live replica of a
    topic whose unclean.leader.election.enable is true, and leaves the topic without it offline
    (the cluster's own setting, --unclean-leader-election, is off here)."""
    import dataclasses
    import json

    from broker.core.cluster_view import PartitionState

    wait_for(lambda: all((n.latest() or ClusterView.single()).live == {1, 2, 3} for n in nodes))
    controller = wait_for(
        lambda: nodes[0].latest() and nodes[0].view.controller != NO_LEADER and nodes[0].view.controller
    )
    leader = next(n for n in (1, 2, 3) if n != controller)  # its death leaves the controller be
    follower = controller
    admin = nodes[follower - 1].agent.admin
    registry = nodes[follower - 1].registry
    unclean = admin.create_topic(
        registry, "unclean", 1, {"unclean.leader.election.enable": "true"}, replication=2
    )
    clean = admin.create_topic(registry, "clean", 1, replication=2)
    k = admin.keys

    def state(topic_id: int) -> tuple[PartitionState, int] | None:
        kv = admin.store.get(k.partition(topic_id, 0))
        return None if kv is None else (PartitionState.from_json(json.loads(kv.value)), kv.mod_revision)

    # both partitions on the same two nodes, in sync only on their leader (the other lagging)
    for topic in (unclean, clean):
        s, rev = wait_for(lambda t=topic: state(t.topic_id))
        new = dataclasses.replace(
            s, replicas=(leader, follower), leader=leader, isr=(leader,), leader_epoch=s.leader_epoch + 1
        )
        assert admin.write_state(topic.topic_id, 0, rev, new) is not None
    nodes[leader - 1].agent._stop.set()  # its session lapses: every in-sync replica is gone
    wait_for(lambda: state(unclean.topic_id)[0].leader == follower, timeout=15)
    assert state(unclean.topic_id)[0].isr == (follower,)
    time.sleep(1.0)
    assert state(clean.topic_id)[0].leader == NO_LEADER, "the cluster's setting: wait for an in-sync one"
