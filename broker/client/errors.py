"""The exceptions the client raises.

Two families, because they call for different reactions:

- `RingLogError(code, message)`: the broker *answered* with an error code. One subclass per common
  `ErrorCode` so callers can write `except UnknownTopicError`; `.code` keeps the wire code and
  `.retriable` says whether the same request may succeed later unchanged (`ErrorCode.retriable`).
- `BrokerUnavailable`: no answer at all (refused, reset, closed, timed out). A `ConnectionError`, so
  code that already handles socket trouble handles it, and retriable: it says nothing about the
  request, only about the path to the broker.

Everything derives from `ClientError`, so `except ClientError` catches whatever this package raises.
"""

from __future__ import annotations

from ringlog_proto.messages import ErrorCode


class ClientError(Exception):
    """Base of every exception raised by `broker.client`."""

    retriable: bool = False


class RingLogError(ClientError):
    """An error response from the broker: `code` is the wire `ErrorCode`, `message` its detail."""

    def __init__(self, code: ErrorCode | int, message: str = "") -> None:
        try:
            self.code = ErrorCode(code)
        except ValueError:  # a code newer than this client: the protocol says treat it as unknown
            self.code = ErrorCode.UNKNOWN_SERVER_ERROR
        self.message = message
        text = f"{self.code.name} ({int(self.code)})"
        super().__init__(f"{text}: {message}" if message else text)

    @property
    def retriable(self) -> bool:  # type: ignore[override]  # a property over the class default
        return self.code.retriable

    def __reduce__(self) -> tuple[type, tuple[ErrorCode, str]]:
        return (type(self), (self.code, self.message))


class UnknownServerError(RingLogError):
    pass


class InvalidRequestError(RingLogError):
    pass


class UnsupportedVersionError(RingLogError):
    pass


class UnknownTopicError(RingLogError):
    """UNKNOWN_TOPIC_OR_PARTITION: no such topic name or id, or no such partition index."""


class TopicExistsError(RingLogError):
    pass


class InvalidTopicError(RingLogError):
    pass


class InvalidConfigError(RingLogError):
    pass


class CorruptMessageError(RingLogError):
    pass


class UndecodableBatchError(CorruptMessageError):
    """A stored batch the consumer cannot decode: a poison batch stored before the broker walked
    record framing, or damage its crc did not catch. Every record of the partition before it was
    delivered first; `poll` then raises this (naming topic, partition and offset) on every call
    until the application seeks past it: to `next_offset` when the batch's header could be read
    (None when even that is damaged). As in Kafka, skipping data is the application's decision."""

    def __init__(self, topic: str, partition: int, offset: int, next_offset: int | None, reason: str) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.next_offset = next_offset
        self.reason = reason
        skip = f"seek to {next_offset} to skip it" if next_offset is not None else "seek past it to skip it"
        super().__init__(
            ErrorCode.CORRUPT_MESSAGE,
            f"{topic}/{partition}: cannot decode the batch at offset {offset} ({reason}); {skip}",
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int, int | None, str]]:  # type: ignore[override]
        return (type(self), (self.topic, self.partition, self.offset, self.next_offset, self.reason))


class MessageTooLargeError(RingLogError):
    pass


class OffsetOutOfRangeError(RingLogError):
    pass


class BrokerStorageError(RingLogError):
    """STORAGE_ERROR: the broker's disk failed, or stored data is damaged. Retriable."""


class RequestTimedOutError(RingLogError):
    pass


class OutOfOrderSequenceError(RingLogError):
    pass


class UnknownProducerIdError(OutOfOrderSequenceError):
    """UNKNOWN_PRODUCER_ID: the partition holds nothing of the producer (its batches deleted, or
    idle past the broker's producer id expiration). The producer starts a new epoch and resends
    (broker/client/idempotence.py); raised only where it could not."""


class InvalidGroupError(RingLogError):
    pass


class NotOwnerError(RingLogError):
    pass


class LeaderNotAvailableError(NotOwnerError):
    """Raised by the client itself (code NOT_OWNER, retriable) for a partition whose Metadata names
    no live leader (offline, or its leader's node is down): ask Metadata again after a back-off,
    as after the broker's own NOT_OWNER."""


