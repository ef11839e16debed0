"""The ringlog Python client: producer, consumer and admin, asyncio and blocking.

    from broker.client import Admin, Consumer, Producer

    Admin().create_topic("orders", partitions=4)
    with Producer() as p:                              # bootstrap defaults to 127.0.0.1:9092
        p.send("orders", b"hello", key=b"customer-7")
    with Consumer(group="billing", auto_offset_reset="earliest") as c:
        c.subscribe("orders")
        for record in c.poll(timeout_ms=1000):
            ...

The asyncio classes (`AsyncProducer`, `AsyncConsumer`, `AsyncAdmin`) are the implementation; the
blocking ones run them on an event loop in a daemon thread. This package imports nothing of the
broker's (only `ringlog_proto`), so applications install and import it without the server.
"""

from broker.client.admin import Admin, AsyncAdmin, PartitionDescription, TopicDescription
from broker.client.blocking_consumer import Consumer
from broker.client.blocking_producer import Producer
from broker.client.client import DEFAULT_BOOTSTRAP, AsyncClient, TopicInfo, TopicPartition
from broker.client.connection import AsyncConnection
from broker.client.consumer import AsyncConsumer
from broker.client.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerShuttingDownError,
    BrokerStorageError,
    BrokerUnavailable,
    ClientClosedError,
    ClientError,
    CorruptMessageError,
    DeliveryTimeoutError,
    InvalidBatchError,
    InvalidConfigError,
    InvalidGroupError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTopicError,
    LeaderNotAvailableError,
    LimitExceededError,
    MessageTooLargeError,
    NotOwnerError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    OutOfSpaceError,
    ProducerFencedError,
    ProtocolViolation,
    RequestTimedOutError,
    RingLogError,
    TopicExistsError,
    TransactionalIdAuthorizationError,
    TransactionError,
    UndecodableBatchError,
    UnknownProducerIdError,
    UnknownServerError,
    UnknownTopicError,
    UnsupportedVersionError,
    error_for,
)
from broker.client.partitioner import key_partition
from broker.client.producer import AsyncProducer
from broker.client.records import ConsumerRecord, RecordMetadata
from broker.client.security import Security
from broker.client.transactions import ConsumerGroupMetadata
from ringlog_proto.messages import Acks, ConfigDescription, ConfigSource

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "Acks",
    "Admin",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncConnection",
    "AsyncConsumer",
    "AsyncProducer",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerShuttingDownError",
    "BrokerStorageError",
    "BrokerUnavailable",
    "ClientClosedError",
    "ClientError",
    "ConfigDescription",
    "ConfigSource",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "CorruptMessageError",
    "DeliveryTimeoutError",
    "InvalidBatchError",
    "InvalidConfigError",
    "InvalidGroupError",
    "InvalidRecordError",
    "InvalidRequestError",
    "InvalidTopicError",
    "LeaderNotAvailableError",
    "LimitExceededError",
    "MessageTooLargeError",
    "NotOwnerError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "OutOfSpaceError",
    "PartitionDescription",
    "Producer",
    "ProducerFencedError",
    "ProtocolViolation",
    "RecordMetadata",
    "RequestTimedOutError",
    "RingLogError",
    "Security",
    "TopicDescription",
    "TopicExistsError",
    "TopicInfo",
    "TopicPartition",
    "TransactionError",
    "TransactionalIdAuthorizationError",
    "UndecodableBatchError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicError",
    "UnsupportedVersionError",
    "error_for",
    "key_partition",
]
