"""The topic config model (broker/core/topic_configs.py) and the registry that keeps a topic's
overrides (broker/core/topics.py): Kafka's names, types and ranges; values stored as Kafka renders
them; the broker's defaults behind every config a topic does not set; what the effective values
mean for the log; how a topic is described; registries and cluster records written before topics
had configs."""

from __future__ import annotations

import json

import pytest

from broker.cluster.records import TopicRecord
from broker.core.errors import error_of
from broker.core.limits import Limits
from broker.core.topic_config_keys import KEYS, LONG_MAX, ConfigError, ConfigType, Effect
from broker.core.topic_configs import (
    ConfigSource,
    TopicDefaults,
    check_topic,
    describe_topic,
    parse_overrides,
    settings,
)
from broker.core.topics import Topic, TopicError, TopicFault, TopicRegistry
from broker.storage.log_config import LogConfig
from ringlog_proto.messages import ErrorCode

MiB = 1 << 20


def test_every_config_kafka_lists_for_a_topic_is_known() -> None:
    kafka_4 = {
        "cleanup.policy", "compression.gzip.level", "compression.lz4.level", "compression.type",
        "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages",
        "flush.ms", "follower.replication.throttled.replicas", "index.interval.bytes",
        "leader.replication.throttled.replicas", "local.retention.bytes", "local.retention.ms",
        "max.compaction.lag.ms", "max.message.bytes", "message.timestamp.after.max.ms",
        "message.timestamp.before.max.ms", "message.timestamp.type", "min.cleanable.dirty.ratio",
        "min.compaction.lag.ms", "min.insync.replicas", "preallocate", "remote.log.copy.disable",
        "remote.log.delete.on.disable", "remote.storage.enable", "retention.bytes", "retention.ms",
        "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
        "unclean.leader.election.enable",
    }  # fmt: skip
    assert set(KEYS) == kafka_4
    for key in KEYS.values():
        key.parse(key.default)  # every built-in default is a valid value of its own config
        assert key.doc
    applied = {k for k, v in KEYS.items() if v.effect is Effect.APPLIED}
    assert {"retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "max.message.bytes"} <= applied
    assert {"message.timestamp.type", "min.insync.replicas", "unclean.leader.election.enable"} <= applied
    cleaner = {k for k, v in KEYS.items() if v.effect is Effect.CLEANER}
    assert cleaner == {
        "cleanup.policy",
        "delete.retention.ms",
        "min.compaction.lag.ms",
        "max.compaction.lag.ms",
        "min.cleanable.dirty.ratio",
    }


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ({"retention.ms": " 1000 "}, {"retention.ms": "1000"}),
        ({"retention.ms": "+5"}, {"retention.ms": "5"}),
        ({"cleanup.policy": "compact, delete"}, {"cleanup.policy": "compact,delete"}),
        ({"unclean.leader.election.enable": "TRUE"}, {"unclean.leader.election.enable": "true"}),
        ({"min.cleanable.dirty.ratio": "0.25"}, {"min.cleanable.dirty.ratio": "0.25"}),
        ({"min.cleanable.dirty.ratio": "1"}, {"min.cleanable.dirty.ratio": "1.0"}),
        ({"retention.bytes": "-7"}, {"retention.bytes": "-7"}),  # any negative: no limit, as Kafka
        (
            {"leader.replication.throttled.replicas": "0:1,1:2"},
            {"leader.replication.throttled.replicas": "0:1,1:2"},
        ),
        ({"compression.gzip.level": "-1"}, {"compression.gzip.level": "-1"}),
    ],
)
def test_values_are_stored_as_kafka_renders_them(given: dict, stored: dict) -> None:
    assert parse_overrides(given) == stored


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"retention.msec": "1"}, "unknown topic config name: retention.msec"),
        ({"retention.ms": None}, "null value"),
        ({"retention.ms": "1h"}, "not a number of type LONG"),
        ({"retention.ms": "1_000"}, "not a number of type LONG"),
        ({"retention.ms": "-2"}, "at least -1"),
        ({"segment.bytes": str(1 << 31)}, "not a number of type INT"),
        ({"segment.ms": "0"}, "at least 1"),
        ({"min.insync.replicas": "0"}, "at least 1"),
        ({"max.message.bytes": "-1"}, "at least 0"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "no more than 1"),
        ({"min.cleanable.dirty.ratio": "nan"}, "DOUBLE"),
        ({"cleanup.policy": "compact,forever"}, "one of: compact, delete"),
        ({"cleanup.policy": ""}, "at least one policy"),
        ({"message.timestamp.type": "logappendtime"}, "one of: CreateTime, LogAppendTime"),
        ({"compression.type": "brotli"}, "one of"),
        ({"compression.gzip.level": "0"}, "-1"),
        ({"compression.lz4.level": "18"}, "no more than 17"),
        ({"preallocate": "yes"}, "true or false"),
        ({"remote.storage.enable": "true"}, "no tiered storage"),
        ({"follower.replication.throttled.replicas": "all"}, "partition:broker"),
    ],
)
def test_bad_names_and_values_are_refused_with_the_reason(given: dict, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason.replace(".", r"\.")):
        parse_overrides(given)


