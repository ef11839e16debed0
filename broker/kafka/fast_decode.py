"""Produce requests read by hand, the one request on the hot path: its records stay views of the
request's bytes.

Rules this module keeps:
- Only requests of `HAND_DECODED_FROM` bytes or more (smaller ones cost kio less) of the versions
  we answer with data: Produce v3-8 (`fast_encode.PRODUCE_VERSIONS`), all with
  request header v1 and no flexible fields. Every other request goes through kio (codec.py),
  which stays the reference: tests/kafka/test_fast_decode.py decodes random requests both ways and
  compares every field, and cuts them everywhere.
- What kio's decode gives, field for field (`transactional_id`, `acks`, `timeout`,
  `topic_data[].name`, `topic_data[].partition_data[].index` and `.records`), but `timeout` is
  milliseconds, not a timedelta (nothing reads it), and `records` is a read-only view of the
  request's bytes, not a copy. Where kio raises, this raises `KafkaDecodeError`, and also where
  Kafka's own parser refuses what kio lets through: a negative count or length where the schema
  allows no null (Kafka: "non-nullable field ... was serialized as null").
- The same bound on array entries as codec.decode_request (`ENTRIES_MAX`: topics and their
  partitions together), checked as each count is read, before anything is built for it.
- Bytes after the body are not read, as everywhere (codec.decode_request says why).

Why by hand: kio decodes in native code but copies each partition's records out of the request
into bytes of their own, and builds frozen dataclasses through their `__init__`. librdkafka
over many partitions sends one partition a request (~110 KiB at 1000 partitions): the copy was
most of the 10-14 us kio took per such request, against ~2 us here.
"""

from __future__ import annotations

import struct
from typing import Final

from broker.kafka.codec import ENTRIES_MAX, KafkaDecodeError, KafkaRequest

# The size from which a Produce is read here, below it by kio (the adapter chooses): kio's native
# decode takes 1.7 us for a one-record Produce against 2.7 here, and ~0.09 us more a KiB for
# the copy of its records (13.7 us at 130 KiB against 2.8): level near 12 KiB.
HAND_DECODED_FROM: Final = 16 * 1024

_HEADER = struct.Struct(">hhih")  # api key, version, correlation id, client id's length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT_TOPICS = struct.Struct(">hii")
_PARTITION = struct.Struct(">ii")  # index, records' length


class ProducePartitionData:
    """One partition's part of a Produce: `records` a view of the request's bytes (None: null)."""

    __slots__ = ("index", "records")

    def __init__(self, index: int, records: memoryview | None) -> None:
        self.index = index
        self.records = records


class TopicProduceData:
    __slots__ = ("name", "partition_data")

    def __init__(self, name: str, partition_data: tuple[ProducePartitionData, ...]) -> None:
        self.name = name
        self.partition_data = partition_data


class ProduceRequestBody:
    """A Produce v3-8 body, named as kio names its fields (broker/kafka/produce.py reads it)."""

    __slots__ = ("acks", "timeout", "topic_data", "transactional_id")

    def __init__(
        self,
        transactional_id: str | None,
        acks: int,
        timeout: int,
        topic_data: tuple[TopicProduceData, ...],
    ) -> None:
        self.transactional_id = transactional_id
        self.acks = acks
        self.timeout = timeout  # ms
        self.topic_data = topic_data


def decode_produce(
    request: KafkaRequest, max_entries: int = ENTRIES_MAX
) -> tuple[ProduceRequestBody, str | None]:
    """The body of a Produce v3-8 `request` and its header's client_id (module rules). Raises
    `KafkaDecodeError` where the bytes do not parse, or hold more than `max_entries` topics and
    partitions together."""
    data = request.data
    view = data if isinstance(data, memoryview) else memoryview(data)
    end = len(view)
    what = f"Produce v{request.api_version}"
    try:
        length = _HEADER.unpack_from(view, 0)[3]
        client_id, p = _string(view, _HEADER.size, length, what)
        (length,) = _I16.unpack_from(view, p)
        transactional_id, p = _string(view, p + 2, length, what)
        acks, timeout, topics = _ACKS_TIMEOUT_TOPICS.unpack_from(view, p)
        p += _ACKS_TIMEOUT_TOPICS.size
        budget = _take(topics, max_entries, max_entries, what, "topic_data")
        topic_data = []
        for _ in range(topics):
            (length,) = _I16.unpack_from(view, p)
            name, p = _string(view, p + 2, length, what)
            if name is None:
                raise KafkaDecodeError(f"{what}: a topic's name is null")
            (count,) = _I32.unpack_from(view, p)
            p += 4
            budget = _take(count, budget, max_entries, what, "partition_data")
            partitions = []
            for _ in range(count):
                index, size = _PARTITION.unpack_from(view, p)
                p += 8
                records = None
                if size >= 0:
                    if p + size > end:
                        raise KafkaDecodeError(f"{what}: records past the end of the request")
                    records = view[p : p + size]
                    p += size
                partitions.append(ProducePartitionData(index, records))
            topic_data.append(TopicProduceData(name, tuple(partitions)))
    except struct.error as exc:  # a fixed field past the end
        raise KafkaDecodeError(f"{what}: {exc}") from exc
    return ProduceRequestBody(transactional_id, acks, timeout, tuple(topic_data)), client_id


def _take(count: int, budget: int, max_entries: int, what: str, field: str) -> int:
    """What is left of the entry bound after an array of `count`; refuses a null array (a
    negative count) and one past the bound."""
    if count < 0:
        raise KafkaDecodeError(f"{what}: {field} is null")
    if count > budget:
        raise KafkaDecodeError(f"{what}: more than {max_entries} array entries")
    return budget - count


def _string(view: memoryview, p: int, length: int, what: str) -> tuple[str | None, int]:
    """The string of `length` bytes at `p` (None for a negative length) and the position after it."""
    if length < 0:
        return None, p
    if p + length > len(view):
        raise KafkaDecodeError(f"{what}: a string past the end of the request")
    try:
        return str(view[p : p + length], "utf-8"), p + length
    except UnicodeDecodeError as exc:
        raise KafkaDecodeError(f"{what}: a string that is not UTF-8: {exc}") from exc
