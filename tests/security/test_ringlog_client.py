"""Our own protocol and client (`broker.client`) over TLS + SCRAM, over mutual TLS, and with ACLs,
on both backends: produce, consume with a group and commit succeed with the right credentials;
a wrong password, a client without credentials or without TLS, and a topic or group the ACLs do
not grant are refused, said so, and leave no trace. Two cores, so that the client's connections
to each core's direct port authenticate too. Certificates are made here (trustme)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import (
    Admin,
    AuthenticationError,
    BrokerUnavailable,
    Consumer,
    Producer,
    Security,
    TopicPartition,
)
from broker.client.errors import GroupAuthorizationError, TopicAuthorizationError
from labkit.brokerproc import BrokerProcess, Wire
from labkit.securitylab import Pki, add_user, broker_cli, start_or_skip
from ringlog_proto import messages as m

ALICE_PASSWORD = "alice's own secret"
ADMIN_PASSWORD = "admin secret"


@pytest.fixture(scope="module", params=["uvloop", "io_uring"])
def sasl_ssl(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[BrokerProcess]:
    """TLS + SCRAM; admin is a super user, alice may write and read `orders` and read group `app`."""
    workdir = tmp_path_factory.mktemp(f"sasl-{request.param}")
    data = workdir / "data"
    add_user(data, "alice", ALICE_PASSWORD)
    add_user(data, "admin", ADMIN_PASSWORD)
    for op in ("write", "read"):
        broker_cli(data, "acls", "add", "User:alice", op, "topic:orders")
    broker_cli(data, "acls", "add", "User:alice", "read", "group:app")
    extra = pki.serve_flags()
    extra += ("--sasl-mechanisms", "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN", "--super-users", "User:admin")
    b = start_or_skip(workdir, request.param, extra, cores=2)
    with Admin(b.bootstrap, security=admin(pki)) as a:
        a.create_topic("orders", 2)
        a.create_topic("payroll", 1)
    yield b
    b.stop()


def alice(pki: Pki, mechanism: str = "SCRAM-SHA-512", password: str = ALICE_PASSWORD) -> Security:
    return Security(
        tls=True, cafile=str(pki.ca), sasl_mechanism=mechanism, username="alice", password=password
    )


def admin(pki: Pki) -> Security:
    return Security(
        tls=True,
        cafile=str(pki.ca),
        sasl_mechanism="SCRAM-SHA-512",
        username="admin",
        password=ADMIN_PASSWORD,
    )


def consume(
    b: BrokerProcess, security: Security, topic: str, n: int, group: str | None = None
) -> list[bytes]:
    got: list[bytes] = []
    with Consumer(b.bootstrap, security=security, group=group, auto_offset_reset="earliest") as c:
        c.subscribe(topic)
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got.extend(r.value for r in c.poll(500))
        if group is not None:
            c.commit()
    return got


def counted(b: BrokerProcess, key: str, at_least: int) -> int:
    """The sum of `key` over both cores' metrics once it reaches `at_least` (snapshots are
    published about once a second), else after 5 s; 0 when it never does."""
    deadline = time.monotonic() + 5
    while True:
        total = sum(b.counter(key, core, timeout=0.01) for core in range(2))
        if total >= at_least or time.monotonic() > deadline:
            return total if total >= at_least else 0
        time.sleep(0.2)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_produce_and_consume_over_tls_with_sasl(sasl_ssl: BrokerProcess, pki: Pki, mechanism: str) -> None:
    sec = alice(pki, mechanism)
    values = [f"{mechanism}-{i}".encode() for i in range(20)]
    with Producer(sasl_ssl.bootstrap, security=sec) as p:
        for i, v in enumerate(values):
            p.send("orders", v, key=str(i).encode())  # both partitions: both cores' direct ports
        p.flush(30)
    got = consume(sasl_ssl, sec, "orders", len(values), group="app")
    assert sorted(got) == sorted(values)  # the group resumed where the last mechanism's run left it
    with Consumer(sasl_ssl.bootstrap, security=sec, group="app") as c:  # and its commit is held
        committed = [c.committed(TopicPartition("orders", i)) for i in range(2)]
    with Admin(sasl_ssl.bootstrap, security=sec) as a:
        ends = [p.end_offset for p in a.describe_topic("orders").partitions]
    assert committed == ends


def test_acls_refuse_what_is_not_granted_and_hide_it(sasl_ssl: BrokerProcess, pki: Pki) -> None:
    sec = alice(pki)
    with Admin(sasl_ssl.bootstrap, security=admin(pki)) as a:
        topics = sorted(a.list_topics())  # the module's broker: other tests may have made some
    denied = counted(sasl_ssl, "auth_denied", 0)
    with Producer(sasl_ssl.bootstrap, security=sec, retries=0) as p, pytest.raises(TopicAuthorizationError):
        p.send("payroll", b"intruder").result(30)
    with Admin(sasl_ssl.bootstrap, security=sec) as a:
        assert a.list_topics() == ["orders"]  # Metadata lists only what alice may describe
        with pytest.raises(TopicAuthorizationError):
            a.create_topic("mine", 1)
        with pytest.raises(TopicAuthorizationError):
            a.delete_topic("orders")  # write and read do not include delete
        with pytest.raises(TopicAuthorizationError):
            a.describe_configs("orders")  # describe_configs is its own operation, as in Kafka
        with pytest.raises(TopicAuthorizationError):
            a.alter_configs("orders", set={"retention.ms": "1"})
    with pytest.raises(GroupAuthorizationError):
        consume(sasl_ssl, sec, "orders", 1, group="not-alices")
    with Admin(sasl_ssl.bootstrap, security=admin(pki)) as a:
        assert sorted(a.list_topics()) == topics  # nothing created, nothing deleted
        assert a.describe_topic("payroll").partitions[0].end_offset == 0  # nothing written
    assert counted(
        sasl_ssl, "auth_denied", denied + 5
    )  # create, delete, the configs, join (Metadata is filtered)


def test_a_wrong_password_is_refused_and_never_logged(sasl_ssl: BrokerProcess, pki: Pki) -> None:
    wrong = "not alice's password"
    before = counted(sasl_ssl, "auth_failures", 0)
    with pytest.raises(AuthenticationError, match="Authentication failed"):
        Admin(sasl_ssl.bootstrap, security=alice(pki, password=wrong))
    with pytest.raises(AuthenticationError):
        Admin(
            sasl_ssl.bootstrap,
            security=Security(
                tls=True, cafile=str(pki.ca), sasl_mechanism="PLAIN", username="mallory", password=wrong
            ),
        )
    assert counted(sasl_ssl, "auth_failures", before + 2)
    assert wrong not in sasl_ssl.log()


def test_clients_without_credentials_or_tls_are_refused(sasl_ssl: BrokerProcess, pki: Pki) -> None:
    # TLS but no SASL: told that the broker requires it, then closed
    with (
        Admin(sasl_ssl.bootstrap, security=Security(tls=True, cafile=str(pki.ca))) as a,
        pytest.raises(AuthenticationError, match="requires SASL"),
    ):
        a.list_topics()  # (ApiVersions, which the admin sends first, is answered before SASL)
    # plaintext to a TLS port: the handshake fails, nothing is served
    with pytest.raises(BrokerUnavailable):
        Admin(sasl_ssl.bootstrap, request_timeout_ms=3000)
    w = Wire(sasl_ssl.port)
    w.send(m.CreateTopicRequest("sneaky", 1))
    assert w.closed_by_peer()
    w.close()
    # a CA that did not sign the broker's certificate: the client refuses the broker
    other = Pki.make(sasl_ssl.data_dir.parent)
    with pytest.raises(BrokerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        Admin(
            sasl_ssl.bootstrap,
            security=Security(
                tls=True,
                cafile=str(other.ca),
                sasl_mechanism="SCRAM-SHA-512",
                username="alice",
                password=ALICE_PASSWORD,
            ),
        )
    with Admin(sasl_ssl.bootstrap, security=admin(pki)) as a:
        assert "sneaky" not in a.list_topics()


def test_sasl_without_tls_and_plain_not_offered(tmp_path: Path) -> None:
    """SCRAM on a plaintext listener, with steering's public port and two cores; PLAIN is not
    offered there (it would send the password)."""
    data = tmp_path / "data"
    add_user(data, "alice", ALICE_PASSWORD)
    broker_cli(data, "acls", "add", "User:alice", "all", "topic:t", "--prefixed")
    b = start_or_skip(tmp_path, "uvloop", ("--sasl-mechanisms", "SCRAM-SHA-256,PLAIN"), cores=2)
    try:
        plain = Security(sasl_mechanism="PLAIN", username="alice", password=ALICE_PASSWORD)
        with pytest.raises(AuthenticationError, match="not offered"):
            Admin(b.bootstrap, security=plain)
        sec = Security(sasl_mechanism="SCRAM-SHA-256", username="alice", password=ALICE_PASSWORD)
        with Admin(b.bootstrap, security=sec) as a:
            a.create_topic("t1", 2)  # "all" on the prefix t includes create
            with pytest.raises(TopicAuthorizationError):
                a.create_topic("x1", 1)
        with Producer(b.bootstrap, security=sec) as p:
            for i in range(6):
                p.send("t1", b"%d" % i, key=b"%d" % i)
            p.flush(30)
        assert sorted(consume(b, sec, "t1", 6)) == [b"%d" % i for i in range(6)]
    finally:
        b.stop()


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_a_producer_creates_a_topic_only_with_create_on_it(tmp_path: Path, backend: str) -> None:
    """Auto topic creation with ACLs, as Kafka's: a producer's lookup creates a missing topic
    only for a principal with create on the topic (or the cluster); one with write and describe
    but no create is refused, TOPIC_AUTHORIZATION_FAILED, and nothing is created."""
    data = tmp_path / "data"
    add_user(data, "alice", ALICE_PASSWORD)
    add_user(data, "admin", ADMIN_PASSWORD)
    for op in ("write", "describe", "read"):
        broker_cli(data, "acls", "add", "User:alice", op, "topic:alice-", "--prefixed")
    broker_cli(data, "acls", "add", "User:alice", "create", "topic:alice-own")
    extra = ("--sasl-mechanisms", "SCRAM-SHA-256", "--super-users", "User:admin", "--default-partitions", "2")
    b = start_or_skip(tmp_path, backend, extra, cores=2)
    try:
        sec = Security(sasl_mechanism="SCRAM-SHA-256", username="alice", password=ALICE_PASSWORD)
        with Producer(b.bootstrap, security=sec, retries=0) as p:
            assert p.send("alice-own", b"mine", partition=1).result(30).offset == 0
            for refused in ("alice-other", "bobs"):  # describe but no create; neither
                with pytest.raises(TopicAuthorizationError):
                    p.send(refused, b"intruder").result(30)
        root = Security(sasl_mechanism="SCRAM-SHA-256", username="admin", password=ADMIN_PASSWORD)
        with Admin(b.bootstrap, security=root) as a:
            assert a.list_topics() == ["alice-own"]
            assert len(a.describe_topic("alice-own").partitions) == 2
        assert consume(b, sec, "alice-own", 1) == [b"mine"]
    finally:
        b.stop()


@pytest.fixture(scope="module", params=["uvloop", "io_uring"])
def mtls(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp(f"mtls-{request.param}")
    principal = "User:CN=alice,OU=eng,O=acme"
    for op in ("create", "write", "read"):
        broker_cli(workdir / "data", "acls", "add", principal, op, "topic:certs")
    broker_cli(workdir / "data", "acls", "add", principal, "read", "group:certs-app")
    extra = pki.serve_flags(mutual=True)
    b = start_or_skip(workdir, request.param, extra, cores=2)
    yield b
    b.stop()


def test_mutual_tls_names_the_principal(mtls: BrokerProcess, pki: Pki) -> None:
    sec = Security(tls=True, cafile=str(pki.ca), certfile=str(pki.client_cert), keyfile=str(pki.client_key))
    with Admin(mtls.bootstrap, security=sec) as a:
        a.create_topic("certs", 2)
        assert a.list_topics() == ["certs"]
    with Producer(mtls.bootstrap, security=sec) as p:
        for i in range(10):
            p.send("certs", f"c{i}".encode(), key=str(i).encode())
        p.flush(30)
    assert sorted(consume(mtls, sec, "certs", 10, group="certs-app")) == sorted(
        f"c{i}".encode() for i in range(10)
    )
    with pytest.raises(BrokerUnavailable):  # no client certificate: the handshake is refused
        Admin(mtls.bootstrap, security=Security(tls=True, cafile=str(pki.ca)), request_timeout_ms=5000)


def test_the_broker_command_over_tls_and_scram(sasl_ssl: BrokerProcess, pki: Pki, tmp_path: Path) -> None:
    """`broker topics|produce|consume` as an operator runs them: the password from a file or the
    environment, never the command line."""
    secret = tmp_path / "admin.password"
    secret.write_text(ADMIN_PASSWORD + "\n")
    auth = ["-b", sasl_ssl.bootstrap, "--tls-ca", str(pki.ca), "--sasl-mechanism", "SCRAM-SHA-512"]

    def cli(
        *args: str, stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "broker.cli", *args],
            input=stdin,
            text=True,
            capture_output=True,
            timeout=60,
            env={**os.environ, **(env or {})},
            check=False,
        )

    admin_file = [*auth, "--sasl-username", "admin", "--sasl-password-file", str(secret)]
    done = cli("topics", "create", "cli-topic", "--partitions", "2", *admin_file)
    assert done.returncode == 0, done.stderr
    done = cli("produce", "cli-topic", *admin_file, stdin="one\ntwo\nthree\n")
    assert done.returncode == 0, done.stderr
    alice_env = {"RINGLOG_SASL_PASSWORD": ALICE_PASSWORD}
    done = cli(
        "consume",
        "cli-topic",
        "--from-beginning",
        "--max-records",
        "3",
        *auth,
        "--sasl-username",
        "alice",
        env=alice_env,
    )
    assert done.returncode == 1 and "TOPIC_AUTHORIZATION_FAILED" in done.stderr  # alice: orders only
    done = cli("consume", "cli-topic", "--from-beginning", "--max-records", "3", *admin_file)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["one", "three", "two"]
    done = cli("topics", "list", *auth, "--sasl-username", "alice", env={"RINGLOG_SASL_PASSWORD": "wrong"})
    assert done.returncode == 1 and "Authentication failed" in done.stderr
