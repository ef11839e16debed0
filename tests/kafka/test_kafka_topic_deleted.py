"""A topic deleted while consumers read it, against a real `broker serve`: the DeleteTopics is
answered NONE, each fetch waiting on the topic's partitions (a long poll, on every core that owns
one) is answered at once with UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers a partition it no
longer has, and so is every later fetch of it; the broker logs no error. Before, closing the first
partition woke a waiting fetch that looked the topic up again, re-entering the loop that closed
the partitions: a `KeyError` in the broker's log and UNKNOWN_SERVER_ERROR for the DeleteTopics
(librdkafka's test suite met it). A librdkafka consumer reading the topic meanwhile sees no other
error."""

from __future__ import annotations

import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")
from test_kafka_errors import KafkaSocket, fetch_body  # noqa: E402  (tests/kafka)

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2cores"),
]
PARTITIONS = 4
LONG_POLL_MS = 10_000


@pytest.mark.parametrize("broker", CONFIGS, indirect=True)
def test_a_topic_deleted_under_its_readers(broker: BrokerProcess) -> None:
    topic_id = Wire(broker.port).create_topic("doomed", PARTITIONS)
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(PARTITIONS):
        p.produce("doomed", b"v", partition=i)
    assert p.flush(20) == 0

    # A librdkafka consumer reading the topic throughout.
    stop = threading.Event()
    consumer_errors: list[str] = []
    read = threading.Event()

    def consume() -> None:
        c = confluent_kafka.Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "readers", "enable.auto.commit": False}
        )
        try:
            c.assign([confluent_kafka.TopicPartition("doomed", i, 0) for i in range(PARTITIONS)])
            while not stop.is_set():
                msg = c.poll(0.1)
                if msg is None:
                    continue
                if msg.error() is None:
                    read.set()
                else:
                    consumer_errors.append(msg.error().name())
        finally:
            c.close()

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        assert read.wait(20), "the consumer read nothing"
        # A long poll at the end of every partition, on the core that owns it.
        owners: dict[int, list[int]] = {}
        for i in range(PARTITIONS):
            owners.setdefault(shard_for(topic_id, i, broker.cores), []).append(i)
        waiting = []
        for core, indexes in owners.items():
            conn = KafkaSocket(broker.core_ports.get(core, broker.port))
            body = fetch_body(11, [("doomed", i, 1) for i in indexes], max_wait=LONG_POLL_MS)
            waiting.append((conn, conn.send(1, 11, body), indexes))
        time.sleep(0.3)  # parked

        admin = ck_admin.AdminClient({"bootstrap.servers": broker.bootstrap})
        started = time.monotonic()
        assert admin.delete_topics(["doomed"], request_timeout=10)["doomed"].result(20) is None
        for conn, corr, indexes in waiting:
            try:
                resp = conn.recv(1, 11, corr)
                assert time.monotonic() - started < LONG_POLL_MS / 2000, "the long poll ran its course"
                [answered] = resp.responses
                assert {q.partition_index: q.error_code for q in answered.partitions} == dict.fromkeys(
                    indexes, ErrorCode.unknown_topic_or_partition
                )
                again = conn.rpc(1, 11, fetch_body(11, [("doomed", i, 0) for i in indexes], max_wait=0))
                codes = {q.error_code for q in again.responses[0].partitions}
                assert codes == {ErrorCode.unknown_topic_or_partition}
            finally:
                conn.close()
        time.sleep(1)  # the consumer's fetches meet the deletion too
    finally:
        stop.set()
        reader.join(30)
    assert set(consumer_errors) <= {"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION"}, consumer_errors
    log = broker.log()
    for bad in ("KeyError", "Traceback", "kafka request failed", "level=error"):
        assert bad not in log, broker.log_tail(40)
