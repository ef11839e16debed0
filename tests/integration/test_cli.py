"""The `broker` command against a real broker: what a user types, what they see, exit statuses."""

from __future__ import annotations

import json
import subprocess
import sys

from labkit.brokerproc import BrokerProcess


def broker_cmd(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_topics_produce_consume_round_trip(broker: BrokerProcess) -> None:
    b = ("-b", f"127.0.0.1:{broker.port}")
    out = broker_cmd("topics", "create", "orders", "--partitions", "2", *b)
    assert out.returncode == 0 and "created topic orders" in out.stdout
    assert broker_cmd("topics", "list", *b).stdout.split() == ["orders"]
    lines = "".join(f"line {i}\n" for i in range(50))
    assert broker_cmd("produce", "orders", "--partition", "1", *b, stdin=lines).returncode == 0
    desc = broker_cmd("topics", "describe", "orders", *b).stdout
    assert "partitions 2" in desc and "50" in desc
    got = broker_cmd("consume", "orders", "--from-beginning", "--max-records", "50", *b)
    assert got.returncode == 0
    assert got.stdout.splitlines() == [f"line {i}" for i in range(50)]


def test_json_lines_with_a_key_field_and_json_output(broker: BrokerProcess) -> None:
    b = ("-b", f"127.0.0.1:{broker.port}")
    broker_cmd("topics", "create", "users", *b)
    docs = [{"id": i, "name": f"u{i}"} for i in range(5)]
    stdin = "".join(json.dumps(d) + "\n" for d in docs)
    assert (
        broker_cmd("produce", "users", "--format", "json", "--key-field", "id", *b, stdin=stdin).returncode
        == 0
    )
    out = broker_cmd(
        "consume", "users", "--from-beginning", "--format", "json", "--idle-timeout-ms", "800", *b
    )
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["key"] for r in records] == ["0", "1", "2", "3", "4"]
    assert [json.loads(r["value"]) for r in records] == docs
    assert all(r["topic"] == "users" and r["partition"] == 0 for r in records)


def test_group_consumption_resumes_where_it_committed(broker: BrokerProcess) -> None:
    b = ("-b", f"127.0.0.1:{broker.port}")
    broker_cmd("topics", "create", "jobs", *b)
    broker_cmd("produce", "jobs", *b, stdin="".join(f"j{i}\n" for i in range(10)))
    first = broker_cmd("consume", "jobs", "--group", "w", "--from-beginning", "--max-records", "4", *b)
    assert first.stdout.split() == ["j0", "j1", "j2", "j3"]
    rest = broker_cmd("consume", "jobs", "--group", "w", "--idle-timeout-ms", "800", *b)
    assert rest.stdout.split() == [f"j{i}" for i in range(4, 10)]


def test_errors_are_one_line_and_a_nonzero_status(broker: BrokerProcess, tmp_path) -> None:
    b = ("-b", f"127.0.0.1:{broker.port}")
    broker_cmd("topics", "create", "t", *b)
    again = broker_cmd("topics", "create", "t", *b)
    assert again.returncode == 1 and "already exists" in again.stderr
    bad_json = broker_cmd("produce", "t", "--format", "json", *b, stdin="{not json\n")
    assert bad_json.returncode == 2 and "line 1 is not JSON" in bad_json.stderr
    down = broker_cmd("topics", "list", "-b", "127.0.0.1:1")
    assert down.returncode == 1 and down.stderr.count("\n") == 1
    missing = broker_cmd("produce", "no-such-topic", *b, stdin="x\n")
    assert missing.returncode == 1 and "no-such-topic" in missing.stderr
    for out in (again, bad_json, down, missing):
        assert "Traceback" not in out.stderr


def test_version() -> None:
    out = broker_cmd("--version")
    assert out.returncode == 0 and out.stdout.startswith("ringlog broker ")
