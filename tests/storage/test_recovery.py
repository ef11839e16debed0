"""Crash and corruption recovery of the segmented log, on real files.

Pattern: build a log, stop it (a clean `close`, or `kit.crash`, which drops it the way a killed
process does: completed writes are in the files, lazy index entries are not), snapshot the
directory, then damage a fresh copy of the snapshot and reopen it. The oracle for "what was intact"
is `kit.store_batches`, a parse of the store file with the codec alone.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.storage.errors import CorruptBatchError, OffsetOutOfRangeError
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.index import ENTRY_SIZE, INDEX_HEADER_SIZE
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import HEADER_SIZE, decode_batches

REPO = Path(__file__).resolve().parents[2]
MINUTE = 60_000
HOUR = 60 * MINUTE


# --------------------------------------------------------------------------------------- helpers


def build(kit, directory: Path, config: LogConfig, n: int, shutdown: str) -> list[tuple[int, int]]:
    """A log of at least `n` self-checking batches over several segments, with at least 8 batches
    in the active segment, stopped by `shutdown`."""
    log = Log.open(str(directory), config)
    written = kit.append_batches(log, n)
    while sum(base >= log.segments[-1].base_offset for base, _ in written) < 8:
        written += kit.append_batches(log, 1, counts=[len(written) % 4 + 1])
    assert len(log.segments) >= 3, "the test wants at least two closed segments"
    if shutdown == "close":
        log.close()
    else:
        kit.crash(log)
    return written


def reopen_and_check(
    kit,
    directory: Path,
    config: LogConfig,
    expected: list[tuple[int, int]],
    active_base: int | None = None,
    active_size: int | None = None,
) -> Log:
    """Reopen; exactly the `expected` batches read back; end_offset is right after the last one;
    the active store was cut to `active_size`; a new append gets end_offset and reads back."""
    log = Log.open(str(directory), config)
    expected_end = expected[-1][0] + expected[-1][1] if expected else 0
    assert log.end_offset == expected_end
    assert log.durable_offset == expected_end
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(expected)
    if active_base is not None:
        assert log.segments[-1].base_offset == active_base
        store = kit.store_path(directory, active_base)
        assert store.stat().st_size == active_size, "recovery must cut the torn tail off the file"
        # The rewritten index matches the store batch for batch.
        entries = kit.index_entries(kit.index_path(directory, active_base), active_base)
        stored = kit.store_batches(store)
        assert [(e.relative_offset + active_base, e.position) for e in entries] == [
            (b.base_offset, b.position) for b in stored
        ]
    got = log.append(kit.batch(expected_end, 3))
    assert got == expected_end
    kit.read_batch(log, expected_end, 3)
    assert log.end_offset == expected_end + 3
    return log


def check_cut_at(kit, work: Path, config: LogConfig, closed: list, stored: list, active: int, p: int) -> None:
    """After damage at byte `p` of the active store: the closed segments' batches and every
    batch wholly before `p` read back, and nothing else does (see `reopen_and_check`).

    "Wholly before `p`" is judged on the bytes: junk that happens to rewrite what the cut removed
    (a record ends with a zero byte, its header count) leaves that batch intact, as it should."""
    data = kit.store_path(work, active).read_bytes()
    intact = []
    for b in stored:
        if b.end <= p or (len(data) >= b.end and data[b.position : b.end] == b.raw):
            intact.append(b)
        else:
            break
    expected = closed + [(b.base_offset, b.record_count) for b in intact]
    try:
        log = reopen_and_check(kit, work, config, expected, active, intact[-1].end if intact else 0)
    except AssertionError as exc:
        raise AssertionError(f"store cut at byte {p}: {exc}") from exc
    log.close()


def cut(path: Path, size: int) -> None:
    os.truncate(path, size)


# --------------------------------------------------------------------------------------- baseline


@pytest.mark.parametrize("shutdown", ["close", "crash"])
def test_reopen_reads_everything_and_continues(tmp_path, kit, small_config, shutdown):
    d = tmp_path / "log"
    written = build(kit, d, small_config, 80, shutdown)
    log = reopen_and_check(kit, d, small_config, written)
    log.close()
    # Once more, after the recovered log itself was closed: the new batch is there too.
    log = Log.open(str(d), small_config)
    end = written[-1][0] + written[-1][1]
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets([*written, (end, 3)])
    # Every segment's index on disk is complete and agrees with its store.
    for base in kit.segment_bases(d):
        entries = kit.index_entries(kit.index_path(d, base), base)
        stored = kit.store_batches(kit.store_path(d, base))
        assert stored and stored[-1].end == kit.store_path(d, base).stat().st_size
        assert [(e.relative_offset + base, e.position) for e in entries] == [
            (b.base_offset, b.position) for b in stored
        ]
    log.close()


# --------------------------------------------------------------------------------------- store damage


@pytest.mark.parametrize("shutdown", ["close", "crash"])
def test_torn_active_store_at_every_position(tmp_path, kit, small_config, shutdown):
    snap = tmp_path / "snap"
    written = build(kit, snap, small_config, 60, shutdown)
    active = kit.segment_bases(snap)[-1]
    stored = kit.store_batches(kit.store_path(snap, active))
    assert [(b.base_offset, b.record_count) for b in stored] == [w for w in written if w[0] >= active]
    assert len(stored) >= 4
    size = stored[-1].end
    rng = random.Random(1234)
    positions = set(range(stored[-3].position, size + 1)) | set(rng.sample(range(size), 25)) | {0}
    closed = [w for w in written if w[0] < active]
    for p in sorted(positions):
        work = kit.fresh_copy(snap, tmp_path / "work")
        cut(kit.store_path(work, active), p)
        check_cut_at(kit, work, small_config, closed, stored, active, p)


@pytest.mark.parametrize("shutdown", ["close", "crash"])
@pytest.mark.parametrize("tail", ["zeros", "zeros_to_old_size", "garbage", "stale_batch"])
def test_junk_after_torn_active_store(tmp_path, kit, small_config, shutdown, tail):
    """Cut the store anywhere, then add what a crash can leave: zeros (power loss after the size
    was extended), random garbage, or a whole stale batch from earlier (right crc, wrong offset)."""
    snap = tmp_path / "snap"
    written = build(kit, snap, small_config, 60, shutdown)
    active = kit.segment_bases(snap)[-1]
    store = kit.store_path(snap, active)
    stored = kit.store_batches(store)
    original = store.read_bytes()
    size = len(original)
    rng = random.Random(f"{tail}-{shutdown}")
    positions = set(range(stored[-3].position, size + 1, 9)) | set(rng.sample(range(size), 10)) | {size}
    closed = [w for w in written if w[0] < active]
    for p in sorted(positions):
        if tail == "zeros":
            junk = bytes(4096)
        elif tail == "zeros_to_old_size":
            junk = bytes(size - p)
        elif tail == "garbage":
            junk = rng.randbytes(rng.randrange(1, 300))
        else:  # any batch but the one that belongs at p (that one would be valid there)
            choices = [b for b in stored if b.position != p]
            b = choices[rng.randrange(len(choices))]
            junk = original[b.position : b.end]
        work = kit.fresh_copy(snap, tmp_path / "work")
        kit.store_path(work, active).write_bytes(original[:p] + junk)
        check_cut_at(kit, work, small_config, closed, stored, active, p)


def test_crash_with_unflushed_index_then_power_loss_zeros(tmp_path, kit, small_config):
    """Process killed with the index entries still in memory, then 4 KiB of zeros on the store:
    recovery scans the store from the start of the segment and keeps every intact batch."""
    d = tmp_path / "log"
    written = build(kit, d, small_config, 60, "crash")
    active = kit.segment_bases(d)[-1]
    # The lazy index of the active segment did not reach the file.
    assert kit.index_path(d, active).stat().st_size == INDEX_HEADER_SIZE
    store = kit.store_path(d, active)
    size = store.stat().st_size  # the batches and what was preallocated after them (zeros)
    with store.open("ab") as f:
        f.write(bytes(4096))
    batches = kit.store_batches(store)
    data_end = batches[-1].position + batches[-1].size
    assert data_end <= size
    reopen_and_check(kit, d, small_config, written, active, data_end).close()


# --------------------------------------------------------------------------------------- index damage


def index_damages(rng: random.Random, size: int, entries: int):
    """(name, edit) pairs: every kind of index damage a crash or a bad disk leaves."""
    last = INDEX_HEADER_SIZE + (entries - 1) * ENTRY_SIZE
    mid = INDEX_HEADER_SIZE + (entries // 2) * ENTRY_SIZE
    first = INDEX_HEADER_SIZE

    def zero(at: int, n: int = ENTRY_SIZE):
        return lambda b: b[:at] + bytes(n) + b[at + n :]

    def swap(i: int, j: int):  # entries at byte positions i < j trade places
        return lambda b: (
            b[:i]
            + b[j : j + ENTRY_SIZE]
            + b[i + ENTRY_SIZE : j]
            + b[i : i + ENTRY_SIZE]
            + b[j + ENTRY_SIZE :]
        )

    def garbage(at: int, n: int = ENTRY_SIZE):
        junk = rng.randbytes(n)
        return lambda b: b[:at] + junk + b[at + n :]

    out = []
    cuts = set(range(0, first + 2 * ENTRY_SIZE)) | set(range(last - ENTRY_SIZE, size + 1))
    cuts |= set(rng.sample(range(size), 10))
    for c in sorted(cuts):
        out.append((f"cut@{c}", lambda b, c=c: b[:c]))
    out += [
        ("deleted", None),
        ("zero entry 0", zero(first)),
        ("zero entry 1", zero(first + ENTRY_SIZE)),
        ("zero middle entry", zero(mid)),
        ("zero last entry", zero(last)),
        ("zero all entries", lambda b: b[:first] + bytes(len(b) - first)),
        ("zero whole file", lambda b: bytes(len(b))),
        ("zeros appended", lambda b: b + bytes(4096)),
        ("garbage entry 0", garbage(first)),
        ("garbage middle entry", garbage(mid)),
        ("garbage last entry", garbage(last)),
        ("garbage appended", lambda b: b + rng.randbytes(3 * ENTRY_SIZE)),
        ("garbage after header", lambda b: b[:first] + rng.randbytes(len(b) - first)),
        ("bad magic", lambda b: b"XLIX" + b[4:]),
        ("bad version", lambda b: b[:4] + b"\x02" + b[5:]),
        ("wrong base offset", lambda b: b[:8] + struct.pack(">q", 12345) + b[16:]),
        ("entries 0 and middle swapped", swap(first, mid)),
    ]
    return out


@pytest.mark.parametrize("which", ["active", "closed"])
def test_index_damage_loses_nothing(tmp_path, kit, small_config, which):
    """The index is a cache of the store: whatever happens to it, every batch still reads back,
    end_offset is unchanged, and the index file is rebuilt to agree with the store."""
    snap = tmp_path / "snap"
    written = build(kit, snap, small_config, 60, "close")
    bases = kit.segment_bases(snap)
    base = bases[-1] if which == "active" else bases[1]
    index = kit.index_path(snap, base)
    entries = len(kit.index_entries(index, base))
    assert entries >= 4
    rng = random.Random(which)
    for name, edit in index_damages(rng, index.stat().st_size, entries):
        work = kit.fresh_copy(snap, tmp_path / "work")
        target = kit.index_path(work, base)
        if edit is None:
            target.unlink()
        else:
            kit.damage(target, edit)
        try:
            log = reopen_and_check(kit, work, small_config, written)
            log.close()
            # After the close, every index file is whole and agrees with its store.
            for b in kit.segment_bases(work):
                got = kit.index_entries(kit.index_path(work, b), b)
                stored = kit.store_batches(kit.store_path(work, b))
                assert [(e.relative_offset + b, e.position) for e in got] == [
                    (s.base_offset, s.position) for s in stored
                ]
        except AssertionError as exc:
            raise AssertionError(f"index damage {name!r}: {exc}") from exc


def test_orphan_index_files_are_removed(tmp_path, kit, small_config):
    d = tmp_path / "log"
    written = build(kit, d, small_config, 60, "close")
    bases = kit.segment_bases(d)
    # A retention delete that died between its two unlinks (store first, then index) ...
    kit.store_path(d, bases[0]).unlink()
    # ... and index files with no store anywhere else in the offset range.
    end = written[-1][0] + written[-1][1]
    for orphan in (bases[1] + 1, end, end + 1000):
        kit.index_path(d, orphan).write_bytes(b"RLIX\x01\x00\x00\x00" + struct.pack(">q", orphan))
    (d / "notes.txt").write_text("not a segment")
    (d / f"{bases[1]:020d}.log.bak").write_bytes(b"x")
    (d / f"{end + 2000:020d}.txnindex").write_bytes(b"")  # a transaction index of no store

    log = Log.open(str(d), small_config)
    names = set(os.listdir(d))
    assert f"{end + 2000:020d}.txnindex" not in names, "removed in the same opening as the indexes"
    assert f"{bases[0]:020d}.index" not in names
    for orphan in (bases[1] + 1, end, end + 1000):
        assert f"{orphan:020d}.index" not in names
    assert "notes.txt" in names and f"{bases[1]:020d}.log.bak" in names, "other files are left alone"
    assert kit.segment_bases(d, ".index") == kit.segment_bases(d) == bases[1:]
    assert log.start_offset == bases[1]
    assert log.end_offset == end
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(w for w in written if w[0] >= bases[1])
    with pytest.raises(OffsetOutOfRangeError):
        log.read(bases[1] - 1, 4096)
    assert log.append(kit.batch(end, 2)) == end
    kit.read_batch(log, end, 2)
    log.close()


# --------------------------------------------------------------------------------------- closed segments

FLIPS = {  # positions in RecordBatch v2 (ringlog_proto/batch.py); the leader epoch (12..15) is
    # outside the crc and checked by nothing, as in Kafka: a flip there goes unnoticed
    "base_offset": 7,  # outside the crc: caught by the offset check against the index
    "batch_length": 11,
    "magic": 16,
    "crc": 19,
    "producer_id": 45,
    "record_count": 60,
    "records": HEADER_SIZE + 3,
    "last_byte": -1,
}


@pytest.mark.parametrize("where", list(FLIPS))
def test_bit_flip_in_closed_segment(tmp_path, kit, small_config, where):
    d = tmp_path / "log"
    written = build(kit, d, small_config, 80, "close")
    bases = kit.segment_bases(d)
    seg_base = bases[1]
    store = kit.store_path(d, seg_base)
    stored = kit.store_batches(store)
    assert len(stored) >= 5
    k = len(stored) // 2
    victim = stored[k]
    at = victim.position + (FLIPS[where] % victim.size)
    kit.damage(store, lambda b: b[:at] + bytes([b[at] ^ 0x01]) + b[at + 1 :])

    log = Log.open(str(d), small_config)
    end = written[-1][0] + written[-1][1]
    assert log.end_offset == end, "damage in a closed segment does not move the end"
    # Batches before the flipped one read fine, one at a time.
    for b in stored[:k]:
        kit.read_batch(log, b.base_offset, b.record_count)
    # The flipped batch: an error naming the file and the byte position, never records.
    for off in {victim.base_offset, victim.next_offset - 1}:
        with pytest.raises(CorruptBatchError) as ei:
            log.read(off, 1)
        assert ei.value.path == str(store)
        assert ei.value.position == victim.position
    # A read whose extent spans intact batches and then the flipped one: the intact prefix, and
    # the error for what follows it.
    r = log.read(stored[0].base_offset, victim.end - stored[0].position)
    assert r.first_offset == stored[0].base_offset
    assert r.data == store.read_bytes()[: victim.position]
    assert r.next_offset == victim.base_offset
    assert isinstance(r.error, CorruptBatchError)
    assert (r.error.path, r.error.position) == (str(store), victim.position)
    records = decode_batches(r.data)
    kit.check_records(records, stored[0].base_offset)
    assert records[-1].offset == victim.base_offset - 1
    # Same, starting in the middle: one intact batch right before the flipped one.
    r = log.read(stored[k - 1].base_offset, stored[k - 1].size + victim.size)
    assert r.data == store.read_bytes()[stored[k - 1].position : victim.position]
    assert r.error is not None and r.error.position == victim.position
    # Batches after it in the same segment, and every later segment, are unaffected.
    for b in stored[k + 1 :]:
        kit.read_batch(log, b.base_offset, b.record_count)
    for base, count in written:
        if base >= bases[2]:
            kit.read_batch(log, base, count)
    # Appends go on.
    assert log.append(kit.batch(end, 1)) == end
    kit.read_batch(log, end, 1)
    log.close()


# --------------------------------------------------------------------------------------- crash during a roll


@pytest.mark.parametrize("new_index", ["header_only", "empty_file", "missing"])
@pytest.mark.parametrize("shutdown", ["close", "crash"])
def test_crash_during_roll_files(tmp_path, kit, small_config, new_index, shutdown):
    """The newest segment was just created (empty store; its index header written, half-written or
    not created yet) and the previous segment's tail is torn. Recovery repairs the previous one
    (its cheap tail check fails), accepts the gap of offsets that were never completed, and
    appends go on at the newest segment's base offset: names are never reused."""
    d = tmp_path / "log"
    written = build(kit, d, small_config, 60, shutdown)
    bases = kit.segment_bases(d)
    newest, prev = bases[-1], bases[-2]
    # Turn the newest segment into one that was just created.
    cut(kit.store_path(d, newest), 0)
    if new_index == "header_only":
        kit.damage(kit.index_path(d, newest), lambda b: b[:INDEX_HEADER_SIZE])
    elif new_index == "empty_file":
        cut(kit.index_path(d, newest), 0)
    else:
        kit.index_path(d, newest).unlink()
    # Tear the previous segment's last batch.
    prev_stored = kit.store_batches(kit.store_path(d, prev))
    torn = prev_stored[-1]
    cut(kit.store_path(d, prev), torn.position + torn.size // 2)

    log = Log.open(str(d), small_config)
    kept = [w for w in written if w[0] < torn.base_offset]
    assert [s.base_offset for s in log.segments] == bases
    assert log.end_offset == newest
    assert kit.store_path(d, prev).stat().st_size == torn.position, "torn tail cut"
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(kept)
    # The offsets of the torn batch are a gap: never completed, never handed out again.
    assert log.append(kit.batch(newest, 2)) == newest
    kit.read_batch(log, newest, 2)
    r = log.read(torn.base_offset, 4096)  # a consumer in the gap moves on to the next batch
    assert r.first_offset == newest
    log.close()
    log = Log.open(str(d), small_config)
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets([*kept, (newest, 2)])
    log.close()


@pytest.mark.parametrize("landed", ["none", "first_half", "second_only"])
def test_crash_with_pending_appends_across_a_roll(tmp_path, kit, small_config, landed):
    """The event-loop shape of a crash during a roll: append A is in flight in the old segment,
    append B was prepared after it and rolled a new segment; the process dies with A's write not
    (or half) done and B's write either not done or done (writes may complete out of order).
    Neither was completed, so neither was acknowledged; everything completed must be there."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    done = kit.append_batches(log, 20)
    # Fill the active segment until one more 3-record batch fits but two do not.
    b3 = len(kit.batch(0, 3, width=12))
    while small_config.segment_bytes - log.segments[-1].size >= 2 * b3:
        done += kit.append_batches(log, 1, counts=[1])
    assert small_config.segment_bytes - log.segments[-1].size >= b3
    old_base = log.segments[-1].base_offset
    a = log.prepare_append(kit.batch(log.end_offset, 3, width=12))
    b = log.prepare_append(kit.batch(a.base_offset + 3, 3, width=12))
    assert a.segment.base_offset == old_base and b.segment.base_offset == b.base_offset == a.base_offset + 3
    io = SyncFileIO()
    if landed == "first_half":
        data = b"".join(bytes(buf) for buf in a.ops[0].buffers)
        os.pwrite(a.ops[0].fd, data[: len(data) // 2], a.ops[0].offset)
    elif landed == "second_only":
        run_ops(io, b.ops)
    kit.crash(log)

    log = Log.open(str(d), small_config)
    assert kit.store_path(d, old_base).stat().st_size == a.position
    read = kit.read_all(log, max_bytes=4096)
    acked = kit.expected_offsets(done)
    assert read[: len(acked)] == acked
    if landed == "second_only":  # B is a whole valid batch in the newest segment: recovery keeps it
        assert read[len(acked) :] == list(range(b.base_offset, b.base_offset + 3))
        assert log.end_offset == b.base_offset + 3
    else:
        assert read == acked
        assert log.end_offset == b.base_offset
    end = log.end_offset
    assert log.append(kit.batch(end, 1)) == end
    kit.read_batch(log, end, 1)
    log.close()


def test_crash_right_after_roll_before_any_flush(tmp_path, kit, small_config):
    """Killed right after a roll, before any flush or close: the newest store is empty and the
    indexes hold whatever the lazy index writing got to. Nothing acknowledged is lost, no gap."""
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    written = kit.append_batches(log, 60)
    # Make the newest segment look just created: cut its store to 0.
    newest = log.segments[-1].base_offset
    kit.crash(log)
    cut(kit.store_path(d, newest), 0)
    written = [w for w in written if w[0] < newest]
    log = reopen_and_check(kit, d, small_config, written)
    assert [s.base_offset for s in log.segments][-1] == newest
    log.close()


# --------------------------------------------------------------------------------------- retention


def build_timed(kit, d: Path, clock, retention_ms=None, retention_bytes=None, n=60):
    """Append `n` batches one minute apart; returns (config, [(base, count, append time)])."""
    cfg = LogConfig(
        segment_bytes=4096, max_batch_bytes=4096, retention_ms=retention_ms, retention_bytes=retention_bytes
    )
    log = Log.open(str(d), cfg, clock=clock)
    out = []
    for i in range(n):
        (w,) = kit.append_batches(log, 1, counts=[i % 4 + 1], clock=clock)
        out.append((*w, clock.now))
        clock.advance(MINUTE)
    log.close()
    return cfg, out


def last_append_by_segment(bases: list[int], timed) -> dict[int, int]:
    return {
        base: max(t for b, _c, t in timed if base <= b and (i + 1 == len(bases) or b < bases[i + 1]))
        for i, base in enumerate(bases)
    }


def test_retention_by_age_survives_restart(tmp_path, kit):
    d = tmp_path / "log"
    clock = kit.FakeClock()
    cfg, timed = build_timed(kit, d, clock, retention_ms=HOUR, n=120)
    bases = kit.segment_bases(d)
    assert len(bases) >= 4
    last = last_append_by_segment(bases, timed)
    end = timed[-1][0] + timed[-1][1]

    # Restart long after the first two segments' last appends, with a clock whose "now" is far
    # from the files' mtimes (which are real time): only the index's append times can tell.
    clock.now = last[bases[1]] + HOUR + 1
    log = Log.open(str(d), cfg, clock=clock)
    assert log.start_offset == 0
    assert log.apply_retention() == 2
    assert log.start_offset == bases[2]
    assert kit.segment_bases(d) == kit.segment_bases(d, ".index") == bases[2:]
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(
        (b, c) for b, c, _t in timed if b >= bases[2]
    )
    with pytest.raises(OffsetOutOfRangeError):
        log.read(bases[2] - 1, 4096)
    assert log.durable_offset >= log.start_offset
    # At exactly retention_ms old a segment is kept (strictly older is deleted).
    clock.now = last[bases[2]] + HOUR
    assert log.apply_retention() == 0
    log.close()

    # Much later: every closed segment goes, the active one never does.
    clock.now = timed[-1][2] + 100 * HOUR
    log = Log.open(str(d), cfg, clock=clock)
    assert log.apply_retention() == len(bases) - 3
    assert kit.segment_bases(d) == [bases[-1]]
    assert log.start_offset == bases[-1]
    assert log.apply_retention() == 0
    assert log.end_offset == end
    # Appends go on at the next offset; new segment names are all above every deleted one.
    more = kit.append_batches(log, 60, clock=clock)
    assert more[0][0] == end
    assert len(log.segments) > 1
    assert kit.read_all(log, max_bytes=4096)[-len(kit.expected_offsets(more)) :] == kit.expected_offsets(more)
    new_bases = kit.segment_bases(d)
    assert new_bases[0] == bases[-1]
    assert all(b > bases[-2] for b in new_bases)
    assert len(set(new_bases)) == len(new_bases)
    log.close()
    # And the deletion itself survived the restart.
    log = Log.open(str(d), cfg, clock=clock)
    assert log.start_offset == bases[-1]
    log.close()


def test_retention_by_bytes(tmp_path, kit):
    d = tmp_path / "log"
    clock = kit.FakeClock()
    _cfg, timed = build_timed(kit, d, clock, n=180)
    bases = kit.segment_bases(d)
    sizes = {b: kit.store_path(d, b).stat().st_size for b in bases}
    total = sum(sizes.values())
    assert len(bases) >= 6
    limit = total - sizes[bases[0]] - sizes[bases[1]] // 2  # needs two segments deleted
    cfg = LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=None, retention_bytes=limit)
    log = Log.open(str(d), cfg, clock=clock)
    assert log.size_bytes == total
    assert log.apply_retention() == 2
    assert log.start_offset == bases[2]
    assert log.size_bytes == total - sizes[bases[0]] - sizes[bases[1]] <= limit
    assert kit.segment_bases(d) == kit.segment_bases(d, ".index") == bases[2:]
    assert log.apply_retention() == 0, "nothing more while under the limit"
    assert kit.read_all(log, max_bytes=4096) == kit.expected_offsets(
        (b, c) for b, c, _t in timed if b >= bases[2]
    )
    log.close()
    # A limit of zero deletes every closed segment and never the active one.
    cfg0 = LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=None, retention_bytes=0)
    log = Log.open(str(d), cfg0, clock=clock)
    assert log.apply_retention() == len(bases) - 3
    assert [s.base_offset for s in log.segments] == [bases[-1]]
    assert log.size_bytes == sizes[bases[-1]] > 0
    end = timed[-1][0] + timed[-1][1]
    assert log.append(kit.batch(end, 1)) == end
    kit.read_batch(log, end, 1)
    log.close()


# --------------------------------------------------------------------------------------- process kill

CHILD = """
import sys
from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import encode_batch
log = Log.open(sys.argv[1], LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=None))
print("open", log.end_offset, flush=True)
i = 0
while True:
    base = log.end_offset
    n = i % 4 + 1
    batch = encode_batch([f"off-{base + j}".ljust(12, ".").encode() for j in range(n)])
    got = log.append(batch)
    assert got == base, (got, base)
    sys.stdout.write(f"{got} {n}\\n")
    sys.stdout.flush()
    i += 1
