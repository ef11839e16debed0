"""Faust (faust-streaming 0.15, on aiokafka) runs unchanged against `broker serve`: an agent
counting per key in a Table (faust_counter.py), SIGKILLed mid-stream and restarted, its table
restored from the changelog topic Faust created (the table lives in memory: nothing survives the
kill but the broker's topics). The input topic is auto-created by the test's producer, the output
by Faust's first send; the test creates none.

Faust's at-least-once commits the input offsets after the records they cover were sent, but its
changelog may run ahead of them at a kill: a record processed again after the restore counts once
more. So every output record's count is at least its sequence number (a count below it would be
the table lost) and every input record reaches the output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from apps_harness import (
    HERE,
    App,
    PacedProducer,
    app_python,
    json_records,
    keyed_records,
    topic_names,
    wait_until,
)

from labkit.brokerproc import BrokerProcess

KEYS = 5
PER_KEY = 600
RATE = 500.0


def test_faust_table_killed_and_restored_from_changelog(app_broker: BrokerProcess, tmp_path: Path) -> None:
    check_faust_table(app_broker.bootstrap, tmp_path, lambda: app_broker.log_tail(40))


def check_faust_table(bootstrap: str, tmp_path: Path, broker_log: Callable[[], str]) -> None:
    """The test on any broker or cluster at `bootstrap` (test_apps_cluster.py: three nodes);
    `broker_log()` explains a failure."""
    python = app_python("faust")
    env = {"BOOTSTRAP": bootstrap, "APP_ID": "counter", "INPUT": "events", "OUTPUT": "counts"}
    log = tmp_path / "app.log"
    expected = {(f"k{k}", seq) for k in range(KEYS) for seq in range(1, PER_KEY + 1)}

    def explain() -> str:
        return f"app log:\n{log.read_text(errors='replace')[-6000:]}\nbroker log:\n{broker_log()}"

    def worker(n: int) -> App:
        return App(
            python,
            [str(HERE / "faust_counter.py"), "worker", "-l", "info"],
            log,
            tmp_path / f"worker-{n}",
            env={**env, "DATADIR": str(tmp_path / f"worker-{n}" / "data")},
        )

    producer = PacedProducer(bootstrap, "events", keyed_records(KEYS, PER_KEY), RATE)
    producer.start()
    wait_until(lambda: "events" in topic_names(bootstrap), 30, explain)
    app = worker(1).start()
    try:
        wait_until(lambda: not app.running() or len(json_records(bootstrap, "counts")) >= 50, 90, explain)
        assert app.running(), explain()
        producer.go.set()
        wait_until(lambda: len(json_records(bootstrap, "counts")) >= 400, 60, explain)
        assert producer.is_alive(), "the input was all written before the kill: not mid-stream"
        app.kill()
        before = len(json_records(bootstrap, "counts"))

        app = worker(2).start()
        producer.join(60)
        assert producer.error is None, producer.error

        def complete() -> bool:
            return expected <= {(r["key"], r["seq"]) for r in json_records(bootstrap, "counts")}

        wait_until(complete, 90, explain)
    finally:
        app.stop()

    out = json_records(bootstrap, "counts")
    lost = [r for r in out if r["count"] < r["seq"]]
    assert not lost, f"table not restored from the changelog: {lost[:10]}\n{explain()}"
    assert before < len(expected), "the kill came after the app had done everything"
    changelogs = [t for t in topic_names(bootstrap) if t.endswith("-changelog")]
    assert changelogs == ["counter-counts-changelog"], topic_names(bootstrap)
