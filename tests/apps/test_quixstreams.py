"""Quix Streams (quixstreams 3.28, on confluent-kafka) runs unchanged against `broker serve`: a
stateful counting app (quix_counter.py), at-least-once, SIGKILLed mid-stream and restarted with an
empty state dir, so its counts come back from the changelog topic alone.

Quix creates its topics itself (Admin CreateTopics after DescribeConfigs of what exists: the
changelog compacted); the test creates none. Quix commits the input offsets and flushes the
changelog at one checkpoint, and on recovery replays the changelog only up to what was committed,
so even with at-least-once every output record's count equals its sequence number: a count below
it would be state lost, above it state counted twice.
"""

from __future__ import annotations

import collections
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
from confluent_kafka.admin import AdminClient, ConfigResource

from labkit.brokerproc import BrokerProcess

KEYS = 5
PER_KEY = 600  # 3000 records, produced over ~6 s
RATE = 500.0


def test_quix_counter_killed_and_restored_from_changelog(app_broker: BrokerProcess, tmp_path: Path) -> None:
    check_quix_counter(app_broker.bootstrap, tmp_path, lambda: app_broker.log_tail(40))


def test_quix_exactly_once_killed_mid_stream(eos_broker: BrokerProcess, tmp_path: Path) -> None:
    """The same app with Quix's processing_guarantee="exactly-once": its producer is transactional
    (one transactional id per app, InitProducerId fencing the killed one's), each checkpoint one
    transaction carrying the output, the changelog and the input offsets
    (send_offsets_to_transaction). A read_committed reader then finds every input record in the
    output exactly once: what the killed app's open transaction wrote is aborted, so the restarted
    app's reprocessing of it is not a duplicate. Quix names a new transactional id each run (it
    fences the killed app through its consumer group's generation, KIP-447), so the killed app's
    transaction ends at its timeout, as on Kafka: that wait is most of this test's time."""
    check_quix_counter(eos_broker.bootstrap, tmp_path, lambda: eos_broker.log_tail(40), exactly_once=True)


def check_quix_counter(
    bootstrap: str, tmp_path: Path, broker_log: Callable[[], str], exactly_once: bool = False
) -> None:
    """The test on any broker or cluster at `bootstrap` (test_apps_cluster.py: three nodes);
    `broker_log()` explains a failure. `exactly_once`: the app runs with that guarantee and its
    output, read read_committed, must hold each input record once, neither more nor less."""
    python = app_python("quixstreams")
    guarantee = "exactly-once" if exactly_once else "at-least-once"
    isolation = "read_committed" if exactly_once else "read_uncommitted"
    args = lambda state: [  # noqa: E731
        *(str(HERE / "quix_counter.py"), bootstrap, str(state)),
        *("events", "counts", "counter", guarantee),
    ]
    log = tmp_path / "app.log"
    expected = {(f"k{k}", seq) for k in range(KEYS) for seq in range(1, PER_KEY + 1)}

    def explain() -> str:
        return f"app log:\n{log.read_text(errors='replace')[-6000:]}\nbroker log:\n{broker_log()}"

    app = App(python, args(tmp_path / "state-1"), log, tmp_path).start()
    try:
        # Quix made the input topic on start: once it exists, records flow while the app runs.
        wait_until(lambda: not app.running() or "events" in topic_names(bootstrap), 60, explain)
        assert app.running(), explain()
        producer = PacedProducer(bootstrap, "events", keyed_records(KEYS, PER_KEY), RATE)
        producer.start()
        wait_until(lambda: len(json_records(bootstrap, "counts")) >= 50, 60, explain)
        producer.go.set()
        wait_until(lambda: len(json_records(bootstrap, "counts")) >= 400, 60, explain)
        assert producer.is_alive(), "the input was all written before the kill: not mid-stream"
        app.kill()
        before = len(json_records(bootstrap, "counts"))

        app = App(python, args(tmp_path / "state-2"), log, tmp_path).start()
        producer.join(60)
        assert producer.error is None, producer.error

        def complete() -> bool:
            return expected <= {(r["key"], r["seq"]) for r in json_records(bootstrap, "counts", isolation)}

        wait_until(complete, 90, explain)
    finally:
        app.stop()

    out = json_records(bootstrap, "counts", isolation)
    if exactly_once:
        twice = [k for k, n in collections.Counter((r["key"], r["seq"]) for r in out).items() if n > 1]
        assert not twice, f"duplicates read_committed: {twice[:10]}\n{explain()}"
        assert len(out) == len(expected)
    wrong = [r for r in out if r["count"] != r["seq"]]
    assert not wrong, f"counts not restored from the changelog: {wrong[:10]}\n{explain()}"
    assert before < len(expected), "the kill came after the app had done everything"
    seen = collections.Counter(r["key"] for r in out)
    assert set(seen) == {f"k{k}" for k in range(KEYS)}
    # The state store's changelog is the one Quix made, compacted, with no state-1 files to help.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    changelogs = [t for t in topic_names(bootstrap) if t.startswith("changelog__")]
    assert changelogs, f"no changelog topic: {topic_names(bootstrap)}"
    resource = ConfigResource("topic", changelogs[0])
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["cleanup.policy"].value == "compact"