def test_effective_settings_come_from_the_override_else_the_broker() -> None:
    broker = TopicDefaults(LogConfig(retention_ms=None, segment_bytes=64 * MiB), min_insync_replicas=2)
    s = settings({}, broker)
    assert (s.retention_ms, s.retention_bytes, s.segment_bytes, s.segment_ms) == (None, None, 64 * MiB, None)
    assert (s.max_message_bytes, s.log_append_time, s.min_insync_replicas) == (MiB, False, 2)
    assert (s.cleanup_policy, s.delete_retention_ms, s.min_cleanable_dirty_ratio) == (
        ("delete",),
        86_400_000,
        0.5,
    )
    s = settings(
        {
            "retention.ms": "60000",
            "retention.bytes": "-1",
            "segment.ms": "3600000",
            "message.timestamp.type": "LogAppendTime",
            "min.insync.replicas": "3",
            "max.message.bytes": str(2 * MiB),
            "segment.bytes": str(MiB),
        },
        broker,
    )
    assert (s.retention_ms, s.retention_bytes, s.segment_ms, s.log_append_time) == (
        60_000,
        None,
        3_600_000,
        True,
    )
    assert s.min_insync_replicas == 3
    config = s.log_config(broker.log)
    assert config.max_batch_bytes == MiB, "a batch is held to its segment"
    assert (config.segment_bytes, config.retention_ms, config.log_append_time) == (MiB, 60_000, True)
    assert config.invalid() is None
    assert settings({"segment.ms": str(LONG_MAX)}, broker).segment_ms is None


def test_without_the_delete_policy_retention_deletes_nothing() -> None:
    broker = TopicDefaults()
    compact = settings({"cleanup.policy": "compact", "retention.ms": "1000"}, broker)
    assert compact.compact and not compact.delete
    config = compact.log_config(broker.log)
    assert (config.retention_ms, config.retention_bytes) == (None, None)
    both = settings({"cleanup.policy": "compact,delete", "retention.ms": "1000"}, broker)
    assert both.compact and both.delete and both.log_config(broker.log).retention_ms == 1000


