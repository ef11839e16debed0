"""TLS on the client listeners, both backends, real clients: confluent-kafka and kcat over
SASL_SSL with SCRAM-SHA-512 (and PLAIN, offered only over TLS), mutual TLS without SASL, and what
is refused: a wrong password, a client without a certificate where one is required, a client
that speaks plaintext to a TLS port. Certificates are made here (trustme), never committed."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from labkit.brokerproc import BrokerProcess
from labkit.securitylab import Pki, add_user, broker_cli, consume, create_topic, produce, start_or_skip

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

KCAT = shutil.which("kcat")
PASSWORD = "tls and scram"


@pytest.fixture(params=["uvloop", "io_uring"])
def sasl_ssl(request: pytest.FixtureRequest, tmp_path: Path, pki: Pki) -> Iterator[BrokerProcess]:
    add_user(tmp_path / "data", "alice", PASSWORD)
    extra = pki.serve_flags()
    sasl = ("--sasl-mechanisms", "SCRAM-SHA-512,PLAIN", "--super-users", "User:alice")  # ACLs: test_acls.py
    b = start_or_skip(tmp_path, request.param, (*extra, *sasl))
    yield b
    b.stop()


def ssl_conf(b: BrokerProcess, pki: Pki, **more: Any) -> dict[str, Any]:
    return {"bootstrap.servers": b.bootstrap, "ssl.ca.location": str(pki.ca), **more}


def scram(
    b: BrokerProcess, pki: Pki, password: str = PASSWORD, mechanism: str = "SCRAM-SHA-512"
) -> dict[str, Any]:
    return ssl_conf(
        b,
        pki,
        **{
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": "alice",
            "sasl.password": password,
        },
    )


def round_trip(c: dict[str, Any], topic: str, n: int = 20) -> None:
    create_topic(c, topic)
    values = [f"{topic}-{i}".encode() * 50 for i in range(n)]
    assert produce(c, topic, values) == [None] * n
    assert consume(c, topic, f"g-{topic}", n) == (values, set())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_sasl_ssl_round_trip(sasl_ssl: BrokerProcess, pki: Pki, mechanism: str) -> None:
    round_trip(scram(sasl_ssl, pki, mechanism=mechanism), f"t-{mechanism.lower()}")


def test_sasl_ssl_wrong_password(sasl_ssl: BrokerProcess, pki: Pki) -> None:
    errors: list[Any] = []
    p = Producer({**scram(sasl_ssl, pki, password="nope"), "message.timeout.ms": 3000})
    p.produce("t", b"x", on_delivery=lambda err, _m: errors.append(err))
    p.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert "authentication failed" in sasl_ssl.log()


def test_plaintext_client_on_a_tls_port_is_closed(sasl_ssl: BrokerProcess) -> None:
    with socket.create_connection(("127.0.0.1", sasl_ssl.port), timeout=10) as s:
        s.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")  # ApiVersions, in the clear
        s.settimeout(10)
        try:
            data = s.recv(100)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"\x00\x00\x00")  # no Kafka answer: at most a TLS alert, then EOF


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (scripts/setup.sh installs it)")
def test_kcat_sasl_ssl(sasl_ssl: BrokerProcess, pki: Pki) -> None:
    assert KCAT is not None
    admin = AdminClient(scram(sasl_ssl, pki))
    admin.create_topics([NewTopic("kc", 1)])["kc"].result(15)
    cmd = [
        KCAT,
        "-b",
        sasl_ssl.bootstrap,
        "-X",
        "security.protocol=SASL_SSL",
        "-X",
        f"ssl.ca.location={pki.ca}",
    ]
    cmd += [
        "-X",
        "sasl.mechanisms=SCRAM-SHA-512",
        "-X",
        "sasl.username=alice",
        "-X",
        f"sasl.password={PASSWORD}",
    ]
    subprocess.run([*cmd, "-P", "-t", "kc"], input=b"a\nb\nc\n", check=True, timeout=60)
    out = subprocess.run([*cmd, "-C", "-t", "kc", "-e", "-q"], capture_output=True, check=True, timeout=60)
    assert out.stdout.split() == [b"a", b"b", b"c"]


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_mutual_tls(tmp_path: Path, pki: Pki, backend: str) -> None:
    extra = pki.serve_flags(mutual=True)
    data = tmp_path / "data"
    principal = "User:CN=alice,OU=eng,O=acme"  # the client certificate's subject, most specific first
    for acl in (("all", "topic:m"), ("read", "group:*")):
        broker_cli(data, "acls", "add", principal, *acl)
    b = start_or_skip(tmp_path, backend, extra)
    try:
        mtls = ssl_conf(
            b,
            pki,
            **{
                "security.protocol": "SSL",
                "ssl.certificate.location": str(pki.client_cert),
                "ssl.key.location": str(pki.client_key),
            },
        )
        round_trip(mtls, "m")
        admin = AdminClient(mtls)  # the ACLs name the certificate's principal, and only that topic
        with pytest.raises(confluent_kafka.KafkaException) as info:
            admin.create_topics([NewTopic("elsewhere", 1)])["elsewhere"].result(15)
        assert info.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
        # no client certificate: the handshake fails, nothing is served
        anonymous = AdminClient(
            {**ssl_conf(b, pki, **{"security.protocol": "SSL"}), "socket.timeout.ms": 3000}
        )
        with pytest.raises(confluent_kafka.KafkaException):
            anonymous.list_topics(timeout=3)
    finally:
        b.stop()
