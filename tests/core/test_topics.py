"""TopicRegistry's refusals carry the TopicFault that becomes their wire error (broker/core/errors.py)."""

from __future__ import annotations

import pytest

from broker.core.errors import error_of
from broker.core.limits import Limits
from broker.core.topics import TopicError, TopicFault, TopicRegistry
from broker.storage.log import LogConfig
from ringlog_proto.messages import ErrorCode


@pytest.mark.parametrize(
    ("limits", "partitions", "flag"),
    [
        (Limits(max_partitions_per_topic=4), 5, "--max-partitions-per-topic"),
        (Limits(max_partitions=4), 5, "(--max-partitions)"),
    ],
    ids=["per-topic", "per-broker"],
)
def test_a_partition_limit_is_limit_exceeded(tmp_path, limits: Limits, partitions: int, flag: str) -> None:
    registry = TopicRegistry(str(tmp_path), LogConfig(), limits=limits)
    with pytest.raises(TopicError) as info:
        registry.create("t", partitions)
    assert info.value.kind is TopicFault.LIMIT
    code, message = error_of(info.value)
    assert code == ErrorCode.LIMIT_EXCEEDED and flag in message
