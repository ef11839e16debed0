"""librdkafka's own test suite (its tests/ directory, built by scripts/compat_build.sh) against a real
`broker serve`, one test per process: the harness of `make compat` (scripts/compat.py).

What runs. The suite's table of tests (`tests[]` in tests/test.c) is read from the build: every
test that needs a broker, i.e. not TEST_F_LOCAL (those run against librdkafka's mock cluster or
nothing) and not TEST_F_MANUAL, less `EXCLUDED` (each with its reason): tests that drive Kafka's
own command-line tools (kafka-topics.sh, kafka-acls.sh, kafka-run-class.sh for a Java client: a
Kafka installation and its JVM) and tests librdkafka itself marks TEST_F_KNOWN_ISSUE. No test of
this suite needs the harness to restart or stop a broker (those that take brokers down do it in
the mock cluster, locally), and none needs ZooKeeper once TEST_KAFKA_VERSION is 3.x
(kafka-topics.sh then takes --bootstrap-server, and those tests are excluded for the tool anyway).

Full mode by default: in the suite's quick mode (`-Q`) every subtest not marked SUB_TEST_QUICK is
skipped without a word and its test still passes (0018_cgrp_term passes in 0.0 s having run
nothing), so quick counts say less than they seem to. `QUICK_ONLY` lists the tests run in quick
mode all the same, each with its reason (a full-mode step that needs Kafka's tools).

How. The test-runner picks tests by number (`TESTS=0012` runs every test whose name starts with
0012), so one process runs one number with `-L` (no local tests) and `-p1`, in the test's
scenario (`-s`): with those filters no number runs more than one test (`plan()` checks it). A run
of a process is bounded by `timeout_s` (the process group is killed past it; librdkafka's own
per-test timeouts usually fire first). Its result is the JSON report the runner writes at exit
(TEST_REPORT): state per test; the reason is the first `### Test "NAME" failed at FILE:LINE` block
of its output, or its `SKIPPING TEST:` line. A process killed or crashed before writing the report
fails its test with what happened and its last line.

The broker. One fresh `broker serve` per scenario's broker arguments for the whole run (on a new
data dir; restarted on a new one if a test kills it, which the test's result then says), with the
defaults a user gets (all CPUs, `--backend auto`) unless told otherwise. The suite's "default"
scenario is Apache Kafka's defaults with automatic topic creation and 4 partitions per created
topic; "noautocreate" is the same with creation off (`SCENARIO_BROKER_ARGS`): two brokers. The
errors the broker logs while a test runs are kept beside the test's result.

The client's configuration (test.conf) is `bootstrap.servers` and nothing else; the broker version
the suite assumes (TEST_KAFKA_VERSION) gates some tests by version: 3.1.0 by default, the newest
release this suite (2.0.2) names in its Makefile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from labkit.brokerproc import BrokerProcess

RDKAFKA_VERSION = "2.0.2"
KAFKA_VERSION = "3.1.0"

# Name -> why the harness does not run it. Named explicitly (`--tests`), an excluded test runs all
# the same: for whoever builds the tool's effect into the broker, or wants the known issue's verdict.
EXCLUDED: dict[str, str] = {
    "0045_subscribe_update_non_exist_and_partchange": "needs kafka-topics.sh (--alter --partitions)",
    "0045_subscribe_update_topic_remove": "needs kafka-topics.sh (--delete)",
    "0052_msg_timestamps": "needs kafka-topics.sh (--create --config message.timestamp.type=...)",
    "0077_compaction": "needs kafka-topics.sh (--create --config cleanup.policy=compact ...)",
    "0098_consumer_txn": (
        "needs kafka-run-class.sh: its transactional producer is Java (java/TransactionProducerCli)"
    ),
    "0109_auto_create_topics": "needs kafka-acls.sh (a deny ACL) from broker version 2.1",
    "0115_producer_auth": "needs kafka-acls.sh (a deny ACL)",
    "0119_consumer_auth": "needs kafka-acls.sh (allow Describe, deny Read ACLs)",
    "0028_long_topicnames": "librdkafka marks it TEST_F_KNOWN_ISSUE (librdkafka issue 529)",
    "0047_partial_buf_tmout": "librdkafka marks it TEST_F_KNOWN_ISSUE",
}

# Name -> why it runs in quick mode (-Q) even in a full run: what its full mode adds needs Kafka's tools.
QUICK_ONLY: dict[str, str] = {
    "0113_cooperative_rebalance": (
        "quick mode: its full mode's o_java_interop runs a Java consumer (kafka-run-class.sh)"
    ),
}

# Scenario -> the broker arguments that make it: the suite's scenarios/*.json, trivup's settings
# for the Kafka cluster it starts (auto_create_topics, num_partitions 4, replication_factor 3 on
# three brokers; a single node keeps one copy, so the last has no counterpart here).
SCENARIO_BROKER_ARGS: dict[str, tuple[str, ...]] = {
    "default": ("--auto-create-topics", "--default-partitions", "4"),
    "noautocreate": ("--no-auto-create-topics", "--default-partitions", "4"),
}

_TEST_START = re.compile(r"^\s*_TEST\(", re.M)
_SCENARIO = re.compile(r'\.scenario\s*=\s*"([^"]*)"')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_FAILED_AT = re.compile(r'^### Test "([^"]+)" failed at ([^:]+):(\d+):[^ ]*\(\) at [^#]*###$')
_SAID = re.compile(r"^\[(\S+)\s*/\s*[\d.]+s\] (.*)$")
_BOOKKEEPING = ("TEST FAILURE", "# Test report written", "Setting test timeout")
_SKIPPING = re.compile(r"^\[(\S+)\s*/\s*[\d.]+s\] (?:WARN: )?SKIPPING TEST: (.*)$")


@dataclass(frozen=True)
class SuiteTest:
    """One entry of the suite's table: `name` is its number and what it tests (0012_produce_consume)."""

    name: str
    flags: frozenset[str]
    scenarios: tuple[str, ...] = ("default",)

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]

    @property
    def needs_broker(self) -> bool:
        return not self.flags & {"TEST_F_LOCAL", "TEST_F_MANUAL"}

    @property
    def scenario(self) -> str:
        """The scenario it runs in here: the default one where it may."""
        return "default" if "default" in self.scenarios else self.scenarios[0]


