"""Shared helpers for the storage tests, handed out as the `kit` fixture.

Every record written by these tests has the value `off-<its offset>` (padded to a chosen width), so
any record read back checks itself: a wrong offset, a shifted batch or a stale byte shows up as a
value that does not match its offset.

The oracle for what is on disk is `store_batches`, which parses a store file with the codec alone
(`ringlog_proto.batch`), independently of the storage engine under test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.storage.index import ENTRY_SIZE, INDEX_HEADER_SIZE, decode_entry, invalid_header
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import (
    LENGTH_PREFIX_SIZE,
    decode_batches,
    encode_batch,
    invalid_batch,
    peek_size,
    read_header,
)

T0 = 1_700_000_000_000  # a fixed "now" for fake clocks, in ms


@dataclass(frozen=True)
class StoredBatch:
    """A batch found in a store file by the oracle parser."""

    position: int
    size: int
    base_offset: int
    record_count: int
    raw: bytes = field(default=b"", compare=False, repr=False)  # the batch's bytes

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


class FakeClock:
    """A settable clock in ms, for `Log.open(..., clock=...)`."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Kit:
    """Helpers; see the module docstring."""

    T0 = T0
    FakeClock = FakeClock

    # ------------------------------------------------------------------ batches and appends

    @staticmethod
    def value(offset: int, width: int = 0) -> bytes:
        return f"off-{offset}".ljust(width, ".").encode()

    @staticmethod
    def batch(first_offset: int, count: int, *, width: int = 0, timestamp: int = T0) -> bytes:
        """A batch whose i-th record has value `off-<first_offset + i>`."""
        return encode_batch([Kit.value(first_offset + i, width) for i in range(count)], timestamp=timestamp)

    @staticmethod
    def append_batches(
        log: Log,
        n: int,
        *,
        counts: Iterable[int] = (1, 2, 3, 4),
        width: int = 23,  # 30-byte records, 23 + 7 bytes of framing: sizes the tests were tuned for
        clock: FakeClock | None = None,
    ) -> list[tuple[int, int]]:
        """Append `n` self-checking batches; returns [(base offset, record count)]."""
        counts = list(counts)
        out = []
        for i in range(n):
            count = counts[i % len(counts)]
            base = log.end_offset
            ts = clock.now if clock is not None else T0
            got = log.append(Kit.batch(base, count, width=width, timestamp=ts))
            assert got == base, "append must return the offset the log was at"
            out.append((base, count))
        return out

    # ------------------------------------------------------------------ reading back

    @staticmethod
    def check_records(records: list, first_offset: int | None = None) -> None:
        """Every record carries its own offset as its value; offsets are consecutive."""
        for i, rec in enumerate(records):
            assert rec.value.rstrip(b".") == f"off-{rec.offset}".encode(), rec
            if i:
                assert rec.offset == records[i - 1].offset + 1, (records[i - 1], rec)
            elif first_offset is not None:
                assert rec.offset == first_offset, (first_offset, rec)

    @staticmethod
    def read_all(log: Log, max_bytes: int = 1000) -> list[int]:
        """Read from start_offset to end_offset in small steps, checking everything; the offsets read.

        Gaps (offsets no segment holds) are allowed and skipped; damage is not: a read that
        reports an error fails the test.
        """
        offsets: list[int] = []
        off = log.start_offset
        end = log.end_offset
        steps = 0
        while off < end:
            r = log.read(off, max_bytes)
            assert r.error is None, r.error
            if not r.data:  # a gap at the end of a segment whose successor is empty
                break
            records = decode_batches(r.data)
            assert records, r
            Kit.check_records(records, r.first_offset)
            assert r.next_offset == records[-1].offset + 1
            new = [rec.offset for rec in records if rec.offset >= off]
            assert new, (off, r)
            offsets.extend(new)
            off = r.next_offset
            steps += 1
            assert steps < 100_000
        return offsets

    @staticmethod
    def expected_offsets(batches: Iterable[tuple[int, int]]) -> list[int]:
        return [base + i for base, count in batches for i in range(count)]

    @staticmethod
    def read_batch(log: Log, base: int, count: int) -> None:
        """The batch at `base` reads back whole and right."""
        r = log.read(base, 1)
        assert r.error is None
        assert r.first_offset == base
        records = decode_batches(r.data)
        assert [rec.offset for rec in records] == list(range(base, base + count))
        Kit.check_records(records, base)

    # ------------------------------------------------------------------ files

    @staticmethod
    def store_batches(path: str | Path) -> list[StoredBatch]:
        """Whole, valid batches from the start of a store file (the oracle; stops at damage)."""
        data = Path(path).read_bytes()
        out = []
        pos = 0
        while len(data) - pos >= LENGTH_PREFIX_SIZE:
            size = peek_size(data, pos)
            assert size is not None
            if invalid_batch(data[pos : pos + size]) is not None:
                break
            h = read_header(data, pos)
            out.append(StoredBatch(pos, size, h.base_offset, h.record_count, data[pos : pos + size]))
            pos += size
        return out

    @staticmethod
    def index_entries(path: str | Path, base_offset: int) -> list:
        """The entries of an index file, which must have a valid header and whole entries."""
        data = Path(path).read_bytes()
        assert invalid_header(data, base_offset) is None, invalid_header(data, base_offset)
        body = data[INDEX_HEADER_SIZE:]
        assert len(body) % ENTRY_SIZE == 0, len(body)
        return [decode_entry(body[i : i + ENTRY_SIZE]) for i in range(0, len(body), ENTRY_SIZE)]

    @staticmethod
    def segment_bases(directory: str | Path, suffix: str = ".log") -> list[int]:
        return sorted(
            int(n[:20]) for n in os.listdir(directory) if n.endswith(suffix) and len(n) == 20 + len(suffix)
        )

    @staticmethod
    def store_path(directory: str | Path, base: int) -> Path:
        return Path(directory) / f"{base:020d}.log"

    @staticmethod
    def index_path(directory: str | Path, base: int) -> Path:
        return Path(directory) / f"{base:020d}.index"

    @staticmethod
    def crash(log: Log) -> None:
        """Abandon a log as a killed process would: close its fds, write nothing more.

        What is on disk is what the kernel has: every completed write, and no lazy index entries.
        """
        log.abandon()
        log.segments = []

    @staticmethod
    def fresh_copy(src: Path, dst: Path) -> Path:
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)
        return dst

    @staticmethod
    def damage(path: Path, edit: Callable[[bytearray], bytes | bytearray]) -> None:
        path.write_bytes(bytes(edit(bytearray(path.read_bytes()))))


@pytest.fixture
def kit() -> type[Kit]:
    return Kit


@pytest.fixture
def small_config() -> LogConfig:
    """Segments of 4 KiB: a few dozen small batches roll several segments."""
    return LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=None)
