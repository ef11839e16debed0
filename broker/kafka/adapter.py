"""The Kafka adapter: Kafka requests in, calls on the protocol-neutral core, outcomes out.

Rules this module keeps:
- One `KafkaAdapter` per core, beside our protocol's adapter over the same `Core`, made by the
  worker and handed to the backend (broker/core/adapter.py's interface: a connection's first bytes
  pick it, `recognises`, and it gives the connection its decoder); `handle(request)` returns an
  `Outcome` (broker/core/outcomes.py) that the backend carries out as it does ours, in the same
  reply slots, so replies keep request order. The core never learns
  which protocol asked: the APIs call the core's protocol-neutral methods (`metadata_view`,
  `partition_named`, `create_topic`, `delete_topic`, `producer_ids`) and the partitions' doors
  (`produce`, `read`, `list_offset`), and encode the answers.
- Each API group lives in a module of its own, as functions of `(ctx, request, body)`
  (broker/kafka/context.py), registered in `_apis`: produce.py, fetch.py, list_offsets.py,
  metadata.py, topics.py (Create/DeleteTopics), partitions.py (CreatePartitions, DeleteRecords),
  groups.py (FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, OffsetCommit/OffsetFetch,
  Describe/ListGroups), group_admin.py (DeleteGroups, OffsetDelete), describe.py
  (DescribeCluster, DescribeLogDirs, DescribeProducers), init_producer_id.py, leader_epoch.py,
  sasl.py, acl_admin.py, configs.py (Describe/Alter/IncrementalAlterConfigs), replicas.py
  (ElectLeaders, Alter/ListPartitionReassignments). A new API is a module and a line here.
- Only what `SUPPORTED_VERSIONS` lists is advertised in ApiVersions, and only that is answered
  by a handler. An ApiVersions above our highest version gets UNSUPPORTED_VERSION in a v0
  response listing our versions (as Kafka brokers answer, so the client retries at a version we
  have). Any other api or version kio knows gets a Kafka error in a response of its own shape,
  the request's items answered one for one (broker/kafka/unsupported.py); only a request kio has
  no schema for, or whose bytes do not parse, closes the connection with one log line
  (`ProtocolError`).
- With SASL on, a request before authentication is refused (broker/kafka/sasl.py `gate`); with
  ACLs on, each request is checked (broker/kafka/authorize.py) before its API sees it. After a
  SaslHandshake v0 the connection's decoder gives bare tokens (`RawSaslToken`), answered in kind.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Opening, Outcome, Reply, Silent
from broker.kafka import (
    acl_admin,
    authorize,
    configs,
    describe,
    fetch,
    group_admin,
    init_producer_id,
    list_offsets,
    metadata,
    partitions,
    produce,
    replicas,
    sasl,
    topics,
    transactions,
)
from broker.kafka.codec import (
    KafkaDecodeError,
    KafkaFrameDecoder,
    KafkaRequest,
    RawSaslToken,
    decode_request,
    encode_response,
    kafka_decoder,
    make,
    request_schema,
    response_schema,
    starts_like_kafka,
)
from broker.kafka.context import Context
from broker.kafka.fast_decode import HAND_DECODED_FROM, decode_produce
from broker.kafka.groups import GROUP_VERSIONS, NOT_ADVERTISED, KafkaGroups
from broker.kafka.leader_epoch import (
    KIO_FROM,
    OFFSET_FOR_LEADER_EPOCH,
    offset_for_leader_epoch,
    offset_for_leader_epoch_v0,
)
from broker.kafka.unsupported import api_name, error_for, error_response
from broker.security.session import ConnectionAuth
from ringlog_proto.frames import Buffer, ProtocolError

log = logging.getLogger(__name__)

API_VERSIONS: Final = 18
# A request naming more partitions of its core that were never opened than this opens them in
# turns first (`Opening`): each is ~0.1-0.9 ms of the loop on ext4, and a consumer group's
# ListOffsets over thousands of new partitions held every other client of the core for seconds.
OPEN_AT_ONCE: Final = 4

# What names a partition in each request that opens them: (its topics' array, a topic's name,
# a topic's partitions' array, a partition's index), as kio names the fields
_PARTITIONS_OF: Final = {
    produce.PRODUCE: ("topic_data", "name", "partition_data", "index"),
    fetch.FETCH: ("topics", "topic", "partitions", "partition"),
    list_offsets.LIST_OFFSETS: ("topics", "name", "partitions", "partition_index"),
}


def _named_count(key: int, body: Any) -> int:
    """How many partitions the request names (a look ahead that costs a topic, not a partition:
    librdkafka's Produce names one)."""
    topics, _, partitions, _ = _PARTITIONS_OF[key]
    return sum(len(getattr(t, partitions)) for t in getattr(body, topics))


INIT_PRODUCER_ID: Final = init_producer_id.INIT_PRODUCER_ID
# api key -> (lowest, highest) version answered: what ApiVersions advertises, nothing more.
SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    produce.PRODUCE: produce.VERSIONS,
    fetch.FETCH: fetch.VERSIONS,
    list_offsets.LIST_OFFSETS: list_offsets.VERSIONS,
    metadata.METADATA: metadata.VERSIONS,
    API_VERSIONS: (0, 3),  # v3 is flexible in its request header only; its response header is v0
    topics.CREATE_TOPICS: topics.CREATE_VERSIONS,
    topics.DELETE_TOPICS: topics.DELETE_VERSIONS,
    partitions.CREATE_PARTITIONS: partitions.CREATE_PARTITIONS_VERSIONS,
    partitions.DELETE_RECORDS: partitions.DELETE_RECORDS_VERSIONS,
    INIT_PRODUCER_ID: init_producer_id.VERSIONS,  # v2+ flexible (kio writes their headers)
    OFFSET_FOR_LEADER_EPOCH: (0, 3),  # v0-1 read here (kio has v2+); v4+ are flexible
    **group_admin.VERSIONS,  # DeleteGroups, OffsetDelete: broker/kafka/group_admin.py
    **describe.VERSIONS,  # DescribeCluster, DescribeLogDirs, DescribeProducers: broker/kafka/describe.py
    **GROUP_VERSIONS,  # FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, offsets: broker/kafka/groups.py
    **sasl.VERSIONS,  # SaslHandshake, SaslAuthenticate: broker/kafka/sasl.py
    **acl_admin.VERSIONS,  # DescribeAcls, CreateAcls, DeleteAcls: broker/kafka/acl_admin.py
    **configs.VERSIONS,  # DescribeConfigs, AlterConfigs, IncrementalAlterConfigs: broker/kafka/configs.py
    **transactions.VERSIONS,  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: broker/kafka/transactions.py
    **replicas.VERSIONS,  # ElectLeaders, Alter/ListPartitionReassignments: broker/kafka/replicas.py
}


