"""How the store's records become the view a node's workers act on (no etcd: the rules only)."""

from __future__ import annotations

import json
import os

from broker.cluster.mirror import Mirror
from broker.cluster.records import Keys, NodeRecord, PresenceRecord, TopicRecord
from broker.core.cluster_view import ClusterView, PartitionState, ViewFile, publish
from broker.core.topics import Topic

K = Keys("lab")


def node(i: int) -> NodeRecord:
    return NodeRecord(i, f"10.0.0.{i}", 9092, (9100, 9101), membership_port=9092, rack="r1")


def test_records_become_the_view(tmp_path) -> None:
    mirror = Mirror(K, node_id=2)
    topic = Topic("t", 7, 2, {"retention.ms": "-1", "segment.bytes": str(1 << 20)})
    state = PartitionState((1, 2, 3), 1, 4, (1, 2))
    mirror.load(
        [
            (K.node(1), node(1).encode().encode(), 3, 0),
            (K.node(2), node(2).encode().encode(), 4, 0),
            (K.live_node(1), b"{}", 5, 0x1234),
            (K.topic("t"), TopicRecord(topic, 3).encode().encode(), 6, 0),
            (K.partition(7, 0), json.dumps(state.to_json()).encode(), 7, 0),
            (K.controller, b'{"node_id": 1}', 8, 0x1234),
        ],
        revision=9,
    )
    view = mirror.view()
    assert view.generation == 9 and view.clustered and view.node_id == 2
    assert view.live == {1}  # node 2 is known but has no presence key
    assert view.nodes[1].core_port(1) == 9101 and view.nodes[2].host == "10.0.0.2"
    assert view.state_of(7, 0) == state and view.state_of(7, 1) is None
    assert view.controller == 1
    assert mirror.topic_list() == [topic]
    assert mirror.live[1] == 0x1234  # the lease the controller would revoke

    # a watch event: the leader moves; a delete: node 1's presence lapses
    moved = PartitionState((1, 2, 3), 2, 5, (2,))
    assert mirror.apply(K.partition(7, 0), json.dumps(moved.to_json()).encode(), 12)
    assert mirror.apply(K.live_node(1), None, 13)
    assert not mirror.apply("/ringlog/lab/unknown", b"x", 14)
    assert not mirror.apply(K.partition(7, 1), b"not json", 15)  # skipped, not fatal
    view2 = mirror.view()
    assert view2.generation == 15 and view2.live == frozenset() and view2.state_of(7, 0) == moved
    assert mirror.partitions[(7, 0)].mod_revision == 12

    # published to the workers, read back once, and only when newer
    publish(str(tmp_path), view)
    reader = ViewFile(str(tmp_path))
    got = reader.poll()
    assert got == view
    assert reader.poll() is None
    publish(str(tmp_path), view2)
    assert reader.poll() == view2
    publish(str(tmp_path), view)  # an older generation is never acted on
    assert reader.poll() is None


def test_single_node_view_is_not_clustered(tmp_path) -> None:
    assert ViewFile(str(tmp_path)).poll() is None
    single = ClusterView.single(0)
    assert not single.clustered and single.state_of(1, 0) is None


def test_the_users_and_acls_documents_are_kept_and_copied_marked(tmp_path) -> None:
    from broker.cluster.security_docs import write_copies
    from broker.security.acls import AclStore
    from broker.security.credentials import CredentialStore
    from broker.security.watched import MirroredFileError

    mirror = Mirror(K, node_id=1)
    users = {"users": {"alice": {}}}
    mirror.load([(K.security + "users.json", json.dumps(users).encode(), 3, 0)], revision=3)
    assert mirror.security == {"users.json": json.dumps(users).encode()}
    acls = {"acls": [{"principal": "User:alice", "resource_type": "topic", "name": "t", "operation": "read"}]}
    assert mirror.apply(K.security + "acls.json", json.dumps(acls).encode(), 4)
    d = tmp_path / "security"
    write_copies(str(d), "etcd /ringlog/lab/security/", mirror.security)
    assert AclStore(str(tmp_path)).bindings()[0].principal == "User:alice"
    assert CredentialStore(str(tmp_path)).users() == {"alice": ()}
    assert oct(os.stat(d / "users.json").st_mode & 0o777) == "0o600"
    try:  # a command against the copy is refused: the next change would undo it
        AclStore(str(tmp_path)).replace(lambda current: ())
    except MirroredFileError as exc:
        assert "copy of etcd /ringlog/lab/security/acls.json" in str(exc)
    else:
        raise AssertionError("a node's copy was changed in place")
    # the document deleted in the store: an empty copy (no ACLs), still marked
    assert mirror.apply(K.security + "acls.json", None, 5)
    write_copies(str(d), "etcd /ringlog/lab/security/", mirror.security)
    assert AclStore(str(tmp_path)).bindings() == ()
    assert json.loads((d / "acls.json").read_text())["mirror_of"] == "etcd /ringlog/lab/security/acls.json"


def test_a_draining_presence_is_live_but_not_serving(tmp_path) -> None:
    mirror = Mirror(K, node_id=1)
    for i in (1, 2, 3):
        mirror.apply(K.node(i), node(i).encode().encode(), i)
    mirror.apply(K.live_node(1), PresenceRecord(1.0).encode().encode(), 4, 0x1)
    mirror.apply(K.live_node(2), PresenceRecord(1.0, draining=True).encode().encode(), 5, 0x2)
    mirror.apply(K.live_node(3), b"not json", 6, 0x3)  # an odd presence is still a presence
    view = mirror.view()
    assert view.live == {1, 2, 3} and view.draining == {2} and view.serving == {1, 3}
    publish(str(tmp_path), view)
    assert ViewFile(str(tmp_path)).poll() == view  # what the workers read
    mirror.apply(K.live_node(2), None, 7)  # it left
    assert mirror.view().draining == frozenset() and mirror.view().serving == {1, 3}


def test_a_reassignment_and_a_placement_by_hand_survive_the_records(tmp_path) -> None:
    """What a controller taking over reads back: the target and the replicas added (a state's
    record), the replicas placed by hand (a topic's), through the mirror and the published view."""
    moving = PartitionState((2, 3, 1), 1, 4, (1, 2), target=(2, 3), adding=(3,))
    assert moving.removing == (1,)
    record = TopicRecord(Topic("placed", 8, 2), 2, {0: (2, 3), 1: (3, 1)})
    assert TopicRecord.decode(record.encode()) == record
    assert "manual" not in TopicRecord(Topic("t", 9, 1), 3).encode()  # as before, when none
    mirror = Mirror(K, node_id=1)
    mirror.load(
        [
            (K.topic("placed"), record.encode().encode(), 3, 0),
            (K.partition(8, 0), json.dumps(moving.to_json()).encode(), 4, 0),
        ],
        revision=5,
    )
    assert mirror.topics["placed"] == record
    publish(str(tmp_path), mirror.view())
    got = ViewFile(str(tmp_path)).poll()
    assert got is not None and got.state_of(8, 0) == moving
