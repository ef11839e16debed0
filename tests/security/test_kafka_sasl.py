"""SASL on the Kafka listener against real clients on both backends: confluent-kafka (librdkafka)
and kcat with SCRAM-SHA-512 and SCRAM-SHA-256, PLAIN where allowed, a hand-driven SaslHandshake v0
exchange; wrong passwords, unknown users and clients without SASL are refused and leave no trace.
Users are made with `broker users add`, as an operator would."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from scramp import ScramClient

from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import frame, read_exactly, read_response, read_sized
from labkit.securitylab import Unavailable, add_user, consume, create_topic, produce, sasl_conf, start_broker
from ringlog_proto import messages as m

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

KCAT = shutil.which("kcat")
PASSWORD = "correct horse battery staple"
MECHANISMS = "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"


@pytest.fixture(params=["uvloop", "io_uring"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    data = tmp_path / "data"
    add_user(data, "alice", PASSWORD)
    # alice may do anything: authorization is test_acls.py's
    extra = ("--sasl-mechanisms", MECHANISMS, "--sasl-plain-without-tls", "--super-users", "User:alice")
    try:
        b = start_broker(tmp_path, request.param, extra)
    except Unavailable as exc:
        pytest.skip(str(exc))
    yield b
    b.stop()


def conf(
    b: BrokerProcess, mechanism: str = "SCRAM-SHA-512", user: str = "alice", password: str = PASSWORD
) -> dict[str, Any]:
    return sasl_conf(b, user, password, mechanism)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_librdkafka_round_trip(broker: BrokerProcess, mechanism: str) -> None:
    c = conf(broker, mechanism)
    topic = f"t-{mechanism.lower()}"
    create_topic(c, topic)
    values = [f"v{i}".encode() for i in range(5)]
    assert produce(c, topic, values) == [None] * 5
    assert consume(c, topic, f"g-{mechanism}", 5) == (values, set())


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("mallory", PASSWORD)])
@pytest.mark.parametrize("broker", ["uvloop"], indirect=True)  # SASL is the same code on both
def test_bad_credentials_are_refused_and_write_nothing(
    broker: BrokerProcess, user: str, password: str
) -> None:
    good = conf(broker)
    create_topic(good, "kept")
    errors = produce(conf(broker, user=user, password=password), "kept", [b"intruder"])
    assert len(errors) == 1 and errors[0] is not None
    assert produce(good, "kept", [b"mine"]) == [None]
    assert consume(good, "kept", "g-check", 1)[0] == [b"mine"]  # the refused record is not there
    assert "authentication failed" in broker.log()
    assert password not in broker.log()
    assert broker.counter("auth_failures") >= 1


def test_clients_without_sasl_are_disconnected(broker: BrokerProcess) -> None:
    plain = {"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 3000}
    with pytest.raises(KafkaException):
        AdminClient(plain).list_topics(timeout=3)
    # our own protocol without its SASL exchange: told why, closed, never served
    w = Wire(broker.port)
    resp = w.rpc(m.CreateTopicRequest("sneaky", 1))
    assert resp.error == m.ErrorCode.ILLEGAL_SASL_STATE and "requires SASL" in resp.message
    assert w.closed_by_peer()
    w.close()
    assert "created topic sneaky" not in broker.log()


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (scripts/setup.sh installs it)")
def test_kcat_scram(broker: BrokerProcess) -> None:
    c = conf(broker)
    create_topic(c, "kc")
    sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-512"]
    sasl += ["-X", "sasl.username=alice", "-X", f"sasl.password={PASSWORD}"]
    assert KCAT is not None
    subprocess.run(
        [KCAT, "-b", broker.bootstrap, *sasl, "-P", "-t", "kc"], input=b"one\ntwo\n", check=True, timeout=60
    )
    out = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *sasl, "-C", "-t", "kc", "-e", "-q"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.split() == [b"one", b"two"]
    bad = [*sasl[:-1], "sasl.password=nope"]
    refused = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *bad, "-L", "-m", "5"], check=False, capture_output=True, timeout=60
    )
    assert refused.returncode != 0
    assert b"Authentication failed" in refused.stderr


def _exchange(s: socket.socket, api_key: int, version: int, corr: int, body: Any) -> Any:
    s.sendall(frame(api_key, version, corr, body))
    head = read_exactly(s, 4)
    got_corr, resp = read_response(api_key, version, head + read_exactly(s, struct.unpack(">i", head)[0]))
    assert got_corr == corr
    return resp


def test_handshake_v0_bare_tokens(broker: BrokerProcess) -> None:
    """SaslHandshake v0 (KIP-43): the SCRAM tokens follow as bare size-prefixed frames."""
    from kio.schema.metadata.v1.request import MetadataRequest
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest

    for password, ok in ((PASSWORD, True), ("wrong", False)):
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            resp = _exchange(s, 17, 0, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
            assert resp.error_code == ErrorCode.none and "SCRAM-SHA-256" in resp.mechanisms
            client = ScramClient(["SCRAM-SHA-256"], "alice", password)
            first = client.get_client_first().encode()
            s.sendall(struct.pack(">i", len(first)) + first)
            server_first = read_sized(s)
            client.set_server_first(server_first.decode())
            final = client.get_client_final().encode()
            s.sendall(struct.pack(">i", len(final)) + final)
            if not ok:
                assert s.recv(4) == b""  # v0 has no error frame: the connection closes
                continue
            server_final = read_sized(s)
            client.set_server_final(server_final.decode())  # the server knew the credential
            meta = _exchange(s, 3, 1, 2, MetadataRequest(topics=None))
            assert meta.brokers  # authenticated: served
