"""`broker dump` and `broker demo`: the storage engine from the command line, no broker running.

`dump` shows what is in a partition directory batch by batch (a transaction's commit and abort
markers as such), with anything damaged named by file and position, without opening (or repairing)
it; `demo` exercises the storage engine alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from broker.storage.index import ENTRY_SIZE, INDEX_HEADER_SIZE, decode_entry, parse_entries
from broker.storage.index import invalid_header as invalid_index_header
from broker.storage.layout import STORE_SUFFIX, index_file_name, parse_segment_name, store_file_name
from broker.storage.log import Log, LogConfig
from broker.storage.segment_recovery import preallocated
from ringlog_proto.batch import (
    CODEC_NAMES,
    CONTROL_TYPE_NAMES,
    BatchError,
    BatchHeader,
    Record,
    control_of,
    decode_batches,
    encode_batch,
    invalid_records,
    invalid_stored_batch,
    iter_batches,
    legacy_format,
)


def cmd_demo(args: argparse.Namespace) -> int:
    path = os.path.join(args.data_dir, "demo-0")
    config = LogConfig(segment_bytes=args.segment_bytes)
    print(f"ringlog storage demo (the storage engine alone, no server): partition log in {path}")
    log = Log.open(path, config)
    print(f"opened: offsets [{log.start_offset}, {log.end_offset}), {len(log.segments)} segment(s)")
    value = b"v" * args.record_bytes
    per_batch = max(1, 16 * 1024 // (args.record_bytes + 18))
    start = time.perf_counter()
    first = None
    for i in range(args.batches):
        batch = encode_batch([Record(value, key=f"key-{i}".encode())] * per_batch)
        base = log.append(batch)
        first = base if first is None else first
    log.flush()
    elapsed = time.perf_counter() - start
    written = args.batches * per_batch
    print(
        f"appended {written} records of {args.record_bytes} B in {args.batches} batches from offset {first}, "
        f"flushed (durable to {log.durable_offset}): {written / elapsed:,.0f} records/s"
    )
    log.close()
    log = Log.open(path, config)
    offset, count = log.start_offset, 0
    while offset < log.end_offset:
        result = log.read(offset, 1024 * 1024)
        count += len(decode_batches(result.data))
        offset = result.next_offset
    print(f"reopened and read back {count} records; offsets [{log.start_offset}, {log.end_offset})")
    print("segments: " + ", ".join(os.path.basename(s.store_path) for s in log.segments))
    log.close()
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    """Print every batch of every segment and check what the broker relies on, without opening
    (or repairing) the log: batch headers and crcs, record framing, base offsets (from the
    segment's name on, each batch following the one before, segments following each other), and
    each index against its store (header, entry crcs, order, every entry naming the batch at its
    position, no partial or missing entries). Exit status 1 when anything is damaged."""
    directory = args.partition_dir
    stores: list[int] = []
    indexes: set[int] = set()
    try:
        names = os.listdir(directory)
    except OSError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
    for name in names:
        parsed = parse_segment_name(name)
        if parsed is not None:
            if parsed[1] == STORE_SUFFIX:
                stores.append(parsed[0])
            else:
                indexes.add(parsed[0])
    stores.sort()
    damaged = False
    prev_end: int | None = None  # the offset after the previous segment's last batch
    for base in stores:
        with open(os.path.join(directory, store_file_name(base)), "rb") as f:
            data = f.read()
        print(f"{store_file_name(base)}: {len(data)} bytes")
        problems: list[str] = []
        if prev_end is not None and base != prev_end:
            how = "overlapping it" if base < prev_end else f"offsets {prev_end}..{base - 1} missing"
            problems.append(
                f"segment starts at offset {base}, the previous one ends at {prev_end - 1} ({how})"
            )
        batches, expected, store_problems = _dump_store(data, base)
        problems += store_problems
        prev_end = expected
        problems += _dump_index(os.path.join(directory, index_file_name(base)), base, batches)
        for problem in problems:
            print(f"  DAMAGED {problem}")
        damaged = damaged or bool(problems)
    for base in sorted(indexes - set(stores)):
        print(f"{index_file_name(base)}: index without a store file (the broker removes it at open)")
    return 1 if damaged else 0


def _dump_store(data: bytes, base: int) -> tuple[list[tuple[int, BatchHeader]], int, list[str]]:
    """List the batches of a store file: (position, header) of each whole valid batch, the offset
    after them (counted from the segment's name), and what is damaged."""
    problems: list[str] = []
    batches: list[tuple[int, BatchHeader]] = []
    expected = base
    end = 0
    if legacy_format(data) is not None:
        problems.append(
            "written by ringlog's record batch format 1 (magic 1), not damaged: this version reads "
            "Kafka's RecordBatch v2 only and refuses to serve this data dir"
        )
        return batches, expected, problems
    try:
        for pos, h in iter_batches(data):
            reason = invalid_stored_batch(data, pos)
            if reason is not None:
                raise BatchError(reason)
            codec = f", {CODEC_NAMES[h.compression]}" if h.compression else ""
            if h.control:
                shown, damage = _marker(data, pos, h)
                print(f"  @{pos}: offset {h.base_offset}: {shown}")
                if damage is not None:
                    problems.append(f"at byte {pos}: {damage}")
            else:
                txn = ""
                if h.transactional:
                    txn = f", transactional, producer {h.producer_id} epoch {h.producer_epoch}"
                print(
                    f"  @{pos}: offsets {h.base_offset}..{h.last_offset} ({h.record_count} records, "
                    f"{h.size} B{codec}{txn}, max_timestamp {h.max_timestamp}, "
                    f"leader epoch {h.partition_leader_epoch})"
                )
            flagged = h.base_offset < expected or (pos == 0 and h.base_offset != expected)
            if flagged:
                after = (
                    "the segment's name"
                    if pos == 0
                    else f"the previous batch's last offset {expected - 1} + 1"
                )
                problems.append(
                    f"at byte {pos}: base offset {h.base_offset}, expected {expected} from {after}"
                )
            elif h.base_offset > expected:  # batches the log cleaner removed
                print(f"  offsets {expected}..{h.base_offset - 1}: removed by the log cleaner")
            reason = invalid_records(data, pos, h)
            if reason is not None:
                problems.append(
                    f"at byte {pos}: the records do not frame ({reason}): no client can decode it"
                )
            batches.append((pos, h))
            # From the header's span, not its record count (a cleaned batch holds fewer records);
            # from `expected`, not a base offset that went back: one bad one flags one batch.
            expected = (expected if flagged else h.base_offset) + h.last_offset_delta + 1
            end = pos + h.size
    except BatchError as exc:
        error: BatchError | None = exc
    else:
        error = None
    if end < len(data):
        if preallocated(data[end:]):  # a killed broker's preallocated space: released at open
            print(f"  @{end}: {len(data) - end} bytes preallocated after the last batch (zeros)")
        elif error is not None:
            problems.append(f"at byte {end}: {error}")
        else:
            problems.append(f"at byte {end}: {len(data) - end} trailing bytes are not a whole batch")
    return batches, expected, problems


def _marker(data: bytes, pos: int, h: BatchHeader) -> tuple[str, str | None]:
    """How `dump` shows a control batch (a transaction's commit or abort marker: its producer and
    coordinator epoch are what a reader of the log wants from it), and what is damaged in it."""
    damage = None
    try:
        control = control_of(data, pos)
    except BatchError as exc:
        what = "control batch"
        damage = f"a control batch that does not read as a marker ({exc})"
    else:
        name = CONTROL_TYPE_NAMES.get(control.type)
        what = (
            f"{name.upper()} marker, coordinator epoch {control.coordinator_epoch}"
            if name is not None
            else f"control batch of type {control.type}"
        )
    shown = (
        f"{what} (producer {h.producer_id} epoch {h.producer_epoch}, {h.size} B, "
        f"max_timestamp {h.max_timestamp}, leader epoch {h.partition_leader_epoch})"
    )
    return shown, damage


def _dump_index(path: str, base: int, batches: list[tuple[int, BatchHeader]]) -> list[str]:
    """What is wrong with the index at `path` against the store's `batches` (the store is the
    truth; the broker rebuilds a damaged index at open, but until then it serves reads from it)."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [f"{name}: missing"]
    reason = invalid_index_header(data, base)
    if reason is not None:
        return [f"{name}: {reason}"]
    problems = []
    entries, reason = parse_entries(data[INDEX_HEADER_SIZE:])
    count = len(entries) // ENTRY_SIZE
    if reason is not None:
        problems.append(f"{name}: {reason} (valid entries end at entry {count})")
    max_ts = None
    for i in range(min(count, len(batches))):
        entry = decode_entry(entries[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE])
        assert entry is not None  # parse_entries kept only entries whose crc matches
        pos, h = batches[i]
        max_ts = h.max_timestamp if max_ts is None else max(max_ts, h.max_timestamp)
        if entry.relative_offset != h.base_offset - base or entry.position != pos:
            problems.append(
                f"{name}: entry {i} says offset {base + entry.relative_offset} at byte {entry.position}, "
                f"the store has offset {h.base_offset} at byte {pos}"
            )
            break  # the rest is shifted too: one line says it
        if entry.max_timestamp != max_ts:
            problems.append(
                f"{name}: entry {i} has max_timestamp {entry.max_timestamp}, the store's batches {max_ts}"
            )
    if reason is None and count < len(batches):
        problems.append(
            f"{name}: {count} entries for {len(batches)} batches (truncated, or not written before a "
            "crash; the broker rebuilds it at open)"
        )
    elif count > len(batches):
        problems.append(f"{name}: {count} entries for {len(batches)} batches (entries past the store's end)")
    if not problems:
        print(f"  {name}: {count} entries, consistent with the store")
    return problems


def add_demo_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="write, sync, reopen and read back a partition log")
    demo.add_argument("--data-dir", default="./data", help="where partitions live (default ./data)")
    demo.add_argument("--batches", type=int, default=2000)
    demo.add_argument("--record-bytes", type=int, default=100)
    demo.add_argument("--segment-bytes", type=int, default=8 * 1024 * 1024)
    demo.set_defaults(func=cmd_demo)


def add_dump_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dump = sub.add_parser(
        "dump",
        help="list the batches of a partition directory, checking crcs, record framing, offsets and "
        "indexes (exit 1 when anything is damaged)",
    )
    dump.add_argument("partition_dir")
    dump.set_defaults(func=cmd_dump)
