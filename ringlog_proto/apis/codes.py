"""The wire's vocabulary: API keys and their current versions, error codes, and the enums that
fields carry (acks, offset specs). Every other module of the protocol names these.
"""

from __future__ import annotations

from enum import IntEnum

API_VERSION = 1  # the version of every API that has never changed its layout


class ApiKey(IntEnum):
    API_VERSIONS = 0
    METADATA = 1
    CREATE_TOPIC = 2
    DELETE_TOPIC = 3
    PRODUCE = 4
    FETCH = 5
    LIST_OFFSETS = 6
    OFFSET_COMMIT = 7
    OFFSET_FETCH = 8
    STATS = 9
    JOIN_GROUP = 10
    SYNC_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    REPLICA_FETCH = 14
    SASL_HANDSHAKE = 15
    SASL_AUTHENTICATE = 16
    DESCRIBE_CONFIGS = 17
    ALTER_CONFIGS = 18
    WRITE_TXN_MARKERS = 19  # between cores only: a transaction coordinator's markers
    INIT_PRODUCER_ID = 20  # a transactional id's producer id and epoch (transactions)
    ADD_PARTITIONS_TO_TXN = 21
    ADD_OFFSETS_TO_TXN = 22
    END_TXN = 23
    TXN_OFFSET_COMMIT = 24  # to the group's coordinator, as OffsetCommit
    FIND_HELD_TXNS = 25  # between cores only: does a coordinator hold these transactions open?


# The current layout version of each API (requests and responses of one API share it). A change of
# an API's body layout bumps its version here and in docs/PROTOCOL.md; the broker speaks only the
# current version (clients and broker ship together) and answers others UNSUPPORTED_VERSION, so a
# stale peer fails clearly instead of misreading bytes.
CURRENT_VERSIONS: dict[int, int] = {key: API_VERSION for key in ApiKey}


CURRENT_VERSIONS[ApiKey.METADATA] = (
    4  # v2: each core's direct port; v3: the cluster's nodes, leaders, replicas; v4: auto-create
)


CURRENT_VERSIONS[ApiKey.CREATE_TOPIC] = 4  # v2: replication factor; v3: configs; v4: assignment


CURRENT_VERSIONS[ApiKey.OFFSET_COMMIT] = 2  # v2: generation and member id (group membership)


CURRENT_VERSIONS[ApiKey.FETCH] = 2  # v2: isolation level; last stable offset and aborted list
CURRENT_VERSIONS[ApiKey.LIST_OFFSETS] = 2  # v2: isolation level
# v2: a transactional id after the records, sent only by a transactional producer (a plain
# produce stays v1: its hot path is unchanged)
CURRENT_VERSIONS[ApiKey.PRODUCE] = 1
PRODUCE_TRANSACTIONAL_VERSION = 2


class Isolation(IntEnum):
    """What a Fetch or ListOffsets may see (Kafka's isolation_level)."""

    READ_UNCOMMITTED = 0  # up to the high watermark
    READ_COMMITTED = 1  # up to the last stable offset, with the aborted transactions named


class ConfigSource(IntEnum):
    """Where a topic config's described value comes from (DescribeConfigs)."""

    TOPIC = 1  # the topic's own override
    BROKER_FLAG = 2  # the broker's default, set by a `broker serve` flag
    DEFAULT = 3  # built in


class ConfigOp(IntEnum):
    """What an AlterConfigs change does to one config (incremental alters)."""

    SET = 0
    DELETE = 1
    APPEND = 2  # list configs: values added
    SUBTRACT = 3  # list configs: values taken out


