"""The `broker` command.

Until the network server exists (the wire-protocol issue), the commands work on the storage engine
directly: `demo` writes, syncs, reopens and reads back a partition log, and `dump` shows what is in a
partition directory, batch by batch, with anything damaged named by file and position.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence

from broker.storage.errors import StorageError
from broker.storage.log import Log, LogConfig
from broker.storage.segment import STORE_SUFFIX
from ringlog_proto.batch import BatchError, Record, decode_batches, encode_batch, invalid_batch, iter_batches


def cmd_demo(args: argparse.Namespace) -> int:
    path = os.path.join(args.data_dir, "demo-0")
    config = LogConfig(segment_bytes=args.segment_bytes)
    print(f"ringlog storage demo (the network broker is not built yet): partition log in {path}")
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
    """Print every batch of every segment, verifying crcs, without opening (or repairing) the log."""
    names = sorted(n for n in os.listdir(args.partition_dir) if n.endswith(STORE_SUFFIX))
    damaged = False
    for name in names:
        with open(os.path.join(args.partition_dir, name), "rb") as f:
            data = f.read()
        print(f"{name}: {len(data)} bytes")
        end = 0
        try:
            for pos, h in iter_batches(data):
                reason = invalid_batch(data, pos)
                if reason is not None:
                    raise BatchError(reason)
                print(
                    f"  @{pos}: offsets {h.base_offset}..{h.last_offset} ({h.record_count} records, "
                    f"{h.size} B, max_timestamp {h.max_timestamp})"
                )
                end = pos + h.size
        except BatchError as exc:
            print(f"  DAMAGED at byte {end}: {exc}")
            damaged = True
            continue
        if end < len(data):
            print(f"  DAMAGED at byte {end}: {len(data) - end} trailing bytes are not a whole batch")
            damaged = True
    return 1 if damaged else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="broker", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="write, sync, reopen and read back a partition log")
    demo.add_argument("--data-dir", default="./data", help="where partitions live (default ./data)")
    demo.add_argument("--batches", type=int, default=2000)
    demo.add_argument("--record-bytes", type=int, default=100)
    demo.add_argument("--segment-bytes", type=int, default=8 * 1024 * 1024)
    demo.set_defaults(func=cmd_demo)
    dump = sub.add_parser("dump", help="list the batches of a partition directory, checking crcs")
    dump.add_argument("partition_dir")
    dump.set_defaults(func=cmd_dump)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except StorageError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
