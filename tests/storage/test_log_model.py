"""Random operation sequences on a real Log, checked against a list of records (the model).

Every step runs against real files; small segments make rollover frequent. Reopen comes in two
kinds: a clean close, and a crash (file descriptors dropped without the index being written),
after which recovery must rebuild what the lazy index had not written yet.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import Record, decode_batches, encode_batch


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def crash(log: Log) -> None:
    """Drop the log as a killed process would: fds closed, nothing written or synced."""
    log.abandon()


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ringlog-model-")
        self.clock = Clock()
        self.config = LogConfig(segment_bytes=1500, max_batch_bytes=1400, retention_ms=None)
        self.log = Log.open(self.dir, self.config, clock=self.clock)
        # The model: batches as (base offset, [(timestamp, value), ...]).
        self.batches: list[tuple[int, list[tuple[int, bytes]]]] = []
        self.start = 0
        self.end = 0
        self.next_ts = 1000

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def records(self) -> list[tuple[int, int, bytes]]:
        return [(base + i, ts, v) for base, recs in self.batches for i, (ts, v) in enumerate(recs)]

    @rule(
        count=st.integers(1, 8),
        size=st.integers(0, 120),
        ts_jumps=st.lists(st.integers(-50, 200), min_size=8, max_size=8),
    )
    def append(self, count: int, size: int, ts_jumps: list[int]) -> None:
        base = self.end
        recs = []
        for i in range(count):
            self.next_ts += ts_jumps[i]
            recs.append((self.next_ts, f"{base + i}:".encode() + b"v" * size))
        batch = encode_batch([Record(v, key=b"k", timestamp=ts) for ts, v in recs])
        got = self.log.append(batch)
        assert got == base
        self.batches.append((base, recs))
        self.end = base + count

    @precondition(lambda self: self.batches)
    @rule(data=st.data(), max_bytes=st.integers(1, 3000))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        result = self.log.read(offset, max_bytes)
        assert result.error is None
        got = decode_batches(result.data)
        if offset == self.end:
            assert got == []
            return
        expected = {o: (ts, v) for o, ts, v in self.records()}
        assert got, "a read below the end returns at least one batch"
        assert got[0].offset <= offset <= got[-1].offset
        bases = {b for b, _ in self.batches}
        if len(result.data) > max_bytes:
            assert [r.offset for r in got if r.offset in bases] == [got[0].offset], "oversize: one batch"
        for rec in got:
            assert expected[rec.offset] == (rec.timestamp, rec.value)
        assert result.next_offset == got[-1].offset + 1
        # Whole batches only: the read starts at a batch boundary and ends at one.
        assert got[0].offset in bases
        assert result.next_offset in bases or result.next_offset == self.end

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        new_end = self.log.truncate(offset)
        self.batches = [(b, r) for b, r in self.batches if b + len(r) - 1 < offset]
        self.end = self.batches[-1][0] + len(self.batches[-1][1]) if self.batches else self.start
        assert new_end == self.end

    @rule()
    def flush(self) -> None:
        self.log.flush()
        assert self.log.durable_offset == self.end

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.log.close()
        else:
            crash(self.log)
        self.log = Log.open(self.dir, self.config, clock=self.clock)
        assert self.log.start_offset == self.start
        assert self.log.end_offset == self.end

    @rule(retention_bytes=st.integers(0, 5000))
    def retention_by_size(self, retention_bytes: int) -> None:
        self.log.config = LogConfig(
            segment_bytes=1500, max_batch_bytes=1400, retention_ms=None, retention_bytes=retention_bytes
        )
        self.log.apply_retention()
        self.log.config = self.config
        segs = self.log.segments
        assert self.log.size_bytes <= retention_bytes or len(segs) == 1
        self._drop_below(self.log.start_offset)

    @rule(age_ms=st.integers(0, 3000))
    def retention_by_age(self, age_ms: int) -> None:
        self.clock.now += 1000
        self.log.config = LogConfig(segment_bytes=1500, max_batch_bytes=1400, retention_ms=age_ms)
        self.log.apply_retention()
        self.log.config = self.config
        for seg in self.log.segments[:-1]:
            assert seg.last_append_ms is not None
        first = self.log.segments[0]
        if len(self.log.segments) > 1:
            assert first.last_append_ms is not None
            assert self.clock.now - first.last_append_ms <= age_ms
        self._drop_below(self.log.start_offset)

    def _drop_below(self, start: int) -> None:
        assert start >= self.start
        bases = {b for b, _ in self.batches} | {self.end}
        assert start in bases or start == self.start, "retention deletes whole segments"
        self.batches = [(b, r) for b, r in self.batches if b >= start]
        self.start = start

    @rule(data=st.data())
    def find_timestamp(self, data: st.DataObject) -> None:
        ts = data.draw(st.integers(0, self.next_ts + 100))
        expected = next((o for o, t, _ in self.records() if t >= ts), None)
        assert self.log.offset_for_timestamp(ts) == expected

    @invariant()
    def marks_in_order(self) -> None:
        log = self.log
        assert log.start_offset == self.start
        assert log.end_offset == self.end
        assert log.start_offset <= log.durable_offset <= log.end_offset
        names = sorted(os.listdir(self.dir))
        bases = [int(n[:20]) for n in names if n.endswith(".log")]
        assert bases == [s.base_offset for s in log.segments]
        assert bases == sorted(set(bases))


LogMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogModel = LogMachine.TestCase
