"""DescribeCluster (api 60), DescribeLogDirs (api 35) and DescribeProducers (api 61) against a real
`broker serve`, with the clients' own admin calls (kafka-python 3 `describe_cluster`,
`describe_log_dirs`, `describe_producers`; aiokafka and confluent-kafka `describe_cluster`) and
raw kio requests for what the clients do not ask: every core a broker as in Metadata, one log dir
per core's broker listing the partitions that core owns with their sizes, the idempotent
producers of a partition on its owning core (NOT_LEADER_OR_FOLLOWER on another)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402

kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from test_kafka_errors import KafkaSocket  # noqa: E402  (tests/kafka)

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]
PARTITIONS = 4


@pytest.fixture(params=CONFIGS)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerProcess]:
    options = request.param
    proc = BrokerProcess(
        tmp_path / "data", tmp_path / "broker.log", cores=options["cores"], backend=options["backend"]
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, proc.log()


def core_port(server: BrokerProcess, core: int) -> int:
    return server.core_ports.get(core, server.port)


def test_describe_cluster_lists_every_core_as_metadata_does(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient

    brokers = {(i, "127.0.0.1", core_port(server, i)) for i in range(server.cores)}
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        described = kp.describe_cluster()
    finally:
        kp.close()
    assert {(b["broker_id"], b["host"], b["port"]) for b in described["brokers"]} == brokers
    assert described["controller_id"] == 0
    assert {"ALTER", "CREATE", "DESCRIBE"} <= set(described["authorized_operations"])

    async def aio() -> dict:
        from aiokafka.admin import AIOKafkaAdminClient

        client = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap)
        await client.start()
        try:
            return await client.describe_cluster()
        finally:
            await client.close()

    got = asyncio.run(aio())
    assert {(b["node_id"], b["host"], b["port"]) for b in got["brokers"]} == brokers
    assert got["cluster_id"] == described["cluster_id"]
    admin = AdminClient({"bootstrap.servers": server.bootstrap})  # held: a dropped one ends its calls
    confluent = admin.describe_cluster().result(15)
    assert confluent.cluster_id == described["cluster_id"]
    assert {(n.id, n.port) for n in confluent.nodes} == {(i, p) for i, _, p in brokers}
    # only brokers here: asking for controllers is MISMATCHED_ENDPOINT_TYPE (v0: INVALID_REQUEST)
    conn = KafkaSocket(server.port)
    try:
        for version, endpoint, code in (
            (1, 2, ErrorCode.mismatched_endpoint_type),
            (2, 7, ErrorCode.unsupported_endpoint_type),
            (1, 1, ErrorCode.none),
        ):
            schema = request_schema(60, version)
            assert schema is not None
            body = make(
                schema,
                include_cluster_authorized_operations=False,
                endpoint_type=endpoint,
                include_fenced_brokers=False,
            )
            resp = conn.rpc(60, version, body)
            assert resp.error_code == code
            assert (len(resp.brokers) == server.cores) == (code == ErrorCode.none)
    finally:
        conn.close()


def produce(server: BrokerProcess, topic: str) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": server.bootstrap, "enable.idempotence": True, "linger.ms": 0}
    )
    for i in range(PARTITIONS):
        for _ in range(i + 1):
            producer.produce(topic, value=b"v" * 100, partition=i)
    assert producer.flush(20) == 0


def test_describe_log_dirs_lists_each_cores_partitions(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient

    topic_id = Wire(server.port).create_topic("dirs", PARTITIONS)
    Wire(server.port).create_topic("idle", 1)
    produce(server, "dirs")
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        described = kp.describe_log_dirs()
        some = kp.describe_log_dirs(topic_partitions={"dirs": [0, 1]})
    finally:
        kp.close()
    data_dir = os.path.realpath(server.data_dir)
    seen: dict[int, int] = {}
    for broker in described:
        [log_dir] = broker["log_dirs"]
        assert log_dir["log_dir"] == data_dir and log_dir["error_code"] == 0
        assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
        for t in log_dir["topics"]:
            if t["name"] != "dirs":
                continue
            for p in t["partitions"]:
                assert shard_for(topic_id, p["partition_index"], server.cores) == broker["broker"]
                assert p["offset_lag"] == 0
                seen[p["partition_index"]] = p["partition_size"]
    assert sorted(seen) == list(range(PARTITIONS))
    assert seen[0] < seen[1] < seen[2] < seen[3]  # i + 1 records in partition i
    asked = {
        p["partition_index"]
        for broker in some
        for t in broker["log_dirs"][0]["topics"]
        for p in t["partitions"]
        if t["name"] == "dirs"
    }
    assert asked == {0, 1}


def test_describe_producers_on_the_owning_core(server: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    topic_id = Wire(server.port).create_topic("prods", PARTITIONS)
    produce(server, "prods")
    kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=15_000)
    try:
        got = kp.describe_producers([TopicPartition("prods", i) for i in range(PARTITIONS)])
    finally:
        kp.close()
    pids = set()
    for tp, state in got.items():
        [producer] = state.active_producers
        assert (producer.producer_epoch, producer.last_sequence) == (0, tp.partition)
        assert producer.last_timestamp > 0 and producer.coordinator_epoch == -1
        pids.add(producer.producer_id)
    assert len(pids) == 1  # one idempotent producer wrote them all
    # a raw request to each core: its own partitions answered, the others NOT_LEADER_OR_FOLLOWER
    schema = request_schema(61, 0)
    assert schema is not None
    module = __import__(schema.__module__, fromlist=["TopicRequest"])
    body = make(
        schema,
        topics=(
            make(module.TopicRequest, name="prods", partition_indexes=tuple(range(PARTITIONS))),
            make(module.TopicRequest, name="nope", partition_indexes=(0,)),
        ),
    )
    for core in range(server.cores):
        conn = KafkaSocket(core_port(server, core))
        try:
            resp = conn.rpc(61, 0, body)
        finally:
            conn.close()
        [prods, nope] = resp.topics
        for p in prods.partitions:
            mine = shard_for(topic_id, p.partition_index, server.cores) == core
            assert p.error_code == (ErrorCode.none if mine else ErrorCode.not_leader_or_follower)
            assert len(p.active_producers) == (1 if mine else 0)
        assert [p.error_code for p in nope.partitions] == [ErrorCode.unknown_topic_or_partition]
