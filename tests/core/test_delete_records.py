"""DeleteRecords in the partition, without a server: the leader's log start moves up to the high
watermark at most (-1: to it), the producer state forgets what went, and a follower takes its
leader's start from the fetch answers, as far as its own high watermark reaches; both keep it
across reopening."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_replication_handlers import Node, ask  # tests/core

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.partition import EARLIEST, LATEST
from broker.core.replication import NotLeaderError
from broker.storage.errors import OffsetOutOfRangeError
from ringlog_proto import messages as m


@pytest.fixture
def pair(tmp_path: Path):
    a, b = Node(1, tmp_path / "a"), Node(2, tmp_path / "b")
    a.lead(1, (1, 2), (1, 2))
    b.follow(1, leader=1)
    yield a, b
    a.close()
    b.close()


def test_the_leader_deletes_up_to_the_high_watermark_and_the_follower_follows(pair) -> None:
    a, b = pair
    for v in (b"a", b"b", b"c", b"d"):
        a.produce(v)
    b.fetch_from(a)
    b.fetch_from(a)  # the follower has all 4: HW 4 on both
    assert a.partition.high_watermark == 4
    a.produce(b"e")  # 5 on the leader, HW still 4
    with pytest.raises(OffsetOutOfRangeError):
        a.partition.delete_records(5)  # past the high watermark, as Kafka refuses it
    with pytest.raises(OffsetOutOfRangeError):
        a.partition.delete_records(-2)
    with pytest.raises(NotLeaderError):
        b.partition.delete_records(1)  # only the leader deletes
    assert a.partition.delete_records(2) == 2
    assert a.partition.list_offset(EARLIEST) == 2
    assert a.partition.delete_records(1) == 2  # never back
    resp = b.fetch_from(a)
    assert resp.partitions[0].log_start_offset == 2
    assert b.partition.log.start_offset == 2  # taken from the answer
    b.fetch_from(a)  # at 5: the high watermark reaches 5
    assert a.partition.delete_records(LATEST) == 5  # -1: the high watermark
    b.fetch_from(a)
    assert b.partition.log.start_offset == 5
    fetch = ask_fetch(a, 3)
    assert fetch.error == m.ErrorCode.OFFSET_OUT_OF_RANGE and "[5, 5]" in fetch.message


def ask_fetch(node: Node, offset: int) -> m.FetchResponse:
    resp = ask(node.handlers, m.FetchRequest(node.topic_id, 0, offset=offset, max_wait_ms=0))
    assert isinstance(resp, m.FetchResponse)
    return resp


def test_a_follower_takes_the_start_only_as_far_as_its_high_watermark(pair) -> None:
    a, b = pair
    for v in (b"a", b"b", b"c"):
        a.produce(v)
    b.fetch_from(a)  # copies 3, HW 0 (it said it had nothing)
    assert b.partition.high_watermark == 0
    b.partition.follow_log_start(3)
    assert b.partition.log.start_offset == 0  # beyond its high watermark: not yet
    b.fetch_from(a)  # HW 3
    b.partition.follow_log_start(2)
    assert b.partition.log.start_offset == 2
    a.partition.follow_log_start(3)  # a leader ignores it
    assert a.partition.log.start_offset == 0


def test_the_start_and_the_producer_state_survive_reopening(tmp_path: Path) -> None:
    node = Node(1, tmp_path / "one")
    try:
        for v in (b"a", b"b", b"c"):
            node.produce(v)
        p = node.partition
        assert p.delete_records(2) == 2
    finally:
        node.close()
    core = Core(BrokerConfig(data_dir=str(tmp_path / "one")))
    try:
        reopened = core.partition_named("t", 0)
        assert not isinstance(reopened, int)
        assert (reopened.list_offset(EARLIEST), reopened.list_offset(LATEST)) == (2, 3)
    finally:
        core.close()