def parse_test_table(test_c: str) -> list[SuiteTest]:
    """The entries of `struct test tests[]` in the suite's tests/test.c, in their order."""
    start = test_c.index("struct test tests[] = {")
    table = test_c[start : test_c.index("{NULL}", start)]
    out = []
    for m in _TEST_START.finditer(table):
        args = _call_arguments(table, m.end())
        flags = frozenset(f.strip() for f in args[1].split("|") if f.strip() not in ("", "0"))
        scenario = next((_SCENARIO.match(a) for a in args[2:] if _SCENARIO.match(a)), None)
        scenarios = tuple(scenario.group(1).split(",")) if scenario else ("default",)
        out.append(SuiteTest(args[0], flags, scenarios))
    return out


def _call_arguments(text: str, at: int) -> list[str]:
    """The top-level, comma-separated arguments of the call whose "(" ends just before `at` (commas
    inside parentheses, braces and string literals belong to their argument)."""
    args, depth, begin, quoted = [], 0, at, False
    for i in range(at, len(text)):
        c = text[i]
        if c == '"' and text[i - 1] != "\\":
            quoted = not quoted
        elif quoted:
            continue
        elif c in "({":
            depth += 1
        elif c in ")}" and depth:
            depth -= 1
        elif c in ",)" and not depth:
            args.append(" ".join(text[begin:i].split()))
            begin = i + 1
            if c == ")":
                return args
    raise ValueError(f"unbalanced call at {text[at - 10 : at + 40]!r}")


@dataclass(frozen=True)
class Invocation:
    """One process of the test-runner: the tests of one number that run in one scenario."""

    number: str
    scenario: str
    tests: tuple[SuiteTest, ...]


def plan(
    tests: Iterable[SuiteTest], only: Iterable[str] = ()
) -> tuple[list[Invocation], list[tuple[SuiteTest, str]]]:
    """The processes to run and the broker tests left out, each with its reason. `only`: test
    numbers or names to run (excluded ones among them too); empty, every broker test not excluded.
    """
    wanted = list(only)
    runs: dict[tuple[str, str], list[SuiteTest]] = {}
    left_out: list[tuple[SuiteTest, str]] = []
    for t in tests:
        if not t.needs_broker:
            continue
        named = any(w in (t.number, t.name) for w in wanted)
        if wanted and not named:
            continue
        if t.name in EXCLUDED and not (named and t.name in wanted):
            left_out.append((t, EXCLUDED[t.name]))
            continue
        runs.setdefault((t.number, t.scenario), []).append(t)
    for (number, scenario), group in runs.items():
        if len(group) > 1:
            raise ValueError(f"{number} runs {len(group)} tests in scenario {scenario}: {group}")
    return [Invocation(n, s, tuple(g)) for (n, s), g in runs.items()], left_out


