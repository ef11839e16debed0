"""The Kafka adapter: Kafka requests in, calls on the protocol-neutral core, outcomes out.

Rules this module keeps:
- One `KafkaAdapter` per core, beside that core's `Core`; `handle(request)` returns an
  `Outcome` (broker/core/outcomes.py) that the backend carries out as it does ours, in the same
  reply slots, so replies keep request order. The core never learns which protocol asked: what
  both protocols need is a protocol-neutral method of `Core` (`metadata_view`,
  `partition_named`, `create_topic`, `delete_topic`, `producer_ids`) or of `Partition`
  (`produce`, the one door of a produce), encoded here. An API group of its own lives in its
  own module (InitProducerId: init_producer_id.py), registered in `_apis`.
- A Kafka Produce or Fetch names many partitions; ours names one. Each partition becomes its own
  outcome (an `Append` from `Partition.produce`, a `Read` of an extent: stored batches are sent
  as they are) and the request one `Gather` of them, whose `finish` writes the one response once
  every part is done (a Produce of one partition: its `Append` answers the request itself).
  Produce and Fetch responses are written by broker/kafka/fast_encode.py (the hot path), every
  other response by kio. A Fetch answers at once when what it can read reaches min_bytes (at least
  one byte), when a partition has an error, or at its deadline; otherwise it waits (`Wait`) on
  every partition of ours it names, and looks again when any of them grows. No fetch sessions:
  session id 0 (full fetches); an incremental one is FETCH_SESSION_ID_NOT_FOUND, as Kafka
  answers a session it does not know. No transactions: last stable offset = high watermark.
- A partition of another core is answered NOT_LEADER_OR_FOLLOWER, never forwarded: Metadata names
  its owning core the leader at that core's own port, so a stock client refreshes Metadata and
  goes there (librdkafka, kafka-python and Java all do), and one request is never split between
  cores. acks: 0 answers nothing, 1 after the write, -1 after the fsync (our acks=2).
- The consumer-group APIs (FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, OffsetCommit,
  OffsetFetch, DescribeGroups, ListGroups) are broker/kafka/groups.py's, entered in the same
  table; they answer for the groups this core coordinates and NOT_COORDINATOR for the others.
- Only what `SUPPORTED_VERSIONS` lists is advertised in ApiVersions, and only that is answered
  by a handler. An ApiVersions above our highest version gets UNSUPPORTED_VERSION in a v0
  response listing our versions (as Kafka brokers answer, so the client retries at a version we
  have). Any other api or version kio knows gets a Kafka error in a response of its own shape,
  the request's items answered one for one (broker/kafka/unsupported.py); only a request kio has
  no schema for, or whose bytes do not parse, closes the connection with one log line
  (`ProtocolError`).
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
import struct
import sys
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Gather, Outcome, Read, Reply, Silent, Wait
from broker.core.partition import Isolation, Partition, PendingRead, Stored
from broker.core.views import MetadataView, NodeView, kafka_broker_id
from broker.kafka import acl_admin, authorize, init_producer_id, sasl
from broker.kafka.codec import (
    KafkaDecodeError,
    KafkaRequest,
    decode_request,
    encode_response,
    make,
    request_schema,
    response_schema,
)
from broker.kafka.errors import DONE, NotLeaderError, TopicNotAuthorized, kafka_error
from broker.kafka.fast_encode import fetch_response, produce_response
from broker.kafka.groups import GROUP_VERSIONS, KafkaGroups
from broker.kafka.leader_epoch import (
    KIO_FROM,
    OFFSET_FOR_LEADER_EPOCH,
    offset_for_leader_epoch,
    offset_for_leader_epoch_v0,
)
from broker.kafka.unsupported import api_name, error_for, error_response
from broker.security.session import ConnectionAuth
from broker.storage.diskspace import is_out_of_space
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import ProtocolError
from ringlog_proto.messages import Acks

log = logging.getLogger(__name__)

PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = init_producer_id.INIT_PRODUCER_ID
# api key -> (lowest, highest) version answered: what ApiVersions advertises, nothing more.
SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (0, 8),  # advertised from 0, but v0-2 are refused (see `_produce_refused`); v9+ flexible
    FETCH: (4, 11),  # v12+ are flexible
    LIST_OFFSETS: (1, 5),  # v6+ are flexible
    METADATA: (0, 8),  # v9+ are flexible
    API_VERSIONS: (0, 3),  # v3 is flexible in its request header only; its response header is v0
    CREATE_TOPICS: (2, 4),  # v0-1: kio has no schema for them; v5+ are flexible
    DELETE_TOPICS: (1, 3),  # v0: kio has no schema for it; v4+ are flexible
    INIT_PRODUCER_ID: init_producer_id.VERSIONS,  # v2+ flexible (kio writes their headers)
    OFFSET_FOR_LEADER_EPOCH: (0, 3),  # v0-1 read here (kio has v2+); v4+ are flexible
    **GROUP_VERSIONS,  # FindCoordinator, Join/Sync/Heartbeat/LeaveGroup, offsets: broker/kafka/groups.py
    **sasl.VERSIONS,  # SaslHandshake, SaslAuthenticate: broker/kafka/sasl.py
    **acl_admin.VERSIONS,  # DescribeAcls, CreateAcls, DeleteAcls: broker/kafka/acl_admin.py
}
PRODUCE_REFUSED_BELOW: Final = 3  # librdkafka < 2.11 stops compressing unless Produce v0 is listed
# Kafka acks -> ours: -1 (all in-sync replicas) is our acks=all: once the high watermark passes
# the batches when the partition is replicated, else (the one copy) after the fsync, as acks=2.
_ACKS: Final[dict[int, Acks]] = {0: Acks.NONE, 1: Acks.WRITTEN, -1: Acks.ALL}
FETCH_PARTITION_MAX: Final = 64 << 20  # a partition's share of one fetch, whatever it asks
FETCH_WAIT_MAX_MS: Final = 30_000
# Fetch sessions (v7+): the epochs of a full fetch; any other asks for a session we never create
FETCH_SESSION_INITIAL: Final = 0
FETCH_SESSION_FINAL: Final = -1
READ_COMMITTED: Final = 1  # Fetch isolation_level


def cluster_id_for(data_dir: str) -> str:
    """A stable cluster id (22 characters, the length of Kafka's base64 UUIDs) derived from the
    data dir's real path (one node: the same broker always says the same, two data dirs differ)
    or from "cluster:<name>" (every node of a cluster says the same)."""
    name = data_dir if data_dir.startswith("cluster:") else os.path.realpath(data_dir)
    digest = hashlib.sha256(name.encode()).digest()[:16]
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


_GONE = NodeView(-1, "", 0, 0, (), live=False)  # a replica's node the view does not know


class KafkaAdapter:
    """Kafka's APIs on one core, over that core's `Core`."""

    def __init__(self, core: Core, config: BrokerConfig) -> None:
        self.core = core
        self.config = config
        # one id for the whole cluster (librdkafka refuses brokers that disagree); alone: per data dir
        self.cluster_id = cluster_id_for(
            config.data_dir if config.cluster is None else f"cluster:{config.cluster.name}"
        )
        self.groups = KafkaGroups(core)
        self.groups.may_describe = lambda group: authorize.may_describe_group(
            self.authorizer, self._auth.principal, group
        )
        # one SASL server and one set of ACL decisions per core, shared with our protocol
        self.authenticator = core.authenticator
        self.authorizer = core.authorizer
        self._auth = ConnectionAuth("")  # the connection of the request being handled
        cluster_acls = config.cluster.acls if config.cluster is not None else None
        acls = acl_admin.AclAdmin(self.authorizer.store, cluster_acls, core.run_blocking)
        # api key -> its handler; SUPPORTED_VERSIONS says which versions reach it
        self._apis: dict[int, Callable[[KafkaRequest, Any], Outcome]] = {
            API_VERSIONS: lambda request, _body: self._api_versions(request),
            PRODUCE: self._produce,
            FETCH: self._fetch_request,
            LIST_OFFSETS: self._list_offsets,
            METADATA: self._metadata,
            CREATE_TOPICS: self._create_topics,
            DELETE_TOPICS: self._delete_topics,
            INIT_PRODUCER_ID: lambda request, body: init_producer_id.init_producer_id(core, request, body),
            OFFSET_FOR_LEADER_EPOCH: lambda request, body: offset_for_leader_epoch(self.core, request, body),
            **self.groups.apis(),
            sasl.SASL_HANDSHAKE: lambda request, body: sasl.handshake(
                self.authenticator, request, body, self._auth
            ),
            sasl.SASL_AUTHENTICATE: lambda request, body: sasl.authenticate(
                self.authenticator, request, body, self._auth
            ),
            acl_admin.DESCRIBE_ACLS: self._acl_api(acls.describe),
            acl_admin.CREATE_ACLS: self._acl_api(acls.create),
            acl_admin.DELETE_ACLS: self._acl_api(acls.delete),
        }
        assert set(self._apis) == set(SUPPORTED_VERSIONS), "an api advertised without a handler"

    def handle(self, request: KafkaRequest, auth: ConnectionAuth | None = None) -> Outcome:
        """The outcome of one Kafka request on a connection whose authentication state is `auth`
        (None: an unauthenticated-listener default, for tests). Raises `ProtocolError` when the
        connection must close (a request we cannot answer in a shape the client reads, or one
        before a required authentication)."""
        if auth is not None:
            sasl.gate(request, auth)
        self._auth = auth or ConnectionAuth("")
        key, version = request.api_key, request.api_version
        if key == API_VERSIONS and version > SUPPORTED_VERSIONS[API_VERSIONS][1]:
            return self._api_versions_unsupported(request)
        if key == PRODUCE and version < PRODUCE_REFUSED_BELOW:
            return self._produce_refused(request)
        if key == OFFSET_FOR_LEADER_EPOCH and version < KIO_FROM:  # decoded (and checked) there
            principal, allowed = self._auth.principal, self.authorizer.allowed
            may = (
                (lambda name: allowed(principal, "describe", "topic", name))
                if self.authorizer.enabled
                else None
            )
            return offset_for_leader_epoch_v0(self.core, request, may)
        supported = SUPPORTED_VERSIONS.get(key)
        if supported is None or not supported[0] <= version <= supported[1]:
            return self._unsupported(request)
        schema = request_schema(key, version)
        assert schema is not None, f"kio lacks api {key} v{version}"
        try:
            body, client_id = decode_request(request, schema)
        except KafkaDecodeError as exc:
            # Kafka closes on a request it cannot parse: the client's bytes are not what it
            # declared, and no response shape would be read right.
            raise ProtocolError(f"malformed kafka request: {exc}") from exc
        self.groups.client_id = client_id or ""  # member ids are made from it
        if self.authorizer.enabled:
            refused = authorize.check(self.authorizer, self._auth.principal, request, body)
            if refused is not None:
                self.core.metrics.error()
                self.core.metrics.denied()
                return refused
        try:
            return self._apis[key](request, body)
        except Exception as exc:  # a bug here must close one connection, not stop the core's loop
            log.exception("kafka api %d v%d failed", key, version)
            raise ProtocolError(f"internal error answering kafka api {key} v{version}: {exc}") from exc

    # ------------------------------------------------------------------------- ApiVersions

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

    # ------------------------------------------------------------------------- Metadata

    def _metadata(self, request: KafkaRequest, body: Any) -> Outcome:
        # v0: an empty list means every topic; v1+: null means every topic, empty means none.
        if body.topics is None or (request.api_version == 0 and not body.topics):
            names: list[str] | None = None
        else:
            names = [t.name for t in body.topics]
        view = self.core.metadata_view(names)
        schema = response_schema(METADATA, request.api_version)
        assert schema is not None
        may: Callable[[str], bool] | None = None
        if self.authorizer.enabled:
            principal, allowed = self._auth.principal, self.authorizer.allowed
            may = lambda name: allowed(principal, "describe", "topic", name)  # noqa: E731
        resp = self.metadata_response(schema, view, may, listed_all=names is None)
        return Reply(encode_response(request.correlation_id, resp))

    def metadata_response(
        self,
        schema: type[Any],
        view: MetadataView,
        may_describe: Callable[[str], bool] | None = None,
        listed_all: bool = False,
    ) -> Any:
        """`view` as the Metadata response of `schema`'s version: every core of every node a
        broker (`kafka_broker_id`), each partition led by the core serving it on its leader node.
        With `may_describe` (ACLs on), a topic the principal may not describe is left out of a
        listing of every topic and answered TOPIC_AUTHORIZATION_FAILED when asked for by name,
        whether or not it exists (its existence is not told either)."""
        module = sys.modules[schema.__module__]
        brokers = tuple(
            make(
                module.MetadataResponseBroker,
                node_id=kafka_broker_id(node.node_id, core),
                host=node.host,
                port=node.core_port(core),
                rack=node.rack or None,
            )
            for node in view.nodes
            if node.live
            for core in range(node.cores)
        )
        topics = []
        for t in view.topics:
            refused: ErrorCode | None = None
            if may_describe is not None and not may_describe(t.name):
                if listed_all:
                    continue  # left out of a listing of every topic
                refused = ErrorCode.topic_authorization_failed  # whether or not it exists
            elif not t.known:
                refused = ErrorCode.unknown_topic_or_partition
            if refused is not None:
                topics.append(
                    make(
                        module.MetadataResponseTopic,
                        error_code=refused,
                        name=t.name,
                        is_internal=False,
                        partitions=(),
                    )
                )
                continue
            partitions = tuple(
                make(
                    module.MetadataResponsePartition,
                    error_code=ErrorCode.none if p.leader_node >= 0 else ErrorCode.leader_not_available,
                    partition_index=p.index,
                    leader_id=kafka_broker_id(p.leader_node, p.owner_core) if p.leader_node >= 0 else -1,
                    leader_epoch=p.leader_epoch,
                    replica_nodes=tuple(kafka_broker_id(n, c) for n, c in p.replicas),
                    isr_nodes=tuple(kafka_broker_id(n, c) for n, c in p.isr),
                    offline_replicas=tuple(
                        kafka_broker_id(n, c) for n, c in p.replicas if not (view.node(n) or _GONE).live
                    ),
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
            controller_id=kafka_broker_id(view.controller, 0),
            topics=tuple(topics),
        )

    # ------------------------------------------------------------------------- Produce

    def _topic_refusal(self, api_key: int, topic: str) -> TopicNotAuthorized | None:
        """Why the request's principal may not use `topic` in this api (broker/kafka/authorize.py
        `PER_TOPIC`), or None when it may."""
        authorizer = self.authorizer
        if not authorizer.enabled:
            return None
        op = authorize.PER_TOPIC[api_key]
        if authorizer.allowed(self._auth.principal, op, "topic", topic):
            return None
        self.core.metrics.denied()
        return TopicNotAuthorized(f"not authorized: {op} topic {topic}")

    def _produce(self, request: KafkaRequest, body: Any) -> Outcome:
        """Each partition through `Partition.produce`, the one door of a produce, as its own part
        of one `Gather`; the answers are combined into one response once every part is done.
        A partition of another core answers NOT_LEADER_OR_FOLLOWER (module rules)."""
        version = request.api_version
        acks = _ACKS.get(int(body.acks))
        core = self.core
        # (topic, index) -> (error, base offset, log start offset, message), filled by the parts
        results: dict[tuple[str, int], tuple[ErrorCode, int, int, str | None]] = {}
        order: list[tuple[str, list[int]]] = []
        parts: list[Outcome] = []

        def refused(key: tuple[str, int], exc: BaseException) -> Reply:
            code, message = kafka_error(exc)
            results[key] = (code, -1, -1, message)
            return DONE

        def stored(key: tuple[str, int], at: Stored) -> Reply:
            results[key] = (ErrorCode.none, at.base_offset, at.log_start_offset, None)
            return DONE

        for topic in body.topic_data:
            indexes: list[int] = []
            order.append((topic.name, indexes))
            refusal = self._topic_refusal(PRODUCE, topic.name)
            for data in topic.partition_data:
                key = (topic.name, int(data.index))
                indexes.append(key[1])
                if refusal is not None:
                    results[key] = (ErrorCode.topic_authorization_failed, -1, -1, str(refusal))
                    continue
                if acks is None:
                    results[key] = (ErrorCode.invalid_required_acks, -1, -1, f"acks {body.acks}")
                    continue
                try:
                    part = self._produce_partition(key, data.records, acks, refused, stored)
                except Exception as exc:  # refused before anything was written
                    code, message = kafka_error(exc)
                    if is_out_of_space(exc):
                        core.space.saw_full(exc)
                    results[key] = (code, -1, -1, message)
                    continue
                if part is not None:
                    parts.append(part)

        def finish() -> Reply | Silent:
            if acks == Acks.NONE:
                return Silent()
            topics = [(name, [(i, *results[(name, i)]) for i in indexes]) for name, indexes in order]
            return Reply(produce_response(version, request.correlation_id, topics))

        if len(parts) == 1 and len(results) == 0 and isinstance(parts[0], Append):
            # The common request, one partition: its append answers the request itself, without
            # the gather's bookkeeping (the same calls, in the same order, as its part would make).
            one = parts[0]

            def answer() -> Reply | Silent:
                one.answer()  # the partition's result, which `finish` reads
                return finish()

            def fail(exc: BaseException) -> Reply | Silent:
                one.fail(exc)
                return finish()

            return Append(one.partition, one.pending, one.acks, one.publish, answer, fail)
        return Gather(parts, finish)

    def _produce_partition(
        self,
        key: tuple[str, int],
        records: bytes | None,
        acks: Acks,
        refused: Any,
        stored: Any,
    ) -> Outcome | None:
        """One partition's part of a Produce: None when it is answered already (`refused` or
        `stored` called), else the outcome that stores it. Raises what refuses it at once."""
        target = self.core.partition_named(*key)
        if not isinstance(target, Partition):
            refused(key, NotLeaderError(f"partition {key[1]} of {key[0]!r} is led by core {target}"))
            return None
        if not records:
            raise ValueError("a produce without records")
        if acks == Acks.ALL and target.replica is not None:
            target.check_replicas()
        produced = target.produce(bytes(records), self.core.space)
        if isinstance(produced, Stored):  # a retry of batches already stored
            reply = stored(key, produced)
            waiting = self.core.stored_reply(target, acks, produced, reply, lambda exc: refused(key, exc))
            return None if waiting is reply else waiting

        def answer() -> Reply:
            return stored(key, produced.stored())

        def fail(exc: BaseException) -> Reply:
            produced.fail()
            if is_out_of_space(exc):
                self.core.space.saw_full(exc)
            return refused(key, exc)

        return Append(target, produced.pending, acks, produced.complete, answer, fail)

    def _produce_refused(self, request: KafkaRequest) -> Outcome:
        """Produce v0-2 (advertised, never answered with data): UNSUPPORTED_VERSION for every
        partition, in the v0-2 response written by hand (kio has no schemas for them)."""
        self.core.metrics.error()
        try:
            topics = _produce_v0_topics(request.data)
        except (struct.error, ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed kafka produce v{request.api_version}: {exc}") from exc
        if topics is None:  # acks=0: no answer at all
            return Silent()
        out = [struct.pack(">ii", request.correlation_id, len(topics))]
        for name, indexes in topics:
            raw = name.encode()
            out.append(struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(indexes)))
            for i in indexes:
                out.append(struct.pack(">ihq", i, int(ErrorCode.unsupported_version), -1))
                if request.api_version >= 2:
                    out.append(struct.pack(">q", -1))
        if request.api_version >= 1:
            out.append(struct.pack(">i", 0))
        body = b"".join(out)
        return Reply([struct.pack(">i", len(body)) + body])

    # ------------------------------------------------------------------------- Fetch

    def _fetch_request(self, request: KafkaRequest, body: Any) -> Outcome:
        deadline = now_ms() + min(max(0, int(body.max_wait.total_seconds() * 1000)), FETCH_WAIT_MAX_MS)
        if int(getattr(body, "session_epoch", -1)) not in (FETCH_SESSION_INITIAL, FETCH_SESSION_FINAL):
            # An incremental fetch of a session we never created (we answer session id 0): what
            # Kafka answers for an unknown session; the client starts over with a full fetch.
            return self._fetch_session_unknown(request)
        return self._fetch(request, body, deadline)

    def _fetch(self, request: KafkaRequest, body: Any, deadline_ms: int, final: bool = False) -> Outcome:
        """Each partition's batches as a plain extent read (one `Read` part each, stored bytes
        sent as they are). Answered at once when a partition has an error, when what can be read
        reaches min_bytes (at least one byte: min_bytes 0 never waits) or at the deadline (`final`);
        otherwise it waits on every partition of ours it names, until one grows (then it looks
        again) or the deadline passes (then it answers with what there is)."""
        # (topic, index) -> (error, high watermark, log start, records)
        results: dict[tuple[str, int], tuple[ErrorCode, int, int, bytes]] = {}
        order: list[tuple[str, list[int]]] = []
        parts: list[Outcome] = []
        ours: dict[Partition, None] = {}  # the partitions of this core it names, once each
        readable = 0
        failed = False
        for topic in body.topics:
            indexes: list[int] = []
            order.append((topic.topic, indexes))
            refusal = self._topic_refusal(FETCH, topic.topic)
            for fp in topic.partitions:
                key = (topic.topic, int(fp.partition))
                indexes.append(key[1])
                try:
                    if refusal is not None:
                        raise refusal
                    target = self.core.partition_named(*key)
                    if not isinstance(target, Partition):
                        raise NotLeaderError(f"led by core {target}")
                    limit = min(max(int(fp.partition_max_bytes), 1), FETCH_PARTITION_MAX)
                    epoch = int(getattr(fp, "current_leader_epoch", -1))
                    read = target.read(int(fp.fetch_offset), limit, Isolation.HIGH_WATERMARK, epoch)
                except Exception as exc:
                    code, _ = kafka_error(exc)
                    results[key] = (code, -1, -1, b"")
                    failed = True
                    continue
                results[key] = (ErrorCode.none, *read.nothing()[1:], b"")
                ours[target] = None
                if read.extent is not None:
                    readable += read.extent.length
                    parts.append(self._read_part(key, read, results))
        read_committed = int(getattr(body, "isolation_level", 0)) == READ_COMMITTED

        def reply() -> Reply:
            return _fetch_reply(request, order, results, read_committed)

        enough = readable >= max(1, int(body.min_bytes)) or int(body.min_bytes) <= 0
        if not (final or failed or enough or not ours) and deadline_ms > now_ms():

            def again() -> Outcome:
                return self._fetch(request, body, deadline_ms)

            def at_deadline() -> Outcome:
                return self._fetch(request, body, deadline_ms, final=True)

            return Wait(tuple(ours), None, deadline_ms, at_deadline, again)

        return Gather(parts, reply)

    def _fetch_session_unknown(self, request: KafkaRequest) -> Outcome:
        schema = response_schema(FETCH, request.api_version)
        assert schema is not None
        resp = make(
            schema,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.fetch_session_id_not_found,
            session_id=0,
            responses=(),
        )
        return Reply(encode_response(request.correlation_id, resp))

    @staticmethod
    def _read_part(key: tuple[str, int], read: PendingRead, results: dict[Any, Any]) -> Read:
        assert read.extent is not None

        def finish(data: bytes) -> Reply:
            records, high_watermark, log_start_offset = read.finish(data)
            results[key] = (ErrorCode.none, high_watermark, log_start_offset, records)
            return DONE

        def fail(exc: BaseException) -> Reply:
            results[key] = (kafka_error(exc)[0], -1, -1, b"")
            return DONE

        return Read(read.extent, finish, fail)

    # ------------------------------------------------------------------------- ListOffsets

    def _list_offsets(self, request: KafkaRequest, body: Any) -> Outcome:
        """-1: the end of the log, -2: its start, a timestamp: the first offset at or after it
        (-1 when none is), each partition answered on its own."""
        schema = response_schema(LIST_OFFSETS, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        topics = []
        for topic in body.topics:
            partitions = []
            refusal = self._topic_refusal(LIST_OFFSETS, topic.name)
            for lp in topic.partitions:
                index, spec = int(lp.partition_index), int(lp.timestamp)
                code, offset, epoch = ErrorCode.none, -1, -1
                try:
                    if refusal is not None:
                        raise refusal
                    target = self.core.partition_named(topic.name, index)
                    if not isinstance(target, Partition):
                        raise NotLeaderError(f"led by core {target}")
                    offset = target.list_offset(spec, int(getattr(lp, "current_leader_epoch", -1)))
                    epoch = target.leader_epoch
                except Exception as exc:
                    code = kafka_error(exc)[0]
                partitions.append(
                    make(
                        module.ListOffsetsPartitionResponse,
                        partition_index=index,
                        error_code=code,
                        timestamp=-1,
                        offset=offset,
                        leader_epoch=epoch if code == ErrorCode.none else -1,
                    )
                )
            topics.append(
                make(module.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions))
            )
        resp = make(schema, throttle_time=datetime.timedelta(0), topics=tuple(topics))
        return Reply(encode_response(request.correlation_id, resp))

    # ------------------------------------------------------------------------- Create/DeleteTopics

    def _create_topics(self, request: KafkaRequest, body: Any) -> Outcome:
        """Each topic through the core's `create_topic`. num_partitions -1 is one partition;
        replication_factor must be -1 or 1 (one copy: no replication yet); manual assignments
        are refused; retention.ms, retention.bytes and segment.bytes are read (-1: forever),
        other configs are accepted and ignored."""
        schema = response_schema(CREATE_TOPICS, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        if self.core.config.cluster is not None:
            return self._create_topics_in_cluster(request, body, schema, module)
        results = []
        for t in body.topics:
            code, message = ErrorCode.none, None
            try:
                if int(t.replication_factor) not in (-1, 1):
                    code, message = (
                        ErrorCode.invalid_replication_factor,
                        "ringlog keeps one copy: replication factor -1 or 1",
                    )
                elif t.assignments:
                    code, message = ErrorCode.invalid_request, "manual replica assignment is not supported"
                else:
                    limits = _topic_limits(t.configs)
                    partitions = 1 if int(t.num_partitions) == -1 else int(t.num_partitions)
                    if body.validate_only:
                        if t.name in self.core.registry.by_name:
                            code, message = ErrorCode.topic_already_exists, f"topic {t.name!r} already exists"
                    else:
                        self.core.create_topic(t.name, partitions, *limits)
            except Exception as exc:
                code, message = kafka_error(exc)
            results.append(
                make(module.CreatableTopicResult, name=t.name, error_code=code, error_message=message)
            )
        resp = make(schema, throttle_time=datetime.timedelta(0), topics=tuple(results))
        return Reply(encode_response(request.correlation_id, resp))

    def _create_topics_in_cluster(
        self, request: KafkaRequest, body: Any, schema: Any, module: Any
    ) -> Outcome:
        """A cluster's CreateTopics: each topic created in the store (replication -1 is the
        cluster's default; placement over the live nodes), off the loop, in one answer."""
        calls = self.core.config.cluster.calls  # type: ignore[union-attr]
        registry = self.core.registry

        def create_all() -> list[tuple[str, ErrorCode, str | None]]:
            out = []
            for t in body.topics:
                code, message = ErrorCode.none, None
                try:
                    if t.assignments:
                        raise _Refused(
                            ErrorCode.invalid_request, "manual replica assignment is not supported"
                        )
                    limits = _topic_limits(t.configs)
                    partitions = 1 if int(t.num_partitions) == -1 else int(t.num_partitions)
                    if body.validate_only:
                        registry.make(t.name, partitions, 1, *limits)
                    else:
                        calls.create_topic(
                            registry, t.name, partitions, *limits, replication=int(t.replication_factor)
                        )
                except _Refused as exc:
                    code, message = exc.code, str(exc)
                except Exception as exc:
                    code, message = kafka_error(exc)
                    if "replication factor" in str(exc):
                        code = ErrorCode.invalid_replication_factor
                out.append((t.name, code, message))
            return out

        def answer(results: Any) -> Reply:
            if isinstance(results, BaseException):
                code, message = kafka_error(results)
                results = [(t.name, code, message) for t in body.topics]
            topics = tuple(
                make(module.CreatableTopicResult, name=n, error_code=c, error_message=msg)
                for n, c, msg in results
            )
            resp = make(schema, throttle_time=datetime.timedelta(0), topics=topics)
            return Reply(encode_response(request.correlation_id, resp))

        def created(results: list[tuple[str, ErrorCode, str | None]]) -> bool:
            return all(n in registry.by_name for n, code, _ in results if code == ErrorCode.none)

        return self.core.in_cluster(create_all, answer, until=created)

    def _delete_topics(self, request: KafkaRequest, body: Any) -> Outcome:
        """Each topic through the core's `delete_topic` (which tells the other cores first); one
        answer once every deletion is done."""
        schema = response_schema(DELETE_TOPICS, request.api_version)
        assert schema is not None
        module = sys.modules[schema.__module__]
        codes: dict[str, ErrorCode] = {}
        parts: list[Outcome] = []
        names = list(body.topic_names or ())
        cluster = self.core.config.cluster
        if cluster is not None:
            calls = cluster.calls

            def delete_all() -> dict[str, ErrorCode]:
                for name in names:
                    try:
                        calls.delete_topic(name)
                        codes[name] = ErrorCode.none
                    except Exception as exc:
                        codes[name] = kafka_error(exc)[0]
                return codes

            def answered(result: Any) -> Reply:
                if isinstance(result, BaseException):
                    for name in names:
                        codes.setdefault(name, kafka_error(result)[0])
                results = tuple(make(module.DeletableTopicResult, name=n, error_code=codes[n]) for n in names)
                resp = make(schema, throttle_time=datetime.timedelta(0), responses=results)
                return Reply(encode_response(request.correlation_id, resp))

            registry = self.core.registry

            def deleted(codes: dict[str, ErrorCode]) -> bool:
                return all(n not in registry.by_name for n, code in codes.items() if code == ErrorCode.none)

            return self.core.in_cluster(delete_all, answered, until=deleted)
        for name in names:
            codes[name] = ErrorCode.none
            try:
                parts.append(self.core.delete_topic(name, lambda: DONE))
            except Exception as exc:
                codes[name] = kafka_error(exc)[0]

        def finish() -> Reply:
            results = tuple(make(module.DeletableTopicResult, name=n, error_code=codes[n]) for n in names)
            resp = make(schema, throttle_time=datetime.timedelta(0), responses=results)
            return Reply(encode_response(request.correlation_id, resp))

        return Gather(parts, finish)

    # ------------------------------------------------------------------------- anything else

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
        if key == PRODUCE and int(body.acks) == 0:
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


