"""Security in a cluster, on real things: three `broker serve --etcd` nodes (two io_uring, one
uvloop, so both backends' TLS client links to a peer carry replication) with TLS and SCRAM, users
and ACLs kept in etcd by `broker users|acls --etcd`, confluent-kafka over SASL_SSL.

What it shows: acks=all writes are acknowledged (every in-sync follower fetched them over an
authenticated TLS link) and every node holds them byte for byte; an ACL granted once in etcd
applies on every node; a node's copy of the users is not changed behind the cluster's back; a
node with the wrong inter-broker password or a CA that does not sign its peers' certificates
logs why and does not replicate."""

from __future__ import annotations

import itertools
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.brokerproc import BrokerProcess, free_udp_port, membership_key_file, wait_for
from labkit.clusterchecker import read_replica
from labkit.securitylab import Pki, broker_cli, consume, produce, scram_server_first

confluent_kafka = pytest.importorskip("confluent_kafka")

_names = itertools.count()
PASSWORDS = {
    "broker": "inter-broker-secret",
    "admin": "admin-secret",
    "alice": "alice-secret",
    "bob": "bob-pw",
}
BACKENDS = {1: "io_uring", 2: "uvloop", 3: "io_uring"}


def produce_retrying(conf: dict[str, Any], topic: str, values: list[bytes]) -> list[Any]:
    """Each record's delivery error (None: acknowledged), with librdkafka's retries: a leader
    that moves on a loaded machine (2 s sessions) is ridden out, as any Kafka producer does."""
    errors: list[Any] = []
    p = confluent_kafka.Producer({**conf, "message.timeout.ms": 30000})
    for v in values:
        p.produce(topic, v, on_delivery=lambda err, _m: errors.append(err))
    assert p.flush(40) == 0
    return errors


