"""Kafka error answers for every api and version kio knows that ringlog does not implement.

Rules this module keeps:
- An api or version we do not answer still gets a well-formed response of its own shape, never a
  dropped connection: clients (and people reading their logs) see a named Kafka error. Only a
  request whose bytes cannot be parsed, or one kio has no schema for, closes the connection (the
  adapter decides that; nothing here reads bytes).
- Which error: `error_for(api_key, supported)`. A version we do not answer of an api we do:
  UNSUPPORTED_VERSION. An api we do not implement: what Kafka's own brokers answer when that
  feature is disabled (SECURITY_DISABLED for ACLs and SCRAM credentials, with no authorizer or
  security; DELEGATION_TOKEN_AUTH_DISABLED for delegation tokens; UNSUPPORTED_SASL_MECHANISM with
  no mechanism listed for SaslHandshake, as a listener with no mechanism enabled; ILLEGAL_SASL_STATE
  for a SaslAuthenticate with no handshake), else UNSUPPORTED_VERSION. docs/KAFKA.md has the table.
- One builder for every schema (`error_response`), walking kio's dataclasses: every error code in
  the response is that error, every error message says what is not supported, throttle time is
  0, other fields are kio's default or empty (-1 for numbers, as Kafka fills offsets, ids and
  epochs of a failed item). A response array whose items carry an error code answers the
  request's items one for one (same-named array, or the name `ITEM_SOURCES` gives for that api),
  copying their keys (topic names, partition indexes, resource names, ...): a client matches
  each of its items to an error instead of finding it missing. Arrays without errors are empty.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.kafka.codec import (
    entity_type,
    is_array,
    is_nullable,
    response_schema,
    schema_cache,
    schema_fields,
)

# api key -> the error an api we do not implement answers (anything else: UNSUPPORTED_VERSION)
DISABLED_FEATURE_ERRORS: Final[dict[int, ErrorCode]] = {
    17: ErrorCode.unsupported_sasl_mechanism,  # SaslHandshake: no mechanism enabled
    36: ErrorCode.illegal_sasl_state,  # SaslAuthenticate: no handshake could have succeeded
    29: ErrorCode.security_disabled,  # DescribeAcls
    30: ErrorCode.security_disabled,  # CreateAcls
    31: ErrorCode.security_disabled,  # DeleteAcls
    50: ErrorCode.security_disabled,  # DescribeUserScramCredentials
    51: ErrorCode.security_disabled,  # AlterUserScramCredentials
    38: ErrorCode.delegation_token_auth_disabled,  # CreateDelegationToken
    39: ErrorCode.delegation_token_auth_disabled,  # RenewDelegationToken
    40: ErrorCode.delegation_token_auth_disabled,  # ExpireDelegationToken
    41: ErrorCode.delegation_token_auth_disabled,  # DescribeDelegationToken
}

# api key -> {response array: the request array it answers item by item}, where the names differ
# (same-named arrays pair up by themselves)
ITEM_SOURCES: Final[dict[int, dict[str, str]]] = {
    0: {"responses": "topic_data", "partition_responses": "partition_data"},  # Produce
    1: {"responses": "topics"},  # Fetch
    8: {},  # OffsetCommit: topics/partitions
    9: {"partitions": "partition_indexes"},  # OffsetFetch (v8+: groups/topics/partitions)
    10: {"coordinators": "coordinator_keys"},  # FindCoordinator v4+
    20: {"responses": "topics"},  # DeleteTopics (v6+ names topics; v4-5 topic_names)
    21: {},  # DeleteRecords: topics/partitions
    23: {},  # OffsetForLeaderEpoch: topics/partitions
    24: {  # AddPartitionsToTxn
        "results_by_topic_v3_and_below": "v3_and_below_topics",
        "results_by_transaction": "transactions",
        "topic_results": "topics",
        "results_by_partition": "partitions",
    },
    27: {"partitions": "partition_indexes"},  # WriteTxnMarkers: markers/topics/partition_indexes
    28: {},  # TxnOffsetCommit: topics/partitions
    30: {"results": "creations"},  # CreateAcls
    31: {"filter_results": "filters"},  # DeleteAcls
    32: {"results": "resources"},  # DescribeConfigs
    33: {"responses": "resources"},  # AlterConfigs
    34: {"results": "dirs.topics"},  # AlterReplicaLogDirs: every dir's topics
    37: {"results": "topics"},  # CreatePartitions
    42: {"results": "groups_names"},  # DeleteGroups
    43: {"replica_election_results": "topic_partitions", "partition_result": "partitions"},  # ElectLeaders
    44: {"responses": "resources"},  # IncrementalAlterConfigs
    45: {"responses": "topics"},  # AlterPartitionReassignments
    47: {},  # OffsetDelete: topics/partitions
    49: {},  # AlterClientQuotas: entries
    50: {"results": "users"},  # DescribeUserScramCredentials
    51: {"results": "deletions"},  # AlterUserScramCredentials (deletions, then upsertions)
    61: {"partitions": "partition_indexes"},  # DescribeProducers
    15: {},  # DescribeGroups: groups
    65: {"transaction_states": "transactional_ids"},  # DescribeTransactions
    69: {"groups": "group_ids"},  # ConsumerGroupDescribe
    77: {"groups": "group_ids"},  # ShareGroupDescribe
    89: {"groups": "group_ids"},  # StreamsGroupDescribe
    **{key: {"results": "topics"} for key in range(83, 88)},  # share group state (internal)
}
# A second request array a response array also answers (after the first's items).
ITEM_SOURCES_MORE: Final[dict[int, dict[str, str]]] = {
    20: {"responses": "topic_names"},  # DeleteTopics v4-5
    51: {"results": "upsertions"},
}
# response key field -> the request fields it copies when no field has its name
_KEY_ALIASES: Final[dict[str, tuple[str, ...]]] = {
    "name": ("topic", "topic_name", "user", "group_id"),
    "topic": ("name", "topic_name"),
    "topic_name": ("name", "topic"),
    "partition_index": ("partition", "index", "partition_id"),
    "partition": ("partition_index", "index"),
    "partition_id": ("partition_index", "partition"),
    "index": ("partition_index", "partition"),
    "user": ("name",),
    "group_id": ("name", "group"),
    "resource_type": ("resource_type_filter",),
    "resource_name": ("resource_name_filter",),
}
_EPOCH_UTC: Final = datetime.datetime.fromtimestamp(0, datetime.UTC)


def api_name(api_key: int) -> str:
    """The api's name as Kafka spells it (DescribeConfigs), from kio's schema of any version."""
    for version in range(0, 20):
        schema = response_schema(api_key, version)
        if schema is not None:
            return schema.__name__.removesuffix("Response")
    return f"api {api_key}"


def error_for(api_key: int, supported: bool) -> ErrorCode:
    """The error an unanswered request of `api_key` gets (module rules); `supported`: we answer
    other versions of it."""
    if supported:
        return ErrorCode.unsupported_version
    return DISABLED_FEATURE_ERRORS.get(api_key, ErrorCode.unsupported_version)


def error_response(api_key: int, schema: type[Any], request: Any, code: ErrorCode, message: str) -> Any:
    """A response of `schema` answering `request` (its decoded body) with `code` everywhere an
    error goes (module rules)."""
    builder = _Builder(code, message, ITEM_SOURCES.get(api_key, {}), ITEM_SOURCES_MORE.get(api_key, {}))
    return builder.entity(schema, request)


class _Builder:
    def __init__(self, code: ErrorCode, message: str, sources: dict[str, str], more: dict[str, str]) -> None:
        self.code = code
        self.message = message
        self.sources = sources
        self.more = more

    def entity(self, cls: type[Any], source: Any) -> Any:
        """An entity of `cls` answering `source`: a request entity, a primitive item of a request
        array (a partition index), or None."""
        values: dict[str, Any] = {}
        scalar_taken = not _is_scalar(source)
        for f, hint in schema_fields(cls):
            kind = f.metadata.get("kafka_type")
            inner = entity_type(hint)
            if kind == "error_code":
                values[f.name] = self.code
            elif kind == "timedelta_i32" and f.name.startswith("throttle"):
                values[f.name] = datetime.timedelta(0)
            elif kind == "string" and f.name.endswith("error_message") and is_nullable(hint):
                values[f.name] = self.message
            elif inner is not None and is_array(hint):
                values[f.name] = self.items(f.name, inner, source, hint)
            elif inner is not None:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    values[f.name] = None if is_nullable(hint) else self.entity(inner, None)
            elif not scalar_taken and kind is not None and _kind_of(source) == kind and not is_array(hint):
                values[f.name] = source
                scalar_taken = True
            else:
                copied = self.copy(f, kind, hint, source)
                if copied is not _NOTHING:
                    values[f.name] = copied
                elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                    continue
                else:
                    values[f.name] = _empty(kind, hint)
        return cls(**values)

    def items(self, name: str, inner: type[Any], source: Any, hint: Any) -> Any:
        """A response array: one answer per item of the request array it answers, when its items
        carry errors; else empty (null where only null is allowed)."""
        out: list[Any] = []
        if _carries_error(inner) and _is_entity(source):
            for src_name in (self.sources.get(name, name), self.more.get(name)):
                if src_name is None:
                    continue
                out.extend(self.entity(inner, item) for item in _path(source, src_name))
        return tuple(out)

    def copy(self, f: dataclasses.Field[Any], kind: str | None, hint: Any, source: Any) -> Any:
        """The request's value for the response field `f` (same name or an alias), if it has one
        of the same Kafka type that fits."""
        if not _is_entity(source) or kind is None:
            return _NOTHING
        by_name = {g.name: g for g, _ in schema_fields(type(source))}
        for candidate in (f.name, *_KEY_ALIASES.get(f.name, ())):
            g = by_name.get(candidate)
            if g is None or g.metadata.get("kafka_type") != kind:
                continue
            value = getattr(source, candidate)
            if is_array(hint) != isinstance(value, tuple):
                continue
            if value is None and not is_nullable(hint):
                continue
            return value
        return _NOTHING


_NOTHING: Final = object()


def _path(source: Any, path: str) -> list[Any]:
    """The items of the request array at `path` ("a.b": every item's b of every a)."""
    items = [source]
    for name in path.split("."):
        out: list[Any] = []
        for item in items:
            given = getattr(item, name, None) if _is_entity(item) else None
            if isinstance(given, tuple):
                out.extend(given)
        items = out
    return items


def _is_entity(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _kind_of(value: Any) -> str | None:
    """The Kafka type a primitive array item of a request most likely had: partition indexes and
    broker ids are int32, names are strings."""
    if isinstance(value, str):
        return "string"
    if isinstance(value, int) and not isinstance(value, bool):
        return "int32"
    return None


@schema_cache
def _carries_error(cls: type[Any]) -> bool:
    """Whether entities of `cls` (or entities within them) have an error code."""
    for f, hint in schema_fields(cls):
        if f.metadata.get("kafka_type") == "error_code":
            return True
        inner = entity_type(hint)
        if inner is not None and inner is not cls and _carries_error(inner):
            return True
    return False


def _empty(kind: str | None, hint: Any) -> Any:
    """The value of a field nothing says anything about."""
    if is_array(hint):
        return ()
    if is_nullable(hint):
        return None
    match kind:
        case "int8" | "uint16":
            return 0
        case "int16" | "int32" | "int64":
            return -1
        case "float64":
            return 0.0
        case "bool":
            return False
        case "string":
            return ""
        case "bytes" | "records":
            return b""
        case "uuid":
            return None
        case "timedelta_i32" | "timedelta_i64":
            return datetime.timedelta(0)
        case "datetime_i64":
            return _EPOCH_UTC
    raise TypeError(f"no empty value for a {kind} field ({hint})")
