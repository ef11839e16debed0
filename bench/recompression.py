"""What a topic's compression.type costs the core that appends: microseconds of CPU per batch
appended to a log that stores another codec than the producer's, beside the same batches appended
to a log that keeps the producer's (compression.type=producer).

Run: `.venv/bin/python bench/recompression.py [--quick] [--rounds N] [--kib N]`

What it measures:
- `Log.append` of one batch (validation, the rewrite in the log's codec: broker/storage/
  recompression.py, the write to the page cache; no fsync), in this process, as process CPU time
  (user + system), per batch: the median over `--rounds` rounds (default 5) of the mean over a
  block of batches, with the range (min-max) beside it.
- Workload: batches of JSON-like records of ~200 B, `--kib` KiB of records each (default 1024:
  a batch the default max.message.bytes, 1 MiB, lets an uncompressed producer send), compressed
  as producers do (gzip level 6, lz4 frame, zstd level 3), encoded before any clock starts.
- Each row: a producer's codec and the topic's; "keep" is the same batches on a log with
  compression.type=producer (the baseline: validation and the write), "rewrite" on a log with the
  topic's codec; "added" is rewrite - keep, per round, what the loop pays for the rewrite.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time

from benchlib import code_version, table

from broker.storage.log import Log, LogConfig
from ringlog_proto.batch import CODEC_NAMES, HEADER_SIZE, encode_batch, read_header, seal_batch
from ringlog_proto.compression import compress

PAIRS = [
    ("gzip", "zstd"),
    ("none", "zstd"),
    ("none", "lz4"),
    ("zstd", "gzip"),
    ("zstd", "none"),
    ("gzip", "lz4"),
]
CODECS = {name: number for number, name in CODEC_NAMES.items()}
BLOCK = 4


def values(rng: random.Random, kib: int) -> list[bytes]:
    out: list[bytes] = []
    size = 0
    while size < kib * 1024:
        doc = {
            "user": f"user-{rng.randrange(100_000)}",
            "event": rng.choice(["click", "view", "purchase", "scroll", "login"]),
            "ts": 1_700_000_000_000 + rng.randrange(10**9),
            "amount": round(rng.random() * 1000, 2),
            "page": f"/products/{rng.randrange(5000)}/details?ref={rng.randrange(100)}",
            "agent": rng.choice(["Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (Macintosh)"]),
        }
        value = json.dumps(doc).encode()
        out.append(value)
        size += len(value) + 8
    return out


def batch(codec: int, rng: random.Random, kib: int) -> bytes:
    plain = encode_batch(values(rng, kib))
    if not codec:
        return plain
    h = read_header(plain)
    section = compress(plain[HEADER_SIZE:], codec)
    return seal_batch(section, h.record_count, h.base_timestamp, h.max_timestamp, attributes=codec)


def per_batch_us(batches: list[bytes], config: LogConfig, root: str) -> float:
    log = Log.open(root, config)
    try:
        t0 = time.process_time()
        for b in batches:
            log.append(b)
        return (time.process_time() - t0) / len(batches) * 1e6
    finally:
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--kib", type=int, default=1024, help="KiB of records per batch (default 1024)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    rng = random.Random(41)
    print(f"code: {code_version()}")
    print(f"batches of {args.kib} KiB of records, {BLOCK} per block, {rounds} rounds, alternated")
    limit = 64 << 20  # room for any batch: the limit is not what is measured
    base = LogConfig(segment_bytes=1 << 30, max_batch_bytes=limit)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rcbench-", dir="/var/tmp") as tmp:
        for source, target in PAIRS:
            work = [batch(CODECS[source], rng, args.kib) for _ in range(BLOCK)]
            rewrite = LogConfig(segment_bytes=1 << 30, max_batch_bytes=limit, compression=CODECS[target])
            keep_us: list[float] = []
            rewrite_us: list[float] = []
            for r in range(rounds):
                order = ((keep_us, base), (rewrite_us, rewrite))
                for out, config in order if r % 2 == 0 else reversed(order):
                    out.append(per_batch_us(work, config, f"{tmp}/{source}-{target}-{r}-{len(out)}"))
            added = [w - k for k, w in zip(keep_us, rewrite_us, strict=True)]
            sent = sum(len(b) for b in work) // len(work)
            rows.append(
                [
                    f"{source} -> {target}",
                    f"{sent / 1024:,.0f} KiB",
                    spread(keep_us),
                    spread(rewrite_us),
                    spread(added),
                ]
            )
    table(["producer -> topic", "batch as sent", "keep µs", "rewrite µs", "added µs"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
