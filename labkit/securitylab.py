"""What the security tests (tests/security/) and bench/security.py share: the `broker users` and
`broker acls` commands as an operator runs them, certificates made at test time (trustme: no
private key is ever committed), and librdkafka helpers that report what was refused."""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

from labkit.brokerproc import BrokerProcess


class Unavailable(Exception):
    """The io_uring broker fell back to uvloop here: callers skip."""


def broker_cli(data: Path, *args: str, stdin: str | None = None) -> str:
    """`broker ARGS --data-dir DATA` (users, acls); its stdout. Fails the caller on an error."""
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli", *args, "--data-dir", str(data)],
        input=stdin,
        text=True,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def add_user(data: Path, name: str, password: str) -> None:
    broker_cli(data, "users", "add", name, "--password-stdin", stdin=password + "\n")


def scram_server_first(
    port: int, user: str, mechanism: str = "SCRAM-SHA-512", tls: ssl.SSLContext | None = None
) -> dict[str, str]:
    """The attributes of a broker's SCRAM server-first message (r, s, i) to a client claiming
    `user`, over Kafka's SaslHandshake v0 and a bare token (KIP-43): what anyone may ask."""
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest

    from labkit.kafka_requests import frame, read_sized

    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        s = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
        s.sendall(frame(17, 0, 1, SaslHandshakeRequest(mechanism=mechanism)))
        read_sized(s)
        first = f"n,,n={user},r=abcdefghijklmnop".encode()
        s.sendall(struct.pack(">i", len(first)) + first)
        text = read_sized(s).decode()
    return dict(part.split("=", 1) for part in text.split(","))


def sasl_conf(b: BrokerProcess, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, Any]:
    """librdkafka's settings for `user` over SASL without TLS."""
    return {
        "bootstrap.servers": b.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def start_broker(workdir: Path, backend: str, extra: tuple[str, ...], cores: int = 1) -> BrokerProcess:
    """A broker on `workdir`/data; raises `Unavailable` when io_uring was asked for and is not here."""
    # a group's first join waits this long for more members (Kafka's default is 3 s): as
    # tests/conftest.py's brokers, so that each test's consumer groups do not wait 3 s to start
    extra = ("--group-initial-rebalance-delay-ms", "100", *extra)
    b = BrokerProcess(
        workdir / "data", workdir / "broker.log", extra=extra, cores=cores, backend=backend
    ).start()
    if b.fell_back():
        b.stop()
        raise Unavailable("io_uring unavailable here: the broker fell back to uvloop")
    return b


def start_or_skip(workdir: Path, backend: str, extra: tuple[str, ...], cores: int = 1) -> BrokerProcess:
    """`start_broker` in a test: skipped, with the reason, where io_uring is not available."""
    import pytest  # only tests call this; bench/security.py imports this module too

    try:
        return start_broker(workdir, backend, extra, cores)
    except Unavailable as exc:
        pytest.skip(str(exc))


def scram_broker(
    workdir: Path, backend: str, users: dict[str, str], grants: list[tuple[str, ...]]
) -> BrokerProcess:
    """`start_or_skip` of a broker with SCRAM-SHA-512 logins for `users` (name: password), User:admin
    its super user, and these `broker acls add` grants made before it starts."""
    data = workdir / "data"
    for user, pw in users.items():
        add_user(data, user, pw)
    for grant in grants:
        broker_cli(data, "acls", "add", *grant)
    return start_or_skip(
        workdir, backend, ("--sasl-mechanisms", "SCRAM-SHA-512", "--super-users", "User:admin")
    )


@dataclass
class Pki:
    """A CA, a server certificate for 127.0.0.1 and localhost, and a client certificate whose
    subject is CN=alice,OU=eng,O=acme (the principal User:CN=alice,OU=eng,O=acme)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, d: Path) -> Pki:
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client = ca.issue_cert(
            "alice@example.com", common_name="alice", organization_name="acme", organization_unit_name="eng"
        )
        ca.cert_pem.write_to_path(str(d / "ca.pem"))
        for cert, name in ((server, "server"), (client, "client")):
            with open(d / f"{name}.pem", "wb") as f:
                for pem in cert.cert_chain_pems:
                    f.write(pem.bytes())
            cert.private_key_pem.write_to_path(str(d / f"{name}.key"))
        return cls(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")

    def serve_flags(self, mutual: bool = False) -> tuple[str, ...]:
        """`broker serve`'s TLS flags for this server certificate; `mutual`: clients need one too."""
        flags = ("--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key))
        return (*flags, "--tls-client-ca", str(self.ca)) if mutual else flags


def create_topic(conf: dict[str, Any], name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(conf)  # held until the result: a collected client cancels its futures
    admin.create_topics([NewTopic(name, partitions)])[name].result(15)


def produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> list[Any]:
    """Each record's delivery error (None: acknowledged), in order; no retries of a refusal."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    p = Producer({**conf, "message.timeout.ms": 5000, "retries": 0})
    for v in values:
        p.produce(topic, v, on_delivery=lambda err, _m: errors.append(err))
    p.flush(15)
    return errors


def consume(conf: dict[str, Any], topic: str, group: str, n: int) -> tuple[list[bytes], set[int]]:
    """Up to `n` values from the start of `topic` as a member of `group`, and the error codes
    seen; with n=0, until the first error (or 8 s)."""
    from confluent_kafka import Consumer

    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
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
