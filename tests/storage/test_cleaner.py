"""The log cleaner on real files (broker/storage/cleaner.py, log_cleaning.py): what a clean keeps
(each key's last record at its offset, tombstones until their horizon), what it never touches
(the active segment, what is not yet cleanable), what survives it (producer sequences, epochs,
reads at any offset, a reopen, a follower's copy), when a log is due, and a clean the log moved
away from."""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path

import pytest
from compaction_kit import COMPACT, T0, Clock, Model, clean_round, read_all
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.producer_state import ProducerState
from broker.storage import log_cleaning
from broker.storage.cleaner import clean
from broker.storage.epochs import EpochHistory
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import Log, LogConfig
from broker.storage.log_cleaning import CleanerCheckpoint
from broker.storage.offset_map import OffsetMap
from broker.storage.throttle import CleanCancelled, Throttle
from ringlog_proto.batch import Record, encode_batch, iter_batches, read_header


def keyed_log(
    tmp_path: Path, n: int, keys: int, config: LogConfig = COMPACT, seed: int = 1
) -> tuple[Log, Model]:
    rng = random.Random(seed)
    log_ = Log.open(str(tmp_path / "p"), config, clock=Clock())
    model = Model()
    for i in range(n):
        pairs: list[tuple[bytes | None, bytes | None]] = []
        for j in range(rng.randint(1, 6)):
            key = b"k%d" % rng.randrange(keys)
            value = None if rng.random() < 0.1 else b"v%d-%d" % (i, j)
            pairs.append((key, value))
        model.append(log_, pairs)
    return log_, model


def test_each_keys_last_record_stays_at_its_offset_and_the_rest_goes(tmp_path: Path) -> None:
    log_, model = keyed_log(tmp_path, 400, 40)
    before = log_.size_bytes
    assert len(log_.segments) > 4
    cp = CleanerCheckpoint()
    r = clean_round(log_, cp)
    assert r.ok and r.result is not None
    upto = r.dirtiness.upto
    assert r.result.cleaned_to == upto == log_.segments[-1].base_offset, "all but the active segment"
    assert read_all(log_) == model.compacted(upto)
    assert log_.size_bytes < before / 2
    assert (log_.start_offset, log_.end_offset) == (0, max(model.records) + 1), "offsets never move"
    assert not [n for n in os.listdir(log_.directory) if n.endswith((".cleaned", ".swap"))]
    log_.close()
    again = Log.open(log_.directory, COMPACT)
    assert read_all(again) == model.compacted(upto), "the same after a reopen"
    again.close()


