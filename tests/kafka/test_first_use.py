"""A partition's directory and files are made on its first use (broker/core/core.py
`open_partition`), 0.1-0.9 ms each on ext4. A Kafka request naming thousands of partitions used
for the first time (a consumer group's ListOffsets over a new topic, a producer's first
round over its partitions) made them all in one go and held every other client of the core for
as long: ~0.5 s per 2,000. Now the core opens them in turns of about a millisecond first
(`Core.open_in_turns`, the adapter's `Opening`), and the requests that came after on the same
connection are carried out after it, in order, as Kafka's are."""

from __future__ import annotations

import datetime
import socket
import sys
import threading
import time
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from broker.kafka.codec import make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import frame, read_response, read_sized
from ringlog_proto.batch import encode_batch

TOPICS = 3
PARTITIONS = 1000  # each topic: the default --max-partitions-per-topic
ONE_CORE = [{"cores": 1, "backend": b} for b in ("uvloop", "io_uring")]


def list_offsets_of_all(correlation_id: int) -> bytes:
    """ListOffsets v1 (latest) of every partition of every topic."""
    schema = request_schema(2, 1)
    assert schema is not None
    mod = sys.modules[schema.__module__]
    topics = tuple(
        make(
            mod.ListOffsetsTopic,
            name=f"t{t}",
            partitions=tuple(
                make(mod.ListOffsetsPartition, partition_index=i, timestamp=-1) for i in range(PARTITIONS)
            ),
        )
        for t in range(TOPICS)
    )
    return frame(2, 1, correlation_id, make(schema, replica_id=-1, topics=topics))


def produce_one(correlation_id: int, topic: str, partition: int) -> bytes:
    """Produce v3, acks=1, one record to `topic`/`partition`."""
    schema = request_schema(0, 3)
    assert schema is not None
    mod = sys.modules[schema.__module__]
    data = make(mod.PartitionProduceData, index=partition, records=encode_batch([b"after"]))
    topic_data = (make(mod.TopicProduceData, name=topic, partition_data=(data,)),)
    return frame(
        0,
        3,
        correlation_id,
        make(
            schema,
            transactional_id=None,
            acks=1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=topic_data,
        ),
    )


def answer(api_key: int, version: int, data: bytes) -> Any:
    """The body of a response `read_sized` took off the socket (its size prefix put back)."""
    return read_response(api_key, version, len(data).to_bytes(4, "big") + data)[1]


def api_versions(correlation_id: int) -> bytes:
    schema = request_schema(18, 0)
    assert schema is not None
    return frame(18, 0, correlation_id, make(schema))


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True, ids=["uvloop", "io_uring"])
def test_thousands_of_new_partitions_in_one_request_hold_no_other_client(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    try:
        for t in range(TOPICS):
            w.create_topic(f"t{t}", PARTITIONS)
    finally:
        w.close()
    answered: dict[str, float] = {}
    got: dict[int, bytes] = {}

    def first_user() -> None:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as s:
            # pipelined: the produce to a partition the ListOffsets names comes after it
            s.sendall(list_offsets_of_all(1) + produce_one(2, "t0", 0))
            got[1] = read_sized(s)
            answered["list_offsets"] = time.monotonic()
            got[2] = read_sized(s)

    t = threading.Thread(target=first_user)
    t.start()
    time.sleep(0.05)  # the ListOffsets is being served
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as s:
        asked = time.monotonic()
        s.sendall(api_versions(3))
        read_sized(s)
        answered["other"] = time.monotonic()
    t.join(60)
    assert not t.is_alive()
    took = answered["list_offsets"] - asked
    assert answered["other"] < answered["list_offsets"], (
        f"another client's ApiVersions waited {answered['other'] - asked:.3f} s, until the ListOffsets "
        f"of {TOPICS * PARTITIONS} new partitions was answered ({took:.3f} s after it was asked)"
    )
    offsets = answer(2, 1, got[1])
    seen = {
        (topic.name, p.partition_index): (p.error_code, p.offset)
        for topic in offsets.topics
        for p in topic.partitions
    }
    # every partition answered, empty: the produce after it on the same connection came after it
    assert seen == {(f"t{t}", i): (ErrorCode.none, 0) for t in range(TOPICS) for i in range(PARTITIONS)}
    produced = answer(0, 3, got[2])
    part = produced.responses[0].partition_responses[0]
    assert (part.error_code, part.base_offset) == (ErrorCode.none, 0), part
    # and the partitions are open: asked again, at once
    with socket.create_connection(("127.0.0.1", broker.port), timeout=60) as s:
        s.sendall(list_offsets_of_all(4))
        again = answer(2, 1, read_sized(s))
    ends = {(topic.name, p.partition_index): p.offset for topic in again.topics for p in topic.partitions}
    assert ends[("t0", 0)] == 1 and sum(ends.values()) == 1
