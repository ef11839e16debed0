"""The core's error vocabulary: what refused or failed a request, as one code and a message.

Rules this module keeps:
- One mapping from the exceptions the core, the partitions and the storage raise to error codes
  (`error_of`), in the codes of ringlog's protocol (ringlog_proto.messages.ErrorCode), which both
  adapters start from: ours answers with them, the Kafka adapter maps them on to Kafka's codes
  (broker/kafka/errors.py), telling apart, by the exception, what Kafka distinguishes and our
  protocol does not. A new exception the core raises gets its case here, once.
"""

from __future__ import annotations

from broker.core.acks import InvalidAcksError
from broker.core.groups import GroupError, OffsetsUnavailable
from broker.core.producer_state import RetryInFlightError, SequenceError, UnknownProducerError
from broker.core.replica_changes import ReplicaFault, ReplicaRefused
from broker.core.replication import NotEnoughReplicasError, NotLeaderError
from broker.core.topic_config_keys import ConfigError
from broker.core.topics import TopicError, TopicFault
from broker.storage.diskspace import is_out_of_space
from broker.storage.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    InvalidBatchError,
    KeylessRecordError,
    LogClosedError,
    OffsetOutOfRangeError,
    OutOfSpaceError,
    RecordFramingError,
    StorageError,
    UnsupportedBatchError,
)
from ringlog_proto import messages as m


def error_of(exc: BaseException) -> tuple[m.ErrorCode, str]:
    """The one mapping from exceptions to wire error codes."""
    E = m.ErrorCode
    match exc:
        case m.MalformedBody():
            return E.INVALID_REQUEST, f"malformed request: {exc}"
        case InvalidAcksError():
            return E.INVALID_REQUEST, str(exc)
        case BatchTooLargeError():
            return E.MESSAGE_TOO_LARGE, str(exc)
        case KeylessRecordError():
            return E.INVALID_RECORD, str(exc)
        case RecordFramingError() | UnsupportedBatchError():
            return E.INVALID_BATCH, str(exc)
        case InvalidBatchError():
            return E.CORRUPT_MESSAGE, str(exc)
        case OffsetOutOfRangeError():
            return E.OFFSET_OUT_OF_RANGE, str(exc)
        case UnknownProducerError():
            return E.UNKNOWN_PRODUCER_ID, str(exc)
        case SequenceError():
            return E.OUT_OF_ORDER_SEQUENCE, str(exc)
        case RetryInFlightError():
            return E.REQUEST_TIMED_OUT, str(exc)
        case NotLeaderError():
            return E.NOT_OWNER, f"not the leader: {exc}"
        case NotEnoughReplicasError():
            return E.NOT_ENOUGH_REPLICAS, str(exc)
        case OutOfSpaceError():
            return E.OUT_OF_SPACE, str(exc)
        case StorageError() | OSError() if is_out_of_space(exc):
            return E.OUT_OF_SPACE, f"the disk holding the data dir is full, nothing was stored: {exc}"
        case CorruptBatchError() | LogClosedError() | StorageError() | OSError():
            return E.STORAGE_ERROR, str(exc)
        case TopicError(kind=TopicFault.EXISTS):
            return E.TOPIC_ALREADY_EXISTS, str(exc)
        case TopicError(kind=TopicFault.UNKNOWN):
            return E.UNKNOWN_TOPIC_OR_PARTITION, str(exc)
        case TopicError(kind=TopicFault.INVALID | TopicFault.PARTITIONS):
            return E.INVALID_TOPIC, str(exc)
        case TopicError(kind=TopicFault.LIMIT):
            return E.LIMIT_EXCEEDED, str(exc)
        case TopicError():
            return E.INVALID_CONFIG, str(exc)
        case GroupError():
            return E.INVALID_GROUP, str(exc)
        case OffsetsUnavailable():
            return E.REQUEST_TIMED_OUT, str(exc)
        case ConfigError():
            return E.INVALID_CONFIG, str(exc)
        case ReplicaRefused(kind=ReplicaFault.UNKNOWN):
            return E.UNKNOWN_TOPIC_OR_PARTITION, str(exc)
        case ReplicaRefused():
            return E.INVALID_REQUEST, str(exc)
        case ValueError():  # ConfigChangeError too
            return E.INVALID_REQUEST, str(exc)
    return E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
