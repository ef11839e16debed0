"""ListOffsets (api 2, v1-5): each partition through `Partition.list_offset_and_time`.

-1 is the high watermark, -2 the log start, a timestamp the first offset at or after it (-1 when
none is); each partition answered on its own, with the leader's epoch. The timestamp answered is
Kafka's: the found record's for a timestamp (the Java client's `offsetsForTimes` throws on a
found offset with timestamp -1), -1 for latest and earliest and when nothing was found.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Outcome, Reply
from broker.core.partition import Partition
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import NotLeaderError, kafka_error

LIST_OFFSETS: Final = 2
VERSIONS: Final = (1, 5)  # v6+ are flexible


def list_offsets(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """-1: the end of the log, -2: its start, a timestamp: the first offset at or after it
    (-1 when none is), each partition answered on its own."""
    schema = response_schema(LIST_OFFSETS, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
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
                    spec, int(getattr(lp, "current_leader_epoch", -1))
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
