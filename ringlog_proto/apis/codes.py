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