@pytest.mark.parametrize(
    ("overrides", "codec", "level"),
    [
        ({}, None, None),
        ({"compression.type": "producer", "compression.zstd.level": "9"}, None, None),
        ({"compression.type": "uncompressed"}, 0, None),
        ({"compression.type": "gzip"}, 1, -1),
        ({"compression.type": "gzip", "compression.gzip.level": "9"}, 1, 9),
        ({"compression.type": "snappy"}, 2, None),
        ({"compression.type": "lz4", "compression.lz4.level": "12"}, 3, 12),
        ({"compression.type": "zstd"}, 4, 3),
        ({"compression.type": "zstd", "compression.zstd.level": "-5", "compression.gzip.level": "1"}, 4, -5),
    ],
)
def test_compression_type_names_the_logs_codec_and_its_level(overrides: dict, codec: int, level: int) -> None:
    """compression.type producer leaves each batch's codec as sent (None); any other is the codec
    every batch is stored in (ringlog_proto.batch's numbers), at that codec's level."""
    broker = TopicDefaults()
    config = settings(parse_overrides(overrides), broker).log_config(broker.log)
    assert (config.compression, config.compression_level) == (codec, level)
    assert config.invalid() is None
    assert KEYS["compression.type"].effect is Effect.APPLIED


def test_configs_that_do_not_hold_together_or_break_a_floor_are_refused() -> None:
    broker, limits = TopicDefaults(), Limits()
    with pytest.raises(
        ConfigError, match=r"min\.compaction\.lag\.ms \(10\) > max\.compaction\.lag\.ms \(5\)"
    ):
        check_topic({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}, broker, limits)
    with pytest.raises(ConfigError, match="--min-segment-bytes"):
        check_topic({"segment.bytes": "4096"}, broker, limits)
    with pytest.raises(ConfigError, match="--min-segment-ms"):
        check_topic({"segment.ms": "1000"}, broker, limits)
    check_topic({"segment.bytes": str(MiB), "segment.ms": str(limits.min_segment_ms)}, broker, limits)


def test_a_topic_is_described_with_every_config_its_source_and_synonyms() -> None:
    broker = TopicDefaults(LogConfig(retention_ms=3_600_000), static=frozenset({"retention.ms"}))
    entries = {e.name: e for e in describe_topic({"segment.bytes": str(MiB)}, broker)}
    assert set(entries) == set(KEYS)
    seg = entries["segment.bytes"]
    assert (seg.value, seg.source, seg.read_only, seg.sensitive, seg.type) == (
        str(MiB),
        ConfigSource.TOPIC,
        False,
        False,
        ConfigType.INT,
    )
    assert [(s.name, s.value, s.source) for s in seg.synonyms] == [
        ("segment.bytes", str(MiB), ConfigSource.TOPIC),
        ("log.segment.bytes", str(128 * MiB), ConfigSource.DEFAULT),
    ]
    retention = entries["retention.ms"]
    assert (retention.value, retention.source) == ("3600000", ConfigSource.STATIC_BROKER)
    assert [(s.name, s.source) for s in retention.synonyms] == [
        ("log.retention.ms", ConfigSource.STATIC_BROKER)
    ]
    assert (
        entries["cleanup.policy"].value == "delete"
        and entries["cleanup.policy"].source is ConfigSource.DEFAULT
    )
    assert entries["remote.storage.enable"].synonyms == ()  # no broker config stands behind it
    assert [e.name for e in describe_topic({}, broker, ["retention.ms", "no.such", "cleanup.policy"])] == [
        "cleanup.policy",
        "retention.ms",
    ]


def test_the_registry_keeps_checked_overrides_and_reloads_them(tmp_path) -> None:
    registry = TopicRegistry(str(tmp_path), LogConfig())
    topic = registry.create("t", 2, {"retention.ms": " 5000", "cleanup.policy": "compact"})
    assert topic.configs == {"retention.ms": "5000", "cleanup.policy": "compact"}
    again = TopicRegistry(str(tmp_path), LogConfig())
    assert again.get("t") == topic
    assert json.loads((tmp_path / "topics.json").read_text())["topics"][0]["configs"] == {
        "cleanup.policy": "compact",
        "retention.ms": "5000",
    }
    with pytest.raises(TopicError) as info:
        registry.create("u", 1, {"retention.ms": "soon"})
    assert info.value.kind is TopicFault.CONFIG and error_of(info.value)[0] == ErrorCode.INVALID_CONFIG
    assert "u" not in registry.by_name
    with registry.locked():
        registry.replace_topic(registry.altered("t", {"segment.bytes": str(MiB)}))
    assert TopicRegistry(str(tmp_path), LogConfig()).get("t").configs == {"segment.bytes": str(MiB)}
    assert registry.log_config(registry.get("t")).segment_bytes == MiB
    with pytest.raises(TopicError) as info:
        registry.altered("nope", {})
    assert info.value.kind is TopicFault.UNKNOWN


