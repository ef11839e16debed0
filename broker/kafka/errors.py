"""What the Kafka adapter's APIs share: the error mapping and the done-marker of a Gather part.

Rules this module keeps:
- One mapping from the core's errors to Kafka's error codes (`kafka_error`), through the core's
  own `error_of`: every Kafka API answers the same failure with the same code. Where Kafka tells
  apart what our protocol does not (a fenced epoch, an unknown producer: both a sequence error of
  ours), the core's exception decides.
- It imports only the core and kio, so each API module of this package can import it.
"""

from __future__ import annotations

import logging
from typing import Final

from kio.schema.errors import ErrorCode

from broker.core.acks import InvalidAcksError
from broker.core.errors import error_of
from broker.core.groups import OffsetsUnavailable, StaleProducerEpoch
from broker.core.outcomes import Reply
from broker.core.partition import RecordDeletionRefused
from broker.core.producer_ids import ProducerIdsUnavailable
from broker.core.producer_state import FencedEpochError, UnknownProducerError
from broker.core.replica_changes import ReplicaFault, ReplicaRefused
from broker.core.topics import TopicError, TopicFault
from ringlog_proto.messages import ErrorCode as Ours

log = logging.getLogger("broker.kafka.adapter")


class NotLeaderError(Exception):
    """A partition another core owns (answered NOT_LEADER_OR_FOLLOWER: the client refreshes
    Metadata and goes to the owning core's port)."""


class TopicNotAuthorized(Exception):
    """A topic of a Produce, Fetch or ListOffsets the principal may not use: its partitions are
    answered TOPIC_AUTHORIZATION_FAILED, the request's other topics are served."""


class UnsupportedCompressionError(Exception):
    """zstd where the request's version predates it (KIP-110: Produce v7, Fetch v10): answered
    UNSUPPORTED_COMPRESSION_TYPE for the partition, as Kafka answers it."""


DONE: Final = Reply([])  # what a Gather part's callbacks return: the gather sends the answer

# why a replica change was refused -> Kafka's code (a preferred election's NOT_AVAILABLE is
# PREFERRED_LEADER_NOT_AVAILABLE: broker/kafka/replicas.py tells it apart)
_REPLICA_CODES: Final[dict[ReplicaFault, ErrorCode]] = {
    ReplicaFault.NOT_NEEDED: ErrorCode.election_not_needed,
    ReplicaFault.NOT_AVAILABLE: ErrorCode.eligible_leaders_not_available,
    ReplicaFault.NO_REASSIGNMENT: ErrorCode.no_reassignment_in_progress,
    ReplicaFault.ASSIGNMENT: ErrorCode.invalid_replica_assignment,
    ReplicaFault.UNKNOWN: ErrorCode.unknown_topic_or_partition,
}

# our error codes -> Kafka's (anything not here is UNKNOWN_SERVER_ERROR)
_KAFKA_CODES: Final[dict[Ours, ErrorCode]] = {
    Ours.NONE: ErrorCode.none,
    Ours.INVALID_REQUEST: ErrorCode.invalid_request,
    Ours.UNSUPPORTED_VERSION: ErrorCode.unsupported_version,
    Ours.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.unknown_topic_or_partition,
    Ours.TOPIC_ALREADY_EXISTS: ErrorCode.topic_already_exists,
    Ours.INVALID_TOPIC: ErrorCode.invalid_topic_exception,
    Ours.INVALID_CONFIG: ErrorCode.invalid_config,
    Ours.CORRUPT_MESSAGE: ErrorCode.corrupt_message,
    Ours.MESSAGE_TOO_LARGE: ErrorCode.message_too_large,
    Ours.OFFSET_OUT_OF_RANGE: ErrorCode.offset_out_of_range,
    Ours.STORAGE_ERROR: ErrorCode.kafka_storage_error,
    Ours.REQUEST_TIMED_OUT: ErrorCode.request_timed_out,
    Ours.OUT_OF_ORDER_SEQUENCE: ErrorCode.out_of_order_sequence_number,
    Ours.UNKNOWN_PRODUCER_ID: ErrorCode.unknown_producer_id,
    Ours.NOT_OWNER: ErrorCode.not_leader_or_follower,
    Ours.BROKER_SHUTTING_DOWN: ErrorCode.broker_not_available,
    Ours.INVALID_BATCH: ErrorCode.corrupt_message,
    Ours.LIMIT_EXCEEDED: ErrorCode.policy_violation,
    Ours.OUT_OF_SPACE: ErrorCode.kafka_storage_error,
    Ours.INVALID_GROUP: ErrorCode.invalid_group_id,
    Ours.NOT_ENOUGH_REPLICAS: ErrorCode.not_enough_replicas,
    Ours.INVALID_RECORD: ErrorCode.invalid_record,
}


def kafka_error(exc: BaseException) -> tuple[ErrorCode, str]:
    """The Kafka error code and message for `exc`, through the core's one mapping (`error_of`)."""
    if isinstance(exc, NotLeaderError):
        return ErrorCode.not_leader_or_follower, str(exc)
    if isinstance(exc, TopicNotAuthorized):
        return ErrorCode.topic_authorization_failed, str(exc)
    if isinstance(exc, UnsupportedCompressionError):
        return ErrorCode.unsupported_compression_type, str(exc)
    if isinstance(exc, FencedEpochError | StaleProducerEpoch):
        return ErrorCode.invalid_producer_epoch, str(exc)
    if isinstance(exc, UnknownProducerError):
        return ErrorCode.unknown_producer_id, str(exc)
    if isinstance(exc, InvalidAcksError):  # ours: INVALID_REQUEST, which Kafka names apart
        return ErrorCode.invalid_required_acks, str(exc)
    if isinstance(exc, ReplicaRefused):
        return _REPLICA_CODES[exc.kind], str(exc)
    if isinstance(exc, RecordDeletionRefused):
        return ErrorCode.policy_violation, str(exc)
    if isinstance(exc, TopicError) and exc.kind is TopicFault.PARTITIONS:
        return ErrorCode.invalid_partitions, str(exc)
    if isinstance(exc, OffsetsUnavailable | ProducerIdsUnavailable):  # retriable, as Kafka's
        return ErrorCode.coordinator_not_available, str(exc)
    code, message = error_of(exc)
    if code == Ours.UNKNOWN_SERVER_ERROR:
        log.error("kafka request failed: %r", exc)
    return _KAFKA_CODES.get(code, ErrorCode.unknown_server_error), message
