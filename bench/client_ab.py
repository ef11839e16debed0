"""Our Python client against another checkout's, in the same run: the blocking `Producer`'s rate
to one partition and spread over several, and the blocking `Consumer`'s read rate.

Run: `.venv/bin/python bench/client_ab.py TREE_A TREE_B [--rounds N] [--quick]`: two checkouts,
     e.g. `git worktree add /tmp/base main` beside this one (not run by `make`)

Each round runs every tree once, in an order rotating per round, each as a fresh subprocess in the
tree with the tree first on `PYTHONPATH` (its broker subprocess too, so both sides import the same
code). What one tree measures, against a fresh `broker serve` (uvloop) in a temporary directory:
- produce: `Producer` (acks=1, linger_ms 5, defaults otherwise) writing N keyless records of
  `--produce-bytes` (200 B, as bench/spark.py) with `partition=i % P` for P = 1 and P = 4 to a
  topic of P partitions, on a broker of `--cores` cores (default 1, and 2 with `--cores 1,2`):
  records/s from the first send to `flush()` returning, and the client's CPU per record; the
  1- and 4-partition runs alternate `--produce-reps` times (median each), and "spread" is the
  median over those pairs of the 4-partition rate over its 1-partition twin's (x100).
- produce 1 KiB: `AsyncProducer` (acks=1, linger_ms 5) writing N records of 1 KiB to one partition.
- consume: N records of 1 KiB values written by the same Producer into one partition, then read
  from the start by one blocking `Consumer` (max_poll_records 10 000), three ways: `poll()` lists,
  `for record in consumer`, and `poll_batches()` where the tree has it. MB/s of record values, and
  the client process's CPU time per GB (both its threads: less sensitive to a busy machine).
With one broker core and at least two CPUs, the broker is pinned to the first CPU and the client
to the second, as bench/e2e.py does; with more cores nothing is pinned.
The table gives per tree the median over rounds and the spread (max/min - 1) of each row, and the
ratio of the medians (second tree / first). The machine's noise shows in the spread: a ratio
within it is not a difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def one(args: argparse.Namespace) -> dict[str, float]:
    """Measure the tree first on sys.path (run with PYTHONPATH=<tree>:<this checkout>: a tree
    from before labkit/ starts its broker with this checkout's, and the broker and the client
    are still the tree's)."""
    from broker.client import Admin, Consumer, Producer
    from labkit.brokerproc import BrokerProcess

    out: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="ringlog-client-ab-"))
    try:
        for cores in [int(c) for c in args.cores.split(",")]:
            broker = BrokerProcess(tmp / f"data{cores}", tmp / f"broker{cores}.log", cores=cores)
            broker.start()
            pinned = cores == 1 and (os.cpu_count() or 1) >= 2
            if pinned:  # as bench/e2e.py: the broker on the first CPU, this client on the second
                for pid in (broker.proc.pid, *broker.worker_pids.values()):
                    os.sched_setaffinity(pid, {0})
                os.sched_setaffinity(0, {1})
            else:
                os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
            try:
                bs = broker.bootstrap
                with Admin(bs) as admin:
                    for parts in (1, 4):
                        admin.create_topic(f"p{parts}", partitions=parts)
                    admin.create_topic("c", partitions=1)
                    admin.create_topic("a", partitions=1)
                small = [os.urandom(args.produce_bytes) for _ in range(256)]
                rates: dict[int, list[float]] = {1: [], 4: []}
                cpus: dict[int, list[float]] = {1: [], 4: []}
                n = args.produce_records
                for _rep in range(0 if args.consume_only else args.produce_reps):
                    for parts in (1, 4):  # alternating, so each 4-partition run has a 1-partition twin
                        with Producer(bs, linger_ms=5) as p:
                            p.send(f"p{parts}", b"warm", partition=0).result()
                            t0 = time.perf_counter()
                            c0 = time.process_time()
                            for i in range(n):
                                p.send(f"p{parts}", small[i & 255], partition=i % parts)
                            p.flush()
                            rates[parts].append(n / (time.perf_counter() - t0))
                            cpus[parts].append((time.process_time() - c0) / n * 1e6)
                for parts in (1, 4) if rates[1] else ():
                    label = f"produce {args.produce_bytes} B, {parts} partition(s), cores {cores}"
                    out[f"{label} (rec/s)"] = statistics.median(rates[parts])
                    out[f"{label} (client CPU us/rec)"] = statistics.median(cpus[parts])
                if rates[1]:
                    ratios = [b / a for a, b in zip(rates[1], rates[4], strict=True)]
                    out[f"produce spread: 4 partitions / 1, cores {cores} (x100)"] = 100 * statistics.median(
                        ratios
                    )
                if cores != 1:
                    continue
                big = [os.urandom(1024) for _ in range(256)]
                if not args.consume_only:
                    out["produce 1 KiB, AsyncProducer, 1 partition (MB/s)"] = asyncio.run(
                        produce_async(bs, big, args.consume_records)
                    )
                n = args.consume_records
                with Producer(bs) as p:
                    for i in range(n):
                        p.send("c", big[i & 255], partition=0)
                    p.flush()
                for mode in ("poll", "iter", "batches"):
                    with Consumer(bs, auto_offset_reset="earliest", max_poll_records=10_000) as c:
                        if mode == "batches" and not hasattr(c, "poll_batches"):
                            continue
                        c.assign([("c", 0)])
                        got = nbytes = 0
                        t0 = time.perf_counter()
                        c0 = time.process_time()
                        if mode == "poll":
                            while got < n:
                                recs = c.poll(timeout_ms=5000)
                                if not recs:
                                    raise RuntimeError("poll timed out")
                                got += len(recs)
                                for r in recs:
                                    nbytes += len(r.value)
                        elif mode == "iter":
                            for r in c:
                                got += 1
                                nbytes += len(r.value)
                                if got >= n:
                                    break
                        else:
                            while got < n:
                                for batch in c.poll_batches(timeout_ms=5000):
                                    got += len(batch)
                                    for r in batch:
                                        nbytes += len(r.value)
                        secs = time.perf_counter() - t0
                        cpu = time.process_time() - c0
                        if got != n or nbytes != n * 1024:
                            raise RuntimeError(f"{mode}: consumed {got} records, {nbytes} B")
                        out[f"consume 1 KiB, Consumer {mode} (MB/s)"] = nbytes / secs / 1e6
                        out[f"consume 1 KiB, Consumer {mode} (client CPU ms/GB)"] = cpu / nbytes * 1e12
            finally:
                broker.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