LEGACY = {
    "name": "old",
    "topic_id": 3,
    "partitions": 2,
    "retention_ms": None,  # created "keep forever"
    "retention_bytes": None,
    "segment_bytes": 4 * MiB,
    "max_batch_bytes": MiB,
    "segment_ms": None,
}


def test_a_registry_written_before_configs_still_loads(tmp_path) -> None:
    doc = {"version": 1, "next_topic_id": 4, "topics": [LEGACY, {**LEGACY, "name": "plain", "topic_id": 2,
           "retention_ms": 7 * 86_400_000, "segment_bytes": 128 * MiB}]}  # fmt: skip
    (tmp_path / "topics.json").write_text(json.dumps(doc))
    registry = TopicRegistry(str(tmp_path), LogConfig(retention_ms=1000))
    old = registry.get("old")
    assert (old.topic_id, old.partitions) == (3, 2)
    assert old.configs == {"retention.ms": "-1", "segment.bytes": str(4 * MiB)}, "what it was made with"
    config = registry.log_config(old)
    assert (config.retention_ms, config.segment_bytes, config.max_batch_bytes) == (None, 4 * MiB, MiB)
    plain = registry.get("plain")
    assert plain.configs == {}, "built-in values follow the broker's defaults"
    assert registry.log_config(plain).retention_ms == 1000
    assert registry.next_topic_id == 4
    registry.create("new", 1)  # written back in the current version
    assert json.loads((tmp_path / "topics.json").read_text())["version"] == 2


def test_a_cluster_record_written_before_configs_still_decodes() -> None:
    record = TopicRecord.decode(json.dumps({**LEGACY, "replication": 3}))
    assert record.replication == 3
    assert record.topic == Topic("old", 3, 2, {"retention.ms": "-1", "segment.bytes": str(4 * MiB)})
    assert TopicRecord.decode(record.encode()) == record


def test_incremental_changes_apply_to_the_overrides_as_stored() -> None:
    from broker.core.topic_configs import ConfigChange, ConfigChangeError, ConfigOp, changing, replacing

    broker = TopicDefaults()
    current = {"retention.ms": "1000", "segment.ms": "3600000"}
    alter = changing(
        [
            ConfigChange("retention.ms", ConfigOp.DELETE),
            ConfigChange("max.message.bytes", ConfigOp.SET, "2048"),
            ConfigChange("cleanup.policy", ConfigOp.APPEND, "compact, delete"),  # delete: there already
        ]
    )
    assert alter(current, broker) == {
        "segment.ms": "3600000",
        "max.message.bytes": "2048",
        "cleanup.policy": "delete,compact",
    }
    assert current == {"retention.ms": "1000", "segment.ms": "3600000"}, "not changed in place"
    subtract = changing([ConfigChange("cleanup.policy", ConfigOp.SUBTRACT, "delete")])
    assert subtract({"cleanup.policy": "compact,delete"}, broker) == {"cleanup.policy": "compact"}
    assert subtract({}, broker) == {"cleanup.policy": ""}, "the default is what it subtracts from"
    with pytest.raises(ConfigChangeError, match=r"duplicate config keys: retention\.ms"):
        changing(
            [ConfigChange("retention.ms", ConfigOp.SET, "1"), ConfigChange("retention.ms", ConfigOp.DELETE)]
        )
    with pytest.raises(ConfigChangeError, match=r"append is not allowed for config key: retention\.ms"):
        changing([ConfigChange("retention.ms", ConfigOp.APPEND, "1")])
    with pytest.raises(ConfigError, match="unknown topic config name"):
        changing([ConfigChange("no.such", ConfigOp.SUBTRACT, "1")])
    assert replacing({"retention.ms": "5"})(current, broker) == {"retention.ms": "5"}
    assert error_of(ConfigChangeError("x"))[0] == ErrorCode.INVALID_REQUEST
    assert error_of(ConfigError("x"))[0] == ErrorCode.INVALID_CONFIG


