"""Topic configs over Kafka's APIs against real clients and a real `broker serve` (two cores, both
backends): CreateTopics with configs, DescribeConfigs (every config with its value, source and
synonyms; a broker's settings), AlterConfigs and IncrementalAlterConfigs, from confluent-kafka
(librdkafka), kafka-python 3 and aiokafka; and the configs' live effect on both cores:
max.message.bytes refusing a batch, retention.ms deleting, LogAppendTime stamping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client import Admin
from broker.core.topic_config_keys import KEYS
from labkit.brokerproc import BrokerProcess, wait_for
from labkit.kafka_requests import describe_configs
from ringlog_proto.routing import shard_for

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")
from confluent_kafka import KafkaError, KafkaException  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

MiB = 1 << 20
RETENTION_FLAG_MS = 86_400_000  # the brokers' --retention-ms: described STATIC_BROKER_CONFIG
CONFIGURATIONS = [
    pytest.param({"cores": 2, "backend": "uvloop"}, id="uvloop-2core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2core"),
]


@pytest.fixture(scope="module", params=CONFIGURATIONS)
def cbroker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker per configuration for the module: small segments allowed (--min-segment-bytes)
    for the retention test, a retention flag for the described sources."""
    tmp = tmp_path_factory.mktemp(request.param["backend"])
    proc = BrokerProcess(
        tmp / "data",
        tmp / "broker.log",
        cores=request.param["cores"],
        backend=request.param["backend"],
        extra=("--retention-ms", str(RETENTION_FLAG_MS), "--min-segment-bytes", "1024"),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


@pytest.fixture(scope="module")
def admin(cbroker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": cbroker.bootstrap})


def create(admin: AdminClient, name: str, partitions: int = 1, **configs: str) -> None:
    admin.create_topics([NewTopic(name, partitions, 1, config=configs)])[name].result(15)


def described(admin: AdminClient, name: str) -> dict[str, Any]:
    resource = ConfigResource("topic", name)
    return admin.describe_configs([resource])[resource].result(15)


def refused(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(15)
    return info.value.args[0]


# ------------------------------------------------------------------------------ the APIs


def test_create_topics_honours_and_checks_configs(admin: AdminClient) -> None:
    create(admin, "made", 2, **{"retention.ms": "60000", "cleanup.policy": "compact, delete"})
    got = described(admin, "made")
    assert (got["retention.ms"].value, got["retention.ms"].source) == (
        "60000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert got["cleanup.policy"].value == "compact,delete"
    for configs, reason in (
        ({"retention.msec": "1"}, "unknown topic config name: retention.msec"),
        ({"retention.ms": "a week"}, "not a number"),
        ({"segment.bytes": "10"}, "--min-segment-bytes"),
        ({"message.timestamp.type": "WallClock"}, "CreateTime, LogAppendTime"),
    ):
        err = refused(admin.create_topics([NewTopic("bad", 1, 1, config=configs)])["bad"])
        assert err.code() == KafkaError.INVALID_CONFIG and reason in err.str(), err
    assert "bad" not in admin.list_topics(timeout=10).topics
    # validate_only checks everything and creates nothing
    admin.create_topics([NewTopic("checked", 1, 1, config={"retention.ms": "5"})], validate_only=True)[
        "checked"
    ].result(15)
    err = refused(
        admin.create_topics([NewTopic("checked", 1, 1, config={"x": "5"})], validate_only=True)["checked"]
    )
    assert err.code() == KafkaError.INVALID_CONFIG
    err = refused(admin.create_topics([NewTopic("made", 1, 1)], validate_only=True)["made"])
    assert err.code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert "checked" not in admin.list_topics(timeout=10).topics


def test_describe_configs_answers_every_config_with_its_source(admin: AdminClient) -> None:
    create(admin, "described", 1, **{"segment.bytes": str(MiB)})
    got = described(admin, "described")
    assert set(got) == set(KEYS), "every config, set or not (Quix Streams reads retention.ms)"
    assert all(not e.is_read_only and not e.is_sensitive for e in got.values())
    seg, ret, policy = got["segment.bytes"], got["retention.ms"], got["cleanup.policy"]
    assert (seg.value, seg.source) == (str(MiB), ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (ret.value, ret.source) == (str(RETENTION_FLAG_MS), ConfigSource.STATIC_BROKER_CONFIG.value)
    assert (policy.value, policy.source, policy.is_default) == (
        "delete",
        ConfigSource.DEFAULT_CONFIG.value,
        True,
    )
    # synonyms: the override, then the broker config the default comes from (librdkafka asks)
    assert [(s.name, s.value) for s in seg.synonyms.values()] == [
        ("segment.bytes", str(MiB)),
        ("log.segment.bytes", str(128 * MiB)),
    ]
    assert list(ret.synonyms) == ["log.retention.ms"]
    unknown = ConfigResource("topic", "no-such-topic")
    err = refused(admin.describe_configs([unknown])[unknown])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_describe_configs_of_each_core_as_a_broker(cbroker: BrokerProcess, admin: AdminClient) -> None:
    for core in range(cbroker.cores):
        resource = ConfigResource("broker", str(core))
        got = admin.describe_configs([resource])[resource].result(15)
        assert got["broker.id"].value == str(core)
        assert (got["log.retention.ms"].value, got["log.retention.ms"].source) == (
            str(RETENTION_FLAG_MS),
            ConfigSource.STATIC_BROKER_CONFIG.value,
        )
        assert got["log.segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
        assert got["message.max.bytes"].value == str(MiB)
        assert all(e.is_read_only for e in got.values()), "they are `broker serve` flags"
    # a broker resource is answered by the broker it names; another id is refused as Kafka does
    raw = describe_configs(cbroker.core_ports[0], [(4, "7")])
    assert [(r.error_code, r.error_message and "Unexpected broker id" in r.error_message) for r in raw] == [
        (KafkaError.INVALID_REQUEST, True)
    ]
    assert describe_configs(cbroker.core_ports[0], [(4, "")])[0].configs == ()  # no dynamic defaults


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_alter_configs_replaces_and_incremental_changes(admin: AdminClient) -> None:
    create(admin, "altered", 1, **{"retention.ms": "60000", "max.message.bytes": "5000"})
    resource = ConfigResource("topic", "altered", set_config={"segment.ms": "3600000"})
    admin.alter_configs([resource])[resource].result(15)
    got = described(admin, "altered")
    assert got["segment.ms"].value == "3600000"
    assert got["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value, (
        "left out: back to the default"
    )
    assert got["max.message.bytes"].value == str(MiB)

    def incremental(*entries: ConfigEntry, validate_only: bool = False) -> Any:
        r = ConfigResource("topic", "altered", incremental_configs=list(entries))
        return admin.incremental_alter_configs([r], validate_only=validate_only)[r]

    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    APPEND, SUBTRACT = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT
    incremental(
        ConfigEntry("retention.bytes", "1000000", incremental_operation=SET),
        ConfigEntry("segment.ms", None, incremental_operation=DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=APPEND),
    ).result(15)
    got = described(admin, "altered")
    assert got["retention.bytes"].value == "1000000"
    assert got["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert got["cleanup.policy"].value == "delete,compact"
    incremental(ConfigEntry("cleanup.policy", "delete", incremental_operation=SUBTRACT)).result(15)
    assert described(admin, "altered")["cleanup.policy"].value == "compact"
    # refused ones change nothing
    err = refused(incremental(ConfigEntry("retention.ms", "-5", incremental_operation=SET)))
    assert err.code() == KafkaError.INVALID_CONFIG and "at least -1" in err.str()
    err = refused(incremental(ConfigEntry("retention.ms", "5", incremental_operation=APPEND)))
    assert err.code() == KafkaError.INVALID_REQUEST
    err = refused(incremental(ConfigEntry("no.such.config", "5", incremental_operation=SET)))
    assert err.code() == KafkaError.INVALID_CONFIG
    incremental(ConfigEntry("retention.ms", "1234", incremental_operation=SET), validate_only=True).result(15)
    got = described(admin, "altered")
    assert (got["retention.ms"].source, got["cleanup.policy"].value) == (
        ConfigSource.STATIC_BROKER_CONFIG.value,
        "compact",
    )
    gone = ConfigResource("topic", "never-made", set_config={"retention.ms": "1"})
    assert refused(admin.alter_configs([gone])[gone]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    broker = ConfigResource("broker", "0", set_config={"log.retention.ms": "1"})
    err = refused(admin.alter_configs([broker])[broker])
    assert err.code() == KafkaError.INVALID_REQUEST and "read-only" in err.str()


def test_kafka_python_admin(cbroker: BrokerProcess) -> None:
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType
    from kafka.admin import NewTopic as KpTopic

    client = kafka.KafkaAdminClient(bootstrap_servers=cbroker.bootstrap)
    try:
        client.create_topics([KpTopic("kp", 1, 1, topic_configs={"retention.ms": "120000"})])
        got = client.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp")], config_filter="all")
        configs = got["topic"]["kp"]
        assert set(configs) == set(KEYS)
        assert configs["retention.ms"]["value"] == "120000"
        modified = client.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp")])["topic"]["kp"]
        assert set(modified) == {"retention.ms"}, "kafka-python's default filter: what the topic sets"
        result = client.alter_configs(
            [KpResource(ConfigResourceType.TOPIC, "kp", configs={"segment.ms": "7200000"})]
        )
        assert result["topic"]["kp"] == "OK"
        configs = client.describe_configs([KpResource(ConfigResourceType.TOPIC, "kp")])["topic"]["kp"]
        assert {k: v["value"] for k, v in configs.items()} == {
            "retention.ms": "120000",
            "segment.ms": "7200000",
        }
    finally:
        client.close()


def test_aiokafka_describe_and_alter(cbroker: BrokerProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource as AioResource
    from aiokafka.admin.config_resource import ConfigResourceType

    async def run() -> tuple[dict[str, str], dict[str, str]]:
        client = AIOKafkaAdminClient(bootstrap_servers=cbroker.bootstrap)
        await client.start()
        try:
            await client.create_topics([NewTopic("aio", 1, 1, topic_configs={"cleanup.policy": "compact"})])
            before = await client.describe_configs([AioResource(ConfigResourceType.TOPIC, "aio")])
            await client.alter_configs(
                [AioResource(ConfigResourceType.TOPIC, "aio", {"retention.ms": "1000"})]
            )
            after = await client.describe_configs([AioResource(ConfigResourceType.TOPIC, "aio")])
        finally:
            await client.close()

        def values(responses: list[Any]) -> dict[str, str]:
            ((error, _message, _rtype, _name, configs),) = responses[0].resources
            assert error == 0
            return {c[0]: c[1] for c in configs}

        return values(before), values(after)

    before, after = asyncio.run(run())
    assert set(before) == set(KEYS) and before["cleanup.policy"] == "compact"
    assert after["retention.ms"] == "1000" and after["cleanup.policy"] == "delete", "AlterConfigs replaces"


# ------------------------------------------------------------------------------ live effect


def partitions_by_core(topic_id: int, partitions: int, cores: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in range(partitions):
        out.setdefault(shard_for(topic_id, p, cores), []).append(p)
    return out


def produce_sizes(cbroker: BrokerProcess, topic: str, partitions: list[int], size: int) -> list[Any]:
    """One record of `size` bytes to each partition, unbatched; each delivery's error (None: stored)."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cbroker.bootstrap, "linger.ms": 0, "retries": 0, "enable.idempotence": False}
    )
    errors: dict[int, Any] = {}
    for p in partitions:
        producer.produce(
            topic,
            b"x" * size,
            partition=p,
            on_delivery=lambda err, msg: errors.__setitem__(msg.partition(), err),
        )
    assert producer.flush(30) == 0
    return [errors[p] for p in partitions]


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_an_alter_reaches_both_cores_live(cbroker: BrokerProcess, admin: AdminClient) -> None:
    """max.message.bytes altered through one core refuses a larger batch on every partition, both
    cores' (each reloads the registry within about a second), and each core describes it."""
    create(admin, "live", 8)
    with Admin(cbroker.bootstrap) as ours:  # the topic's id: where each partition lives
        topic_id = ours.describe_topic("live").topic_id
    owners = partitions_by_core(topic_id, 8, cbroker.cores)
    assert set(owners) == set(range(cbroker.cores)), owners
    every = [p for ps in owners.values() for p in ps]
    assert produce_sizes(cbroker, "live", every, 10_000) == [None] * len(every)
    resource = ConfigResource("topic", "live", set_config={"max.message.bytes": "4096"})
    admin.alter_configs([resource])[resource].result(15)
    keys = ("max.message.bytes",)
    for port in cbroker.core_ports.values():
        wait_for(
            lambda p=port: describe_configs(p, [(2, "live")], keys)[0].configs[0].value == "4096", timeout=5
        )

    def refused_everywhere() -> bool:
        errors = produce_sizes(cbroker, "live", every, 10_000)
        return all(e is not None and e.code() == KafkaError.MSG_SIZE_TOO_LARGE for e in errors)

    wait_for(refused_everywhere, timeout=10, step=0.5)
    assert produce_sizes(cbroker, "live", every, 1000) == [None] * len(every), "smaller batches still go in"


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")
def test_retention_altered_live_deletes(cbroker: BrokerProcess, admin: AdminClient) -> None:
    create(admin, "aging", 1, **{"segment.bytes": "4096"})
    producer = confluent_kafka.Producer({"bootstrap.servers": cbroker.bootstrap, "linger.ms": 0})
    for _ in range(41):  # about ten segments of 4 KiB, a batch each
        producer.produce("aging", b"y" * 1000, partition=0)
        assert producer.flush(10) == 0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cbroker.bootstrap, "group.id": "aging"})
    try:
        low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition("aging", 0), timeout=10)
        assert (low, high) == (0, 41)
        resource = ConfigResource("topic", "aging", set_config={"segment.bytes": "4096", "retention.ms": "1"})
        admin.alter_configs([resource])[resource].result(15)
        deadline = time.monotonic() + 10  # well inside the 30 s retention pass: it runs on the change

        def start() -> int:
            return consumer.get_watermark_offsets(confluent_kafka.TopicPartition("aging", 0), timeout=10)[0]

        while start() == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        low = start()
        assert 0 < low <= 40, "closed segments deleted, the active one kept"
    finally:
        consumer.close()


def test_log_append_time_stamps_batches(cbroker: BrokerProcess, admin: AdminClient) -> None:
    create(admin, "stamped", 1, **{"message.timestamp.type": "LogAppendTime"})
    old = 1_000_000_000_000  # 2001: the producer's timestamp, replaced
    delivered: list[Any] = []
    producer = confluent_kafka.Producer({"bootstrap.servers": cbroker.bootstrap})
    before = int(time.time() * 1000)
    producer.produce(
        "stamped", b"v", timestamp=old, on_delivery=lambda err, msg: delivered.append((err, msg))
    )
    assert producer.flush(15) == 0
    after = int(time.time() * 1000)
    ((err, msg),) = delivered
    assert err is None
    kind, ts = msg.timestamp()
    assert kind == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME and before <= ts <= after, (kind, ts)
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": cbroker.bootstrap, "group.id": "stamped", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition("stamped", 0, 0)])
        got = None
        deadline = time.monotonic() + 15
        while got is None and time.monotonic() < deadline:
            got = consumer.poll(1)
        assert got is not None and got.error() is None
        assert got.timestamp() == (confluent_kafka.TIMESTAMP_LOG_APPEND_TIME, ts)
    finally:
        consumer.close()