def test_the_active_segment_is_never_cleaned(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"), COMPACT)
    model = Model()
    for i in range(10):
        model.append(log_, [(b"same", b"%d" % i)])
    assert len(log_.segments) == 1
    r = clean_round(log_, CleanerCheckpoint())
    assert not r.ok
    assert read_all(log_) == model.records
    log_.close()


def test_tombstones_stay_until_their_delete_horizon_then_go(tmp_path: Path) -> None:
    config = COMPACT
    log_, model = keyed_log(tmp_path, 300, 30, config)
    cp = CleanerCheckpoint()
    first = clean_round(log_, cp, T0)
    assert first.ok and first.result is not None
    upto = first.dirtiness.upto
    assert read_all(log_) == model.compacted(upto, tombstones=True)
    horizon = T0 + config.delete_retention_ms
    assert cp.next_horizon_ms == horizon
    d = log_cleaning.assess(log_, cp, horizon - 1, log_.end_offset)
    assert d.reason is None, "nothing dirty, no horizon come: not due"
    d = log_cleaning.assess(log_, cp, horizon, log_.end_offset)
    assert d.reason == "tombstones past their delete horizon"
    second = clean_round(log_, cp, horizon)
    assert second.ok and second.result is not None and second.result.stats.tombstones_dropped > 0
    assert read_all(log_) == model.compacted(upto, tombstones=False)
    assert cp.next_horizon_ms is None
    log_.close()


def test_a_map_too_small_cleans_what_fits_and_later_rounds_finish(tmp_path: Path) -> None:
    log_, model = keyed_log(tmp_path, 500, 120)
    cp = CleanerCheckpoint()
    upto = None
    rounds = 0
    while True:
        r = clean_round(log_, cp, map_bytes=40 * 24)  # 36 keys at most
        assert r.ok and r.result is not None
        upto = r.dirtiness.upto
        rounds += 1
        served = read_all(log_)
        cleaned_to = r.result.cleaned_to
        assert {o: v for o, v in served.items() if o >= cleaned_to} == {
            o: v for o, v in model.records.items() if o >= cleaned_to
        }, "what the map did not cover is untouched"
        if cleaned_to == upto:
            break
        assert r.result.cleaned_to < upto
    assert rounds > 2
    # a last full round (a big map) changes nothing more: every key already has one record
    assert read_all(log_) == model.compacted(upto)
    log_.close()


def test_a_partial_clean_keeps_every_record_past_what_its_map_covered(tmp_path: Path) -> None:
    log_, model = keyed_log(tmp_path, 300, 80)
    r = clean_round(log_, CleanerCheckpoint(), map_bytes=30 * 24)
    assert r.ok and r.result is not None
    cleaned_to = r.result.cleaned_to
    assert cleaned_to < r.dirtiness.upto
    served = read_all(log_)
    assert {o: v for o, v in served.items() if o >= cleaned_to} == {
        o: v for o, v in model.records.items() if o >= cleaned_to
    }
    # below it, no key twice, and each record kept is its key's last below the cleaned end
    below = model.compacted(cleaned_to)
    assert {o: v for o, v in served.items() if o < cleaned_to} == {
        o: v for o, v in below.items() if o < cleaned_to
    }
    log_.close()


def test_an_idempotent_producers_last_batch_keeps_its_header(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"), COMPACT)
    model = Model()
    model.append(log_, [(b"a", b"1"), (b"b", b"2")], producer_id=7, producer_epoch=3, base_sequence=0)
    model.append(log_, [(b"a", b"3"), (b"b", b"4")], producer_id=7, producer_epoch=3, base_sequence=2)
    for i in range(60):  # a plain producer overwrites both keys, rolling segments
        model.append(log_, [(b"a", b"p%d" % i), (b"b", b"q%d" % i), (b"pad%d" % i, b"x" * 100)])
    before = ProducerState.rebuild(log_.batch_headers())
    assert before.producer(7) == (3, 3)
    producers_last = before.last_offsets()
    assert producers_last == {7: 3}
    r = clean_round(log_, CleanerCheckpoint(), producers_last=producers_last)
    assert r.ok
    kept = [h for h in log_.batch_headers() if h.producer_id == 7]
    # its last batch, emptied (and the log's first, kept for the epoch history and the name)
    assert [(h.base_offset, h.record_count, h.last_offset, h.last_sequence) for h in kept] == [
        (0, 0, 1, 1),
        (2, 0, 3, 3),
    ]
    log_.close()
    again = Log.open(log_.directory, COMPACT)
    after = ProducerState.rebuild(again.batch_headers())
    assert after.producer(7) == (3, 3), "its epoch and last sequence, as before the clean"
    h7 = read_header(encode_batch([b"z"], producer_id=7, producer_epoch=3, base_sequence=4))
    assert after.check([h7]) is None, "its next batch follows"
    again.close()


def test_each_leader_epochs_first_batch_keeps_its_header(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"), COMPACT)
    for epoch in (0, 0, 2, 2, 2, 5, 5):
        for i in range(8):
            pending = log_.prepare_append(
                encode_batch([Record(b"e%d-%d" % (epoch, i) * 30, key=b"k")]), leader_epoch=epoch
            )
            run_ops(log_.io, pending.ops)
            log_.complete_append(pending)
    history = EpochHistory()
    for h in log_.batch_headers():
        history.assign(h.partition_leader_epoch, h.base_offset)
    r = clean_round(log_, CleanerCheckpoint())
    assert r.ok
    rebuilt = EpochHistory()
    for h in log_.batch_headers():
        rebuilt.assign(h.partition_leader_epoch, h.base_offset)
    assert rebuilt.entries() == history.entries() == [(0, 0), (2, 16), (5, 40)]
    log_.close()


def test_reads_at_every_offset_of_a_cleaned_log(tmp_path: Path) -> None:
    log_, _ = keyed_log(tmp_path, 200, 10)
    r = clean_round(log_, CleanerCheckpoint())
    assert r.ok
    served = read_all(log_)
    for offset in range(log_.start_offset, log_.end_offset):
        result = log_.read(offset, 1)
        assert result.next_offset > offset
        after = [h for _, h in iter_batches(result.data)]
        assert after and after[-1].next_offset > offset, "never only batches that end before it"
        first_served = min((o for o in served if o >= offset), default=None)
        records = [o for h in after for o in [h.base_offset]]
        assert records
        if first_served is not None:
            assert after[0].base_offset <= first_served
    log_.close()


def test_a_follower_copies_a_cleaned_log_as_it_is(tmp_path: Path) -> None:
    leader, _ = keyed_log(tmp_path, 250, 12)
    assert clean_round(leader, CleanerCheckpoint()).ok
    follower = Log.open(str(tmp_path / "f"), COMPACT)
    off = 0
    while off < leader.end_offset:
        got = leader.read(off, 2000)
        for pending in follower.prepare_copies(got.data):
            run_ops(follower.io, pending.ops)
            follower.complete_append(pending)
        off = follower.end_offset
    assert follower.end_offset == leader.end_offset
    assert read_all(follower) == read_all(leader)
    follower.close()
    again = Log.open(str(tmp_path / "f"), COMPACT)
    assert read_all(again) == read_all(leader), "recovery takes the gaps for what they are"
    again.close()
    leader.close()


def test_offset_for_a_time_whose_record_was_cleaned_is_the_next_records(tmp_path: Path) -> None:
    log_ = Log.open(str(tmp_path / "p"), COMPACT)
    model = Model()
    for i in range(40):
        model.append(log_, [(b"k%d" % (i % 2), b"x" * 200)], timestamp=T0 + i)
    assert clean_round(log_, CleanerCheckpoint()).ok
    served = read_all(log_)
    # the records at times T0 .. T0+k of the cleaned part are gone but for each key's last
    found = log_.offset_for_timestamp(T0 + 1)
    assert found == min(served)
    log_.close()


def test_compact_alone_retains_everything_compact_delete_retention_still_deletes(tmp_path: Path) -> None:
    clock = Clock()
    for policy, kept in (("compact", True), ("compact,delete", False)):
        config = replace(COMPACT, cleanup_policy=policy, retention_ms=1000)
        log_ = Log.open(str(tmp_path / policy), config, clock=clock)
        for i in range(50):
            log_.append(encode_batch([Record(b"x" * 200, key=b"k%d" % i)]))
        segments = len(log_.segments)
        deleted = log_.apply_retention(clock.now + 5000)
        assert (deleted == 0) == kept and (len(log_.segments) == segments) == kept
        log_.close()


def test_when_a_log_is_due(tmp_path: Path) -> None:
    config = replace(
        COMPACT, min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=10_000, max_compaction_lag_ms=60_000
    )
    clock = Clock()
    log_ = Log.open(str(tmp_path / "p"), config, clock=clock)
    for i in range(100):  # as many keys: a clean keeps them all
        clock.now = T0 + i
        log_.append(encode_batch([Record(b"x" * 100, key=b"k%d" % i)]))
    cp = CleanerCheckpoint()
    young = log_cleaning.assess(log_, cp, T0 + 200, log_.end_offset)
    assert young.segments == () and young.reason is None, "younger than the min lag: not cleanable"
    due = log_cleaning.assess(log_, cp, T0 + 20_000, log_.end_offset)
    assert due.reason == "dirty ratio" and due.ratio == 1.0
    hw = log_cleaning.assess(log_, cp, T0 + 20_000, log_.segments[1].base_offset)
    assert [s.base_offset for s in hw.segments] == [0], "only what is below the high watermark"
    assert clean_round(log_, cp, T0 + 20_000).ok
    clean_ratio = log_cleaning.assess(log_, cp, T0 + 20_000, log_.end_offset)
    assert clean_ratio.reason is None and clean_ratio.dirty_bytes == 0
    # a little more dirt: below the ratio, until the max lag makes it due anyway
    active = log_.segments[-1]
    for i in range(40):
        clock.now = T0 + 30_000 + i
        log_.append(encode_batch([Record(b"y" * 100, key=b"k%d" % i)]))
    assert log_.segments[-1] is not active
    some = log_cleaning.assess(log_, cp, T0 + 50_000, log_.end_offset)
    assert some.dirty_bytes and some.ratio <= 0.5 and some.reason is None
    late = log_cleaning.assess(log_, cp, T0 + 30_000 + 60_001, log_.end_offset)
    assert late.reason == "max compaction lag"
    log_.close()


def test_the_max_compaction_lag_rolls_the_active_segment(tmp_path: Path) -> None:
    config = replace(COMPACT, segment_bytes=1 << 20, max_compaction_lag_ms=1000)
    clock = Clock()
    log_ = Log.open(str(tmp_path / "p"), config, clock=clock)
    log_.append(encode_batch([Record(b"a", key=b"k")]))
    clock.now += 1001
    log_.append(encode_batch([Record(b"b", key=b"k")]))
    assert len(log_.segments) == 2, "rolled by the lag, as Kafka rolls by it (KIP-354)"
    log_.close()


def test_a_clean_is_not_installed_when_the_log_moved_under_it(tmp_path: Path) -> None:
    config = replace(COMPACT, cleanup_policy="compact,delete", retention_ms=1000)
    clock = Clock()
    log_ = Log.open(str(tmp_path / "p"), config, clock=clock)
    model = Model()
    for i in range(120):
        model.append(log_, [(b"k%d" % (i % 7), b"v" * 60)])
    d = log_cleaning.assess(log_, CleanerCheckpoint(), T0, log_.end_offset)
    planned = log_cleaning.plan(log_, d, T0, {})
    assert planned is not None
    result = clean(planned.plan, OffsetMap(1 << 16), SyncFileIO(), Throttle(None))
    assert log_.apply_retention(clock.now + 10_000) > 0  # meanwhile, retention took the oldest segment
    before = read_all(log_)
    assert not log_cleaning.install(log_, planned, result)
    assert read_all(log_) == before
    assert not [n for n in os.listdir(log_.directory) if ".cleaned" in n or ".swap" in n]
    log_.close()


def test_a_cancelled_clean_leaves_no_file(tmp_path: Path) -> None:
    log_, _ = keyed_log(tmp_path, 300, 30)
    d = log_cleaning.assess(log_, CleanerCheckpoint(), T0, log_.end_offset)
    planned = log_cleaning.plan(log_, d, T0, {})
    assert planned is not None
    throttle = Throttle(None)
    calls = []

    def steps(name: str) -> None:
        calls.append(name)
        if name == "cleaned-written":
            throttle.cancel()

    with pytest.raises(CleanCancelled):
        clean(planned.plan, OffsetMap(1 << 16), SyncFileIO(), throttle, steps)
    assert "cleaned-written" in calls
    assert not [n for n in os.listdir(log_.directory) if ".cleaned" in n]
    log_.close()


def test_the_throttle_holds_its_rate_and_yields() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    t = Throttle(1000.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        t.account(500)  # 5000 bytes at 1000 B/s: 5 s
    assert 4.4 <= now[0] <= 5.1 and t.slept_s == pytest.approx(now[0])
    free = Throttle(None, clock=lambda: now[0], sleep=sleep)
    slept.clear()
    now[0] += 1.0
    free.account(10**9)
    assert slept == [0], "no cap: only the loop's turn"
    free.cancel()
    with pytest.raises(CleanCancelled):
        free.account(1)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 15), st.booleans(), st.booleans()), min_size=1, max_size=5),
        min_size=1,
        max_size=120,
    ),
    st.integers(16, 200),
)
def test_any_log_cleaned_any_number_of_times_serves_the_model(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[int, bool, bool]]], map_slots: int
) -> None:
    tmp = tmp_path_factory.mktemp("log")
    log_ = Log.open(str(tmp / "p"), COMPACT, clock=Clock())
    model = Model()
    cp = CleanerCheckpoint()
    for i, batch in enumerate(batches):
        pairs = [
            (None if not keyed else b"k%d" % k, None if tomb else b"v%d" % i * 20) for k, tomb, keyed in batch
        ]
        model.append(log_, pairs)
        if i % 40 == 39:
            clean_round(log_, cp, map_bytes=map_slots * 24)
    r = clean_round(log_, cp, map_bytes=1 << 20)
    upto = r.dirtiness.upto
    while r.ok and r.result is not None and r.result.cleaned_to < upto:
        r = clean_round(log_, cp, map_bytes=1 << 20)
    served = read_all(log_)
    want = model.compacted(upto)
    assert served == want
    log_.close()
