"""DescribeConfigs (api 32, v1-4), AlterConfigs (api 33, v0-2) and IncrementalAlterConfigs (api 44,
v0-1) over the core's one config model (broker/core/topic_configs.py).

Rules this module keeps (Kafka 4.x's ConfigHelper and ConfigAdminManager are the yardstick):
- Resources are answered one by one, in the request's order, each with its own error: a topic
  the principal may not describe (or alter) is TOPIC_AUTHORIZATION_FAILED, a broker resource
  without the permission on the cluster CLUSTER_AUTHORIZATION_FAILED, and the others are served
  (ACLs: describe_configs, alter_configs; alter_configs implies describe_configs).
- A topic is described with every config Kafka lists for one (or the `configuration_keys` asked,
  all when null or empty): the effective value, its source (DYNAMIC_TOPIC_CONFIG for the topic's
  override, STATIC_BROKER_CONFIG for a default a `broker serve` flag set, else DEFAULT_CONFIG),
  read_only false, sensitive false; synonyms when asked (the override, then the broker config
  the default comes from); type and documentation from v3 (documentation when asked).
- A broker resource names a Kafka broker id: every core of this node is one (broker/core/views.py
  `kafka_broker_id`), and each describes the node's settings, read only (they are `broker serve`
  flags). The empty name (Kafka's cluster-wide dynamic defaults) has none. Any other id, or a
  name that is not a number, is INVALID_REQUEST, as Kafka answers.
- AlterConfigs replaces a topic's overrides with the ones given (a config left out goes back to
  its default); IncrementalAlterConfigs changes the ones named: SET, DELETE, and APPEND and
  SUBTRACT on list configs (cleanup.policy, the throttled-replica lists). Unknown names and bad
  values are INVALID_CONFIG, a bad operation or a duplicate name or resource INVALID_REQUEST;
  `validate_only` checks everything and changes nothing. Broker resources cannot be altered
  here (INVALID_REQUEST saying so). Other resource types (groups, client metrics, loggers) are
  INVALID_REQUEST.
- One node: the registry is changed under its lock and every core applies it on its next reload
  (this one at once). A cluster: the topic's record in the store is changed off the loop, and
  the answer waits until this node's registry shows it (`Core.in_cluster`).
"""

from __future__ import annotations

import datetime
import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.config import BrokerConfig
from broker.core.outcomes import Outcome, Reply
from broker.core.topic_config_keys import ConfigType
from broker.core.topic_configs import (
    Alteration,
    BrokerSetting,
    ConfigChange,
    ConfigEntry,
    ConfigOp,
    ConfigSource,
    changing,
    describe_broker,
    replacing,
)
from broker.core.views import KAFKA_IDS_PER_NODE
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error
from broker.security.acls import CLUSTER_NAME

DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
INCREMENTAL_ALTER_CONFIGS: Final = 44
VERSIONS: Final = {
    DESCRIBE_CONFIGS: (1, 4),  # v0: kio has no schema for it (Kafka 4 dropped it too); v4 flexible
    ALTER_CONFIGS: (0, 2),  # v2 flexible
    INCREMENTAL_ALTER_CONFIGS: (0, 1),  # v1 flexible
}

TOPIC: Final = 2  # Kafka's ConfigResource.Type ids
BROKER: Final = 4
BROKER_LOGGER: Final = 8
SOURCES: Final = {  # Kafka's DescribeConfigsResponse.ConfigSource ids
    ConfigSource.TOPIC: 1,
    ConfigSource.STATIC_BROKER: 4,
    ConfigSource.DEFAULT: 5,
}
TYPES: Final = {  # Kafka's DescribeConfigsResponse.ConfigType ids
    ConfigType.BOOLEAN: 1,
    ConfigType.STRING: 2,
    ConfigType.INT: 3,
    ConfigType.LONG: 5,
    ConfigType.DOUBLE: 6,
    ConfigType.LIST: 7,
}
OPS: Final = {0: ConfigOp.SET, 1: ConfigOp.DELETE, 2: ConfigOp.APPEND, 3: ConfigOp.SUBTRACT}  # Kafka's op ids


