"""Authentication and ACLs of ringlog's own protocol, before the handlers act on a frame.

Rules this module keeps:
- One `Access` per core, made by our protocol's adapter (broker/ringlog/adapter.py), over the
  core's SASL server (`authenticator`, None when the listener has no SASL) and ACL decisions
  (`authorizer`). The Kafka adapter uses the same two, so users, ACLs, counters and the failure
  log are one whatever protocol a client speaks.
- The backend hands every client frame of our protocol to `take` with its connection's
  `ConnectionAuth` (never a frame from another core: those are trusted). `take` answers the SASL
  apis itself, refuses what the connection may not do, and returns None for what the handlers
  should serve.
- The exchange (docs/PROTOCOL.md §4.15) is Kafka's SaslHandshake v1 + SaslAuthenticate, in our
  frames: a handshake names the mechanism, then each SaslAuthenticate carries the client's next
  message and its answer the server's. A failed exchange is answered SASL_AUTHENTICATION_FAILED
  with a generic message and the connection closes `AUTH_FAILURE_CLOSE_DELAY_S` later.
- Before authentication (when the listener requires it) only ApiVersions and the SASL apis are
  answered; anything else gets ILLEGAL_SASL_STATE and the connection closes. Kafka closes without
  an answer; ours says why, so a client without credentials reports the cause, not a lost link.
- Every api needs what its Kafka twin needs (broker/kafka/authorize.py): Produce write on the
  topic, Fetch read, ListOffsets describe, CreateTopic create (on the topic, or on the cluster),
  DeleteTopic delete; JoinGroup, SyncGroup, Heartbeat, LeaveGroup read on the group; OffsetCommit
  read on the group and the topic, OffsetFetch describe on both; DescribeConfigs
  describe_configs on the topic, AlterConfigs alter_configs; Stats describe on the cluster;
  InitProducerId, AddPartitionsToTxn (and write on its topics), AddOffsetsToTxn (and read on its
  group), EndTxn, TxnOffsetCommit (and read on its group and topics) and a Produce naming a
  transactional id write on that transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
  ReplicaFetch (a follower's) alter on the cluster. Metadata is filtered instead
  (`RinglogAdapter.metadata_reply`), and creates a missing topic it names (a producer's lookup)
  only for a principal with create on the cluster or the topic, as Kafka's does. A refused
  request is answered TOPIC_, GROUP_ or CLUSTER_AUTHORIZATION_FAILED and has no effect (an
  acks=0 produce: no answer, nothing stored).
  A topic id that names no topic is left to the handlers (UNKNOWN_TOPIC_OR_PARTITION): an id
  tells nothing about a name, and a refusal does not tell it either (its message names the
  operation and the id the client sent, never the topic's name: ids are sequential, and naming
  the topic would undo Metadata's filtering).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from broker.core.core import Core
from broker.core.metrics import CoreMetrics
from broker.core.outcomes import Outcome, Reply, Silent
from broker.security.acls import CLUSTER_NAME
from broker.security.sasl import FAILED_MESSAGE, AuthenticationFailed
from broker.security.session import ConnectionAuth
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame

ALLOWED_BEFORE_AUTH: Final = frozenset(
    (m.ApiKey.API_VERSIONS, m.ApiKey.SASL_HANDSHAKE, m.ApiKey.SASL_AUTHENTICATE)
)
# api -> the operation it needs on the topic its frame header names
_PARTITION_OPS: Final[dict[int, str]] = {
    m.ApiKey.PRODUCE: "write",
    m.ApiKey.FETCH: "read",
    m.ApiKey.LIST_OFFSETS: "describe",
    m.ApiKey.OFFSET_COMMIT: "read",
    m.ApiKey.OFFSET_FETCH: "describe",
}
# api -> the operation it needs on the group its body names
_GROUP_OPS: Final[dict[int, str]] = {
    m.ApiKey.JOIN_GROUP: "read",
    m.ApiKey.SYNC_GROUP: "read",
    m.ApiKey.HEARTBEAT: "read",
    m.ApiKey.LEAVE_GROUP: "read",
    m.ApiKey.OFFSET_COMMIT: "read",
    m.ApiKey.OFFSET_FETCH: "describe",
    m.ApiKey.TXN_OFFSET_COMMIT: "read",
}
# a transactional producer's apis: write on the transactional id their body names (Kafka's
# KafkaApis), a Produce naming one too
_TXN_REQUESTS: Final = (
    m.InitProducerIdRequest,
    m.AddPartitionsToTxnRequest,
    m.AddOffsetsToTxnRequest,
    m.EndTxnRequest,
    m.TxnOffsetCommitRequest,
)
_GROUP_REQUESTS: Final = (
    m.JoinGroupRequest,
    m.SyncGroupRequest,
    m.HeartbeatRequest,
    m.LeaveGroupRequest,
    m.OffsetCommitRequest,
    m.OffsetFetchRequest,
    m.TxnOffsetCommitRequest,
)  # the bodies of _GROUP_OPS's apis
_CLUSTER_OPS: Final[dict[int, str]] = {
    m.ApiKey.STATS: "describe",
    m.ApiKey.REPLICA_FETCH: "alter",
    m.ApiKey.WRITE_TXN_MARKERS: "alter",  # another node's coordinator, as the inter-broker user
    m.ApiKey.FIND_HELD_TXNS: "alter",  # another node's hanging-transaction sweep, the same user
}


class Served(Protocol):
    """What `Access` needs of our protocol's handlers (broker/ringlog/adapter.py), which make it."""

    core: Core
    metrics: CoreMetrics

    def error_answer(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply: ...

    def metadata_reply(
        self,
        req: m.MetadataRequest,
        frame: Frame,
        may_describe: Callable[[str], bool] | None = None,
        may_create: Callable[[str], bool] | None = None,
    ) -> Outcome: ...


class Access:
    """A core's authentication and authorization of our protocol (module rules)."""

    def __init__(self, handlers: Served) -> None:
        self.handlers = handlers
        self.authenticator = handlers.core.authenticator
        self.authorizer = handlers.core.authorizer
        # Whether `take` has anything to do: without SASL and ACLs the handlers answer the SASL
        # apis themselves (no SASL here) and every frame goes straight to them.
        self.active = self.authenticator is not None or self.authorizer.enabled

    def take(self, frame: Frame, auth: ConnectionAuth) -> Outcome | None:
        """The answer to `frame` when it is decided here (SASL, or refused), else None."""
        key = frame.api_key
        if key == m.ApiKey.SASL_HANDSHAKE:
            return self._handshake(frame, auth)
        if key == m.ApiKey.SASL_AUTHENTICATE:
            return self._authenticate(frame, auth)
        if not auth.authenticated and key not in ALLOWED_BEFORE_AUTH:
            return self._closing(
                frame,
                m.ErrorCode.ILLEGAL_SASL_STATE,
                "this broker requires SASL authentication before any other request (docs/SECURITY.md)",
            )
        if not self.authorizer.enabled or m.unsupported(frame) is not None:
            return None  # an unsupported frame is answered so by the handlers, with no effect
        try:
            req = m.decode_request(frame)
        except m.MalformedBody:
            return None  # answered INVALID_REQUEST by the handlers, with no effect
        return self._check(frame, req, auth.principal)

    # ------------------------------------------------------------------------- SASL

    def _reply(self, frame: Frame, resp: m.Response) -> Reply:
        return Reply(m.encode_response(resp, frame.correlation_id))

    def _closing(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply:
        reply = self.handlers.error_answer(frame, code, message)
        reply.then_close = True
        return reply

    def _handshake(self, frame: Frame, auth: ConnectionAuth) -> Outcome:
        authenticator = self.authenticator
        if authenticator is None:
            return self.handlers.error_answer(
                frame, m.ErrorCode.UNSUPPORTED_SASL_MECHANISM, "this listener has no SASL"
            )
        try:
            req = m.decode_request(frame)
        except m.MalformedBody as exc:
            return self._closing(frame, m.ErrorCode.INVALID_REQUEST, str(exc))
        assert isinstance(req, m.SaslHandshakeRequest)
        offered = authenticator.config.offered(auth.tls)
        if auth.exchange is not None or auth.authenticated:
            return self._closing(frame, m.ErrorCode.ILLEGAL_SASL_STATE, "a second SaslHandshake")
        exchange = authenticator.start(req.mechanism, auth.tls, auth.peer)
        if exchange is None:
            return self.handlers.error_answer(
                frame,
                m.ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                f"{req.mechanism!r} is not offered here; offered: {', '.join(offered) or 'none'}",
            )
        auth.exchange = exchange
        return self._reply(frame, m.SaslHandshakeResponse(mechanisms=offered))

    def _authenticate(self, frame: Frame, auth: ConnectionAuth) -> Outcome:
        exchange = auth.exchange
        if exchange is None:
            return self._closing(
                frame, m.ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate before a SaslHandshake"
            )
        try:
            req = m.decode_request(frame)
            assert isinstance(req, m.SaslAuthenticateRequest)
            out = exchange.step(req.auth_bytes)
        except (m.MalformedBody, AuthenticationFailed):
            auth.exchange = None
            return self._closing(frame, m.ErrorCode.SASL_AUTHENTICATION_FAILED, FAILED_MESSAGE)
        if exchange.principal is not None:
            auth.principal = exchange.principal
            auth.exchange = None
        return self._reply(frame, m.SaslAuthenticateResponse(auth_bytes=out))

    # ------------------------------------------------------------------------- ACLs

    def _check(self, frame: Frame, req: m.Request, principal: str | None) -> Outcome | None:
        allowed = self.authorizer.allowed
        key = frame.api_key
        if key == m.ApiKey.METADATA:
            assert isinstance(req, m.MetadataRequest)
            return self.handlers.metadata_reply(
                req,
                frame,
                lambda name: allowed(principal, "describe", "topic", name),
                lambda name: (
                    allowed(principal, "create", "cluster", CLUSTER_NAME)
                    or allowed(principal, "create", "topic", name)
                ),
            )
        txn_id = req.txn_id if isinstance(req, _TXN_REQUESTS) else None
        if isinstance(req, m.ProduceRequest):
            txn_id = req.transactional_id
        if txn_id is not None and not allowed(principal, "write", "transactional_id", txn_id):
            return self._refused(
                frame, m.ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, f"write transactional id {txn_id}"
            )
        refused = self._check_txn_extras(req, principal)
        if refused is not None:
            return self._refused(frame, *refused)
        group_op = _GROUP_OPS.get(key)
        if group_op is not None:
            assert isinstance(req, _GROUP_REQUESTS)
            group = req.group
            if not allowed(principal, group_op, "group", group):
                return self._refused(
                    frame, m.ErrorCode.GROUP_AUTHORIZATION_FAILED, f"{group_op} group {group}"
                )
        topic_op = _PARTITION_OPS.get(key)
        if topic_op is not None:
            name = self.handlers.core.topic_name(frame.topic_id)
            if name is not None and not allowed(principal, topic_op, "topic", name):
                # the id's topic is not named: ids are sequential, and the name of one the
                # principal may not describe is what Metadata keeps from it (Kafka's refusals
                # name nothing either)
                return self._refused(
                    frame, m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{topic_op} on topic id {frame.topic_id}"
                )
            return None
        if key == m.ApiKey.CREATE_TOPIC:
            assert isinstance(req, m.CreateTopicRequest)
            if allowed(principal, "create", "cluster", CLUSTER_NAME) or allowed(
                principal, "create", "topic", req.name
            ):
                return None
            return self._refused(frame, m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"create topic {req.name}")
        if key in (m.ApiKey.DESCRIBE_CONFIGS, m.ApiKey.ALTER_CONFIGS):
            assert isinstance(req, m.DescribeConfigsRequest | m.AlterConfigsRequest)
            op = "describe_configs" if key == m.ApiKey.DESCRIBE_CONFIGS else "alter_configs"
            if allowed(principal, op, "topic", req.topic):
                return None
            return self._refused(frame, m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{op} topic {req.topic}")
        if key == m.ApiKey.DELETE_TOPIC:
            assert isinstance(req, m.DeleteTopicRequest)
            if allowed(principal, "delete", "topic", req.name):
                return None
            return self._refused(frame, m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"delete topic {req.name}")
        cluster_op = _CLUSTER_OPS.get(key)
        if cluster_op is not None and not allowed(principal, cluster_op, "cluster", CLUSTER_NAME):
            return self._refused(frame, m.ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{cluster_op} cluster")
        return None

    def _check_txn_extras(self, req: m.Request, principal: str | None) -> tuple[m.ErrorCode, str] | None:
        """What a transaction api needs beyond its transactional id, as Kafka's: write on the
        topics added (AddPartitionsToTxn), read on the group (AddOffsetsToTxn), read on the
        topics whose offsets are committed (TxnOffsetCommit; its group is `_GROUP_OPS`'s)."""
        allowed = self.authorizer.allowed
        core = self.handlers.core
        if isinstance(req, m.AddOffsetsToTxnRequest):
            if not allowed(principal, "read", "group", req.group_id):
                return m.ErrorCode.GROUP_AUTHORIZATION_FAILED, f"read group {req.group_id}"
            return None
        if isinstance(req, m.AddPartitionsToTxnRequest):
            op, topic_ids = "write", {t for t, _ in req.partitions}
        elif isinstance(req, m.TxnOffsetCommitRequest):
            op, topic_ids = "read", {o[0] for o in req.offsets}
        else:
            return None
        for topic_id in sorted(topic_ids):
            name = core.topic_name(topic_id)
            if name is not None and not allowed(principal, op, "topic", name):
                return m.ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"{op} on topic id {topic_id}"
        return None

    def _refused(self, frame: Frame, code: m.ErrorCode, what: str) -> Outcome:
        self.handlers.metrics.denied()
        if frame.api_key == m.ApiKey.PRODUCE and m.peek_produce_acks(frame) == m.Acks.NONE:
            self.handlers.metrics.error()
            return Silent()  # acks=0 promises no answer at all
        return self.handlers.error_answer(frame, code, f"not authorized: {what}")