def cluster_id_for(data_dir: str) -> str:
    """A stable cluster id (22 characters, the length of Kafka's base64 UUIDs) derived from the
    data dir's real path (one node: the same broker always says the same, two data dirs differ)
    or from "cluster:<name>" (every node of a cluster says the same)."""
    name = data_dir if data_dir.startswith("cluster:") else os.path.realpath(data_dir)
    digest = hashlib.sha256(name.encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class KafkaAdapter:
    """Kafka's APIs on one core, over that core's `Core`."""

    frame_name = "a Kafka request"

    def __init__(self, core: Core, config: BrokerConfig) -> None:
        self.core = core
        self.config = config
        # counted apart from ours: its api keys are not ours
        self.count_request: Callable[[int, int], int] = core.metrics.kafka_request
        # one id for the whole cluster (librdkafka refuses brokers that disagree); alone: per data dir
        cluster_id = cluster_id_for(
            config.data_dir if config.cluster is None else f"cluster:{config.cluster.name}"
        )
        self.ctx = ctx = Context(core, cluster_id)
        self.cluster_id = cluster_id
        self.groups = KafkaGroups(core)
        self.groups.may_describe = lambda group: authorize.may_describe_group(
            ctx.authorizer, ctx.auth.principal, group
        )
        self.authenticator = ctx.authenticator
        self.authorizer = ctx.authorizer
        cluster_acls = config.cluster.acls if config.cluster is not None else None
        acls = acl_admin.AclAdmin(self.authorizer.store, cluster_acls, core.run_blocking)

        def api(
            call: Callable[[Context, KafkaRequest, Any], Outcome],
        ) -> Callable[[KafkaRequest, Any], Outcome]:
            return lambda request, body: call(ctx, request, body)

        # api key -> its handler; SUPPORTED_VERSIONS says which versions reach it. An API group
        # lives in a module of its own, as functions of (ctx, request, body).
        self._apis: dict[int, Callable[[KafkaRequest, Any], Outcome]] = {
            API_VERSIONS: lambda request, _body: self._api_versions(request),
            produce.PRODUCE: api(produce.produce),
            fetch.FETCH: api(fetch.fetch),
            list_offsets.LIST_OFFSETS: api(list_offsets.list_offsets),
            metadata.METADATA: api(metadata.metadata),
            topics.CREATE_TOPICS: api(topics.create_topics),
            topics.DELETE_TOPICS: api(topics.delete_topics),
            partitions.CREATE_PARTITIONS: api(partitions.create_partitions),
            partitions.DELETE_RECORDS: api(partitions.delete_records),
            INIT_PRODUCER_ID: api(init_producer_id.init_producer_id),
            transactions.ADD_PARTITIONS_TO_TXN: api(transactions.add_partitions_to_txn),
            transactions.ADD_OFFSETS_TO_TXN: api(transactions.add_offsets_to_txn),
            transactions.END_TXN: api(transactions.end_txn),
            transactions.WRITE_TXN_MARKERS: api(transactions.write_txn_markers),
            transactions.DESCRIBE_TRANSACTIONS: api(transactions.describe_transactions),
            transactions.LIST_TRANSACTIONS: api(transactions.list_transactions),
            OFFSET_FOR_LEADER_EPOCH: lambda request, body: offset_for_leader_epoch(core, request, body),
            **self.groups.apis(),
            group_admin.DELETE_GROUPS: api(group_admin.delete_groups),
            group_admin.OFFSET_DELETE: api(group_admin.offset_delete),
            describe.DESCRIBE_CLUSTER: api(describe.describe_cluster),
            describe.DESCRIBE_LOG_DIRS: api(describe.describe_log_dirs),
            describe.DESCRIBE_PRODUCERS: api(describe.describe_producers),
            sasl.SASL_HANDSHAKE: lambda request, body: sasl.handshake(
                self.authenticator, request, body, ctx.auth
            ),
            sasl.SASL_AUTHENTICATE: lambda request, body: sasl.authenticate(
                self.authenticator, request, body, ctx.auth
            ),
            acl_admin.DESCRIBE_ACLS: self._acl_api(acls.describe),
            acl_admin.CREATE_ACLS: self._acl_api(acls.create),
            acl_admin.DELETE_ACLS: self._acl_api(acls.delete),
            configs.DESCRIBE_CONFIGS: api(configs.describe_configs),
            configs.ALTER_CONFIGS: api(configs.alter_configs),
            configs.INCREMENTAL_ALTER_CONFIGS: api(configs.incremental_alter_configs),
            replicas.ELECT_LEADERS: api(replicas.elect_leaders),
            replicas.ALTER_PARTITION_REASSIGNMENTS: api(replicas.alter_partition_reassignments),
            replicas.LIST_PARTITION_REASSIGNMENTS: api(replicas.list_partition_reassignments),
        }
        # NOT_ADVERTISED: built, unreachable until listed in SUPPORTED_VERSIONS (groups.py says why)
        assert set(self._apis) == set(SUPPORTED_VERSIONS) | set(NOT_ADVERTISED), (
            "an api advertised without a handler"
        )

    # ------------------------------------------------------------------------- what a backend asks

    @staticmethod
    def recognises(first: Buffer) -> bool | None:
        """Whether a connection's first bytes may begin a Kafka request (its api key's high byte
        is zero where ours have our magic)."""
        return starts_like_kafka(first)

    @staticmethod
    def decoder(max_frame_bytes: int, auth: ConnectionAuth) -> KafkaFrameDecoder:
        """A connection's decoder, which reads `auth` for the bare tokens of a SaslHandshake v0."""
        return kafka_decoder(max_frame_bytes, auth)

    @staticmethod
    def reply_reserve(request: KafkaRequest | RawSaslToken) -> int:
        """Nothing held ahead: a Fetch's reply is counted once it is read."""
        return 0

    @staticmethod
    def error_reply(request: KafkaRequest | RawSaslToken, exc: BaseException) -> None:
        """None: a failure while carrying out a request's outcome has no Kafka answer here (the
        APIs give their outcomes their own `fail`); the backend closes the connection."""
        return None

    def handle(self, request: KafkaRequest | RawSaslToken, auth: ConnectionAuth | None = None) -> Outcome:
        """The outcome of one Kafka request on a connection whose authentication state is `auth`
        (None: an unauthenticated-listener default, for tests). Raises `ProtocolError` when the
        connection must close (a request we cannot answer in a shape the client reads, one
        before a required authentication, or a bare token that fails the exchange)."""
        if isinstance(request, RawSaslToken):
            assert auth is not None, "bare tokens come only from a connection's decoder"
            return sasl.raw_token(request.token, auth)
        if auth is not None:
            sasl.gate(request, auth)
        self.ctx.auth = auth or ConnectionAuth("")
        key, version = request.api_key, request.api_version
        if key == API_VERSIONS and version > SUPPORTED_VERSIONS[API_VERSIONS][1]:
            return self._api_versions_unsupported(request)
        if key == produce.PRODUCE and version < produce.REFUSED_BELOW:
            return produce.produce_refused(self.ctx, request)
        if key == OFFSET_FOR_LEADER_EPOCH and version < KIO_FROM:  # decoded (and checked) there
            principal, allowed = self.ctx.auth.principal, self.authorizer.allowed
            may = (
                (lambda name: allowed(principal, "describe", "topic", name))
                if self.authorizer.enabled
                else None
            )
            return offset_for_leader_epoch_v0(self.core, request, may)
        supported = SUPPORTED_VERSIONS.get(key)
        if supported is None or not supported[0] <= version <= supported[1]:
            return self._unsupported(request)
        try:
            if key == produce.PRODUCE and len(request.data) >= HAND_DECODED_FROM:
                body, client_id = decode_produce(request)  # its records left where they arrived
            else:
                schema = request_schema(key, version)
                assert schema is not None, f"kio lacks api {key} v{version}"
                body, client_id = decode_request(request, schema)
        except KafkaDecodeError as exc:
            # Kafka closes on a request it cannot parse: the client's bytes are not what it
            # declared, and no response shape would be read right.
            raise ProtocolError(f"malformed kafka request: {exc}") from exc
        self.groups.client_id = client_id or ""  # member ids are made from it
        if self.authorizer.enabled:
            refused = authorize.check(self.authorizer, self.ctx.auth.principal, request, body)
            if refused is not None:
                self.core.metrics.error()
                self.core.metrics.denied()
                return refused
        if key in _PARTITIONS_OF and _named_count(key, body) > OPEN_AT_ONCE:
            first = self.core.unopened(self._named(key, body))
            if len(first) > OPEN_AT_ONCE:
                auth = self.ctx.auth

                def then() -> Outcome:
                    self.ctx.auth = auth  # another connection's requests ran meanwhile
                    return self._answer(request, body)

                return Opening(first, then)
        return self._answer(request, body)

    def _answer(self, request: KafkaRequest, body: Any) -> Outcome:
        key = request.api_key
        try:
            return self._apis[key](request, body)
        except Exception as exc:  # a bug here must close one connection, not stop the core's loop
            log.exception("kafka api %d v%d failed", key, request.api_version)
            raise ProtocolError(
                f"internal error answering kafka api {key} v{request.api_version}: {exc}"
            ) from exc

    def _named(self, key: int, body: Any) -> Iterator[tuple[str, int]]:
        """The (topic, partition) a Produce, Fetch or ListOffsets names, of the topics its
        principal may use there: those it would open."""
        may_use = self.ctx.may_use
        topics, name, partitions, index = _PARTITIONS_OF[key]
        for t in getattr(body, topics):
            topic = getattr(t, name)
            if may_use(key, topic):
                yield from ((topic, int(getattr(p, index))) for p in getattr(t, partitions))

    def _acl_api(self, api: Callable[[KafkaRequest, Any], Outcome]) -> Callable[[KafkaRequest, Any], Outcome]:
        """An ACL admin api, answered SECURITY_DISABLED where ACLs are off (no authentication), as
        a Kafka broker without an authorizer answers."""

        def answer(request: KafkaRequest, body: Any) -> Outcome:
            if self.authorizer.enabled:
                return api(request, body)
            schema = response_schema(request.api_key, request.api_version)
            assert schema is not None
            message = "ACLs are on only where clients authenticate (SASL or mutual TLS): docs/SECURITY.md"
            resp = error_response(request.api_key, schema, body, ErrorCode.security_disabled, message)
            return Reply(encode_response(request.correlation_id, resp))

        return answer

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
        whatever version it asked (Kafka's own answer to a newer client). Not counted as an
        error: every newer client (Java 4.x sends v4 first) negotiates this way."""
        schema = response_schema(API_VERSIONS, 0)
        assert schema is not None
        module = sys.modules[schema.__module__]
        resp = schema(error_code=ErrorCode.unsupported_version, api_keys=self._api_keys(module))
        return Reply(encode_response(request.correlation_id, resp))

    def _unsupported(self, request: KafkaRequest) -> Outcome:
        """An api or version we do not answer: a response of its own shape with a Kafka error
        in every error code (broker/kafka/unsupported.py says which), the request's items
        answered one for one. Closes only when the request cannot be read: kio has no schema for
        that api and version, or its bytes do not parse."""
        key, version = request.api_key, request.api_version
        schema = request_schema(key, version)
        answer = response_schema(key, version)
        if schema is None or answer is None:
            raise ProtocolError(
                f"kafka api {key} v{version} is not supported and has no known schema: closing the connection"
            )
        try:
            body, _client_id = decode_request(request, schema)
        except KafkaDecodeError as exc:
            raise ProtocolError(f"malformed kafka request: {exc}") from exc
        self.core.metrics.error()
        if key == produce.PRODUCE and int(body.acks) == 0:
            return Silent()  # acks=0: the client reads no answer, not even an error
        supported = key in SUPPORTED_VERSIONS
        code = error_for(key, supported)
        name = api_name(key)
        if supported:
            lo, hi = SUPPORTED_VERSIONS[key]
            message = f"{name} v{version} is not supported: ringlog answers v{lo}-{hi}"
        else:
            message = f"ringlog does not implement {name}"
        resp = error_response(key, answer, body, code, message)
        return Reply(encode_response(request.correlation_id, resp))