class ErrorCode(IntEnum):
    """Wire error codes. The broker maps every exception to one of these at one place."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = 1
    INVALID_REQUEST = 2  # the body did not parse, or a field is out of range
    UNSUPPORTED_VERSION = 3  # unknown api key or api version
    UNKNOWN_TOPIC_OR_PARTITION = 4
    TOPIC_ALREADY_EXISTS = 5
    INVALID_TOPIC = 6  # bad name or partition count
    INVALID_CONFIG = 7
    CORRUPT_MESSAGE = 8  # a produced batch failed validation (crc, lengths, counts)
    MESSAGE_TOO_LARGE = 9  # a produced batch exceeds max_batch_bytes
    OFFSET_OUT_OF_RANGE = 10
    STORAGE_ERROR = 11  # disk I/O failed, or stored data is damaged (corrupt on read)
    REQUEST_TIMED_OUT = 12
    OUT_OF_ORDER_SEQUENCE = 13  # idempotent producer: a gap in sequence numbers
    INVALID_GROUP = 14
    NOT_OWNER = 15  # the partition is owned by another core and could not be forwarded
    BROKER_SHUTTING_DOWN = 16
    INVALID_BATCH = 17  # crc checks out but the record framing inside does not (lengths, counts)
    LIMIT_EXCEEDED = 18  # the request would pass a documented broker limit (docs/LIMITS.md)
    OUT_OF_SPACE = 19  # the disk is full: writes are refused until space is freed, reads still work
    REBALANCE_IN_PROGRESS = 20  # the group is rebalancing: rejoin (JoinGroup) to get an assignment
    ILLEGAL_GENERATION = 21  # a generation the group has moved past: rejoin
    UNKNOWN_MEMBER_ID = 22  # the coordinator does not know this member (expired, left): rejoin as new
    INCONSISTENT_GROUP_PROTOCOL = 23  # no assignor, or not the group's protocol type, shared by all
    NOT_ENOUGH_REPLICAS = 24  # acks=all with fewer in-sync replicas than min_insync: nothing stored
    SASL_AUTHENTICATION_FAILED = 25  # wrong credentials (a generic message): the connection closes
    UNSUPPORTED_SASL_MECHANISM = 26  # a mechanism this listener does not offer (the message lists them)
    ILLEGAL_SASL_STATE = 27  # a SASL request out of order, or on a listener without SASL
    TOPIC_AUTHORIZATION_FAILED = 28  # the ACLs refuse this principal the operation on the topic
    GROUP_AUTHORIZATION_FAILED = 29  # ... on the consumer group
    CLUSTER_AUTHORIZATION_FAILED = 30  # ... on the cluster
    INVALID_RECORD = 31  # a record the topic refuses: one without a key, on a compacted topic
    # idempotent producer: the partition holds nothing of it (new, or forgotten: its batches
    # deleted, or idle past the producer id expiration) and its batch is not at sequence 0
    UNKNOWN_PRODUCER_ID = 32
    # transactions (Kafka's codes of the same names)
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 33  # the ACLs refuse it, or this node serves none
    PRODUCER_FENCED = 34  # a newer producer of the transactional id exists: this one is a zombie
    INVALID_PRODUCER_EPOCH = 35  # an epoch older than the coordinator's (fenced too)
    INVALID_TXN_STATE = 36  # the request does not fit the transaction's state
    CONCURRENT_TRANSACTIONS = 37  # the previous transaction is still completing: ask again
    COORDINATOR_NOT_AVAILABLE = 38  # the coordinator cannot serve now (loading, no state topic)
    INVALID_TRANSACTION_TIMEOUT = 39  # above the broker's --transaction-max-timeout-ms
    INVALID_PRODUCER_ID_MAPPING = 40  # the producer id is not the transactional id's

    @property
    def retriable(self) -> bool:
        return self in _RETRIABLE


_RETRIABLE = frozenset(
    {
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NOT_OWNER,
        ErrorCode.BROKER_SHUTTING_DOWN,
        ErrorCode.STORAGE_ERROR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
    }
)


class Acks(IntEnum):
    """When a produce is acknowledged. What each promises is stated in docs/STORAGE.md."""

    NONE = 0  # no response at all
    WRITTEN = 1  # after the write reached the page cache: survives a broker crash
    DURABLE = 2  # after fdatasync (group commit): survives a power loss
    ALL = -1  # after every in-sync replica has it (the high watermark passed it); unreplicated: DURABLE


class OffsetSpec(IntEnum):
    LATEST = -1
    EARLIEST = -2
