"""A produce's batches are checked in one C call (`ringlog_proto.batch.produced_checker`,
native._records' `rr_check_produced`) for those that pass, and by the Python checks of
`Log.validate` (broker/storage/validation.py) from the first that does not. The two must agree on
what passes: `validate` gives the same headers, or raises the same error with the same message,
with the C check and without it, on intact, damaged, cut and mutated batches (each header field at
its edges, with the crc made right again so that the checks after it are reached)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import broker.storage.validation as validation_module
from broker.storage.log import Log, LogConfig
from labkit.poison_batches import POISON, poison_batch
from ringlog_proto import batch as b
from ringlog_proto import batch_header
from ringlog_proto.batch import COMPRESSION_GZIP, CRC_START, HEADER_SIZE, Record, encode_batch

needs_c = pytest.mark.skipif(b.produced_checker() is None, reason="native._records is not built")


FIELDS = dict(zip(b.BatchHeader._fields, batch_header._HEADER.format[1:], strict=True))


def _field(name: str) -> tuple[int, str]:
    return batch_header._field_at(name), ">" + FIELDS[name]


def with_field(batch: bytes, name: str, value: int) -> bytes:
    """`batch` with one header field set to `value` and its crc made right again."""
    out = bytearray(batch)
    at, fmt = _field(name)
    struct.pack_into(fmt, out, at, value)
    return resealed(out)


def resealed(batch: bytearray | bytes) -> bytes:
    out = bytearray(batch)
    at, fmt = _field("crc")
    struct.pack_into(fmt, out, at, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[tuple[Log, Log]]:
    """The same log config twice: batches are only validated, never appended."""
    a = Log.open(str(tmp_path / "a"), LogConfig(max_batch_bytes=4096))
    c = Log.open(str(tmp_path / "c"), LogConfig(max_batch_bytes=4096, check_records=False))
    try:
        yield a, c
    finally:
        a.close()
        c.close()


def outcome(log: Log, data: bytes | memoryview, c: bool, transactional: bool = False) -> object:
    """What `validate` makes of `data`, with the C check (`c`) or with the Python checks alone."""
    saved = validation_module._check_produced
    if not c:
        validation_module._check_produced = None
    try:
        return log.validate(data, transactional=transactional)
    except Exception as exc:  # the type and message are the outcome compared
        return type(exc).__name__, str(exc)
    finally:
        validation_module._check_produced = saved


CHECK = b.produced_checker()


def agree(log: Log, data: bytes, transactional: bool = False) -> object:
    """The outcome with and without the C check, which must be one; and the C check passes the
    whole of `data` exactly when the Python checks accept it (stricter would only be slower, but
    the twins are meant to be exact), but for a compressed batch's records: inflating them is
    zlib's or cramjam's work, which `validate` does after the C check passed the batch."""
    py = outcome(log, data, False, transactional)
    assert outcome(log, data, True, transactional) == py, data.hex()
    assert outcome(log, memoryview(data), True, transactional) == py
    if CHECK is not None and data:
        passed = CHECK(data, log.config.max_batch_bytes, log.config.check_records, transactional)
        compressed_records = not isinstance(py, list) and any(
            f"{codec} record section" in py[1] or f"{codec}-compressed" in py[1]
            for codec in ("gzip", "snappy", "lz4", "zstd")
        )
        assert (passed == len(data)) == (isinstance(py, list) or compressed_records), (py, data.hex())
    return py


def sample_batches() -> list[bytes]:
    return [
        encode_batch([b"v"]),
        encode_batch([b"x" * 100] * 5, producer_id=7, producer_epoch=1, base_sequence=3),
        encode_batch([Record(b"v", key=b"k", headers=(("h", b"1"), ("\u00e9", None)))]),
        encode_batch([b"z" * 50] * 4, compression=COMPRESSION_GZIP),
    ]


@needs_c
def test_the_broker_uses_the_c_check_when_it_is_built() -> None:
    assert validation_module._check_produced is not None


@needs_c
def test_the_broker_uses_the_c_check_of_a_followers_copy_when_it_is_built() -> None:
    assert validation_module._check_stored is not None


@needs_c
def test_the_c_check_passes_the_leading_good_batches() -> None:
    check = b.produced_checker()
    assert check is not None
    good = encode_batch([b"a"] * 3) + encode_batch([b"b"])
    bad = poison_batch("trailing_bytes")
    assert check(good, 4096, True, False) == len(good)
    assert check(memoryview(good), 4096, True, False) == len(good)
    assert check(good + bad, 4096, True, False) == len(good)
    assert check(good + bad, 4096, False, False) == len(good + bad)  # the walk only finds a poison batch
    assert check(bad + good, 4096, True, False) == 0
    assert check(b"", 4096, True, False) == 0
    one = encode_batch([b"a"] * 3)
    assert check(one, len(one), True, False) == len(one)
    assert check(one, len(one) - 1, True, False) == 0  # the size limit
    txn = with_field(one, "attributes", b.TRANSACTIONAL_BIT)
    marker = b.control_batch(7, 0, True, 0, 1000)
    assert check(good + txn, 4096, True, False) == len(good)  # refused unless allowed
    assert check(good + txn + good, 4096, True, True) == len(good + txn + good)
    assert check(good + marker, 4096, True, True) == len(good)  # a marker never is


def test_intact_batches(logs: tuple[Log, Log]) -> None:
    for log in logs:
        data = b"".join(sample_batches())
        headers = agree(log, data)
        assert isinstance(headers, list) and len(headers) == 4
        for one in sample_batches():
            assert isinstance(agree(log, one), list)


def test_every_flipped_byte_and_every_cut(logs: tuple[Log, Log]) -> None:
    data = encode_batch([b"a", b"bc"]) + encode_batch([Record(b"v", key=b"k", headers=(("h", b"1"),))])
    for log in logs:
        for i in range(len(data)):
            for flip in (0x01, 0x80, 0xFF):
                damaged = bytearray(data)
                damaged[i] ^= flip
                agree(log, bytes(damaged))
        for n in range(len(data) + 1):
            agree(log, data[:n])


def test_poison_batches(logs: tuple[Log, Log]) -> None:
    """Framing only the walk finds: refused with the walk on, passed with it off."""
    for name in sorted(POISON):
        for log in logs:
            agree(log, poison_batch(name))
            agree(log, encode_batch([b"ok"]) + poison_batch(name))


def test_transactional_and_control_batches(logs: tuple[Log, Log]) -> None:
    """Both switches, both twins: a transactional batch passes only when allowed, a control batch
    (a marker, or the control bit alone) never, and either refusal is UnsupportedBatchError with
    the reason both twins give."""
    marker = b.control_batch(7, 1, False, 3, 1000)
    for log in logs:
        for transactional in (False, True):
            for batch in sample_batches():
                attributes = b.read_header(batch).attributes
                for bits in (b.TRANSACTIONAL_BIT, b.CONTROL_BIT, b.TRANSACTIONAL_BIT | b.CONTROL_BIT):
                    changed = with_field(batch, "attributes", attributes | bits)
                    got = agree(log, changed, transactional)
                    if transactional and bits == b.TRANSACTIONAL_BIT:
                        assert isinstance(got, list) and got[0].transactional
                    else:
                        assert isinstance(got, tuple) and got[0] == "UnsupportedBatchError", got
                    agree(log, batch + changed + batch, transactional)
            got = agree(log, marker, transactional)
            assert got == ("UnsupportedBatchError", b.refused_batch(b.read_header(marker), transactional))


def test_a_followers_copy_takes_transactional_and_control_batches(logs: tuple[Log, Log]) -> None:
    """`stored` (a follower's copy of its leader's batches) is not a produce: both kinds pass."""
    batches = [
        encode_batch([b"v"] * 2),
        with_field(encode_batch([b"t"], producer_id=7, producer_epoch=1), "attributes", b.TRANSACTIONAL_BIT),
        b.control_batch(7, 1, True, 3, 1000),
    ]
    for log in logs:
        headers = log.validate_copy(b"".join(batches))
        kinds = [(h.transactional, h.control) for h in headers]
        assert kinds == [(False, False), (True, False), (True, True)]


EDGES = {
    "magic": [0, 1, 3, -1],
    "batch_length": [-100, -12, 0, HEADER_SIZE - 13, HEADER_SIZE - 12, 10**6, 4096 - 12, 4096 - 11],
    "record_count": [-1, 0, 1, 2, 3, b.RECORD_COUNT_MAX, b.RECORD_COUNT_MAX + 1, 2**31 - 1],
    "last_offset_delta": [-1, 0, 1, 2, 3, 2**31 - 1],
    "attributes": [0, 1, 2, 3, 4, 5, 6, 7, 0x08, 0x10, 0x20, 0x40, 0x80, 0x100, -1, -32768, 0x09],
    "base_timestamp": [-(2**63), -1, 0, 1_700_000_000_000, 2**63 - 1],
    "max_timestamp": [-(2**63), -1, 0, 1_700_000_000_000, 2**63 - 1],
    "producer_id": [-1, 0, 2**63 - 1],
    "base_sequence": [-1, 0, 2**31 - 1],
    "partition_leader_epoch": [-1, 0, 7],
    "base_offset": [-1, 0, 2**63 - 1],
}


@pytest.mark.parametrize("name", sorted(EDGES))
def test_each_header_field_at_its_edges(logs: tuple[Log, Log], name: str) -> None:
    batches = sample_batches()
    for log in logs:
        for value in EDGES[name]:
            for batch in batches:
                agree(log, with_field(batch, name, value))
                agree(log, batches[0] + with_field(batch, name, value))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.data(),
    st.sampled_from(sorted(set(FIELDS) - {"crc"})),
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
)
def test_random_header_values(
    logs: tuple[Log, Log], data: st.DataObject, name: str, value: int, crc_right: bool
) -> None:
    fmt = ">" + FIELDS[name]
    bits = struct.calcsize(fmt) * 8
    signed = FIELDS[name].islower()
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    value = lo + (value - lo) % (hi - lo + 1)
    batch = data.draw(st.sampled_from(sample_batches()))
    out = bytearray(batch)
    struct.pack_into(fmt, out, batch_header._field_at(name), value)
    mutated = resealed(out) if crc_right else bytes(out)
    for log in logs:
        agree(log, mutated)


def test_random_bytes(logs: tuple[Log, Log]) -> None:
    """Garbage that happens to start like a batch header."""
    head = encode_batch([b"v"])[:HEADER_SIZE]
    for _ in range(200):
        body = os.urandom(int.from_bytes(os.urandom(1), "big"))
        for log in logs:
            agree(log, body)
            agree(log, resealed(head + body) if len(head + body) >= HEADER_SIZE else head + body)


# ----------------------------------------------------------------------------- a follower's copies

STORED = b.stored_checker()


def stored_outcome(data: bytes | memoryview, c: bool, max_batch: int = 4096) -> object:
    """What `validate_stored` makes of `data`, with the C check (`c`) or the Python checks alone."""
    saved = validation_module._check_stored
    if not c:
        validation_module._check_stored = None
    try:
        return validation_module.validate_stored(data, max_batch)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        validation_module._check_stored = saved


def agree_stored(data: bytes, max_batch: int = 4096) -> object:
    """`validate_stored` with and without the C check is one outcome, and the C check passes the
    whole of `data` exactly when the Python checks accept it (no exception for compressed
    records here: neither twin inflates them)."""
    py = stored_outcome(data, False, max_batch)
    assert stored_outcome(data, True, max_batch) == py, data.hex()
    assert stored_outcome(memoryview(data), True, max_batch) == py
    if STORED is not None and data:
        assert (STORED(data, max_batch) == len(data)) == isinstance(py, list), (py, data.hex())
    return py


def cleaned_shapes() -> list[bytes]:
    """Batches a leader's cleaner leaves (broker/storage/cleaner.py): fewer records than offsets,
    none at all (the header alone), a delete horizon in place of the first timestamp."""
    five = encode_batch([b"a"] * 5)
    fewer = with_field(with_field(encode_batch([b"a"] * 2), "last_offset_delta", 4), "record_count", 2)
    empty = bytearray(five[:HEADER_SIZE])
    struct.pack_into(">i", empty, batch_header._field_at("batch_length"), HEADER_SIZE - 12)
    empty_batch = with_field(with_field(bytes(empty), "record_count", 0), "last_offset_delta", 4)
    horizon = with_field(five, "attributes", b.DELETE_HORIZON_BIT)
    horizon = with_field(horizon, "base_timestamp", 2**40)
    return [fewer, empty_batch, horizon]


def test_a_followers_copy_passes_the_same_batches_in_c_and_python(logs: tuple[Log, Log]) -> None:
    marker = b.control_batch(7, 1, True, 3, 1000)
    txn = with_field(encode_batch([b"t"], producer_id=7, producer_epoch=1), "attributes", b.TRANSACTIONAL_BIT)
    shapes = [*sample_batches(), *cleaned_shapes(), txn, marker]
    for one in shapes:
        assert isinstance(agree_stored(one), list), one.hex()
    got = agree_stored(b"".join(shapes))
    assert isinstance(got, list) and len(got) == len(shapes)
    assert [h.record_count for h in got[4:7]] == [2, 0, 5]
    assert isinstance(agree_stored(shapes[0], max_batch=len(shapes[0]) - 1), tuple), "the size limit"


def test_a_followers_copy_is_not_walked_nor_inflated() -> None:
    """The leader walked the records when they were produced; the crc covers them since."""
    for name in sorted(POISON):
        assert isinstance(agree_stored(poison_batch(name)), list), name


def test_a_followers_copy_every_flipped_byte_and_every_cut() -> None:
    """Both twins agree on each; a flip the crc covers (from the crc field on) is always refused."""
    parts = [encode_batch([b"a", b"bc"]), *cleaned_shapes()]
    data = b"".join(parts)
    covered: set[int] = set()
    pos = 0
    for part in parts:
        covered.update(range(pos + CRC_START - 4, pos + len(part)))
        pos += len(part)
    for i in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[i] ^= flip
            got = agree_stored(bytes(damaged))
            assert i not in covered or isinstance(got, tuple), f"byte {i} ^ {flip:#x} passed"
    for n in range(len(data) + 1):
        agree_stored(data[:n])


@pytest.mark.parametrize("name", sorted(EDGES))
def test_a_followers_copy_each_header_field_at_its_edges(name: str) -> None:
    batches = sample_batches() + cleaned_shapes()
    for value in EDGES[name]:
        for batch in batches:
            agree_stored(with_field(batch, name, value))
            agree_stored(batches[0] + with_field(batch, name, value))


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(sorted(set(FIELDS) - {"crc"})), st.integers(-(2**63), 2**63 - 1))
def test_a_followers_copy_random_header_values(data: st.DataObject, name: str, value: int) -> None:
    fmt = ">" + FIELDS[name]
    bits = struct.calcsize(fmt) * 8
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if FIELDS[name].islower() else (0, 2**bits - 1)
    value = lo + (value - lo) % (hi - lo + 1)
    batch = data.draw(st.sampled_from(sample_batches() + cleaned_shapes()))
    out = bytearray(batch)
    struct.pack_into(fmt, out, batch_header._field_at(name), value)
    agree_stored(resealed(out))


def test_a_followers_copy_random_bytes() -> None:
    head = encode_batch([b"v"])[:HEADER_SIZE]
    for _ in range(200):
        body = os.urandom(int.from_bytes(os.urandom(1), "big"))
        agree_stored(body)
        agree_stored(resealed(head + body) if len(head + body) >= HEADER_SIZE else head + body)