class BrokerShuttingDownError(RingLogError):
    pass


class InvalidBatchError(RingLogError):
    pass


class InvalidRecordError(RingLogError):
    """INVALID_RECORD: records the topic refuses, records without a key on a compacted topic
    (cleanup.policy compact). Nothing of the batch was stored; resending it fails again."""


class LimitExceededError(RingLogError):
    pass


class OutOfSpaceError(RingLogError):
    pass


class RebalanceInProgressError(RingLogError):
    """The consumer group is rebalancing: the member rejoins (broker/client/group.py does)."""


class IllegalGenerationError(RingLogError):
    pass


class UnknownMemberError(RingLogError):
    pass


class InconsistentGroupProtocolError(RingLogError):
    """No assignor, or not the protocol type, that every member of the group shares."""


class NotEnoughReplicasError(RingLogError):
    """acks=-1 to a replicated partition with fewer in-sync replicas than min_insync (retriable)."""


class AuthenticationError(RingLogError):
    """The broker refused the SASL exchange (SASL_AUTHENTICATION_FAILED: wrong user or password;
    UNSUPPORTED_SASL_MECHANISM; ILLEGAL_SASL_STATE: a request before authenticating, or a listener
    without SASL). Not retriable: the same credentials fail again."""


class AuthorizationError(RingLogError):
    """The ACLs refuse this principal the request (TOPIC_, GROUP_ or CLUSTER_AUTHORIZATION_FAILED);
    it had no effect."""


class TopicAuthorizationError(AuthorizationError):
    pass


class GroupAuthorizationError(AuthorizationError):
    pass


class ClusterAuthorizationError(AuthorizationError):
    pass


class TransactionalIdAuthorizationError(AuthorizationError):
    """TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the ACLs refuse the transactional id, or the
    broker serves no transactions (a cluster, so far: the message says)."""


class ProducerFencedError(RingLogError):
    """PRODUCER_FENCED or INVALID_PRODUCER_EPOCH: a newer producer with the same transactional
    id has started; this one is a zombie and can do nothing more (fatal: close it)."""


class InvalidTxnStateError(RingLogError):
    """INVALID_TXN_STATE: the request does not fit the transaction's state at the coordinator."""


class ConcurrentTransactionsError(RingLogError):
    """CONCURRENT_TRANSACTIONS: the previous transaction is still completing (retriable)."""


class CoordinatorNotAvailableError(RingLogError):
    """COORDINATOR_NOT_AVAILABLE: the transaction coordinator cannot serve now (retriable)."""


class InvalidTransactionTimeoutError(RingLogError):
    """INVALID_TRANSACTION_TIMEOUT: above the broker's --transaction-max-timeout-ms."""


class TransactionError(ClientError):
    """A transactional producer's misuse or state: a call out of order (`begin_transaction`
    twice), or a transaction that must be aborted (`abortable`: a batch of it failed; call
    `abort_transaction()` and start again) or a producer that can do nothing more (fatal:
    fenced, or refused its transactional id). `__cause__` is the error that caused it."""

    def __init__(self, message: str, *, abortable: bool = False, fatal: bool = False) -> None:
        super().__init__(message)
        self.abortable = abortable
        self.fatal = fatal


