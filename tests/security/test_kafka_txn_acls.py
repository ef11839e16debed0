"""ACLs on transactions, as Kafka checks them, with confluent-kafka's transactional producer over
SASL: without write on its transactional id a producer's init_transactions fails (FindCoordinator
needs describe on it, InitProducerId write: TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal); with
them (and write on the topic) it commits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess
from labkit.securitylab import broker_cli, create_topic, sasl_conf, scram_broker

confluent_kafka = pytest.importorskip("confluent_kafka")

PW = {"admin": "admin pw", "alice": "alice pw"}
TIMEOUT_S = 15


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    grants = [("User:alice", "write", "topic:orders"), ("User:alice", "describe", "topic:orders")]
    b = scram_broker(tmp_path, "uvloop", PW, grants)
    yield b
    b.stop()


def producer(b: BrokerProcess, txn_id: str) -> confluent_kafka.Producer:
    return confluent_kafka.Producer({**sasl_conf(b, "alice", PW["alice"]), "transactional.id": txn_id})


def test_a_transactional_id_needs_its_grants(broker: BrokerProcess) -> None:
    create_topic(sasl_conf(broker, "admin", PW["admin"]), "orders", 1)
    p = producer(broker, "tx-denied")
    with pytest.raises(confluent_kafka.KafkaException) as info:
        p.init_transactions(TIMEOUT_S)
    error = info.value.args[0]
    assert error.code() == confluent_kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "describe", "transactional_id:tx-ok")
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "write", "transactional_id:tx-ok")
    p = producer(broker, "tx-ok")
    p.init_transactions(TIMEOUT_S)
    p.begin_transaction()
    p.produce("orders", b"granted")
    p.commit_transaction(TIMEOUT_S)


def test_our_client_needs_the_same_grants(broker: BrokerProcess) -> None:
    """Our protocol checks what Kafka's does (broker/ringlog/access.py): write on the
    transactional id for init_transactions (refused: a fatal TransactionError), write on the
    topics the transaction adds (AddPartitionsToTxn refused: the transaction is abortable)."""
    from broker.client import Admin, Producer, Security, TransactionError
    from broker.client.errors import TopicAuthorizationError, TransactionalIdAuthorizationError

    def ours(user: str) -> Security:
        return Security(sasl_mechanism="SCRAM-SHA-512", username=user, password=PW[user])

    with Admin(broker.bootstrap, security=ours("admin")) as a:
        a.create_topic("orders", 1)
        a.create_topic("payroll", 1)
    with Producer(broker.bootstrap, security=ours("alice"), transactional_id="ours-denied") as p:
        with pytest.raises(TransactionError) as info:
            p.init_transactions()
        assert info.value.fatal and isinstance(info.value.__cause__, TransactionalIdAuthorizationError)
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "write", "transactional_id:ours-ok")
    broker_cli(broker.data_dir, "acls", "add", "User:alice", "describe", "topic:payroll")
    with Producer(broker.bootstrap, security=ours("alice"), transactional_id="ours-ok") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("orders", b"granted").result(TIMEOUT_S)
        p.commit_transaction()
        p.begin_transaction()
        refused = p.send("payroll", b"not granted")  # described, not written: AddPartitionsToTxn
        with pytest.raises(TransactionError):
            refused.result(TIMEOUT_S)
        with pytest.raises(TransactionError) as info:
            p.commit_transaction()
        assert info.value.abortable and isinstance(info.value.__cause__, TopicAuthorizationError)
        epoch = p.producer_epoch
        p.abort_transaction()  # then a new epoch from the coordinator (KIP-360), and on
        assert p.producer_epoch == epoch + 1
        p.begin_transaction()
        p.send("orders", b"after").result(TIMEOUT_S)
        p.commit_transaction()
