"""The Kafka adapter: Kafka requests in, calls on the protocol-neutral core, outcomes out.

Rules this module keeps:
- One `KafkaAdapter` per core, beside that core's `Handlers`; `handle(request)` returns an
  `Outcome` (broker/core/outcomes.py) that the backend carries out as it does ours, in the same
  reply slots, so replies keep request order. The core never learns which protocol asked: what
  both protocols need is a protocol-neutral method of `Handlers` (`metadata_view`), encoded here.
- Only what `SUPPORTED_VERSIONS` lists is advertised in ApiVersions, and only that is answered.
  An ApiVersions above our highest version gets UNSUPPORTED_VERSION in a v0 response listing our
  versions (as Kafka brokers answer, so the client retries at a version we have). Any other api
  or version we do not answer gets UNSUPPORTED_VERSION when its response schema has a top-level
  error_code whose other fields can all be left empty; otherwise the connection is closed with
  one log line (`ProtocolError`): a client that sends what we never advertised cannot be
  answered in a shape it will read correctly.
- Metadata lists every core as a broker: node id = core id, the broker's host, the core's direct
  port (the public port when unknown); each partition's leader is its owning core, replicas and
  isr are just the leader, the controller is core 0. Stock clients thus connect straight to the
  owning core. Topics are never created by Metadata (auto-create is off): an unknown one is
  UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import logging
import os
import sys
from dataclasses import MISSING, fields
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.config import BrokerConfig
from broker.core.handlers import Handlers
from broker.core.outcomes import Outcome, Reply
from broker.core.views import MetadataView
from broker.kafka.codec import (
    KafkaDecodeError,
    KafkaRequest,
    decode_request,
    encode_response,
    make,
    request_schema,
    response_schema,
)
from ringlog_proto.frames import ProtocolError

log = logging.getLogger(__name__)

API_VERSIONS: Final = 18
METADATA: Final = 3
# api key -> (lowest, highest) version answered: what ApiVersions advertises, nothing more.
SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    METADATA: (0, 8),  # v9+ are flexible
    API_VERSIONS: (0, 3),  # v3 is flexible in its request header only; its response header is v0
}
CONTROLLER_ID: Final = 0


def cluster_id_for(data_dir: str) -> str:
    """A stable cluster id (22 characters, the length of Kafka's base64 UUIDs) derived from the
    data dir's real path: the same broker always says the same, two data dirs differ."""
    digest = hashlib.sha256(os.path.realpath(data_dir).encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class KafkaAdapter:
    """Kafka's APIs on one core, over that core's `Handlers`."""

    def __init__(self, handlers: Handlers, config: BrokerConfig) -> None:
        self.handlers = handlers
        self.config = config
        self.cluster_id = cluster_id_for(config.data_dir)

    def handle(self, request: KafkaRequest) -> Outcome:
        """The outcome of one Kafka request. Raises `ProtocolError` when the connection must
        close (a request we cannot answer in a shape the client reads)."""
        key, version = request.api_key, request.api_version
        if key == API_VERSIONS and version > SUPPORTED_VERSIONS[API_VERSIONS][1]:
            return self._api_versions_unsupported(request)
        supported = SUPPORTED_VERSIONS.get(key)
        if supported is None or not supported[0] <= version <= supported[1]:
            return self._unsupported(request)
        schema = request_schema(key, version)
        assert schema is not None, f"kio lacks api {key} v{version}"
        try:
            body, _client_id = decode_request(request, schema)
        except KafkaDecodeError as exc:
            # Kafka closes on a request it cannot parse: the client's bytes are not what it
            # declared, and no response shape would be read right.
            raise ProtocolError(f"malformed kafka request: {exc}") from exc
        try:
            if key == API_VERSIONS:
                return self._api_versions(request)
            return self._metadata(request, body)
        except Exception as exc:  # a bug here must close one connection, not stop the core's loop
            log.exception("kafka api %d v%d failed", key, version)
            raise ProtocolError(f"internal error answering kafka api {key} v{version}: {exc}") from exc

    # ------------------------------------------------------------------------- ApiVersions

    def _api_keys(self, module: Any) -> tuple[Any, ...]:
        return tuple(
            make(module.ApiVersion, api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items())
        )

    def _api_versions(self, request: KafkaRequest) -> Outcome:
        schema = response_schema(API_VERSIONS, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        resp = make(
            schema,
            error_code=ErrorCode.none,
            api_keys=self._api_keys(module),
            throttle_time=datetime.timedelta(0),
        )
        return Reply(encode_response(request.correlation_id, resp))

    def _api_versions_unsupported(self, request: KafkaRequest) -> Outcome:
        """A version above ours: the error and our versions, in a v0 response the client can read
        whatever version it asked (Kafka's own answer to a newer client)."""
        self.handlers.metrics.error()
        schema = response_schema(API_VERSIONS, 0)
        assert schema is not None
        module = sys.modules[schema.__module__]
        resp = schema(error_code=ErrorCode.unsupported_version, api_keys=self._api_keys(module))
        return Reply(encode_response(request.correlation_id, resp))

    # ------------------------------------------------------------------------- Metadata

    def _metadata(self, request: KafkaRequest, body: Any) -> Outcome:
        # v0: an empty list means every topic; v1+: null means every topic, empty means none.
        if body.topics is None or (request.api_version == 0 and not body.topics):
            names: list[str] | None = None
        else:
            names = [t.name for t in body.topics]
        view = self.handlers.metadata_view(names)
        schema = response_schema(METADATA, request.api_version)
        assert schema is not None
        resp = self.metadata_response(schema, view)
        return Reply(encode_response(request.correlation_id, resp))

    def metadata_response(self, schema: type[Any], view: MetadataView) -> Any:
        """`view` as the Metadata response of `schema`'s version: every core a broker, each
        partition led by its owning core."""
        module = sys.modules[schema.__module__]
        brokers = tuple(
            make(
                module.MetadataResponseBroker,
                node_id=core,
                host=view.host,
                port=view.core_port(core),
                rack=None,
            )
            for core in range(view.cores)
        )
        topics = []
        for t in view.topics:
            if not t.known:
                topics.append(
                    make(
                        module.MetadataResponseTopic,
                        error_code=ErrorCode.unknown_topic_or_partition,
                        name=t.name,
                        is_internal=False,
                        partitions=(),
                    )
                )
                continue
            partitions = tuple(
                make(
                    module.MetadataResponsePartition,
                    error_code=ErrorCode.none,
                    partition_index=p.index,
                    leader_id=p.owner_core,
                    leader_epoch=0,
                    replica_nodes=(p.owner_core,),
                    isr_nodes=(p.owner_core,),
                    offline_replicas=(),
                )
                for p in t.partitions
            )
            topics.append(
                make(
                    module.MetadataResponseTopic,
                    error_code=ErrorCode.none,
                    name=t.name,
                    is_internal=False,
                    partitions=partitions,
                )
            )
        return make(
            schema,
            throttle_time=datetime.timedelta(0),
            brokers=brokers,
            cluster_id=self.cluster_id,
            controller_id=CONTROLLER_ID,
            topics=tuple(topics),
        )

    # ------------------------------------------------------------------------- anything else

    def _unsupported(self, request: KafkaRequest) -> Outcome:
        """An api or version we do not answer: UNSUPPORTED_VERSION where the response has a
        top-level error_code and nothing else that must be filled, else close (logged once by
        the backend's rate-limited log)."""
        key, version = request.api_key, request.api_version
        schema = response_schema(key, version)
        resp = _error_only_response(schema, ErrorCode.unsupported_version) if schema else None
        if resp is None:
            raise ProtocolError(
                f"kafka api {key} v{version} is not supported and its response has no top-level "
                "error code: closing the connection"
            )
        self.handlers.metrics.error()
        return Reply(encode_response(request.correlation_id, resp))


_EMPTY_BY_KAFKA_TYPE: Final[dict[str, Any]] = {
    "int8": 0,
    "int16": 0,
    "int32": 0,
    "int64": 0,
    "uint16": 0,
    "float64": 0.0,
    "bool": False,
    "string": "",
    "bytes": b"",
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
}


def _error_only_response(schema: type[Any], code: ErrorCode) -> Any | None:
    """A response of `schema` carrying `code` in its top-level error_code, every other required
    field empty (zero, "", an empty array, null); None if it has no such field or needs a value
    that cannot be empty (a nested struct)."""
    names = {f.name for f in fields(schema)}
    if "error_code" not in names:
        return None
    values: dict[str, Any] = {}
    for f in fields(schema):
        if f.name == "error_code":
            values[f.name] = code
            continue
        if f.default is not MISSING or f.default_factory is not MISSING:
            continue
        hint = str(f.type)
        if hint.startswith("tuple["):
            values[f.name] = ()
        elif hint.endswith("| None"):
            values[f.name] = None
        elif f.metadata.get("kafka_type") in _EMPTY_BY_KAFKA_TYPE:
            values[f.name] = _EMPTY_BY_KAFKA_TYPE[f.metadata["kafka_type"]]
        else:
            return None
    try:
        return schema(**values)
    except (TypeError, ValueError):
        return None
