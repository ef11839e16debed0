"""OffsetForLeaderEpoch (api 23, v0-3): where a leader epoch ends, for clients validating positions.

Rules this module keeps:
- The answer is the partition's epoch history (broker/storage/epochs.py, from the
  `partition_leader_epoch` of its batches, plus the epoch it leads in): the largest epoch <= the
  one asked and where the next one starts, or the log end for the latest; an epoch below the
  first ends where the first starts (the epoch asked, that offset); an epoch above ours or -1 is
  UNDEFINED (-1 epoch, -1 offset, no error), as Kafka answers. A partition that is not
  replicated leads at epoch 0, so epoch 0 ends at its log end.
- current_leader_epoch (v2+) is checked as Kafka checks it: above ours is UNKNOWN_LEADER_EPOCH,
  below is FENCED_LEADER_EPOCH, -1 is not checked. replica_id (v3) is read and ignored (our
  followers use ReplicaFetch, whose answer carries the diverging epoch itself).
- A partition of another core is NOT_LEADER_OR_FOLLOWER, like every per-partition request of
  the Kafka adapter (Metadata sends the client to the owning core).
- v2-3 go through kio; v0-1, which kio has no schema for, are read and written here (the same
  fields without current_leader_epoch; v0's answer has no leader epoch).
- Every version needs describe on each topic it names (broker/kafka/authorize.py checks v2-3
  before they get here; v0-1 are checked here, as they are decoded here): one topic refused and
  the whole request is, every partition answered TOPIC_AUTHORIZATION_FAILED with no epoch and no
  offset, as v2-3 are answered. They were once answered whatever the ACLs said, telling anyone
  authenticated which topics exist and where they end.
"""

from __future__ import annotations

import datetime
import struct
import sys
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.core import Core
from broker.core.outcomes import Outcome, Reply
from broker.core.partition import Partition
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.errors import NotLeaderError, kafka_error
from ringlog_proto.frames import ProtocolError

OFFSET_FOR_LEADER_EPOCH: Final = 23
UNDEFINED: Final = -1  # Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET
KIO_FROM: Final = 2  # kio has v2 and up


def epoch_end(core: Core, topic: str, index: int, current: int, epoch: int) -> tuple[ErrorCode, int, int]:
    """(error, leader epoch, end offset) of `epoch` in partition `index` of `topic`."""
    try:
        target = core.partition_named(topic, index)
        if not isinstance(target, Partition):
            raise NotLeaderError(f"led by core {target}")
        if target.replica is not None:
            target.check_leader()
    except Exception as exc:
        return kafka_error(exc)[0], UNDEFINED, UNDEFINED
    ours = target.leader_epoch
    if current != UNDEFINED and current > ours:
        return ErrorCode.unknown_leader_epoch, UNDEFINED, UNDEFINED
    if current != UNDEFINED and current < ours:
        return ErrorCode.fenced_leader_epoch, UNDEFINED, UNDEFINED
    got, end = target.end_offset_for_epoch(epoch)
    return ErrorCode.none, got, end


def offset_for_leader_epoch(core: Core, request: KafkaRequest, body: Any) -> Outcome:
    """v2-3, decoded by kio."""
    schema = response_schema(OFFSET_FOR_LEADER_EPOCH, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    topics = []
    for t in body.topics:
        partitions = []
        for p in t.partitions:
            code, epoch, end = epoch_end(
                core, t.topic, int(p.partition), int(p.current_leader_epoch), int(p.leader_epoch)
            )
            partitions.append(
                make(
                    module.EpochEndOffset,
                    error_code=code,
                    partition=int(p.partition),
                    leader_epoch=epoch,
                    end_offset=end,
                )
            )
        topics.append(make(module.OffsetForLeaderTopicResult, topic=t.topic, partitions=tuple(partitions)))
    resp = make(schema, throttle_time=datetime.timedelta(0), topics=tuple(topics))
    return Reply(encode_response(request.correlation_id, resp))


def offset_for_leader_epoch_v0(
    core: Core, request: KafkaRequest, may_describe: Callable[[str], bool] | None = None
) -> Outcome:
    """v0-1, read and written here: request header v1; topics [name, partitions [partition,
    leader_epoch]]; answer header v0; topics [name, partitions [error, partition, (v1) leader
    epoch, end offset]]. `may_describe` (ACLs on): whether the principal may describe a topic."""
    try:
        asked = _read_v0(request.data)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed kafka OffsetForLeaderEpoch v{request.api_version}: {exc}") from exc
    refused = may_describe is not None and not all(may_describe(name) for name, _ in asked)
    if refused:
        core.metrics.error()
        core.metrics.denied()
    out = [struct.pack(">ii", request.correlation_id, len(asked))]
    for name, partitions in asked:
        raw = name.encode()
        out.append(struct.pack(">h", len(raw)) + raw + struct.pack(">i", len(partitions)))
        for index, epoch in partitions:
            if refused:
                code, got, end = ErrorCode.topic_authorization_failed, UNDEFINED, UNDEFINED
            else:
                code, got, end = epoch_end(core, name, index, UNDEFINED, epoch)
            if request.api_version >= 1:
                out.append(struct.pack(">hiiq", int(code), index, got, end))
            else:
                out.append(struct.pack(">hiq", int(code), index, end))
    body = b"".join(out)
    return Reply([struct.pack(">i", len(body)) + body])


def _read_v0(data: bytes | memoryview) -> list[tuple[str, list[tuple[int, int]]]]:
    pos = 8  # api key, version, correlation id
    (n,) = struct.unpack_from(">h", data, pos)
    pos += 2 + max(n, 0)
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    topics = []
    for _ in range(max(count, 0)):
        (n,) = struct.unpack_from(">h", data, pos)
        if n < 0 or pos + 2 + n > len(data):
            raise ValueError(f"topic name of length {n}")
        name = str(data[pos + 2 : pos + 2 + n], "utf-8")  # a large request's data is a view
        pos += 2 + n
        (parts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        partitions = []
        for _ in range(max(parts, 0)):
            partitions.append(struct.unpack_from(">ii", data, pos))
            pos += 8
        topics.append((name, partitions))
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes left over")
    return topics
