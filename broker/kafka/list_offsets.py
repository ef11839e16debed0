"""ListOffsets (api 2, v1-5): each partition through `Partition.list_offset_and_time`.

-1 is the high watermark (for isolation_level 1, read_committed: the last stable offset, as
Kafka's `Partition.fetchOffsetForTimestamp`, which also finds no time's offset at or past it), -2
the log start, a timestamp the first offset at or after it (-1 when none is); each partition
answered on its own, with the leader's epoch. The timestamp answered is
Kafka's: the found record's for a timestamp (the Java client's `offsetsForTimes` throws on a
found offset with timestamp -1), -1 for latest and earliest and when nothing was found.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.core.partition import Isolation, Partition
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import NotLeaderError, kafka_error

LIST_OFFSETS: Final = 2
VERSIONS: Final = (1, 5)  # v6+ are flexible
READ_COMMITTED: Final = 1  # isolation_level (v2+)


def list_offsets(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """-1: the end of the log, -2: its start, a timestamp: the first offset at or after it
    (-1 when none is), each partition answered on its own."""
    schema = response_schema(LIST_OFFSETS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    committed = int(getattr(body, "isolation_level", 0)) == READ_COMMITTED
    isolation = Isolation.LAST_STABLE if committed else Isolation.HIGH_WATERMARK
    topics = []
    for topic in body.topics:
        partitions = []
        refusal = ctx.topic_refusal(LIST_OFFSETS, topic.name)
        for lp in topic.partitions:
            index, spec = int(lp.partition_index), int(lp.timestamp)
            code, offset, timestamp, epoch = ErrorCode.none, -1, -1, -1
            try:
                if refusal is not None:
                    raise refusal
                target = ctx.core.partition_named(topic.name, index)
                if not isinstance(target, Partition):
                    raise NotLeaderError(f"led by core {target}")
                offset, timestamp = target.list_offset_and_time(
                    spec, int(getattr(lp, "current_leader_epoch", -1)), isolation
                )
                epoch = target.leader_epoch
            except Exception as exc:
                code = kafka_error(exc)[0]
            partitions.append(
                make(
                    module.ListOffsetsPartitionResponse,
                    partition_index=index,
                    error_code=code,
                    timestamp=timestamp if code == ErrorCode.none else -1,
                    offset=offset,
                    leader_epoch=epoch if code == ErrorCode.none else -1,
                )
            )
        topics.append(make(module.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(partitions)))
    resp = make(schema, throttle_time=datetime.timedelta(0), topics=tuple(topics))
    return Reply(encode_response(request.correlation_id, resp))
