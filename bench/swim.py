"""SWIM in the simulator (labkit/swimsim.py): failure detection time and false positives.

Run by hand from the repository root: `python bench/swim.py [--seeds 3] [--quiet-s 30]`.
For each cluster size and loss rate, per seed: the cluster joins through one seed node and
converges, runs `--quiet-s` virtual seconds in which nobody fails (every DEAD of a live node in that
time is a false positive; "suspect events" counts each node that heard a suspicion, so one
suspicion in a 200-node cluster counts up to 199), then one node crashes: detection is the time
until the first live node holds it dead, and until every live node does. Virtual time: the figures
are the protocol's, not this machine's (the wall time per run is printed too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchlib import code_version, table

from broker.cluster.swim import SwimConfig
from labkit.swimsim import Sim
from ringlog_proto.membership import DEAD, SUSPECT


def run(n: int, loss: float, seed: int, quiet_s: float) -> dict[str, float]:
    sim = Sim(seed=seed, loss=loss)
    sim.add(1)
    for nid in range(2, n + 1):
        sim.add(nid, [1])
    converged = sim.run_until_converged(60)
    start = sim.now
    sim.run_for(quiet_s)
    false_dead = sum(1 for t, _, ev in sim.events if t >= start and ev.kind == DEAD)
    suspicions = sum(
        1 for t, o, ev in sim.events if t >= start and ev.kind == SUSPECT and o != ev.view.member.node_id
    )
    victim = n // 2 + 1
    crash_at = sim.now
    sim.crash(victim)
    sim.run_for(30)
    seen: dict[int, float] = {}
    for t, o, ev in sim.events:
        if t >= crash_at and ev.kind == DEAD and ev.view.member.node_id == victim:
            seen.setdefault(o, t - crash_at)
    live = set(sim.live())
    return {
        "converge": converged if converged is not None else float("nan"),
        "first": min(seen.values()) if seen else float("nan"),
        "all": max(seen.values()) if set(seen) >= live else float("nan"),
        "false_dead_per_node_hour": false_dead / n / (quiet_s / 3600),
        "suspicions_per_s": suspicions / quiet_s,
        "packets_per_node_s": sim.packets / n / sim.now,
    }


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    if len(xs) == 1:
        return fmt.format(xs[0])
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,50,200")
    ap.add_argument("--losses", default="0,0.05,0.10")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quiet-s", type=float, default=30.0)
    args = ap.parse_args()
    c = SwimConfig()
    print(f"code: {code_version()}")
    print(
        f"SwimConfig: period {c.period * 1000:.0f} ms, ack timeout {c.ack_timeout * 1000:.0f} ms, "
        f"k {c.indirect_k}, suspicion {c.suspicion_mult} x max(1, log10 n) periods, "
        f"retransmit {c.retransmit_mult} x ceil(log10(n+1))"
    )
    print(
        f"{args.seeds} seeds per row, median (min-max); "
        f"{args.quiet_s:.0f} s without failures, then one crash\n"
    )
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        for loss in (float(x) for x in args.losses.split(",")):
            t0 = time.perf_counter()
            rs = [run(n, loss, seed, args.quiet_s) for seed in range(1, args.seeds + 1)]
            wall = time.perf_counter() - t0
            rows.append(
                [
                    str(n),
                    f"{loss:.0%}",
                    spread([r["converge"] for r in rs], "{:.1f}"),
                    spread([r["first"] for r in rs]),
                    spread([r["all"] for r in rs]),
                    f"{c.suspicion_timeout(n):.2f}",
                    spread([r["suspicions_per_s"] for r in rs], "{:.1f}"),
                    spread([r["false_dead_per_node_hour"] for r in rs], "{:.1f}"),
                    spread([r["packets_per_node_s"] for r in rs], "{:.1f}"),
                    f"{wall:.1f}",
                ]
            )
            print(f"  done n={n} loss={loss:.0%} in {wall:.1f} s", file=sys.stderr)
    table(
        [
            "nodes",
            "loss",
            "converge s",
            "detect first s",
            "detect all s",
            "suspicion s",
            "suspect events/s",
            "false dead /node/h",
            "pkts/node/s",
            "wall s",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