@dataclass
class Outcome:
    """What became of one test: `state` is passed, failed or skipped; `reason` one line."""

    name: str
    state: str
    seconds: float
    reason: str = ""
    broker_errors: list[str] = field(default_factory=list)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def failure_reasons(output: str) -> dict[str, str]:
    """Test name -> its first failure as `FILE:LINE: message`, from a test-runner's output (the
    `### Test "NAME (subtest)" failed at ...` block and the line after it). A timeout says nothing of
    what the test waited for, so the last line the test printed before it is added."""
    lines = strip_ansi(output).splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = _FAILED_AT.match(line.strip())
        if not m:
            continue
        full, file, lineno = m.groups()
        name, _, subtest = full.partition(" (")
        if name in out:
            continue
        message = next((x.strip() for x in lines[i + 1 : i + 4] if x.strip()), "")
        where = f"{file}:{lineno}"
        if subtest:
            where = f"[{subtest.rstrip(')')}] {where}"
        out[name] = f"{where}: {message}"
        if "timed out" in message:
            said = _last_said(lines[:i], name)
            out[name] += f"; last said: {said[:160]}" if said else ""
    return out


def _last_said(lines: list[str], name: str) -> str:
    """The last line test `name` printed in `lines` that is not the runner's own bookkeeping."""
    for line in reversed(lines):
        m = _SAID.match(line.strip())
        if m and m.group(1) == name and not m.group(2).startswith(_BOOKKEEPING):
            return m.group(2).strip()
    return ""


def skip_reasons(output: str) -> dict[str, str]:
    """Test name -> why it skipped itself, from the runner's `SKIPPING TEST:` lines."""
    out: dict[str, str] = {}
    for line in strip_ansi(output).splitlines():
        m = _SKIPPING.match(line.strip())
        if m:
            out.setdefault(m.group(1), m.group(2).strip())
    return out


