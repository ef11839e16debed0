"""`make compat`: librdkafka's own test suite against a fresh `broker serve`, one test per process,
printing each test's result as it comes, then the failures and skips with their reasons, the tests
left out and why, and the totals ("58 passed, 21 failed, 6 skipped of 85").

Run `bash scripts/compat_build.sh` first (`make compat` does): it builds librdkafka 2.0.2 and the
suite's test-runner into .compat/. What runs, how, and what is left out: labkit/rdkafka_suite.py.
Results go to .compat/run/ (`--out`): results.json, each process's output in logs/, the brokers'
data dirs and logs. Exit status 1 when a test failed, 0 when none did.

    .venv/bin/python scripts/compat.py [--tests 0001,0012] [--quick] [--timeout-s S]
        [--cores N] [--backend auto|io_uring|uvloop] [--broker-arg=--flag ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from labkit.rdkafka_suite import KAFKA_VERSION, RDKAFKA_VERSION, Outcome, Suite, plan, run_all, summary_line

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", default="", help="test numbers or names, comma-separated (default: all)")
    ap.add_argument("--quick", action="store_true", help="the suite's quick mode (-Q): fewer subtests")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="kill a test's process after this")
    ap.add_argument("--cores", type=int, default=0, help="broker cores (default: every CPU)")
    ap.add_argument("--backend", default="auto", choices=["auto", "io_uring", "uvloop"])
    ap.add_argument("--broker-arg", action="append", default=[], help="one more `broker serve` argument")
    ap.add_argument("--kafka-version", default=KAFKA_VERSION, help="TEST_KAFKA_VERSION for the suite")
    # the build's folder, as scripts/compat_build.sh takes it (COMPAT_DIR, default .compat/)
    cache = Path(os.environ.get("COMPAT_DIR") or ROOT / ".compat")
    ap.add_argument("--source", type=Path, default=cache / f"librdkafka-{RDKAFKA_VERSION}")
    ap.add_argument("--out", type=Path, default=cache / "run")
    args = ap.parse_args()

    suite = Suite(
        source=args.source,
        out=args.out,
        quick=args.quick,
        timeout_s=args.timeout_s,
        kafka_version=args.kafka_version,
        cores=args.cores,
        backend=args.backend,
        broker_args=tuple(args.broker_arg),
    )
    if not suite.runner.exists():
        print(f"no test-runner at {suite.runner}: run `bash scripts/compat_build.sh` first", file=sys.stderr)
        return 2
    invocations, excluded = plan(suite.table(), [t for t in args.tests.split(",") if t])
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    mode = "quick" if args.quick else "full"
    print(
        f"librdkafka {RDKAFKA_VERSION} test suite ({mode}, TEST_KAFKA_VERSION={args.kafka_version}): "
        f"{len(invocations)} tests, one process each, against broker serve "
        f"(--backend {args.backend}, {args.cores or 'all'} cores); output in {args.out}",
        flush=True,
    )
    started = time.monotonic()

    def report(o: Outcome) -> None:
        print(f"  {o.name:<48} {o.state.upper():<8} {o.seconds:7.1f}s  {o.reason}"[:220], flush=True)

    outcomes = run_all(suite, invocations, report)
    print_details(outcomes, excluded)
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "outcomes": [asdict(o) for o in outcomes],
                "excluded": {t.name: why for t, why in excluded},
                "summary": summary_line(outcomes, len(excluded)),
                "seconds": round(time.monotonic() - started),
            },
            indent=1,
        )
    )
    took_s = time.monotonic() - started
    print(f"{len(suite.brokers)} broker(s), started {suite.broker_starts} time(s); {took_s:.0f} s in all")
    print(summary_line(outcomes, len(excluded)))
    return 1 if any(o.state == "failed" for o in outcomes) else 0


def print_details(outcomes: list[Outcome], excluded: list) -> None:
    for state in ("failed", "skipped"):
        chosen = [o for o in outcomes if o.state == state]
        if chosen:
            print(f"\n{state} ({len(chosen)}):")
        for o in chosen:
            print(f"  {o.name}: {o.reason}")
            errors = list(dict.fromkeys(o.broker_errors))
            for err in errors[:3]:
                print(f"      broker logged: {err}")
            if len(errors) > 3:
                print(f"      broker logged {len(errors) - 3} other errors (its log: broker-N/broker.log)")
    if excluded:
        print(f"\nexcluded ({len(excluded)}):")
        for t, why in excluded:
            print(f"  {t.name}: {why}")
    print()


if __name__ == "__main__":
    sys.exit(main())