def _fetch_reply(
    request: KafkaRequest,
    order: list[tuple[str, list[int]]],
    results: dict[tuple[str, int], tuple[ErrorCode, int, int, bytes]],
    read_committed: bool,
) -> Reply:
    """The Fetch response (written by fast_encode.py). No transactions: the last stable offset
    is the high watermark, and read_committed gets an empty aborted-transactions list
    (read_uncommitted: null)."""
    aborted = () if read_committed else None
    topics = []
    for name, indexes in order:
        partitions = []
        for i in indexes:
            code, high, start, records = results[(name, i)]
            partitions.append((i, int(code), high, high, start, aborted, records))
        topics.append((name, partitions))
    return Reply(fetch_response(request.api_version, request.correlation_id, 0, 0, topics))  # type: ignore[arg-type]


def _topic_limits(configs: Any) -> tuple[int, int, int]:
    """retention_ms, retention_bytes, segment_bytes from CreateTopics configs, as the registry
    reads them: -1 the broker's default, -2 keep forever (Kafka's -1)."""
    values = {c.name: c.value for c in configs or ()}
    out = []
    for key in ("retention.ms", "retention.bytes", "segment.bytes"):
        raw = values.get(key)
        if raw is None:
            out.append(-1)
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"config {key}={raw!r} is not a number") from None
        out.append(-2 if value == -1 and key != "segment.bytes" else value)
    return out[0], out[1], out[2]


def _produce_v0_topics(data: bytes) -> list[tuple[str, list[int]]] | None:
    """The topics and partitions of a Produce v0-2 request (header v1), None when acks=0."""
    pos = 8  # api key, version, correlation id
    (n,) = struct.unpack_from(">h", data, pos)
    pos += 2 + max(n, 0)
    acks, _timeout, count = struct.unpack_from(">hii", data, pos)
    pos += 10
    topics = []
    for _ in range(count):
        (n,) = struct.unpack_from(">h", data, pos)
        name = data[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        (parts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        indexes = []
        for _ in range(parts):
            index, size = struct.unpack_from(">ii", data, pos)
            pos += 8 + max(size, 0)
            indexes.append(index)
        topics.append((name, indexes))
    return None if acks == 0 else topics