def last_line(output: str) -> str:
    lines = [x.strip() for x in strip_ansi(output).splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


def outcomes_of(
    inv: Invocation, report: dict | None, output: str, seconds: float, ended: str
) -> list[Outcome]:
    """The outcome of each test of `inv` from the runner's JSON report (None when the process left
    none), its output, and `ended`: what ended a process that did not end by itself with a report
    ("" when it did: a runner kills itself after writing the report when a test times out)."""
    failures, skips = failure_reasons(output), skip_reasons(output)
    out = []
    for t in inv.tests:
        entry = (report or {}).get("tests", {}).get(t.name)
        if entry is None or ended or entry.get("state") not in ("PASSED", "FAILED", "SKIPPED"):
            why = ended or "the runner wrote no result for it"
            reason = f"{why}; last line: {last_line(output)}"
            if t.name in failures:
                reason = f"{why}; first failure {failures[t.name]}"
            out.append(Outcome(t.name, "failed", seconds, reason))
            continue
        state = entry["state"].lower()
        reason = failures.get(t.name, "") if state == "failed" else skips.get(t.name, "")
        if state == "failed" and not reason:
            reason = f"failed; last line: {last_line(output)}"
        # The process's own time: the report's duration is 0.0 for many a test that ran for seconds.
        out.append(Outcome(t.name, state, seconds, reason))
    return out


def broker_errors(log_text: str) -> list[str]:
    """One line per error the broker logged (logfmt, level=error): its message's first line and,
    for an exception, the traceback's last line."""
    out = []
    for line in log_text.splitlines():
        if "level=error" not in line and "level=critical" not in line:
            continue
        m = re.search(r"msg=(\".*\")\s*$", line)
        try:
            msg = json.loads(m.group(1)) if m else line
        except ValueError:
            msg = m.group(1) if m else line
        parts = [p.strip() for p in str(msg).splitlines() if p.strip()]
        text = parts[0] if parts else ""
        if any(p.startswith("Traceback") for p in parts):
            text = f"{text} ... {parts[-1]}"
        out.append(text[:300])
    return out


def summary_line(outcomes: Iterable[Outcome], excluded: int) -> str:
    """`58 passed, 21 failed, 6 skipped of 85` (and the tests left out, when some were)."""
    states = [o.state for o in outcomes]
    passed, failed, skipped = (states.count(s) for s in ("passed", "failed", "skipped"))
    line = f"{passed} passed, {failed} failed, {skipped} skipped of {len(states)}"
    return f"{line} ({excluded} excluded)" if excluded else line


@dataclass
class Suite:
    """The build (`source`: the unpacked librdkafka tree with tests/test-runner built in it) and
    where a run writes (`out`: test.conf, each process's output, the broker's data and log)."""

    source: Path
    out: Path
    quick: bool = False
    timeout_s: float = 600.0
    kafka_version: str = KAFKA_VERSION
    cores: int = 0  # 0: every CPU, as `broker serve` does by default
    backend: str = "auto"
    broker_args: tuple[str, ...] = ()
    brokers: dict[tuple[str, ...], BrokerProcess] = field(default_factory=dict)
    broker_starts: int = 0

    @property
    def runner(self) -> Path:
        return self.source / "tests" / "test-runner"

    def table(self) -> list[SuiteTest]:
        return parse_test_table((self.source / "tests" / "test.c").read_text())

    def broker_for(self, scenario: str) -> BrokerProcess:
        """The running broker of `scenario`'s arguments, started (on a fresh data dir) if none is."""
        args = self.broker_args + SCENARIO_BROKER_ARGS.get(scenario, ())
        broker = self.brokers.get(args)
        if broker is not None and broker.running():
            return broker
        self.broker_starts += 1
        data = self.out / f"broker-{self.broker_starts}"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        broker = BrokerProcess(
            data / "data",
            data / "broker.log",
            extra=args,
            cores=self.cores or os.cpu_count() or 1,
            backend=self.backend,
        )
        broker.start(timeout_s=120)
        self.brokers[args] = broker
        return broker

    def stop(self) -> None:
        for broker in self.brokers.values():
            if broker.running():
                broker.stop()

    def run(self, inv: Invocation) -> list[Outcome]:
        """One process of the test-runner for `inv`, against its scenario's broker."""
        broker = self.broker_for(inv.scenario)
        work = self.out / "work"
        work.mkdir(parents=True, exist_ok=True)
        # The runner runs in tests/, as the suite's own scripts run it: tests open files beside it by
        # relative paths (0053_stats checks its statistics against ../src/statistics_schema.json).
        cwd = self.source / "tests"
        conf = work / "test.conf"
        conf.write_text(f"bootstrap.servers={broker.bootstrap}\n")
        report = work / f"report-{inv.number}-{inv.scenario}.json"
        report.unlink(missing_ok=True)
        log_path = self.out / "logs" / f"{inv.number}-{inv.scenario}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not _suite_variable(k)}
        env |= {
            "TESTS": inv.number,
            "TEST_KAFKA_VERSION": self.kafka_version,
            "RDKAFKA_TEST_CONF": str(conf),
            "TEST_REPORT": str(report),
            "RDKAFKA_GITVER": f"{RDKAFKA_VERSION} (Debian bookworm source)",
            "LD_LIBRARY_PATH": f"{self.source / 'src'}:{self.source / 'src-cpp'}",
        }
        quick = self.quick or any(t.name in QUICK_ONLY for t in inv.tests)
        argv = [str(self.runner), "-L", "-p1", "-s", inv.scenario] + (["-Q"] if quick else [])
        broker_log_at = len(broker.log())
        started = time.monotonic()
        ended = ""
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                proc.wait(self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                ended = f"no result after {self.timeout_s:.0f} s: killed by the harness"
            except BaseException:  # Ctrl-C: the runner is in a session of its own, so it is ours to end
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        seconds = time.monotonic() - started
        for stats in cwd.glob("stats_*.json"):  # each client's statistics, which nothing here reads
            stats.unlink()
        output = log_path.read_text(errors="replace")
        try:
            doc = json.loads(report.read_text())
        except (OSError, ValueError):
            doc = None
        if doc is None and not ended and proc.returncode < 0:
            ended = f"the runner died of signal {signal.Signals(-proc.returncode).name}"
        outcomes = outcomes_of(inv, doc, output, seconds, ended)
        errors = broker_errors(broker.log()[broker_log_at:])
        if not broker.running():
            errors.append(f"the broker exited ({broker.proc.returncode if broker.proc else '?'})")
        for o in outcomes:
            o.broker_errors = errors
            if o.name in QUICK_ONLY and not self.quick:
                o.reason = f"{o.reason} ({QUICK_ONLY[o.name]})" if o.reason else QUICK_ONLY[o.name]
        return outcomes


def _suite_variable(name: str) -> bool:
    """Whether `name` is one of the suite's own knobs, which a caller's environment must not set
    behind the harness's back (a `TESTS` left in a shell would pick other tests)."""
    return name in {
        "TESTS",
        "SUBTESTS",
        "TESTS_SKIP",
        "TEST_SCENARIO",
        "TEST_DEBUG",
        "KAFKA_PATH",
        "ZK_ADDRESS",
        "BROKERS",
        "KAFKA_VERSION",
    }


def run_all(suite: Suite, invocations: list[Invocation], report: Callable[[Outcome], None]) -> list[Outcome]:
    """Every invocation in turn, `report`ing each outcome as it comes; the brokers stop at the end."""
    outcomes: list[Outcome] = []
    try:
        for inv in invocations:
            for o in suite.run(inv):
                outcomes.append(o)
                report(o)
    finally:
        suite.stop()
    return outcomes
