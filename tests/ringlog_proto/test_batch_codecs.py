"""encode_batch and decode_records run the C records codec (native._codec) when it is built and
batch.py's own pure-Python codec when it is not: both must give the same bytes and the same
records, and fail on the same batches. Each test runs once per codec."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.poison_batches import POISON, poison_batch
from ringlog_proto import records_codec
from ringlog_proto.batch import (
    COMPRESSION_GZIP,
    BatchError,
    Record,
    decode_records,
    decode_rows,
    encode_batch,
    set_base_offset,
)

maybe_bytes = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3)
timestamps = st.one_of(st.none(), st.integers(1_600_000_000_000, 1_600_000_000_000 + 10_000_000))
records = st.one_of(
    st.binary(max_size=300),  # a plain value: the producer's common case
    st.builds(Record, value=maybe_bytes, key=maybe_bytes, headers=headers, timestamp=timestamps),
)


def _codec_ids() -> list[str]:
    return ["python"] + (["native"] if records_codec.native_codec() is not None else [])


@pytest.fixture(params=_codec_ids())
def codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """Make `request.param` the codec batch.py uses (the C one is the default when built)."""
    chosen = records_codec.PYTHON if request.param == "python" else records_codec.native_codec()
    saved = records_codec._codec
    records_codec._codec = chosen
    try:
        yield request.param
    finally:
        records_codec._codec = saved


def _with(codec: str, fn):
    saved = records_codec._codec
    records_codec._codec = records_codec.PYTHON if codec == "python" else records_codec.native_codec()
    try:
        return fn()
    finally:
        records_codec._codec = saved


def test_the_c_codec_is_what_runs_when_it_is_built() -> None:
    if records_codec.native_codec() is None:
        pytest.skip("native._codec is not built here (pip install -e . builds it)")
    assert records_codec.implementation() == "native"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(records, min_size=1, max_size=30), st.sampled_from([0, COMPRESSION_GZIP]), st.integers(0, 2**40)
)
def test_both_codecs_encode_the_same_bytes_and_decode_the_same_records(
    recs: list[Record | bytes], compression: int, base: int
) -> None:
    kw = {"timestamp": 1_650_000_000_000, "producer_id": 7, "producer_epoch": 1, "base_sequence": 3}
    encoded = {c: _with(c, lambda: encode_batch(recs, compression=compression, **kw)) for c in _codec_ids()}
    assert len(set(encoded.values())) == 1, "the codecs encode different bytes"
    buf = bytearray(next(iter(encoded.values())))
    set_base_offset(buf, base)
    data = bytes(buf)
    decoded = {c: _with(c, lambda: decode_records(data)) for c in _codec_ids()}
    first = next(iter(decoded.values()))
    assert all(d == first for d in decoded.values())
    assert [r.offset for r in first] == list(range(base, base + len(recs)))
    for got, sent in zip(first, recs, strict=True):
        if type(sent) is bytes:
            assert (got.key, got.value, tuple(got.headers)) == (None, sent, ())
        else:
            assert (got.key, got.value, tuple(got.headers)) == (sent.key, sent.value, tuple(sent.headers))
    # The consumer's rows: the same records as tuples, from both codecs, at any position in a buffer.
    expect = [("t", 3, r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in first]
    padded = b"pad" + data + b"tail"
    for c in _codec_ids():
        for buf, pos in ((data, 0), (padded, 3), (memoryview(padded), 3)):
            rows = _with(c, lambda buf=buf, pos=pos: decode_rows(buf, pos, True, ("t", 3), Row))
            assert all(type(r) is Row for r in rows)
            assert [(*r[:6], list(r[6])) for r in rows] == expect
            assert all(type(r.value) in (bytes, type(None)) for r in rows)


class Row(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: object


class _Bytes(bytes):
    pass


@pytest.mark.parametrize(
    "records",
    [
        ["text"],
        [bytearray(b"v")],
        [memoryview(b"v")],
        [_Bytes(b"v")],
        [b"v", "text"],
        [Record(b"v"), "text"],
        [Record("text")],
        [Record(b"v", key="text")],
        [Record(b"v", headers=[(b"key", b"v")])],
    ],
    ids=[
        "str",
        "bytearray",
        "memoryview",
        "bytes-subclass",
        "str-after-bytes",
        "str-after-a-record",
        "str-value",
        "str-key",
        "bytes-header-key",
    ],
)
@pytest.mark.parametrize("compression", [0, COMPRESSION_GZIP], ids=["plain", "gzip"])
def test_each_codec_refuses_a_record_of_another_type_with_a_batch_error(
    codec: str, records: list, compression: int
) -> None:
    """What encode_batch cannot encode is a BatchError whichever codec runs, never the TypeError
    or AttributeError of the code that met it."""
    with pytest.raises(BatchError, match="cannot be encoded"):
        encode_batch(records, compression=compression)


@pytest.mark.parametrize("name", sorted(POISON))
def test_each_codec_refuses_every_poison_batch(codec: str, name: str) -> None:
    with pytest.raises(BatchError):
        decode_records(poison_batch(name))
    with pytest.raises(BatchError):
        decode_rows(poison_batch(name))