ERROR_CLASSES: dict[ErrorCode, type[RingLogError]] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: UnknownServerError,
    ErrorCode.INVALID_REQUEST: InvalidRequestError,
    ErrorCode.UNSUPPORTED_VERSION: UnsupportedVersionError,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicError,
    ErrorCode.TOPIC_ALREADY_EXISTS: TopicExistsError,
    ErrorCode.INVALID_TOPIC: InvalidTopicError,
    ErrorCode.INVALID_CONFIG: InvalidConfigError,
    ErrorCode.CORRUPT_MESSAGE: CorruptMessageError,
    ErrorCode.MESSAGE_TOO_LARGE: MessageTooLargeError,
    ErrorCode.OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
    ErrorCode.STORAGE_ERROR: BrokerStorageError,
    ErrorCode.REQUEST_TIMED_OUT: RequestTimedOutError,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: OutOfOrderSequenceError,
    ErrorCode.UNKNOWN_PRODUCER_ID: UnknownProducerIdError,
    ErrorCode.INVALID_GROUP: InvalidGroupError,
    ErrorCode.NOT_OWNER: NotOwnerError,
    ErrorCode.BROKER_SHUTTING_DOWN: BrokerShuttingDownError,
    ErrorCode.INVALID_BATCH: InvalidBatchError,
    ErrorCode.LIMIT_EXCEEDED: LimitExceededError,
    ErrorCode.OUT_OF_SPACE: OutOfSpaceError,
    ErrorCode.REBALANCE_IN_PROGRESS: RebalanceInProgressError,
    ErrorCode.ILLEGAL_GENERATION: IllegalGenerationError,
    ErrorCode.UNKNOWN_MEMBER_ID: UnknownMemberError,
    ErrorCode.INCONSISTENT_GROUP_PROTOCOL: InconsistentGroupProtocolError,
    ErrorCode.NOT_ENOUGH_REPLICAS: NotEnoughReplicasError,
    ErrorCode.SASL_AUTHENTICATION_FAILED: AuthenticationError,
    ErrorCode.UNSUPPORTED_SASL_MECHANISM: AuthenticationError,
    ErrorCode.ILLEGAL_SASL_STATE: AuthenticationError,
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: TopicAuthorizationError,
    ErrorCode.GROUP_AUTHORIZATION_FAILED: GroupAuthorizationError,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: ClusterAuthorizationError,
    ErrorCode.INVALID_RECORD: InvalidRecordError,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: TransactionalIdAuthorizationError,
    ErrorCode.PRODUCER_FENCED: ProducerFencedError,
    ErrorCode.INVALID_PRODUCER_EPOCH: ProducerFencedError,
    ErrorCode.INVALID_TXN_STATE: InvalidTxnStateError,
    ErrorCode.CONCURRENT_TRANSACTIONS: ConcurrentTransactionsError,
    ErrorCode.COORDINATOR_NOT_AVAILABLE: CoordinatorNotAvailableError,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT: InvalidTransactionTimeoutError,
    ErrorCode.INVALID_PRODUCER_ID_MAPPING: InvalidTxnStateError,
}


def error_for(code: ErrorCode | int, message: str = "") -> RingLogError:
    """The exception for an error response: the code's own class, or `RingLogError` for a code
    this table does not name (so a new broker error never goes unraised)."""
    try:
        key = ErrorCode(code)
    except ValueError:
        key = ErrorCode.UNKNOWN_SERVER_ERROR
    return ERROR_CLASSES.get(key, RingLogError)(key, message)


class BrokerUnavailable(ClientError, ConnectionError):
    """No response: the connection could not be made, was lost, or the request timed out on it.

    Raised for every request that was in flight on a connection when it failed: whether the broker
    acted on such a request is unknown (an idempotent producer retries it safely).
    """

    retriable = True


class ClientClosedError(ClientError):
    """The client (producer, consumer, admin) was closed; it accepts no more work."""


class DeliveryTimeoutError(ClientError, TimeoutError):
    """A record was not acknowledged within `delivery_timeout_ms` (retries included).

    `__cause__` is the last error seen while retrying, when there was one.
    """


class ProtocolViolation(ClientError):
    """The broker sent something this client cannot make sense of (a response to no request, a
    body that does not parse). The connection is closed: its state cannot be trusted."""


__all__ = [
    "ERROR_CLASSES",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerShuttingDownError",
    "BrokerStorageError",
    "BrokerUnavailable",
    "ClientClosedError",
    "ClientError",
    "ClusterAuthorizationError",
    "ConcurrentTransactionsError",
    "CoordinatorNotAvailableError",
    "CorruptMessageError",
    "DeliveryTimeoutError",
    "GroupAuthorizationError",
    "InvalidConfigError",
    "InvalidGroupError",
    "InvalidRequestError",
    "InvalidTopicError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "LeaderNotAvailableError",
    "MessageTooLargeError",
    "NotEnoughReplicasError",
    "NotOwnerError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "ProtocolViolation",
    "RequestTimedOutError",
    "RingLogError",
    "TopicAuthorizationError",
    "TopicExistsError",
    "TransactionError",
    "TransactionalIdAuthorizationError",
    "UndecodableBatchError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicError",
    "UnsupportedVersionError",
    "error_for",
]
