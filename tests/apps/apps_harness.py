"""What tests/apps shares: each stream processor's venv (scripts/setup_apps.sh), an app script run
in it as a subprocess, and the test's own producer and reader (confluent-kafka from the project's
venv) for the input and output topics.

The apps are scripts beside this module (quix_counter.py, faust_counter.py, bytewax_copy.py),
written with their framework's own API and nothing of ours; no topic is created by the tests
(the frameworks create theirs, or the broker auto-creates them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
confluent_admin = pytest.importorskip("confluent_kafka.admin")

HERE = Path(__file__).parent
APPS_VENVS = Path(sys.prefix) / "apps"  # scripts/setup_apps.sh makes them there


def app_python(name: str) -> Path:
    """The python of framework `name`'s venv; the test is skipped when setup could not make it."""
    python = APPS_VENVS / name / "bin" / "python"
    if not (APPS_VENVS / name / ".installed").exists() or not python.exists():
        pytest.skip(f"{name} is not installed in {APPS_VENVS / name} (scripts/setup_apps.sh)")
    return python


class App:
    """`python args...` in a framework's venv (`args`: an app script beside this module and its
    arguments, or the framework's own runner), its output (stdout and stderr) in `log_path`."""

    def __init__(
        self,
        python: Path,
        args: Iterable[str],
        log_path: Path,
        cwd: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = [str(python), *args]
        self.log_path = log_path
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        # The project's PYTHONPATH (pytest's, ours) is no business of the framework's venv.
        self.env.pop("PYTHONPATH", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> App:
        self.cwd.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"--- start: {' '.join(self.argv)}\n".encode())
            log.flush()
            # Its own session, so a kill reaches whatever the framework started beside it.
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
            )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing flushed, committed or closed."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def keyed_records(keys: int, per_key: int) -> list[tuple[str, dict]]:
    """`per_key` records for each of `keys` keys, interleaved: (key, {"seq": n}), n from 1."""
    return [(f"k{k}", {"seq": seq}) for seq in range(1, per_key + 1) for k in range(keys)]


class PacedProducer(threading.Thread):
    """Produces `records` (JSON values) to `topic`: the first `first` at once, then, once
    `go` is set (the app has shown it is processing: a framework takes seconds to join its group),
    the rest at about `rate` per second, so a kill lands mid-stream. A topic that does not exist is
    auto-created by the producer's Metadata. Idempotent, so that a retried batch keeps its place
    (a freshly made topic's first produce on a cluster may be refused retriably while the next is
    taken): without it, in one CI run on three nodes, the app met two keys' seq 2 before their
    seq 1 and counted them 1 and 2."""

    def __init__(
        self, bootstrap: str, topic: str, records: list[tuple[str, dict]], rate: float, first: int = 100
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.records, self.rate, self.first = (
            bootstrap,
            topic,
            records,
            rate,
            first,
        )
        self.go = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = confluent_kafka.Producer(
                {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
            )
            start = time.monotonic()
            for i, (key, value) in enumerate(self.records):
                if i == self.first:
                    producer.flush(30)
                    self.go.wait(120)
                    start = time.monotonic() - i / self.rate
                producer.produce(self.topic, key=key.encode(), value=json.dumps(value).encode())
                producer.poll(0)
                self.sent = i + 1
                ahead = start + self.sent / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            if producer.flush(30) != 0:
                raise AssertionError(f"{self.topic}: records left unsent")
        except BaseException as exc:
            self.error = exc


def topic_names(bootstrap: str) -> list[str]:
    """The topics the broker lists (a Metadata for all: naming one could auto-create it)."""
    admin = confluent_admin.AdminClient({"bootstrap.servers": bootstrap})
    return sorted(admin.list_topics(timeout=10).topics)


def read_topic(
    bootstrap: str, topic: str, isolation: str = "read_uncommitted"
) -> list[tuple[str | None, bytes | None]]:
    """Every record of `topic` up to the end of each partition a consumer of `isolation` sees (the
    high watermark; the last stable offset for read_committed, which also leaves aborted records
    out), every partition (key, value); [] while it does not exist. Reads with assign(), so nothing
    is committed and no topic is created. A partition is done at the watermark it had when its read
    began, or at its end-of-partition event before that: commit and abort markers take offsets no
    record is delivered at."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tests-apps-reader",
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        meta = consumer.list_topics(timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        out: list[tuple[str | None, bytes | None]] = []
        for partition in sorted(meta.partitions):
            tp = confluent_kafka.TopicPartition(topic, partition)
            try:
                low, high = consumer.get_watermark_offsets(tp, timeout=10)
            except confluent_kafka.KafkaException as exc:
                # a topic the app just made: librdkafka's own metadata may not list the partition
                # yet although the listing above did; the caller's next poll reads it
                if exc.args[0].code() != confluent_kafka.KafkaError._UNKNOWN_PARTITION:
                    raise
                return []
            if high <= low:
                continue
            consumer.assign([confluent_kafka.TopicPartition(topic, partition, low)])
            at_end = False
            deadline = time.monotonic() + 30
            while not at_end and time.monotonic() < deadline:
                for msg in consumer.consume(1000, timeout=0.25):
                    error = msg.error()
                    if error is not None:
                        at_end = at_end or error.code() == confluent_kafka.KafkaError._PARTITION_EOF
                        continue
                    if msg.offset() >= high:
                        at_end = True  # written since the read began: not chased
                        continue
                    key = msg.key()
                    out.append((key.decode() if key is not None else None, msg.value()))
                    at_end = at_end or msg.offset() + 1 >= high
        return out
    finally:
        consumer.close()


def json_records(bootstrap: str, topic: str, isolation: str = "read_uncommitted") -> list[dict]:
    return [json.loads(value) for _, value in read_topic(bootstrap, topic, isolation) if value is not None]


def wait_until(what: Callable[[], object], timeout: float, explain: Callable[[], str]) -> object:
    """`what()`'s first truthy answer, polled each half second; else a failure with `explain()`
    (the app's and the broker's logs)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = what()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout} s (last answer {last!r}):\n{explain()}")
