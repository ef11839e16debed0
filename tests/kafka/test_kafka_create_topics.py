"""CreateTopics v5-7 (flexible; KIP-525's answer: the created topic's partition count,
replication factor and every config with its value, source, read-only and sensitive flags; v7 its
topic id) against a real `broker serve`, two cores, both backends: raw v5, v6 and v7 requests
checked field by field against DescribeConfigs and Metadata's topic ids, validate_only and a
refusal, and the admin clients as they are (confluent-kafka asks v4, aiokafka v3, kafka-python 3
the newest we advertise)."""

from __future__ import annotations

import asyncio
import datetime
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.core.topic_config_keys import KEYS
from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess
from labkit.kafka_requests import describe_configs, rpc

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic  # noqa: E402

CREATE_TOPICS = 19
METADATA = 3
CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]
ZERO_ID = None  # kio reads the zero UUID (Kafka's "no topic id") as None


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def cbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data",
        tmp / "broker.log",
        cores=request.param["cores"],
        backend=request.param["backend"],
        extra=("--retention-ms", "86400000"),  # a default a flag sets: STATIC_BROKER_CONFIG
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def create_raw(
    cbroker: BrokerProcess,
    version: int,
    name: str,
    partitions: int = 1,
    configs: dict[str, str] | None = None,
    validate_only: bool = False,
    replication: int = -1,
) -> Any:
    """A CreateTopics of one topic at `version`, asked of core 0: its one result."""
    schema = request_schema(CREATE_TOPICS, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    topic = make(
        module.CreatableTopic,
        name=name,
        num_partitions=partitions,
        replication_factor=replication,
        assignments=(),
        configs=tuple(make(module.CreatableTopicConfig, name=k, value=v) for k, v in (configs or {}).items()),
    )
    body = make(schema, topics=(topic,), timeout=datetime.timedelta(seconds=10), validate_only=validate_only)
    (result,) = rpc(cbroker.core_ports[0], CREATE_TOPICS, version, body).topics
    assert result.name == name
    return result


def metadata_topic_id(cbroker: BrokerProcess, name: str) -> uuid.UUID:
    schema = request_schema(METADATA, 12)
    assert schema is not None
    module = sys.modules[schema.__module__]
    body = make(
        schema,
        topics=(make(module.MetadataRequestTopic, topic_id=None, name=name),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (topic,) = rpc(cbroker.core_ports[1], METADATA, 12, body).topics
    assert topic.error_code == ErrorCode.none
    return topic.topic_id


def topic_names(cbroker: BrokerProcess) -> set[str]:
    return set(AdminClient({"bootstrap.servers": cbroker.bootstrap}).list_topics(timeout=10).topics)


# ------------------------------------------------------------------------------ raw requests


def test_v7_answers_counts_configs_and_the_topic_id_field_by_field(cbroker: BrokerProcess) -> None:
    overrides = {"retention.ms": "60000", "cleanup.policy": "compact, delete"}
    result = create_raw(cbroker, 7, "raw7", 3, overrides)
    assert (result.error_code, result.error_message, result.topic_config_error_code) == (
        ErrorCode.none,
        None,
        0,
    )
    assert (result.num_partitions, result.replication_factor) == (3, 1)
    assert result.topic_id == metadata_topic_id(cbroker, "raw7") is not None
    # every config, sorted by name, as DescribeConfigs describes it
    (described,) = describe_configs(cbroker.core_ports[1], [(2, "raw7")])
    assert [c.name for c in result.configs] == sorted(KEYS)
    expected = {
        c.name: (c.value, c.read_only, int(c.config_source), c.is_sensitive) for c in described.configs
    }
    got = {c.name: (c.value, c.read_only, int(c.config_source), c.is_sensitive) for c in result.configs}
    assert got == expected
    sources = {c.name: int(c.config_source) for c in result.configs}
    assert sources["retention.ms"] == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert {c.name: c.value for c in result.configs}["cleanup.policy"] == "compact,delete"
    assert sources["segment.bytes"] == ConfigSource.DEFAULT_CONFIG.value
    with_flag = create_raw(cbroker, 7, "raw7-defaults")
    flagged = {c.name: (c.value, int(c.config_source)) for c in with_flag.configs}
    assert flagged["retention.ms"] == ("86400000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert all(not c.read_only and not c.is_sensitive for c in result.configs)


@pytest.mark.parametrize("version", [5, 6])
def test_v5_and_v6_answer_configs_without_an_id(cbroker: BrokerProcess, version: int) -> None:
    name = f"raw{version}"
    result = create_raw(cbroker, version, name, 2, {"segment.ms": "3600000"})
    assert not hasattr(result, "topic_id")
    assert (result.error_code, result.num_partitions, result.replication_factor) == (ErrorCode.none, 2, 1)
    configs = {c.name: c for c in result.configs}
    assert set(configs) == set(KEYS)
    assert configs["segment.ms"].value == "3600000"
    assert configs["segment.ms"].config_source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert name in topic_names(cbroker)


def test_validate_only_answers_what_it_would_create_and_creates_nothing(cbroker: BrokerProcess) -> None:
    result = create_raw(cbroker, 7, "checked7", 4, {"max.message.bytes": "2048"}, validate_only=True)
    assert (result.error_code, result.num_partitions, result.replication_factor) == (ErrorCode.none, 4, 1)
    assert {c.name: c.value for c in result.configs}["max.message.bytes"] == "2048"
    assert result.topic_id == ZERO_ID, "no topic: no id"
    assert "checked7" not in topic_names(cbroker)


def test_a_refused_topic_answers_its_error_alone(cbroker: BrokerProcess) -> None:
    bad = create_raw(cbroker, 7, "bad7", 1, {"retention.ms": "a week"})
    assert bad.error_code == ErrorCode.invalid_config and "not a number" in (bad.error_message or "")
    assert (bad.num_partitions, bad.replication_factor, bad.configs, bad.topic_id) == (-1, -1, (), ZERO_ID)
    assert bad.topic_config_error_code == 0
    create_raw(cbroker, 7, "twice7")
    again = create_raw(cbroker, 7, "twice7")
    assert again.error_code == ErrorCode.topic_already_exists and again.configs == ()
    factor = create_raw(cbroker, 7, "copies7", replication=3)
    assert factor.error_code == ErrorCode.invalid_replication_factor and factor.num_partitions == -1
    assert not {"bad7", "copies7"} & topic_names(cbroker)


@pytest.mark.parametrize("version", [2, 7])
def test_a_name_given_twice_is_refused_once_and_the_others_made(cbroker: BrokerProcess, version: int) -> None:
    """Kafka's controller answers a name given twice with one INVALID_REQUEST and creates neither
    copy; the other topics of the request are made."""
    schema = request_schema(CREATE_TOPICS, version)
    assert schema is not None
    module = sys.modules[schema.__module__]

    def topic(name: str, partitions: int) -> Any:
        return make(
            module.CreatableTopic,
            name=name,
            num_partitions=partitions,
            replication_factor=-1,
            assignments=(),
            configs=(),
        )

    doubled, alone = f"doubled{version}", f"alone{version}"
    body = make(
        schema,
        topics=(topic(doubled, 1), topic(alone, 1), topic(doubled, 2)),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    results = rpc(cbroker.core_ports[0], CREATE_TOPICS, version, body).topics
    assert [(r.name, r.error_code) for r in results] == [
        (alone, ErrorCode.none),
        (doubled, ErrorCode.invalid_request),
    ]
    assert results[1].error_message == "Duplicate topic name."
    names = topic_names(cbroker)
    assert alone in names and doubled not in names


# ------------------------------------------------------------------------------ the clients


def test_confluent_kafka_creates_with_configs(cbroker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": cbroker.bootstrap})
    admin.create_topics([NewTopic("rdk", 2, 1, config={"retention.bytes": "1048576"})])["rdk"].result(15)
    resource = ConfigResource("topic", "rdk")
    got = admin.describe_configs([resource])[resource].result(15)
    assert got["retention.bytes"].value == "1048576"
    assert len(admin.list_topics(timeout=10).topics["rdk"].partitions) == 2


def test_kafka_python_reads_the_v7_answer(cbroker: BrokerProcess) -> None:
    client = kafka.KafkaAdminClient(bootstrap_servers=cbroker.bootstrap)
    try:
        result = client.create_topics({"kp7": {"num_partitions": 3, "configs": {"retention.ms": "120000"}}})
    finally:
        client.close()
    (topic,) = result["topics"]
    assert (topic["name"], topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (
        "kp7",
        0,
        3,
        1,
    )
    assert set(topic["configs"]) == set(KEYS)
    assert topic["configs"]["retention.ms"]["value"] == "120000"
    assert uuid.UUID(str(topic["topic_id"])) == metadata_topic_id(cbroker, "kp7")


def test_aiokafka_creates(cbroker: BrokerProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewTopic as AioTopic

    async def run() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=cbroker.bootstrap)
        await client.start()
        try:
            await client.create_topics([AioTopic("aio7", 2, 1, topic_configs={"cleanup.policy": "compact"})])
        finally:
            await client.close()

    asyncio.run(run())
    (described,) = describe_configs(cbroker.core_ports[0], [(2, "aio7")], ("cleanup.policy",))
    assert [c.value for c in described.configs] == ["compact"]
