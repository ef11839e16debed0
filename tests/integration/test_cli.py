"""The `broker` command against a real broker: what a user types, what they see, exit statuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

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
    # a name no topic can have (the broker auto-creates any other a producer names)
    missing = broker_cmd("produce", "no such topic", *b, stdin="x\n")
    assert missing.returncode == 1 and "no such topic" in missing.stderr
    for out in (again, bad_json, down, missing):
        assert "Traceback" not in out.stderr


def test_topic_configs_from_the_command_line(broker: BrokerProcess) -> None:
    """`broker topics create/alter --config`, `describe` showing them: the same config model as
    Kafka's APIs (a Kafka client's describe of the topic sees what was set here)."""
    b = ("-b", f"127.0.0.1:{broker.port}")
    out = broker_cmd(
        "topics", "create", "cfg", "--config", "cleanup.policy=compact", "--config", "retention.ms=60000", *b
    )
    assert out.returncode == 0, out.stderr
    desc = broker_cmd("topics", "describe", "cfg", *b).stdout
    assert "cleanup.policy  compact" in desc and "retention.ms    60000" in desc
    assert "segment.bytes" not in desc, "only the topic's own, unless --all-configs"
    out = broker_cmd(
        "topics", "alter", "cfg", "--config", "max.message.bytes=4096", "--delete-config", "retention.ms", *b
    )
    assert out.returncode == 0 and "altered topic cfg" in out.stdout, out.stderr
    every = broker_cmd("topics", "describe", "cfg", "--all-configs", *b).stdout
    assert re.search(r"max\.message\.bytes +4096\n", every) and re.search(
        r"cleanup\.policy +compact\n", every
    )
    assert re.search(r"retention\.ms +604800000  \(default\)", every)
    bad = broker_cmd("topics", "alter", "cfg", "--config", "retention.ms=soon", *b)
    assert bad.returncode == 1 and "retention.ms" in bad.stderr and "Traceback" not in bad.stderr
    unknown = broker_cmd("topics", "create", "cfg2", "--config", "retention.msec=1", *b)
    assert unknown.returncode == 1 and "unknown topic config name" in unknown.stderr
    assert broker_cmd("topics", "alter", "cfg", "--config", "oops", *b).returncode == 2
    checked = broker_cmd("topics", "alter", "cfg", "--config", "retention.ms=1", "--validate-only", *b)
    assert checked.returncode == 0 and "checked topic cfg" in checked.stdout
    every = broker_cmd("topics", "describe", "cfg", "--all-configs", *b).stdout
    assert re.search(r"retention\.ms +604800000  \(default\)", every), "unchanged"


@pytest.mark.parametrize("broker", [{"cores": 1, "backend": "uvloop"}], indirect=True)  # the CLI's own
def test_replicas_placed_by_hand_from_the_command_line(broker: BrokerProcess) -> None:
    """`topics create --replica-assignment` (kafka-topics.sh's form): on one node each partition
    can only be this node's (node 0); anything else is refused in one line."""
    b = ("-b", f"127.0.0.1:{broker.port}")
    out = broker_cmd("topics", "create", "placed", "--replica-assignment", "0,0,0", *b)
    assert out.returncode == 0 and "3 partitions" in out.stdout, out.stderr
    elsewhere = broker_cmd("topics", "create", "elsewhere", "--replica-assignment", "0:1", *b)
    assert elsewhere.returncode == 1 and "node 0" in elsewhere.stderr and "Traceback" not in elsewhere.stderr
    assert broker_cmd("topics", "list", *b).stdout.split() == ["placed"]


def test_version() -> None:
    out = broker_cmd("--version")
    assert out.returncode == 0 and out.stdout.startswith("ringlog broker ")


# Imported by `broker serve`'s own process only if something else than the supervisor needed them:
# the client library, a worker's protocols and core, and what they import (kio imports hypothesis).
WORKER_OR_CLIENT_MODULES = ("broker.client", "broker.cli.client", "broker.node.worker", "broker.kafka", "kio")


def test_serve_parses_and_checks_without_the_client_library_or_a_worker(tmp_path) -> None:
    probe = (
        "import sys\n"
        "from broker.cli import main\n"
        f"rc = main(['serve', '--cores', '0', '--data-dir', {str(tmp_path)!r}])\n"
        f"print(rc, sorted(m for m in {WORKER_OR_CLIENT_MODULES!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split(maxsplit=1) == ["2", "[]\n"], out
    assert "--cores must be at least 1" in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("serve", "--cores", "2", "--ebpf", "off"),
        ("--log-level", "debug", "serve", "--port", "0"),
        ("topics", "list", "-b", "h:1"),
        ("dump", "somewhere"),
        ("serve", "--bogus"),
        ("serve", "-p"),
        ("serve", "--cores", "x"),
        ("serve", "--help"),
        ("--log-level", "nope", "serve"),
        ("-h", "serve"),
        ("topics", "nope"),
        ("topics", "create", "--help"),
        ("users", "--help"),
        ("nope",),
        (),
    ],
)
def test_a_commands_own_parser_answers_as_the_whole_one(args: tuple[str, ...], capsys) -> None:
    from broker.cli import build_parser, parse_args

    def answer(parse) -> tuple[object, str, str]:
        try:
            result: object = vars(parse(list(args)))
        except SystemExit as exc:
            result = exc.code
        out = capsys.readouterr()
        return result, out.out, out.err

    assert answer(parse_args) == answer(build_parser().parse_args)