"""


def test_sigkill_loses_no_acknowledged_append(tmp_path, kit):
    """An append that returned survives SIGKILL of the process (the batch is in the page cache).
    Three rounds on the same directory, so recovery also runs on a log that recovery wrote."""
    d = tmp_path / "log"
    acked: list[tuple[int, int]] = []
    for round_, kill_after in enumerate((40, 150, 400)):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(d)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[0] == "open", (first, proc.stderr.read() if proc.stderr else "")
        expected_start = acked[-1][0] + acked[-1][1] if acked else 0
        assert int(first[1]) >= expected_start, "a restart never goes back before acknowledged data"
        lines = 0
        deadline = time.monotonic() + 20
        while lines < kill_after and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            base, n = map(int, line.split())
            acked.append((base, n))
            lines += 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        # Lines the child printed between our last read and the kill were acknowledged too.
        for line in proc.stdout.read().splitlines():
            if line.strip():
                base, n = map(int, line.split())
                acked.append((base, n))
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()

        log = Log.open(str(d), LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=None))
        assert log.end_offset >= acked[-1][0] + acked[-1][1], f"round {round_}"
        offsets = kit.read_all(log, max_bytes=4096)  # everything readable is intact
        acked_offsets = kit.expected_offsets(acked)
        assert set(acked_offsets) <= set(offsets)
        for base, n in acked[-50:]:
            kit.read_batch(log, base, n)
        log.close()
    assert len(kit.segment_bases(d)) > 3


# --------------------------------------------------------------------------------------- bugs


def test_open_reads_only_the_tail_of_closed_indexes(tmp_path, kit, small_config):
    """Segment._tail_consistent promises that opening reads one index entry and one batch header
    per closed segment, "so opening a log with many segments stays fast", and `Segment.index`
    says closed segments keep their index on disk until read."""

    class Counting(SyncFileIO):
        def __init__(self) -> None:
            self.paths: dict[int, str] = {}
            self.index_bytes_read: dict[str, int] = {}

        def open(self, path: str, create: bool) -> int:
            fd = super().open(path, create)
            self.paths[fd] = path
            return fd

        def pread(self, fd: int, length: int, offset: int) -> bytes:
            data = super().pread(fd, length, offset)
            path = self.paths[fd]
            if path.endswith(".index"):
                self.index_bytes_read[path] = self.index_bytes_read.get(path, 0) + len(data)
            return data

    d = tmp_path / "log"
    build(kit, d, small_config, 80, "close")
    io = Counting()
    log = Log.open(str(d), small_config, io=io)
    for base in kit.segment_bases(d)[:-1]:
        path = str(kit.index_path(d, base))
        assert io.index_bytes_read.get(path, 0) <= INDEX_HEADER_SIZE + ENTRY_SIZE, path
    log.close()


def test_zeroed_index_entry_does_not_make_data_old(tmp_path, kit):
    d = tmp_path / "log"
    clock = kit.FakeClock()
    cfg = LogConfig(segment_bytes=4096, max_batch_bytes=4096, retention_ms=HOUR)
    log = Log.open(str(d), cfg, clock=clock)
    # Batches of ~3 KiB: one per segment.
    for _ in range(3):
        base = log.end_offset
        assert log.append(kit.batch(base, 3, width=1000, timestamp=clock.now)) == base
    assert len(log.segments) == 3
    log.close()
    bases = kit.segment_bases(d)
    # Power loss: the first segment's only index entry reads back as zeros.
    kit.damage(kit.index_path(d, bases[0]), lambda b: b[:INDEX_HEADER_SIZE] + bytes(ENTRY_SIZE))
    clock.advance(MINUTE)  # one minute later, retention is one hour
    log = Log.open(str(d), cfg, clock=clock)
    assert log.apply_retention() == 0, "one-minute-old data deleted by a one-hour retention"
    assert log.start_offset == 0
    log.close()


def test_wrong_but_ordered_index_position_is_repaired(tmp_path, kit, small_config):
    d = tmp_path / "log"
    written = build(kit, d, small_config, 60, "close")
    active = kit.segment_bases(d)[-1]
    index = kit.index_path(d, active)
    entries = kit.index_entries(index, active)
    i = len(entries) // 2
    at = INDEX_HEADER_SIZE + i * ENTRY_SIZE + 4  # the position field of entry i
    # Position + 1 keeps the entries strictly increasing, so parse_entries accepts it.
    kit.damage(index, lambda b: b[:at] + struct.pack(">I", entries[i].position + 1) + b[at + 4 :])
    log = Log.open(str(d), small_config)
    assert kit.read_all(log, max_bytes=200) == kit.expected_offsets(written)
    log.close()


def test_roll_writes_the_closed_segments_index(tmp_path, kit, small_config):
    d = tmp_path / "log"
    log = Log.open(str(d), small_config)
    kit.append_batches(log, 60)
    assert len(log.segments) >= 3
    kit.crash(log)
    for base in kit.segment_bases(d)[:-1]:
        entries = kit.index_entries(kit.index_path(d, base), base)
        stored = kit.store_batches(kit.store_path(d, base))
        assert len(entries) == len(stored), f"{base}: {len(entries)} of {len(stored)} entries on disk"
