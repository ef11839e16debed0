"""Kafka's consumer-protocol bytes as we write and read them, checked against kio's schemas
(generated from Kafka's own JSON definitions): a group mixing our Consumer with Kafka consumers
depends on both sides reading each other's subscriptions and assignments."""

from __future__ import annotations

import io
import struct

import pytest
from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment as AssignmentV0
from kio.schema.consumer_protocol_assignment.v0.data import TopicPartition as KioTopicPartition
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription as SubV0
from kio.schema.consumer_protocol_subscription.v1.data import ConsumerProtocolSubscription as SubV1
from kio.schema.consumer_protocol_subscription.v1.data import TopicPartition as OwnedV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32

from broker.client.group import range_assign
from ringlog_proto.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from ringlog_proto.messages import GroupMember


def kio_bytes(entity: object, version: int) -> bytes:
    buf = io.BytesIO()
    buf.write(struct.pack(">h", version))
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def kio_read(schema: type, data: bytes) -> object:
    assert struct.unpack_from(">h", data)[0] == 0
    entity, used = entity_reader(schema)(data, 2)
    assert 2 + used == len(data)
    return entity


def test_our_subscription_is_kafkas_v0() -> None:
    ours = encode_subscription(["b", "a"], b"ud")
    assert kio_read(SubV0, ours) == SubV0(topics=("a", "b"), user_data=b"ud")
    assert ours == kio_bytes(SubV0(topics=("a", "b"), user_data=b"ud"), 0)


def test_later_subscription_versions_are_read_for_their_topics() -> None:
    v1 = kio_bytes(
        SubV1(topics=("t",), user_data=None, owned_partitions=(OwnedV1(topic="t", partitions=(i32(0),)),)), 1
    )
    sub = decode_subscription(v1)
    assert sub.topics == ("t",) and sub.user_data is None


def test_our_assignment_is_kafkas_v0_both_ways() -> None:
    ours = encode_assignment({"t": [2, 0], "a": [1]})
    expected = AssignmentV0(
        assigned_partitions=(
            KioTopicPartition(topic="a", partitions=(i32(1),)),
            KioTopicPartition(topic="t", partitions=(i32(0), i32(2))),
        ),
        user_data=None,
    )
    assert kio_read(AssignmentV0, ours) == expected
    assert decode_assignment(kio_bytes(expected, 0)) == {"a": [1], "t": [0, 2]}
    assert decode_assignment(b"") == {}


@pytest.mark.parametrize("bad", [b"\x00", b"\x00\x00\x7f\xff\xff\xff", b"\xff\xff\x00\x00\x00\x00"])
def test_damaged_bytes_are_a_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_subscription(bad)
    with pytest.raises(ValueError):
        decode_assignment(bad)


def test_range_assignor_splits_each_topic_in_contiguous_ranges() -> None:
    members = [
        GroupMember("m-b", encode_subscription(["t", "u"])),
        GroupMember("m-a", encode_subscription(["t"])),
        GroupMember("m-c", b"\x00"),  # does not parse: gets nothing
    ]
    plan = range_assign(members, {"t": 5, "u": 2})
    assert plan == {"m-a": {"t": [0, 1, 2]}, "m-b": {"t": [3, 4], "u": [0, 1]}, "m-c": {}}
    # every partition exactly once
    owned = [(t, p) for parts in plan.values() for t, ps in parts.items() for p in ps]
    assert sorted(owned) == [("t", i) for i in range(5)] + [("u", 0), ("u", 1)]
