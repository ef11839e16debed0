"""TopicRegistry's refusals carry the TopicFault that becomes their wire error (broker/core/errors.py)."""

from __future__ import annotations

import re

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


def test_a_topic_grows_only_and_its_partitions_keep_their_place(tmp_path) -> None:
    registry = TopicRegistry(str(tmp_path), LogConfig(), limits=Limits(max_partitions=8))
    registry.create("other", 2)
    t = registry.create("t", 2)
    with registry.locked():
        registry.load()
        grown = registry.grow("t", 5)
    assert (grown.topic_id, grown.partitions) == (t.topic_id, 5)
    assert TopicRegistry(str(tmp_path), LogConfig()).get("t").partitions == 5  # saved
    for count, message in ((5, "Topic already has 5 partition(s)."), (3, "3 would not be an increase")):
        with pytest.raises(TopicError, match=re.escape(message)) as info:
            registry.grow("t", count)
        assert info.value.kind is TopicFault.PARTITIONS
        assert error_of(info.value)[0] == ErrorCode.INVALID_TOPIC
    with pytest.raises(TopicError) as info:
        registry.grow("t", 7)  # 2 + 7 > 8
    assert info.value.kind is TopicFault.LIMIT and "(--max-partitions)" in str(info.value)
    assert registry.grown(registry.get("t"), 6).partitions == 6  # 2 + 6: at the limit
    assert registry.get("t").partitions == 5  # `grown` changes nothing
    with pytest.raises(TopicError) as info:
        registry.grow("nope", 3)
    assert info.value.kind is TopicFault.UNKNOWN