class SecureCluster:
    def __init__(self, root: Path, endpoints: str, pki: Pki) -> None:
        self.root = root
        self.endpoints = endpoints
        self.pki = pki
        self.name = f"sec{next(_names)}"
        (root / "inter-broker.pw").write_text(PASSWORDS["broker"] + "\n")
        mports = [free_udp_port() for _ in BACKENDS]
        self.seeds = ",".join(f"127.0.0.1:{p}" for p in mports)
        self.nodes = {i: self.node(i, mports[i - 1]) for i in BACKENDS}

    def node(
        self, i: int, mport: int, password_file: str = "inter-broker.pw", peer_ca: Path | None = None
    ) -> BrokerProcess:
        extra = (
            "--node-id", str(i), "--etcd", self.endpoints, "--cluster-name", self.name,
            "--membership-port", str(mport), "--join", self.seeds, "--ebpf", "off",
            "--membership-key-file", str(membership_key_file(self.root)),
            "--group-initial-rebalance-delay-ms", "100",
            *self.pki.serve_flags(), "--sasl-mechanisms", "SCRAM-SHA-512",
            "--inter-broker-user", "broker", "--inter-broker-password-file", str(self.root / password_file),
            "--super-users", "User:admin",
            "--tls-peer-ca", str(peer_ca or self.pki.ca),
        )  # fmt: skip
        return BrokerProcess(self.root / f"node{i}", self.root / f"node{i}.log", extra, backend=BACKENDS[i])

    def cli(self, *args: str, stdin: str | None = None) -> str:
        return broker_cli(
            self.root, *args, "--etcd", self.endpoints, "--cluster-name", self.name, stdin=stdin
        )

    def conf(self, user: str, password: str | None = None) -> dict[str, Any]:
        return {
            "bootstrap.servers": ",".join(n.bootstrap for n in self.nodes.values() if n.running()),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.pki.ca),
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password,
        }

    def view(self, node: int) -> dict:
        return json.loads((self.nodes[node].data_dir / "run" / "cluster.json").read_text())

    def close(self) -> None:
        for n in self.nodes.values():
            if n.running():
                n.kill()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.make(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(etcd, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    c = SecureCluster(tmp_path_factory.mktemp("secure"), ",".join(etcd.endpoints), pki)
    try:
        for user, password in PASSWORDS.items():  # in etcd before the nodes start: they copy them
            c.cli("users", "add", user, "--password-stdin", stdin=password + "\n")
        for op, resource in (
            ("write", "topic:orders"),
            ("read", "topic:orders"),
            ("describe", "topic:orders"),
            ("read", "group:g"),
        ):
            c.cli("acls", "add", "User:alice", op, resource)
        for n in c.nodes.values():
            n.start()
        for n in c.nodes.values():
            if n.backend == "io_uring" and "backend io_uring" not in n.log():
                pytest.skip("io_uring unavailable here: the broker fell back to uvloop")
        wait_for(lambda: all(sorted(c.view(i)["live"]) == [1, 2, 3] for i in c.nodes))
        yield c
    finally:
        c.close()


ORDERS = [f"order-{i}".encode() for i in range(300)]


@pytest.fixture(scope="module")
def orders(cluster: SecureCluster) -> list[bytes]:
    """The topic every test of this module reads or writes, made and filled once by whichever test
    runs first (each must pass alone and in any order): 3 partitions on all three nodes, ORDERS
    written by alice with acks=all, so each write waited for every in-sync follower to have fetched
    it over its authenticated TLS link to the leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(cluster.conf("admin"))
    admin.create_topics([NewTopic("orders", 3, 3)])["orders"].result(20)

    def ready() -> bool:
        t = admin.list_topics("orders", timeout=5).topics["orders"]
        return len(t.partitions) == 3 and all(
            p.leader >= 0 and len(p.isrs) == 3 for p in t.partitions.values()
        )

    wait_for(ready)
    errors = produce_retrying({**cluster.conf("alice"), "acks": "all"}, "orders", ORDERS)
    assert errors == [None] * len(ORDERS)
    return ORDERS


def test_replicated_over_tls_and_scram_with_users_and_acls_from_etcd(
    cluster: SecureCluster, orders: list[bytes]
) -> None:
    assert cluster.cli("users", "list").split() == [
        "admin", "SCRAM-SHA-256,SCRAM-SHA-512", "alice", "SCRAM-SHA-256,SCRAM-SHA-512",
        "bob", "SCRAM-SHA-256,SCRAM-SHA-512", "broker", "SCRAM-SHA-256,SCRAM-SHA-512",
    ]  # fmt: skip
    # every node's copy holds the credentials, never a password
    for n in cluster.nodes.values():
        copy = (n.data_dir / "security" / "users.json").read_text()
        assert '"alice"' in copy and all(pw not in copy for pw in PASSWORDS.values())
        assert (n.data_dir / "security" / "users.json").stat().st_mode & 0o077 == 0

    def identical() -> bool:
        logs = [
            {i: read_replica(n.data_dir, "orders", p, i).records for i, n in cluster.nodes.items()}
            for p in range(3)
        ]
        return all(len(set(by_node.values())) == 1 for by_node in logs)

    wait_for(identical, 10)
    # node 3 holds every order once (tests that ran before this one may have added their own)
    held = [v for p in range(3) for _, v in read_replica(cluster.nodes[3].data_dir, "orders", p, 3).records]
    assert len(held) == len(set(held)) and set(held) >= set(orders)
    got, seen = consume(cluster.conf("alice"), "orders", "g", len(held))
    assert sorted(got) == sorted(held) and not seen

    # bob has no ACL: refused on every node, and nothing written
    bob = produce(cluster.conf("bob"), "orders", [b"forged"])
    assert [e.code() for e in bob] == [confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED]
    # one ACL added in etcd applies on every node (whichever leads bob's partition)
    cluster.cli("acls", "add", "User:bob", "write", "topic:orders")
    for n in cluster.nodes.values():
        wait_for(lambda n=n: "User:bob" in (n.data_dir / "security" / "acls.json").read_text(), 10)
    bob_conf = {**cluster.conf("bob"), "partitioner": "random"}
    assert produce_retrying(bob_conf, "orders", [f"bob-{i}".encode() for i in range(30)]) == [None] * 30
    # a wrong password is refused, counted, and never logged
    node2 = cluster.nodes[2]
    wrong = produce(
        {**cluster.conf("alice", "not-it"), "bootstrap.servers": node2.bootstrap}, "orders", [b"x"]
    )
    assert wrong[0] is not None
    assert node2.wait_for_log("authentication failed") and "not-it" not in node2.log()
    assert b"x" not in {v for p in range(3) for _, v in read_replica(node2.data_dir, "orders", p, 2).records}


def test_every_node_answers_an_unknown_user_alike(cluster: SecureCluster) -> None:
    """The decoy secret is in etcd with the users: a name that is no user's gets the same salt
    and iteration count from every node (a node of its own would tell it is a decoy), with a
    salt as long as a real user's."""
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca))
    answers = [scram_server_first(n.port, "mallory", tls=ctx) for n in cluster.nodes.values()]
    assert len({(a["s"], a["i"]) for a in answers}) == 1, answers
    real = scram_server_first(cluster.nodes[1].port, "alice", tls=ctx)
    assert len(real["s"]) == len(answers[0]["s"]) and real["i"] == answers[0]["i"]