def test_an_alteration_is_checked_by_the_registry(tmp_path) -> None:
    from broker.core.topic_configs import ConfigChange, ConfigOp, changing

    registry = TopicRegistry(str(tmp_path), LogConfig())
    registry.create("t", 1, {"cleanup.policy": "compact"})
    with pytest.raises(TopicError) as info:  # subtracting the last policy leaves none
        registry.altered("t", changing([ConfigChange("cleanup.policy", ConfigOp.SUBTRACT, "compact")]))
    assert info.value.kind is TopicFault.CONFIG and "at least one policy" in str(info.value)
    altered = registry.altered("t", changing([ConfigChange("retention.ms", ConfigOp.SET, "10")]))
    assert altered.configs == {"cleanup.policy": "compact", "retention.ms": "10"}
    assert registry.get("t").configs == {"cleanup.policy": "compact"}, "the registry is not changed"


def test_a_core_alters_many_topics_in_one_write_and_applies_them_at_once(tmp_path, monkeypatch) -> None:
    from broker.core.config import BrokerConfig
    from broker.core.core import Core
    from broker.core.partition import Partition
    from broker.core.topic_configs import replacing

    core = Core(BrokerConfig(data_dir=str(tmp_path)))
    try:
        core.create_topic("a", 1)
        core.create_topic("b", 1)
        p = core.partition_named("a", 0)
        assert isinstance(p, Partition) and p.log.config.max_batch_bytes == MiB
        saves = []
        real_save = core.registry._save
        monkeypatch.setattr(core.registry, "_save", lambda: (saves.append(1), real_save()))
        results = core.alter_topics_configs(
            [
                ("a", replacing({"max.message.bytes": "2048", "message.timestamp.type": "LogAppendTime"})),
                ("nope", replacing({})),
                ("b", replacing({"retention.ms": "1"})),
                ("b", replacing({"retention.ms": "never"})),
            ]
        )
        assert [type(r).__name__ for r in results] == ["Topic", "TopicError", "Topic", "TopicError"]
        assert len(saves) == 1, "one write of the registry for the request"
        assert (p.log.config.max_batch_bytes, p.log.config.log_append_time) == (2048, True), "live, no reopen"
        assert core.registry.get("b").configs == {"retention.ms": "1"}
        assert TopicRegistry(str(tmp_path), LogConfig()).get("a").configs["max.message.bytes"] == "2048"
    finally:
        core.close()


def test_a_registry_edited_by_hand_is_still_served(tmp_path) -> None:
    odd_configs = {"retention.ms": "soon", "x.y": "1", "segment.ms": "7200000"}
    doc = {
        "version": 2,
        "next_topic_id": 3,
        "topics": [
            {"name": "odd", "topic_id": 1, "partitions": 1, "configs": odd_configs},
            {"name": "small", "topic_id": 2, "partitions": 1, "configs": {"segment.bytes": "4096"}},
        ],
    }
    (tmp_path / "topics.json").write_text(json.dumps(doc))
    registry = TopicRegistry(str(tmp_path), LogConfig())
    odd = registry.settings_of(registry.get("odd"))
    assert (odd.retention_ms, odd.segment_ms) == (LogConfig().retention_ms, 7_200_000), "what parses is kept"
    assert registry.log_config(registry.get("small")).segment_bytes == 4096, "below today's floor: as stored"
