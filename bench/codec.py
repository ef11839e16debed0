"""Records codec micro-benchmark: the paths a client encodes and decodes Kafka v2 batches by, side
by side in one run: `encode_batch` and `decode_records` as a client calls them, beside the
records-section codec in C (native._codec) and its Python twin (ringlog_proto.records_codec.PYTHON,
what runs where native/ is not built).

Run: `.venv/bin/python bench/codec.py [--quick] [--rounds N] [--batch-kib N]` (not run by `make`;
`--quick` takes about 15 s)

What it measures:
- Workloads: 1 KiB and 100 B plain values (the producer's case, which `encode_batch` hands whole to
  the C batch encoder, native._batch), and `Record`s with a 16 B key, a timestamp of their own
  and no headers (which `encode_batch` encodes in Python: the C section codec takes one base
  timestamp); batches of about `--batch-kib` KiB of values (default 256, a typical fetch holds a
  few of them). Batches are built before the clock starts.
- Encode: what a client's producer pays per batch. `encode_batch` (header and crc included); and
  each section codec: `encode_section` with 61 bytes of room for the header, the header packed
  into it and the crc32c computed over it (what `encode_batch` does around the codec when the
  whole-batch encoder cannot take the batch). Every path gives the same bytes: checked before
  the clock starts.
- Decode: what a client's consumer pays per batch. `decode_records(verify=True)`; and per codec,
  the crc32c of the batch checked, then `decode_section`. All yield `Record` objects with offsets
  and timestamps filled in.
- Each path runs `--rounds` rounds (default 7), the paths alternating inside each round in a
  rotating order; the best round is reported, as a ratio to `encode_batch` (or `decode_records`)
  beside it, and the spread (worst / best - 1) so a disturbed run shows itself.

MB = 10^6 bytes of record values (not keys, not framing); records/s are records encoded or
decoded, Record objects built, per second of one CPU.
"""

from __future__ import annotations

import argparse
import struct
import time
from collections.abc import Callable
from functools import partial

from benchlib import KIB, code_version, size_label, table
from crc32c import crc32c

from ringlog_proto import records_codec as rc
from ringlog_proto.batch import Record, decode_records, encode_batch

V2_HEADER = struct.Struct(">qiiBIhiqqqhii")  # Kafka RecordBatch v2's 61-byte header
V2_CRC_START = 21
TS = 1_700_000_000_000


def seal_v2(out: bytearray, count: int, first_ts: int, max_ts: int) -> bytearray:
    """The v2 header packed into the 61 bytes `encode_section(prefix=61)` left, crc32c included."""
    V2_HEADER.pack_into(out, 0, 0, len(out) - 12, -1, 2, 0, 0, count - 1, first_ts, max_ts, -1, -1, -1, count)
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[V2_CRC_START:]))
    return out


def v2_encoder(codec: rc.Codec) -> Callable[[list], object]:
    def encode(records: list) -> object:
        out, count, max_ts = rc.encode_section(records, TS, prefix=V2_HEADER.size, codec=codec)
        return seal_v2(out, count, TS, max_ts)

    return encode


def v2_decoder(codec: rc.Codec) -> Callable[[bytes], list[Record]]:
    def decode(batch: bytes) -> list[Record]:
        (crc,) = struct.unpack_from(">I", batch, 17)
        if crc32c(memoryview(batch)[V2_CRC_START:]) != crc:
            raise ValueError("crc32c mismatch")
        fields = V2_HEADER.unpack_from(batch)
        return rc.decode_section(
            batch, V2_HEADER.size, len(batch), fields[-1], fields[0], fields[7], codec=codec
        )

    return decode


def client_encode(records: list) -> object:
    return encode_batch(records, timestamp=TS)


def workloads(batch_bytes: int) -> list[tuple[str, int, list]]:
    out = []
    for size in (1024, 100):
        n = max(1, batch_bytes // size)
        out.append((f"{size_label(size)} values", size, [bytes([i % 251]) * size for i in range(n)]))
    for size in (1024, 100):
        n = max(1, batch_bytes // size)
        recs = [Record(bytes([i % 251]) * size, b"key-%012d" % i, (), TS + i % 7) for i in range(n)]
        out.append((f"{size_label(size)} values, 16 B keys", size, recs))
    return out


def best_of(
    fns: dict[str, Callable[[], object]], rounds: int, min_seconds: float
) -> dict[str, tuple[float, float]]:
    """Seconds per call of each fn, (best, worst) over rounds, fns alternating within a round."""
    names = list(fns)
    reps = {}
    for name in names:  # calibrate: enough calls for min_seconds per round
        fn = fns[name]
        k = 1
        while True:
            t = time.perf_counter()
            for _ in range(k):
                fn()
            dt = time.perf_counter() - t
            if dt >= min_seconds / 4:
                break
            k *= 2
        reps[name] = max(1, int(k * min_seconds / dt))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = fns[name]
            k = reps[name]
            t = time.perf_counter()
            for _ in range(k):
                fn()
            times[name].append((time.perf_counter() - t) / k)
    return {name: (min(ts), max(ts)) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 0.1 s")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch-kib", type=int, default=256)
    args = ap.parse_args()
    rounds, min_s = (3, 0.1) if args.quick else (args.rounds, 0.3)
    native = rc.native_codec()
    codecs = [c for c in (native, rc.PYTHON) if c is not None]
    print(f"records codec micro-bench: {code_version()}")
    print(f"native._codec: {'built' if native else 'NOT BUILT (only the Python codec runs)'}")
    print(f"batches of ~{args.batch_kib} KiB of values; best of {rounds} rounds, paths alternating\n")
    rows = []
    for label, size, records in workloads(args.batch_kib * KIB):
        n = len(records)
        batch = encode_batch(records, timestamp=TS)
        for c in codecs:  # the paths agree before they are timed
            assert v2_encoder(c)(records) == batch
            assert v2_decoder(c)(batch) == decode_records(batch)
        enc = {"encode_batch": partial(client_encode, records)}
        enc.update({f"section {c.name}": partial(v2_encoder(c), records) for c in codecs})
        dec = {"decode_records": partial(decode_records, batch)}
        dec.update({f"section {c.name}": partial(v2_decoder(c), batch) for c in codecs})
        for op, fns in (("encode", enc), ("decode", dec)):
            res = best_of(fns, rounds, min_s)
            base = res[next(iter(fns))][0]
            for name, (best, worst) in res.items():
                rows.append(
                    [
                        label,
                        op,
                        name,
                        f"{n / best:,.0f}",
                        f"{n * size / best / 1e6:,.0f}",
                        f"{base / best:.2f}x",
                        f"{worst / best - 1:.0%}",
                    ]
                )
    table(["workload", "op", "path", "records/s", "MB/s", "vs the client's", "spread"], rows, labels=3)


if __name__ == "__main__":
    main()
