"""What checking compressed batches costs the broker: CPU-seconds per GB of compressed produce
with the check on against off, for each codec Kafka has.

Run: `.venv/bin/python bench/compressed_validation.py [--quick] [--rounds N] [--mb N]`

What it measures:
- The broker's produce work for a batch once its bytes are read: `Log.append` (header and crc
  checks, the records check, the write to the page cache; no fsync), in this process, as
  process CPU time (user + system). With `LogConfig.check_records` on, a compressed batch is
  inflated (bounded: ringlog_proto.batch.decompress_bounded, cramjam for every codec) and its
  records walked (C); off, it is stored after the header and crc checks,
  as compressed batches were before they were validated.
- Workload: batches as librdkafka sends them: 1000 JSON-like records of ~200 B (about 200 KB
  inflated; text-like, so 3-6x compression), compressed as producers do: gzip level 6, snappy
  raw, lz4 frame, zstd level 3. `--mb` MB of compressed batches per codec, encoded before any
  clock starts.
- Both variants are open side by side in the same run and fed the same batches in blocks of 8,
  alternating which goes first at every block, for `--rounds` rounds (default 5). Reported per
  codec: CPU-s per GB (10^9 bytes) of compressed batches with the check and without, as the
  median over rounds with the range (min-max) beside it, and the added cost per round (on - off)
  likewise, so a disturbed run shows itself.
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
from labkit.poison_batches import compress
from ringlog_proto.batch import HEADER_SIZE, encode_batch, read_header, seal_batch

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
RECORDS_PER_BATCH = 1000
BLOCK = 8


def values(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(RECORDS_PER_BATCH):
        doc = {
            "user": f"user-{rng.randrange(100_000)}",
            "event": rng.choice(["click", "view", "purchase", "scroll", "login"]),
            "ts": 1_700_000_000_000 + rng.randrange(10**9),
            "amount": round(rng.random() * 1000, 2),
            "page": f"/products/{rng.randrange(5000)}/details?ref={rng.randrange(100)}",
            "agent": rng.choice(["Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (Macintosh)"]),
        }
        out.append(json.dumps(doc).encode())
    return out


def batches(codec: int, megabytes: float, rng: random.Random) -> tuple[list[bytes], int]:
    """Compressed batches of `codec` totalling about `megabytes` MB, and their inflated bytes."""
    out: list[bytes] = []
    total = 0
    plain_total = 0
    while total < megabytes * 1e6:
        plain = encode_batch(values(rng))
        h = read_header(plain)
        section = compress(plain[HEADER_SIZE:], codec)
        batch = seal_batch(section, h.record_count, h.base_timestamp, h.max_timestamp, attributes=codec)
        out.append(batch)
        total += len(batch)
        plain_total += len(plain)
    return out, plain_total


def measure(codec_batches: list[bytes], rounds: int, root: str) -> dict[bool, list[float]]:
    """CPU-s per GB, per round, with the check on (True) and off (False)."""
    size = sum(len(b) for b in codec_batches)
    result: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        logs = {}
        for check in (True, False):
            config = LogConfig(segment_bytes=1 << 30, max_batch_bytes=1 << 20, check_records=check)
            logs[check] = Log.open(f"{root}/r{r}-{int(check)}", config)
        cpu = {True: 0.0, False: 0.0}
        for i in range(0, len(codec_batches), BLOCK):
            block = codec_batches[i : i + BLOCK]
            order = (True, False) if (i // BLOCK + r) % 2 == 0 else (False, True)
            for check in order:
                append = logs[check].append
                t0 = time.process_time()
                for b in block:
                    append(b)
                cpu[check] += time.process_time() - t0
        for check in (True, False):
            logs[check].close()
            shutil.rmtree(f"{root}/r{r}-{int(check)}", ignore_errors=True)
            result[check].append(cpu[check] / (size / 1e9))
    return result


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8 MB per codec, 3 rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--mb", type=float, default=None, help="MB of compressed batches per codec (default 32)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    mb = args.mb or (8 if args.quick else 32)
    rng = random.Random(37)
    print(f"code: {code_version()}")
    print(f"{mb:g} MB of compressed batches per codec, {rounds} rounds, blocks of {BLOCK} alternated")
    rows = []
    with tempfile.TemporaryDirectory(prefix="zbench-", dir="/var/tmp") as root:
        for name, codec in CODECS.items():
            work, inflated = batches(codec, mb, rng)
            compressed = sum(len(b) for b in work)
            res = measure(work, rounds, root)
            added = [on - off for on, off in zip(res[True], res[False], strict=True)]
            rows.append(
                [
                    name,
                    f"{len(work)} x {compressed / len(work) / 1e3:.0f} KB",
                    f"{inflated / compressed:.1f}x",
                    spread(res[False]),
                    spread(res[True]),
                    spread(added),
                ]
            )
    table(["codec", "batches", "ratio", "CPU-s/GB off", "CPU-s/GB on", "added CPU-s/GB"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
