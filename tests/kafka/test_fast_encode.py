"""The hand-written Produce and Fetch responses (broker/kafka/fast_encode.py) are byte for byte
what kio writes, for every version we serve, on fixed and random inputs; and a Fetch's records
are sent as the buffers they were given (zero copy)."""

from __future__ import annotations

import datetime
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from broker.kafka import fast_encode
from broker.kafka.codec import encode_response, make, response_schema

PRODUCE, FETCH = 0, 1
PRODUCE_VERSIONS = range(fast_encode.PRODUCE_VERSIONS[0], fast_encode.PRODUCE_VERSIONS[1] + 1)
FETCH_VERSIONS = range(fast_encode.FETCH_VERSIONS[0], fast_encode.FETCH_VERSIONS[1] + 1)
CODES = [int(c) for c in ErrorCode]
i32s = st.integers(-(2**31), 2**31 - 1)
i64s = st.integers(-(2**63), 2**63 - 1)
names = st.text(min_size=0, max_size=20)
messages = st.none() | st.text(max_size=40)
stamps = st.just(-1) | st.integers(0, 253_402_300_799_000)  # log append time: -1 or a time in ms (to 9999)
_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


def kio_produce(version: int, correlation_id: int, topics: list[Any]) -> bytes:
    schema = response_schema(PRODUCE, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    resp = make(
        schema,
        throttle_time=datetime.timedelta(0),
        responses=tuple(
            make(
                module.TopicProduceResponse,
                name=name,
                partition_responses=tuple(
                    make(
                        module.PartitionProduceResponse,
                        index=i,
                        error_code=ErrorCode(code),
                        base_offset=base,
                        log_append_time=None
                        if stamp == -1
                        else _EPOCH + datetime.timedelta(milliseconds=stamp),
                        log_start_offset=start,
                        record_errors=tuple(
                            make(
                                module.BatchIndexAndErrorMessage, batch_index=b, batch_index_error_message=why
                            )
                            for b, why in record_errors
                        )
                        if version >= 8  # v8 added record errors (KIP-467)
                        else (),
                        error_message=message,
                    )
                    for i, code, base, start, message, stamp, record_errors in parts
                ),
            )
            for name, parts in topics
        ),
    )
    return b"".join(encode_response(correlation_id, resp))


def kio_fetch(version: int, correlation_id: int, code: int, session: int, topics: list[Any]) -> bytes:
    schema = response_schema(FETCH, version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    resp = make(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode(code),
        session_id=session,
        responses=tuple(
            make(
                module.FetchableTopicResponse,
                topic=name,
                partitions=tuple(
                    make(
                        module.PartitionData,
                        partition_index=i,
                        error_code=ErrorCode(c),
                        high_watermark=high,
                        last_stable_offset=stable,
                        log_start_offset=start,
                        aborted_transactions=None
                        if aborted is None
                        else tuple(
                            make(module.AbortedTransaction, producer_id=p, first_offset=f) for p, f in aborted
                        ),
                        records=None if records is None else bytes(records),
                    )
                    for i, c, high, stable, start, aborted, records in parts
                ),
            )
            for name, parts in topics
        ),
    )
    return b"".join(encode_response(correlation_id, resp))


PRODUCE_CASES = [
    [],
    [("t", [(0, 0, 42, 0, None, -1, ())])],
    [("t", [(0, 0, 42, 0, None, 1_700_000_000_123, ())])],  # a LogAppendTime topic's stamp
    [
        (
            "topic-a",
            [
                (0, 0, 7, 3, None, -1, ()),
                (5, int(ErrorCode.not_leader_or_follower), -1, -1, "led by core 1", -1, ()),
            ],
        )
    ],
    [("ü", [(2, int(ErrorCode.invalid_required_acks), -1, -1, "acks 3", -1, ())]), ("b", [])],
    # a compacted topic's records without a key: a record error each (v8)
    [("c", [(1, int(ErrorCode.invalid_record), -1, -1, "2 records", -1, ((0, "no key"), (3, None)))])],
]


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("topics", PRODUCE_CASES)
def test_produce_response_is_kio_s(version: int, topics: list[Any]) -> None:
    fast = fast_encode.produce_response(version, 12345, topics)
    assert b"".join(fast) == kio_produce(version, 12345, topics)


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(PRODUCE_VERSIONS),
    correlation_id=i32s,
    topics=st.lists(
        st.tuples(
            names,
            st.lists(
                st.tuples(
                    i32s,
                    st.sampled_from(CODES),
                    i64s,
                    i64s,
                    messages,
                    stamps,
                    st.lists(st.tuples(i32s, messages), max_size=3),
                ),
                max_size=4,
            ),
        ),
        max_size=3,
    ),
)
def test_produce_response_random(version: int, correlation_id: int, topics: list[Any]) -> None:
    assert b"".join(fast_encode.produce_response(version, correlation_id, topics)) == kio_produce(
        version, correlation_id, topics
    )


BIG = bytes(range(256)) * 8  # above the copy threshold: its own buffer
FETCH_CASES = [
    [],
    [("t", [(0, 0, 10, 10, 0, None, BIG)])],
    [("t", [(0, 0, 10, 10, 0, (), b"small"), (1, int(ErrorCode.offset_out_of_range), -1, -1, -1, (), b"")])],
    [
        ("a", [(0, 0, 1, 1, 0, None, BIG), (1, 0, 2, 2, 0, None, BIG)]),
        ("b", [(3, 0, 4, 4, 0, [(7, 8)], None)]),
    ],
]


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("topics", FETCH_CASES)
def test_fetch_response_is_kio_s(version: int, topics: list[Any]) -> None:
    fast = fast_encode.fetch_response(version, 99, 0, 0, topics)
    assert b"".join(fast) == kio_fetch(version, 99, 0, 0, topics)


def test_fetch_records_are_not_copied() -> None:
    """Each large records buffer goes out as the very object given, between small buffers."""
    a, b = memoryview(bytearray(BIG)), bytes(BIG)
    out = fast_encode.fetch_response(
        11, 1, 0, 0, [("t", [(0, 0, 1, 1, 0, None, a), (1, 0, 1, 1, 0, None, b)])]
    )
    assert any(buf is a for buf in out) and any(buf is b for buf in out)
    assert int.from_bytes(out[0][:4], "big", signed=True) == sum(map(len, out)) - 4


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from(FETCH_VERSIONS),
    correlation_id=i32s,
    code=st.sampled_from(CODES),
    session=i32s,
    topics=st.lists(
        st.tuples(
            names,
            st.lists(
                st.tuples(
                    i32s,
                    st.sampled_from(CODES),
                    i64s,
                    i64s,
                    i64s,
                    st.none() | st.lists(st.tuples(i64s, i64s), max_size=2),
                    st.none() | st.binary(max_size=600),
                ),
                max_size=4,
            ),
        ),
        max_size=3,
    ),
)
def test_fetch_response_random(
    version: int, correlation_id: int, code: int, session: int, topics: list[Any]
) -> None:
    fast = fast_encode.fetch_response(version, correlation_id, code, session, topics)
    assert b"".join(fast) == kio_fetch(version, correlation_id, code, session, topics)