async def produce_async(bs: str, values: list[bytes], n: int) -> float:
    from broker.client import AsyncProducer

    async with AsyncProducer(bs, linger_ms=5) as p:
        await (await p.send("a", values[0], partition=0))
        t0 = time.perf_counter()
        for i in range(n):
            await p.send("a", values[i & 255], partition=0)
        await p.flush()
        return n * len(values[0]) / (time.perf_counter() - t0) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", help="checkouts to measure; the ratio is the last over the first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", default="1", help="broker cores for the produce rows, e.g. 1,2")
    ap.add_argument("--produce-bytes", type=int, default=200)
    ap.add_argument("--produce-records", type=int, default=200_000)
    ap.add_argument("--consume-records", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true", help="a quarter of the records")
    ap.add_argument("--consume-only", action="store_true", help="skip the produce rows")
    ap.add_argument(
        "--produce-reps", type=int, default=3, help="alternating 1- and 4-partition runs per tree run"
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.produce_records //= 4
        args.consume_records //= 4
    if args.one:
        print(json.dumps(one(args)))
        return 0
    if not args.trees:
        ap.error("name the checkouts to measure, e.g. a worktree of main and this one")
    trees = [str(Path(t).resolve()) for t in args.trees]
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    passthrough = [
        f"--cores={args.cores}",
        f"--produce-bytes={args.produce_bytes}",
        f"--produce-records={args.produce_records}",
        f"--consume-records={args.consume_records}",
        *(["--consume-only"] if args.consume_only else []),
        f"--produce-reps={args.produce_reps}",
    ]
    for r in range(args.rounds):
        order = trees[r % len(trees) :] + trees[: r % len(trees)]
        for tree in order:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, str(HERE.parent.parent)])}
            proc = subprocess.run(
                [sys.executable, str(HERE), "--one", *passthrough],
                env=env,
                cwd=tree,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode:
                print(proc.stdout, proc.stderr, file=sys.stderr)
                return 1
            results[tree].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {tree}: done", file=sys.stderr)
    rows = list(dict.fromkeys(k for t in trees for res in results[t] for k in res))
    print(f"{args.rounds} rounds, trees alternating; median (spread max/min - 1)")
    head = f"{'':<52}" + "".join(f"{Path(t).name:>22}" for t in trees) + "   ratio"
    print(head)
    for row in rows:
        cells = []
        meds = []
        for t in trees:
            vals = [res[row] for res in results[t] if row in res]
            if not vals:
                cells.append(f"{'-':>22}")
                meds.append(None)
                continue
            med = statistics.median(vals)
            meds.append(med)
            cells.append(f"{med:>13,.0f} ({max(vals) / min(vals) - 1:>4.0%})")
        ratio = f"{meds[-1] / meds[0]:.2f}x" if meds[0] and meds[-1] else ""
        print(f"{row:<52}" + "".join(cells) + f"   {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