def test_kafkas_acl_admin_apis_change_the_clusters_acls(cluster: SecureCluster) -> None:
    """CreateAcls and DeleteAcls through any node write etcd; every node's copy follows."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    grant = AclBinding(
        ResourceType.TOPIC, "audit-", ResourcePatternType.PREFIXED, "User:bob", "*",
        AclOperation.READ, AclPermissionType.ALLOW,
    )  # fmt: skip
    admin = AdminClient({**cluster.conf("admin"), "bootstrap.servers": cluster.nodes[2].bootstrap})
    admin.create_acls([grant])[grant].result(15)
    assert "allow User:bob read topic:audit- (prefixed)" in cluster.cli("acls", "list")
    for n in cluster.nodes.values():
        wait_for(lambda n=n: "audit-" in (n.data_dir / "security" / "acls.json").read_text(), 10)
    assert grant in wait_for(lambda: grant in admin.describe_acls(_bob_filter()).result(15) and [grant], 10)
    deleted = admin.delete_acls([_bob_filter()])[_bob_filter()].result(15)
    assert grant in deleted
    assert "audit-" not in cluster.cli("acls", "list")
    for n in cluster.nodes.values():
        wait_for(lambda n=n: "audit-" not in (n.data_dir / "security" / "acls.json").read_text(), 10)


def _bob_filter() -> Any:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return AclBindingFilter(
        ResourceType.TOPIC, "audit-", ResourcePatternType.PREFIXED, "User:bob", None,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip


def test_a_nodes_copy_is_not_changed_behind_the_clusters_back(cluster: SecureCluster) -> None:
    import subprocess
    import sys

    node = cluster.nodes[1]
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", "users", "add", "mallory", "--password-stdin",
         "--data-dir", str(node.data_dir)],
        input="pw\n", text=True, capture_output=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "copy of etcd /ringlog/" in done.stderr and "--etcd" in done.stderr
    assert "mallory" not in (node.data_dir / "security" / "users.json").read_text()


@pytest.mark.parametrize("fault", ["wrong inter-broker password", "peer CA that did not sign them"])
def test_a_node_that_cannot_log_in_to_its_peers_says_why_and_replicates_nothing(
    cluster: SecureCluster, orders: list[bytes], fault: str, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient

    old = cluster.nodes[3]
    old.stop()
    mport = int(old.extra[old.extra.index("--membership-port") + 1])
    if fault == "wrong inter-broker password":
        (cluster.root / "wrong.pw").write_text("not-the-password\n")
        node = cluster.node(3, mport, password_file="wrong.pw")
        expected = "cannot log in to"
    else:
        node = cluster.node(3, mport, peer_ca=Pki.make(tmp_path).ca)
        expected = "certificate verify failed"
    node.port = old.port
    cluster.nodes[3] = node
    late = [f"late-{fault}-{i}".encode() for i in range(30)]
    try:
        node.start()
        # node 3 follows partitions of "orders": its fetcher's links to their leaders fail
        assert node.wait_for_log(expected, 20), node.log()[-3000:]
        admin = AdminClient(cluster.conf("admin"))
        leaders = {
            p: md.leader // 1000
            for p, md in admin.list_topics("orders", timeout=10).topics["orders"].partitions.items()
        }
        followed = [p for p, leader in leaders.items() if leader != 3]
        assert followed, leaders
        producer = confluent_kafka.Producer({**cluster.conf("admin"), "acks": 1})
        errors: list[object] = []
        for i, v in enumerate(late):  # every partition node 3 follows gets some
            producer.produce(
                "orders", v, partition=followed[i % len(followed)], on_delivery=lambda e, _m: errors.append(e)
            )
        assert producer.flush(15) == 0 and errors == [None] * len(late)
        time.sleep(1.0)  # a follower that could fetch would have these within milliseconds
        for p in followed:
            on_leader = {
                v for _, v in read_replica(cluster.nodes[leaders[p]].data_dir, "orders", p, 0).records
            }
            on_3 = {v for _, v in read_replica(node.data_dir, "orders", p, 3).records}
            assert on_leader & set(late) and not on_3 & set(late), p
    finally:
        node.stop()
        cluster.nodes[3] = old
        old.start()
        # back with the right settings, it catches up on what it missed
        wait_for(
            lambda: (
                {v for p in range(3) for _, v in read_replica(old.data_dir, "orders", p, 3).records}
                >= set(late)
            ),
            30,
        )
