"""ACLs: the decisions (broker/security/acls.py) and their effect on real Kafka clients over SASL
and mutual TLS: what a principal lacks rights to is refused with the authorization errors and
leaves no trace; Metadata shows only what it may describe; deny beats allow; super users pass."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.security.acls import AclBinding, AclError, AclStore, Authorizer
from labkit.brokerproc import BrokerProcess
from labkit.securitylab import (
    broker_cli,
    consume,
    create_topic,
    produce,
    sasl_conf,
    scram_broker,
)

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AclBinding as KafkaAcl  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

PW = {"admin": "admin pw", "alice": "alice pw", "bob": "bob pw"}


# ----------------------------------------------------------------------------- decisions


def test_decisions(tmp_path: Path) -> None:
    store = AclStore(str(tmp_path))
    store.add(AclBinding("User:alice", "topic", "orders", "write"))
    store.add(AclBinding("User:alice", "topic", "logs-", "read", pattern="prefixed"))
    store.add(AclBinding("User:*", "topic", "public", "read"))
    store.add(AclBinding("User:alice", "topic", "logs-secret", "all", permission="deny"))
    store.add(AclBinding("User:alice", "group", "*", "read"))
    az = Authorizer(str(tmp_path), enabled=True, super_users=("User:admin",))
    ok = az.allowed
    assert ok("User:alice", "write", "topic", "orders")
    assert ok("User:alice", "describe", "topic", "orders")  # implied by write
    assert not ok("User:alice", "read", "topic", "orders")
    assert not ok("User:alice", "delete", "topic", "orders")
    assert ok("User:alice", "read", "topic", "logs-app")  # prefixed
    assert not ok("User:alice", "read", "topic", "logs-secret")  # deny wins
    assert not ok("User:alice", "describe", "topic", "logs-secret")  # a deny of all denies describe
    assert ok("User:bob", "read", "topic", "public") and not ok("User:bob", "write", "topic", "public")
    assert ok("User:alice", "read", "group", "any-group")  # literal "*"
    assert not ok("User:bob", "read", "group", "g")  # nothing allows it: denied by default
    assert ok("User:admin", "delete", "topic", "orders")  # super user
    assert not ok(None, "describe", "topic", "public")  # not authenticated
    assert Authorizer(str(tmp_path), enabled=False).allowed(None, "delete", "topic", "x")
    store.remove(AclBinding("User:alice", "topic", "orders", "write"))
    assert not ok("User:alice", "write", "topic", "orders")  # changes are read again
    assert store.add(AclBinding("User:*", "topic", "public", "read")) is False  # already there
    for bad in (
        AclBinding("alice", "topic", "t", "read"),
        AclBinding("User:alice", "table", "t", "read"),
        AclBinding("User:alice", "topic", "t", "eat"),
        AclBinding("User:alice", "cluster", "mine", "alter"),
    ):
        with pytest.raises(AclError):
            store.add(bad)


# ----------------------------------------------------------------------------- real clients


@pytest.fixture(params=["uvloop", "io_uring"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    grants = [
        ("User:alice", "write", "topic:orders"),
        ("User:alice", "read", "topic:orders"),
        ("User:alice", "read", "group:alice-", "--prefixed"),
    ]
    b = scram_broker(tmp_path, request.param, PW, grants)
    yield b
    b.stop()


def conf(b: BrokerProcess, user: str) -> dict[str, Any]:
    return sasl_conf(b, user, PW[user])


def test_acls_against_librdkafka(broker: BrokerProcess) -> None:
    for t in ("orders", "payroll"):
        create_topic(conf(broker, "admin"), t)
    assert produce(conf(broker, "admin"), "payroll", [b"salary"]) == [None]

    alice = conf(broker, "alice")
    assert produce(alice, "orders", [b"o1", b"o2"]) == [None, None]
    refused = produce(alice, "payroll", [b"raise"])
    assert [e.code() for e in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    got, errors = consume(alice, "orders", "alice-readers", 2)
    assert got == [b"o1", b"o2"] and not errors
    _, errors = consume(alice, "orders", "other-group", 0)  # no read on that group
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors

    # Metadata lists only what alice may describe
    names = set(AdminClient(alice).list_topics(timeout=10).topics)
    assert names == {"orders"}

    bob = conf(broker, "bob")
    assert set(AdminClient(bob).list_topics(timeout=10).topics) == set()
    assert [e.code() for e in produce(bob, "orders", [b"intruder"])] == [
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]
    bob_admin = AdminClient(bob)  # held: a collected client cancels its futures
    with pytest.raises(KafkaException) as info:
        bob_admin.create_topics([NewTopic("bobs", 1)])["bobs"].result(15)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as info:
        bob_admin.delete_topics(["orders"])["orders"].result(15)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # create on the cluster creates any topic, as in Kafka
    broker_cli(broker.data_dir, "acls", "add", "User:bob", "create", "cluster:kafka-cluster")
    create_topic(bob, "bobs-own")
    assert "bobs-own" in AdminClient(conf(broker, "admin")).list_topics(timeout=10).topics

    # no trace of what was refused: the admin sees exactly what was allowed
    got, _ = consume(conf(broker, "admin"), "orders", "audit", 2)
    assert got == [b"o1", b"o2"]
    got, _ = consume(conf(broker, "admin"), "payroll", "audit", 1)
    assert got == [b"salary"]

    # One Produce naming a topic alice may write and one she may only describe (so the client
    # sends it rather than failing it from Metadata): answered topic by topic, as Kafka does.
    # kafka-python, like Kafka's Java client, puts every partition bound for one broker in one
    # Produce (librdkafka sends a partition per request, so it never mixes them).
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "describe", "topic:payroll")
    kafka = pytest.importorskip("kafka")
    mixed = kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice",
        sasl_plain_password=PW["alice"],
        linger_ms=300,
        retries=0,
    )
    try:
        mixed.partitions_for("orders"), mixed.partitions_for("payroll")  # leaders known first
        sent = {topic: mixed.send(topic, b"o3", partition=0) for topic in ("orders", "payroll")}
        mixed.flush(15)
        assert sent["orders"].get(15).offset == 2
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            sent["payroll"].get(15)
    finally:
        mixed.close(5)
    marks = Consumer({**conf(broker, "admin"), "group.id": "marks"})
    for topic, end in (("orders", 3), ("payroll", 1)):  # nothing refused was stored
        assert marks.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, end)
    marks.close()
    assert "bobs" not in AdminClient(conf(broker, "admin")).list_topics(timeout=10).topics

    # ListGroups shows a principal the groups it may describe; describe on the cluster shows all
    members = []
    for user, group in (("alice", "alice-readers"), ("admin", "audit")):  # groups with a member
        member = Consumer({**conf(broker, user), "group.id": group})
        member.subscribe(["orders"])
        members.append(member)
    for member in members:
        deadline = time.monotonic() + 20
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)

    def listed(user: str) -> set[str]:
        admin = AdminClient(conf(broker, user))  # held until the result
        return {g.group_id for g in admin.list_consumer_groups().result(15).valid}

    assert listed("admin") == {"alice-readers", "audit"}
    assert listed("alice") == {"alice-readers"}  # read on group:alice- implies describe
    assert listed("bob") == set()
    for member in members:
        member.close()

    assert broker.counter("auth_denied") >= 1
    # a deny wins over the allow, at once (the workers reread the file)
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "write", "topic:orders", "--deny")
    refused = produce(alice, "orders", [b"o4"])
    assert [e.code() for e in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


# ----------------------------------------------------------------------------- Kafka's ACL admin APIs


def _everything() -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )


def test_acl_admin_apis(broker: BrokerProcess) -> None:
    """CreateAcls, DescribeAcls and DeleteAcls from confluent-kafka's AdminClient change the ACLs
    `broker acls` lists, and the change applies at once; only alter on the cluster may."""
    admin = AdminClient(conf(broker, "admin"))
    create_topic(conf(broker, "admin"), "ledger")
    bob = conf(broker, "bob")
    assert [e.code() for e in produce(bob, "ledger", [b"x"])] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    grant = KafkaAcl(
        ResourceType.TOPIC, "ledg", ResourcePatternType.PREFIXED, "User:bob", "*",
        AclOperation.WRITE, AclPermissionType.ALLOW,
    )  # fmt: skip
    admin.create_acls([grant])[grant].result(15)
    assert "allow User:bob write topic:ledg (prefixed)" in broker_cli(broker.data_dir, "acls", "list")
    assert produce(bob, "ledger", [b"x"]) == [None]

    listed = admin.describe_acls(_everything()).result(15)
    assert grant in listed and len(listed) == 4  # alice's three and bob's
    only_bob = AclBindingFilter(
        ResourceType.TOPIC, "ledger", ResourcePatternType.MATCH, "User:bob", None,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip
    assert admin.describe_acls(only_bob).result(15) == [grant]  # MATCH: the prefix applies

    # bob may not change ACLs: CLUSTER_AUTHORIZATION_FAILED, and nothing changes
    bob_admin = AdminClient(bob)
    with pytest.raises(KafkaException) as refused:
        bob_admin.delete_acls([_everything()])[_everything()].result(15)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert len(admin.describe_acls(_everything()).result(15)) == 4

    # a host other than "*" is refused item by item
    hosted = KafkaAcl(
        ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:bob", "10.0.0.1",
        AclOperation.READ, AclPermissionType.ALLOW,
    )  # fmt: skip
    with pytest.raises(KafkaException):
        admin.create_acls([hosted])[hosted].result(15)

    deleted = admin.delete_acls([only_bob])[only_bob].result(15)
    assert deleted == [grant]
    assert [e.code() for e in produce(bob, "ledger", [b"y"])] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    assert "User:bob" not in broker_cli(broker.data_dir, "acls", "list")


def test_config_operations_and_what_they_imply(tmp_path: Path) -> None:
    store = AclStore(str(tmp_path))
    store.add(AclBinding("User:alice", "topic", "orders", "alter_configs"))
    store.add(AclBinding("User:bob", "topic", "orders", "describe_configs"))
    store.add(AclBinding("User:carol", "topic", "orders", "alter"))
    auth = Authorizer(str(tmp_path), enabled=True)
    assert auth.allowed("User:alice", "describe_configs", "topic", "orders")  # implied, as in Kafka
    assert not auth.allowed("User:bob", "alter_configs", "topic", "orders")
    assert not auth.allowed("User:carol", "alter_configs", "topic", "orders")  # alter is not alter_configs
    assert not auth.allowed("User:carol", "describe_configs", "topic", "orders")


def test_config_apis_are_authorized_resource_by_resource(broker: BrokerProcess) -> None:
    """DescribeConfigs needs describe_configs on the topic (or the cluster, for a broker's),
    AlterConfigs and IncrementalAlterConfigs alter_configs: a refused resource is answered
    TOPIC_AUTHORIZATION_FAILED / CLUSTER_AUTHORIZATION_FAILED, changes nothing, and the
    request's other resources are served, as Kafka answers."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    for t in ("orders", "payroll"):
        create_topic(conf(broker, "admin"), t)
    alice = AdminClient(conf(broker, "alice"))  # write and read on orders: no config rights
    orders, payroll, node = (
        ConfigResource("topic", "orders"),
        ConfigResource("topic", "payroll"),
        ConfigResource("broker", "0"),
    )

    def code(future: Any) -> int:
        with pytest.raises(KafkaException) as info:
            future.result(15)
        return info.value.args[0].code()

    assert code(alice.describe_configs([orders])[orders]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert code(alice.describe_configs([node])[node]) == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "describe_configs", "topic:orders")
    futures = alice.describe_configs([orders, payroll])
    assert futures[orders].result(15)["retention.ms"].value is not None
    assert code(futures[payroll]) == KafkaError.TOPIC_AUTHORIZATION_FAILED

    change = ConfigResource(
        "topic",
        "orders",
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    assert code(alice.incremental_alter_configs([change])[change]) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    admin = AdminClient(conf(broker, "admin"))
    assert admin.describe_configs([orders])[orders].result(15)["retention.ms"].value != "1000", (
        "nothing changed"
    )
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "alter_configs", "topic:orders")
    alice.incremental_alter_configs([change])[change].result(15)
    assert admin.describe_configs([orders])[orders].result(15)["retention.ms"].value == "1000"


def test_create_topics_answers_configs_only_to_who_may_describe_them(broker: BrokerProcess) -> None:
    """CreateTopics v5+ (kafka-python 3 asks v7) answers the created topic's counts and configs
    when the principal may describe its configs; else topic_config_error_code
    TOPIC_AUTHORIZATION_FAILED and none of them, the topic created all the same (Kafka's
    controller answers so)."""
    kafka = pytest.importorskip("kafka")
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "create", "topic:alice-", "--prefixed")

    def create(name: str) -> dict[str, Any]:
        client = kafka.KafkaAdminClient(
            bootstrap_servers=broker.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="alice",
            sasl_plain_password=PW["alice"],
        )
        try:
            (topic,) = client.create_topics({name: {"num_partitions": 2}})["topics"]
        finally:
            client.close()
        return topic

    blind = create("alice-1")
    assert (blind["error_code"], blind["topic_config_error_code"]) == (
        0,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    )
    assert (blind["num_partitions"], blind["replication_factor"], blind.get("configs") or {}) == (-1, -1, {})
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "describe_configs", "topic:alice-", "--prefixed")
    seen = create("alice-2")
    assert (seen["error_code"], seen["topic_config_error_code"], seen["num_partitions"]) == (0, 0, 2)
    assert seen["configs"]["retention.ms"]["value"] is not None
    names = set(AdminClient(conf(broker, "admin")).list_topics(timeout=10).topics)
    assert {"alice-1", "alice-2"} <= names
