"""What TLS and SASL cost, in one run: librdkafka (confluent-kafka) against one broker per
variant and backend, alternating round by round.

Run: `.venv/bin/python bench/security.py [--quick] [--rounds N] [--backends io_uring,uvloop]`
     (`make bench-security`)

Variants, each a fresh `broker serve --cores 1 --port 0` on its own data dir (worker pinned to
CPU 0 by its supervisor; this client process on CPU 1, librdkafka's threads with it):
- `plaintext`: no TLS, no SASL.
- `tls`: `--tls-cert --tls-key` (a CA and server certificate made here with trustme; TLS 1.3, the
  default suite of this OpenSSL), clients `security.protocol=SSL`.
- `tls+scram`: the same with `--sasl-mechanisms SCRAM-SHA-512` and a super user, clients
  `SASL_SSL`.

Rows (1 KiB random values, one partition; MB = 10^6 bytes of values), the median of the rounds
with their spread:
1. Produce acks=1: `--records` records through `Producer.produce` (linger.ms 5), from the first
   produce() to flush() returning with every record acknowledged.
2. Consume from earliest: a Consumer assigned the partition at OFFSET_BEGINNING, `consume(1000)`
   batches until every record is read.
3. Acked one-at-a-time produce, acks=1: produce() then flush() per record: p50 in microseconds.
4. Connect + authenticate: a fresh Producer per sample, from its creation to the first delivery
   report of one record (TCP, the TLS handshake, the SASL exchange with its 8192 PBKDF2
   iterations on both sides, Metadata, the produce): p50 in milliseconds.
Then the headline figure (docs/SECURITY.md, "Figures"): TLS (and TLS+SCRAM) throughput as a ratio
of plaintext, per backend (goal on io_uring: >= 0.6).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import code_version, table, tree_cpu
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from labkit.brokerproc import BrokerProcess
from labkit.securitylab import Pki, add_user

VALUE_BYTES = 1024
PASSWORD = "bench password"
VARIANTS = ("plaintext", "tls", "tls+scram")
CLIENT_CPU = 1
GOAL_TLS_RATIO = 0.6


def start(variant: str, backend: str, work: Path, pki: Pki) -> tuple[BrokerProcess, dict[str, Any]]:
    data = work / f"{variant}-{backend}"
    shutil.rmtree(data, ignore_errors=True)
    extra: list[str] = []
    conf: dict[str, Any] = {}
    if variant != "plaintext":
        extra += ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
        conf = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
    if variant == "tls+scram":
        add_user(data, "bench", PASSWORD)
        extra += ["--sasl-mechanisms", "SCRAM-SHA-512", "--super-users", "User:bench"]
        conf.update(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "bench",
                "sasl.password": PASSWORD,
            }
        )
    # started with every CPU allowed, so that its supervisor pins the worker to CPU 0, not to the
    # client's CPU this process is pinned to meanwhile (bench/perf.py measured what that hides)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    try:
        b = BrokerProcess(
            data, work / f"{variant}-{backend}.log", extra=tuple(extra), backend=backend
        ).start()
    finally:
        os.sched_setaffinity(0, {CLIENT_CPU})
    if b.fell_back():
        b.stop()
        raise SystemExit("io_uring unavailable here: the broker fell back to uvloop")
    conf["bootstrap.servers"] = b.bootstrap
    return b, conf


def run_round(
    conf: dict[str, Any], b: BrokerProcess, records: int, samples: int, topic: str
) -> dict[str, float]:
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    raw = os.urandom(VALUE_BYTES * 64)
    values = [raw[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(64)]
    out: dict[str, float] = {}

    p = Producer({**conf, "linger.ms": 5, "acks": 1, "enable.idempotence": False})
    p.produce(topic, b"warm", partition=0)
    p.flush(30)
    cpu0, t0 = tree_cpu(b.pid), time.perf_counter()
    for i in range(records):
        while True:
            try:
                p.produce(topic, values[i & 63], partition=0)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(120)
    elapsed, cpu = time.perf_counter() - t0, tree_cpu(b.pid) - cpu0
    out["produce_mb_s"] = records * VALUE_BYTES / elapsed / 1e6
    out["produce_cpu_s_gb"] = cpu / (records * VALUE_BYTES / 1e9)

    c = Consumer({**conf, "group.id": "bench", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
    got = 0
    cpu0, t0 = tree_cpu(b.pid), time.perf_counter()
    while got < records + 1:
        for m in c.consume(min(1000, records + 1 - got), 5):  # never waiting out the timeout at the end
            if m.error() is None:
                got += 1
    elapsed, cpu = time.perf_counter() - t0, tree_cpu(b.pid) - cpu0
    c.close()
    out["consume_mb_s"] = records * VALUE_BYTES / elapsed / 1e6
    out["consume_cpu_s_gb"] = cpu / (records * VALUE_BYTES / 1e9)

    one = Producer({**conf, "linger.ms": 0, "acks": 1, "enable.idempotence": False})
    one.produce(topic, b"warm", partition=0)
    one.flush(30)
    lat = []
    for i in range(samples):
        t = time.perf_counter_ns()
        one.produce(topic, values[i & 63], partition=0)
        one.flush(30)
        lat.append((time.perf_counter_ns() - t) / 1000)
    out["p50_us"] = statistics.median(lat)

    connects = []
    for _ in range(max(5, samples // 100)):
        t = time.perf_counter_ns()
        fresh = Producer({**conf, "linger.ms": 0, "acks": 1, "enable.idempotence": False})
        fresh.produce(topic, b"hello", partition=0)
        fresh.flush(30)
        connects.append((time.perf_counter_ns() - t) / 1e6)
    out["connect_ms"] = statistics.median(connects)
    return out


def spread(xs: list[float], digits: int = 0) -> str:
    return f"{statistics.median(xs):,.{digits}f} ({min(xs):,.{digits}f}..{max(xs):,.{digits}f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer records and samples (~1 minute)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="io_uring,uvloop")
    args = ap.parse_args()
    records, samples = (60_000, 300) if args.quick else (300_000, 1500)
    backends = args.backends.split(",")
    print(f"bench/security.py: {code_version()}")
    print(
        f"  {os.cpu_count()} CPUs; client on CPU {CLIENT_CPU}; {records:,} records of {VALUE_BYTES} B; "
        f"rounds {args.rounds}"
    )
    os.sched_setaffinity(0, {CLIENT_CPU})
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rl-security-") as tmp:
        work = Path(tmp)
        pki = Pki.make(work)
        combos = [(v, b) for b in backends for v in VARIANTS]
        for rnd in range(args.rounds):
            order = combos[rnd % len(combos) :] + combos[: rnd % len(combos)]
            for variant, backend in order:
                b, conf = start(variant, backend, work, pki)
                try:
                    r = run_round(conf, b, records, samples, f"t{rnd}")
                finally:
                    b.stop()
                results.setdefault((variant, backend), []).append(r)
                print(
                    f"  round {rnd + 1}: {backend} {variant}: produce {r['produce_mb_s']:.0f} MB/s, "
                    f"consume {r['consume_mb_s']:.0f} MB/s, p50 {r['p50_us']:.0f} us, "
                    f"connect {r['connect_ms']:.1f} ms",
                    flush=True,
                )
    rows = []
    for (variant, backend), rs in sorted(
        results.items(), key=lambda kv: (kv[0][1], VARIANTS.index(kv[0][0]))
    ):

        def col(k: str, d: int = 0, rs: list[dict[str, float]] = rs) -> str:
            return spread([r[k] for r in rs], d)

        rows.append(
            [
                backend,
                variant,
                col("produce_mb_s"),
                col("produce_cpu_s_gb", 2),
                col("consume_mb_s"),
                col("consume_cpu_s_gb", 2),
                col("p50_us"),
                col("connect_ms", 1),
            ]
        )
    print("\nlibrdkafka against ringlog --cores 1 (median of rounds, min..max)")
    table(
        [
            "backend",
            "variant",
            "produce MB/s",
            "CPU s/GB",
            "consume MB/s",
            "CPU s/GB",
            "p50 us",
            "connect ms",
        ],
        rows,
    )
    print("\nTLS against plaintext (throughput ratio of medians; goal on io_uring >= 0.6)")
    ratio_rows = []
    for backend in backends:
        base = results.get(("plaintext", backend))
        if not base:
            continue
        for variant in VARIANTS[1:]:
            rs = results.get((variant, backend))
            if not rs:
                continue
            for what in ("produce_mb_s", "consume_mb_s"):
                r = statistics.median(x[what] for x in rs) / statistics.median(x[what] for x in base)
                ok = "met" if r >= GOAL_TLS_RATIO else "MISSED"
                ratio_rows.append(
                    [backend, variant, what.split("_")[0], f"{r:.2f}x", ok if backend == "io_uring" else ""]
                )
    table(["backend", "variant", "what", "of plaintext", "goal"], ratio_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
