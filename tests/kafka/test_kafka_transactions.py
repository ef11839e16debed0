"""Transactional producers against a real `broker serve`, which has no transactions yet: each stock
client must fail at once with an error that says so, not retry until its own timeout (librdkafka's
`init_transactions()` did for 60 s, aiokafka's `start()` never returned), and an idempotent
producer without a transactional id beside it must work as before.

The answer (broker/kafka/init_producer_id.py says why this one): TRANSACTIONAL_ID_AUTHORIZATION_FAILED
to FindCoordinator with key type 1 (with a message) and to InitProducerId with a transactional id.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i64

from labkit.brokerproc import BrokerProcess, Wire

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from test_kafka_idempotence import KafkaWire  # noqa: E402  (tests/kafka)

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
FAST_S = 5.0  # "at once": well under every client's own timeout (20 s asked of each here)
CLIENT_TIMEOUT_S = 20


def timed(call: Callable[[], object]) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def produce_idempotent(broker: BrokerProcess, topic: str) -> None:
    """An idempotent producer without a transactional id still gets its id and stores a record."""
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    delivered: list[object] = []
    p.produce(topic, b"idempotent", on_delivery=lambda err, msg: delivered.append(err or msg.offset()))
    assert p.flush(20) == 0
    assert delivered == [0]


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_confluent_kafka_init_transactions_fails_at_once(broker: BrokerProcess) -> None:
    Wire(broker.port).create_topic("beside", 1)
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-ck"})
    exc, took = timed(lambda: p.init_transactions(CLIENT_TIMEOUT_S))
    assert isinstance(exc, confluent_kafka.KafkaException), exc
    error = exc.args[0]
    assert error.fatal() and not error.retriable(), error
    assert error.code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert "does not support transactions" in error.str() and "tx-ck" in error.str(), error.str()
    assert took < FAST_S, f"init_transactions took {took:.1f} s"
    produce_idempotent(broker, "beside")


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_aiokafka_transactional_start_fails_at_once(broker: BrokerProcess) -> None:
    async def start() -> None:
        p = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="tx-aio")
        try:
            await asyncio.wait_for(p.start(), CLIENT_TIMEOUT_S)
        finally:
            await p.stop()

    exc, took = timed(lambda: asyncio.run(start()))
    assert isinstance(exc, aiokafka.errors.TransactionalIdAuthorizationFailed), repr(exc)
    assert took < FAST_S, f"start() took {took:.1f} s"


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_kafka_python_init_transactions_fails_at_once(broker: BrokerProcess) -> None:
    p = kafka.KafkaProducer(
        bootstrap_servers=broker.bootstrap, transactional_id="tx-kp", max_block_ms=CLIENT_TIMEOUT_S * 1000
    )
    try:
        exc, took = timed(p.init_transactions)
    finally:
        p.close(0)
    assert isinstance(exc, kafka.errors.TransactionalIdAuthorizationFailedError), repr(exc)
    assert took < FAST_S, f"init_transactions took {took:.1f} s"


@pytest.mark.parametrize("broker", CONFIGS[:1], indirect=True)
def test_init_producer_id_refuses_a_transactional_id_on_every_version(broker: BrokerProcess) -> None:
    """A client that skips FindCoordinator meets the same refusal; one without a transactional id
    is given an id on the same connection."""
    kw = KafkaWire(broker.port)
    try:
        for version in range(5):
            extra = {"producer_id": i64(-1), "producer_epoch": i16(-1)} if version >= 3 else {}
            resp = kw.call(
                22,
                version,
                transactional_id="tx-raw",
                transaction_timeout=datetime.timedelta(seconds=60),
                **extra,
            )
            assert resp.error_code == ErrorCode.transactional_id_authorization_failed, version
            assert (resp.producer_id, resp.producer_epoch) == (-1, -1)
        assert kw.init_producer_id()[0] >= 0
    finally:
        kw.close()