class _Refused(Exception):
    """A resource answered with this error (the request's others are still served)."""

    def __init__(self, code: ErrorCode, message: str | None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _permitted(ctx: Context, operation: str, resource_type: int, name: str) -> None:
    """`_Refused` unless the principal may do `operation` (describe_configs, alter_configs) on it."""
    authorizer = ctx.authorizer
    if not authorizer.enabled:
        return
    if resource_type == TOPIC:
        if not authorizer.allowed(ctx.auth.principal, operation, "topic", name):
            ctx.core.metrics.denied()
            raise _Refused(ErrorCode.topic_authorization_failed, f"not authorized: {operation} topic {name}")
    elif not authorizer.allowed(ctx.auth.principal, operation, "cluster", CLUSTER_NAME):
        ctx.core.metrics.denied()
        raise _Refused(ErrorCode.cluster_authorization_failed, f"not authorized: {operation} cluster")


def _response(request: KafkaRequest, **fields: Any) -> Reply:
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    resp = make(schema, throttle_time=datetime.timedelta(0), **fields)
    return Reply(encode_response(request.correlation_id, resp))


def _module(request: KafkaRequest) -> Any:
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    return sys.modules[schema.__module__]


# --------------------------------------------------------------------------------------- describe


def describe_configs(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """Each resource's configs (module rules)."""
    module = _module(request)
    synonyms = bool(getattr(body, "include_synonyms", False))
    docs = bool(getattr(body, "include_documentation", False))
    results = []
    for resource in body.resources:
        rtype, name = int(resource.resource_type), str(resource.resource_name)
        code, message, entries = ErrorCode.none, None, []
        try:
            _permitted(ctx, "describe_configs", rtype, name)
            keys = list(resource.configuration_keys or ()) or None
            entries = _describe(ctx, rtype, name, keys)
        except _Refused as exc:
            code, message = exc.code, exc.message
        except Exception as exc:
            code, message = kafka_error(exc)
        configs = tuple(_entry(module, e, synonyms, docs) for e in entries)
        results.append(
            make(
                module.DescribeConfigsResult,
                error_code=code,
                error_message=message,
                resource_type=rtype,
                resource_name=name,
                configs=configs,
            )
        )
    return _response(request, results=tuple(results))


def _describe(ctx: Context, rtype: int, name: str, keys: list[str] | None) -> list[ConfigEntry]:
    core = ctx.core
    if rtype == TOPIC:
        return core.topic_config_entries(name, keys)
    if rtype == BROKER:
        if name == "":
            return []  # Kafka's cluster-wide dynamic defaults: ringlog has none
        broker_id = _broker_id(core.config, name)
        return describe_broker(core.registry.topic_defaults, broker_settings(core.config, broker_id), keys)
    if rtype == BROKER_LOGGER:
        raise _Refused(ErrorCode.invalid_request, "ringlog does not describe its loggers (--log-level)")
    raise _Refused(
        ErrorCode.invalid_request, f"unsupported resource type {rtype}: ringlog has topic and broker configs"
    )


def _broker_id(config: BrokerConfig, name: str) -> int:
    """The Kafka broker id `name` when it is a core of this node, else `_Refused` as Kafka answers."""
    try:
        broker_id = int(name)
    except ValueError:
        raise _Refused(
            ErrorCode.invalid_request, f"Broker id must be an integer, but it is: {name}"
        ) from None
    node, core = divmod(broker_id, KAFKA_IDS_PER_NODE)
    if node != config.node_id or not 0 <= core < config.cores:
        first = config.node_id * KAFKA_IDS_PER_NODE
        raise _Refused(
            ErrorCode.invalid_request,
            f"Unexpected broker id, expected one of {first}..{first + config.cores - 1} (this node's cores) "
            f"or empty string, but received {name}",
        )
    return broker_id


def _entry(module: Any, e: ConfigEntry, synonyms: bool, docs: bool) -> Any:
    return make(
        module.DescribeConfigsResourceResult,
        name=e.name,
        value=e.value,
        read_only=e.read_only,
        config_source=SOURCES[e.source],
        is_sensitive=e.sensitive,
        synonyms=tuple(
            make(module.DescribeConfigsSynonym, name=s.name, value=s.value, source=SOURCES[s.source])
            for s in e.synonyms
        )
        if synonyms
        else (),
        config_type=TYPES[e.type],
        documentation=e.doc if docs else None,
    )


def created_topic_configs(module: Any, entries: list[ConfigEntry]) -> tuple[Any, ...]:
    """A topic's configs as CreateTopics v5+ answers them (KIP-525, `module`: its response
    schema's): each entry as DescribeConfigs describes it, without synonyms or documentation, a
    sensitive value null (Kafka's rule; no topic config is sensitive)."""
    return tuple(
        make(
            module.CreatableTopicConfigs,
            name=e.name,
            value=None if e.sensitive else e.value,
            read_only=e.read_only,
            config_source=SOURCES[e.source],
            is_sensitive=e.sensitive,
        )
        for e in entries
    )


def broker_settings(config: BrokerConfig, broker_id: int) -> dict[str, BrokerSetting]:
    """The broker configs a Kafka client may look up that are not topic configs' synonyms, as
    this node has them (Kafka's names; each is a `broker serve` flag here)."""
    tls, sasl = config.tls.enabled, config.sasl.enabled
    protocol = {(False, False): "PLAINTEXT", (True, False): "SSL", (False, True): "SASL_PLAINTEXT"}.get(
        (tls, sasl), "SASL_SSL"
    )
    core_port = config.core_ports[broker_id % KAFKA_IDS_PER_NODE] if config.core_ports else config.port
    out = {
        "broker.id": BrokerSetting(
            str(broker_id), ConfigType.INT, "This core's Kafka broker id (node id x 1000 + core)."
        ),
        "node.id": BrokerSetting(str(broker_id), ConfigType.INT, "As broker.id."),
        "log.dirs": BrokerSetting(
            os.path.abspath(config.data_dir), ConfigType.LIST, "The data dir (--data-dir)."
        ),
        "listeners": BrokerSetting(
            f"{protocol}://{config.host}:{config.port}",
            ConfigType.LIST,
            "The public listener (--host, --port).",
        ),
        "advertised.listeners": BrokerSetting(
            f"{protocol}://{config.public_host}:{core_port}",
            ConfigType.LIST,
            "Where clients reach this core (--advertised-host, the core's direct port).",
        ),
        "socket.request.max.bytes": BrokerSetting(
            str(config.limits.max_request_bytes),
            ConfigType.INT,
            "The largest request accepted (--max-request-bytes).",
        ),
        "auto.create.topics.enable": BrokerSetting(
            str(config.auto_create_topics).lower(),
            ConfigType.BOOLEAN,
            "Whether Metadata creates the topics it names (--auto-create-topics).",
        ),
        "num.partitions": BrokerSetting(
            str(config.default_partitions),
            ConfigType.INT,
            "Partitions of an auto-created topic (--default-partitions).",
        ),
        "group.initial.rebalance.delay.ms": BrokerSetting(
            str(config.group_initial_rebalance_delay_ms),
            ConfigType.INT,
            "How long an empty group waits for more members (--group-initial-rebalance-delay-ms).",
        ),
        "producer.id.expiration.ms": BrokerSetting(
            str(config.producer_id_expiration_ms),
            ConfigType.INT,
            "How long a producer's state is kept after its last write (--producer-id-expiration-ms).",
        ),
    }
    cluster = config.cluster
    if cluster is not None:
        out["replica.lag.time.max.ms"] = BrokerSetting(
            str(cluster.replica_lag_max_ms),
            ConfigType.LONG,
            "How long a follower may lag before it leaves the ISR.",
        )
        out["replica.fetch.wait.max.ms"] = BrokerSetting(
            str(cluster.replica_fetch_wait_ms), ConfigType.INT, "A follower's long poll."
        )
    return out


# ------------------------------------------------------------------------------------------ alter


def alter_configs(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """AlterConfigs: each topic's overrides become the configs given (module rules)."""

    def alteration(resource: Any) -> Alteration:
        names = [str(c.name) for c in resource.configs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _Refused(ErrorCode.invalid_request, f"duplicate config keys: {', '.join(twice)}")
        return replacing({str(c.name): c.value for c in resource.configs})

    return _alter(ctx, request, body, alteration)


def incremental_alter_configs(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """IncrementalAlterConfigs: the named configs set, deleted, appended to or subtracted from."""

    def alteration(resource: Any) -> Alteration:
        changes = []
        for c in resource.configs:
            op = OPS.get(int(c.config_operation))
            if op is None:
                raise _Refused(
                    ErrorCode.invalid_request, f"unknown config operation {c.config_operation} for {c.name}"
                )
            changes.append(ConfigChange(str(c.name), op, c.value))
        return changing(changes)

    return _alter(ctx, request, body, alteration)


def _alter(
    ctx: Context, request: KafkaRequest, body: Any, alteration: Callable[[Any], Alteration]
) -> Outcome:
    """Both alters: each resource checked here, then its alteration stored (one node: at once,
    under the registry's lock; a cluster: in the store, off the loop), one answer for all."""
    module = _module(request)
    core = ctx.core
    validate_only = bool(body.validate_only)
    seen = Counter((int(r.resource_type), str(r.resource_name)) for r in body.resources)
    # per resource: (type, name, error, message); the topics to store: index -> (name, alteration)
    answers: list[tuple[int, str, ErrorCode, str | None]] = []
    todo: dict[int, tuple[str, Alteration]] = {}
    core.refresh_topics()
    for resource in body.resources:
        rtype, name = int(resource.resource_type), str(resource.resource_name)
        code, message = ErrorCode.none, None
        try:
            if seen[(rtype, name)] > 1:
                raise _Refused(ErrorCode.invalid_request, f"duplicate resource in the request: {name!r}")
            _permitted(ctx, "alter_configs", rtype, name)
            if rtype == BROKER:
                raise _Refused(
                    ErrorCode.invalid_request,
                    "broker configs are read-only in ringlog: they are `broker serve` flags, set at start",
                )
            if rtype != TOPIC:
                raise _Refused(
                    ErrorCode.invalid_request,
                    f"unsupported resource type {rtype}: ringlog alters topic configs",
                )
            if name not in core.registry.by_name:
                core.refresh_topics(force=True)
            change = alteration(resource)
            core.registry.altered(name, change)  # checked now: only valid changes go on
            if not validate_only:
                todo[len(answers)] = (name, change)
        except _Refused as exc:
            code, message = exc.code, exc.message
        except Exception as exc:
            code, message = kafka_error(exc)
        answers.append((rtype, name, code, message))

    def answer(results: Mapping[int, BaseException | None]) -> Reply:
        items = []
        for i, (rtype, name, refused, why) in enumerate(answers):
            failed = results.get(i)
            code, message = kafka_error(failed) if failed is not None else (refused, why)
            items.append(
                make(
                    module.AlterConfigsResourceResponse,
                    error_code=code,
                    error_message=message,
                    resource_type=rtype,
                    resource_name=name,
                )
            )
        return _response(request, responses=tuple(items))

    cluster = core.config.cluster
    if not todo:
        return answer({})
    if cluster is None:  # every topic in one write of the registry
        outcomes = core.alter_topics_configs(list(todo.values()))
        return answer(
            {i: r if isinstance(r, Exception) else None for i, r in zip(todo, outcomes, strict=True)}
        )
    calls, registry = cluster.calls, core.registry
    stored: dict[str, Mapping[str, str]] = {}

    def alter_all() -> dict[int, BaseException | None]:
        out: dict[int, BaseException | None] = {}
        for i, (name, change) in todo.items():
            try:
                stored[name] = calls.alter_topic_configs(registry, name, change).configs
                out[i] = None
            except Exception as exc:
                out[i] = exc
        return out

    def done(results: Any) -> Reply:
        if isinstance(results, BaseException):
            return answer(dict.fromkeys(todo, results))
        return answer(results)

    def mirrored(_results: Any) -> bool:
        return all((t := registry.by_name.get(n)) is not None and t.configs == c for n, c in stored.items())

    return core.in_cluster(alter_all, done, until=mirrored)
