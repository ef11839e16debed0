"""ACLs: the decisions (broker/security/acls.py) and their effect on real Kafka clients over SASL
and mutual TLS: what a principal lacks rights to is refused with the authorization errors and
leaves no trace; Metadata shows only what it may describe; deny beats allow; super users pass."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from brokerproc import BrokerProcess

from broker.security.acls import AclBinding, AclError, AclStore, Authorizer

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

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


def cli(data: Path, *args: str, stdin: str | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", *args, "--data-dir", str(data)],
        input=stdin,
        text=True,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(params=["uvloop", "io_uring"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    data = tmp_path / "data"
    for user, pw in PW.items():
        cli(data, "users", "add", user, "--password-stdin", stdin=pw + "\n")
    cli(data, "acls", "add", "User:alice", "write", "topic:orders")
    cli(data, "acls", "add", "User:alice", "read", "topic:orders")
    cli(data, "acls", "add", "User:alice", "read", "group:alice-", "--prefixed")
    args = ("--sasl-mechanisms", "SCRAM-SHA-512", "--super-users", "User:admin")
    b = BrokerProcess(data, tmp_path / "broker.log", extra=args, backend=request.param).start()
    if request.param == "io_uring" and "backend io_uring" not in b.log():
        b.stop()
        pytest.skip("io_uring unavailable here: the broker fell back to uvloop")
    yield b
    b.stop()


def conf(b: BrokerProcess, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": b.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": PW[user],
    }


def produce(c: dict[str, Any], topic: str, values: list[bytes]) -> list[Any]:
    errors: list[Any] = []
    p = Producer({**c, "message.timeout.ms": 5000, "retries": 0})
    for v in values:
        p.produce(topic, v, on_delivery=lambda err, _m: errors.append(err))
    p.flush(15)
    return errors


def consume(c: dict[str, Any], topic: str, group: str, n: int) -> tuple[list[bytes], set[int]]:
    consumer = Consumer({**c, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    errors: set[int] = set()
    deadline = time.monotonic() + (30 if n else 8)
    while time.monotonic() < deadline and (len(got) < n or (not n and not errors)):
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error() is not None:
            errors.add(msg.error().code())
        else:
            got.append(msg.value())
    consumer.close()
    return got, errors


def test_acls_against_librdkafka(broker: BrokerProcess) -> None:
    admin = AdminClient(conf(broker, "admin"))
    for t in ("orders", "payroll"):
        admin.create_topics([NewTopic(t, 1)])[t].result(15)
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

    # no trace of what was refused: the admin sees exactly what was allowed
    got, _ = consume(conf(broker, "admin"), "orders", "audit", 2)
    assert got == [b"o1", b"o2"]
    got, _ = consume(conf(broker, "admin"), "payroll", "audit", 1)
    assert got == [b"salary"]
    assert "bobs" not in AdminClient(conf(broker, "admin")).list_topics(timeout=10).topics

    assert broker.counter("auth_denied") >= 1
    # a deny wins over the allow, at once (the workers reread the file)
    cli(Path(broker.data_dir), "acls", "add", "User:alice", "write", "topic:orders", "--deny")
    refused = produce(alice, "orders", [b"o3"])
    assert [e.code() for e in refused] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
