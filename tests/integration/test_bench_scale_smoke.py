"""bench/scale.py at its smallest (`--smoke`: every row, uvloop only, no Tansu, tiny sizes) runs to
the end and prints every row of its table with a figure: a bench that `make bench-scale` runs
for minutes must not find out there that a row broke.

Marked slow: every phase starts its own brokers (a three-node cluster with etcd among them),
about 40 s on the 2-CPU VM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.brokerproc import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
ROWS = [f"R{i}" for i in range(1, 16)]
ROW_RE = re.compile(r"^  (R\d+)\s{2}.*\s(PASS|FAIL|reported|not run|error)$")


def table_rows(output: str) -> dict[str, str]:
    """Row name -> verdict, of each line of the bench's table."""
    return {m.group(1): m.group(2) for m in map(ROW_RE.match, output.splitlines()) if m}


def missing_or_unmeasured(output: str) -> list[str]:
    """What is wrong with the table: rows missing, rows not run or in error."""
    got = table_rows(output)
    wrong = [f"{r} missing" for r in ROWS if r not in got]
    wrong += [f"{r} {v}" for r, v in got.items() if v in ("not run", "error")]
    return wrong


def python_in_repo(args: list[str], timeout_s: float, *paths: Path) -> subprocess.CompletedProcess[str]:
    """This interpreter on `args` from the repository, with it (and `paths`) on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (REPO, *paths))}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        check=False,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout_s,
    )


def test_the_check_fails_when_a_row_is_missing_or_in_error() -> None:
    lines = [f"  {r}   what  goal  1.0  -  -  reported" for r in ROWS]
    assert missing_or_unmeasured("\n".join(lines)) == []
    assert missing_or_unmeasured("\n".join(lines[:6] + lines[7:])) == ["R7 missing"]
    errored = [*lines[:-1], "  R15  growth  table below  error: RuntimeError: x  -  -  error"]
    assert missing_or_unmeasured("\n".join(errored)) == ["R15 error"]


def test_librdkafka_takes_the_admin_configs_of_every_size() -> None:
    """The smoke run's sizes cannot tell a librdkafka config that only the full run's make
    invalid: its 900 s step timeout as `socket.timeout.ms` (librdkafka's most is 300 s) failed R12
    and R13 at their first topic, in the full run alone. Each preset's admin config is built here."""
    probe = (
        "import scale\n"
        "from confluent_kafka.admin import AdminClient\n"
        "for sizes in (scale.FULL, scale.QUICK, scale.SMOKE):\n"
        "    AdminClient(scale.admin_conf('127.0.0.1:1', sizes.step_timeout_s))\n"
        "print('ok')\n"
    )
    run = python_in_repo(["-c", probe], 60, REPO / "bench")
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout[-2000:] + run.stderr[-2000:]


@pytest.mark.parametrize("broker", [{"backend": "uvloop"}], indirect=True)
def test_librdkafka_statistics_say_where_a_record_waited(broker: BrokerProcess) -> None:
    """R12's cell puts librdkafka's own p50s beside the rates (a record queued in the client, a
    request's round trip): read from a real producer's statistics of the seconds it produced."""
    probe = (
        "import json, scale\n"
        "stats = []\n"
        f"scale.k_produce_for({broker.bootstrap!r}, 'waits', 1, 1.3, '1', stats=stats)\n"
        "print(json.dumps([len(stats), scale.queue_waits(stats), scale.queue_waits([])]))\n"
    )
    run = python_in_repo(["-c", probe], 60, REPO / "bench")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    count, waits, none = json.loads(run.stdout.strip().splitlines()[-1])
    assert count >= 1 and none is None
    queued_ms, rtt_ms = waits
    assert 0 <= queued_ms < 1300 and 0 < rtt_ms < 1300


def test_tree_waited_counts_a_tree_kept_from_its_cpu() -> None:
    """R1/R2's "nodes waiting for a CPU": a process and its child spinning on one CPU each wait
    while the other runs, and `tree_waited` of the parent counts both."""
    probe = (
        "import os, time, benchlib\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "before = benchlib.tree_waited(os.getpid())\n"
        "kid = os.fork()\n"
        "end = time.monotonic() + 0.6\n"
        "while time.monotonic() < end:\n"
        "    pass\n"
        "if kid == 0:\n"
        "    time.sleep(1)\n"
        "    os._exit(0)\n"
        "waited = benchlib.tree_waited(os.getpid()) - before\n"
        "os.kill(kid, 9)\n"
        "os.waitpid(kid, 0)\n"
        "print(waited)\n"
    )
    run = python_in_repo(["-c", probe], 60, REPO / "bench")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert float(run.stdout.strip()) >= 0.3  # 1.2 s of spinning on one CPU: ~0.6 s of waiting


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="the replication rows need etcd")
def test_every_row_of_the_smoke_run_is_measured(tmp_path: Path) -> None:
    run = python_in_repo([str(REPO / "bench" / "scale.py"), "--smoke", "--dir", str(tmp_path)], 240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert missing_or_unmeasured(run.stdout) == [], run.stdout
    assert "R15 growth" in run.stdout and "idle connections 10" in run.stdout
    r1 = next(line for line in run.stdout.splitlines() if line.startswith("  R1 "))
    assert re.search(r"client \d+\.\d/\d+\.\d CPU, nodes waiting for a CPU \d+\.\d/\d+\.\d", r1), r1
    r4 = next(line for line in run.stdout.splitlines() if line.startswith("  R4 "))
    assert re.search(r"stages: HW wait \d+ = follower append \d+", r4), r4  # the stage metrics were fed
    # the machine's share beside it: bench/hops_floor.py ran its trips (a failure leaves it out)
    assert re.search(
        r"bare processes \(bench/hops_floor.py\): \d+ µs with 3 replicas, \d+ µs one node", r4
    ), r4
    # the disk's share beside R12: bench/sync_floor.py ran its writes and syncs (a failure leaves it out)
    r12 = next(line for line in run.stdout.splitlines() if line.startswith("  R12 "))
    assert re.search(r"\(bench/sync_floor.py\): \d+k / \d+k rec/s over \d+ files / one", r12), r12
    assert not list(tmp_path.glob("scale/run-*")), "the bench left its data dirs behind"
