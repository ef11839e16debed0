"""Bytewax (0.21, bytewax.connectors.kafka) runs unchanged against `broker serve`: a dataflow from a
Kafka source to a Kafka sink (bytewax_copy.py) copies every record of its input, in order, to an
output topic it never created: the broker auto-creates it on the sink's first produce, as Kafka's
auto.create.topics.enable does (without it Bytewax writes nothing and says nothing).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from apps_harness import HERE, App, PacedProducer, app_python, keyed_records, read_topic, wait_until

from labkit.brokerproc import BrokerProcess

RECORDS = keyed_records(5, 1000)


def test_bytewax_kafka_source_to_sink(app_broker: BrokerProcess, tmp_path: Path) -> None:
    check_bytewax_copy(app_broker.bootstrap, tmp_path, lambda: app_broker.log_tail(40))


def check_bytewax_copy(bootstrap: str, tmp_path: Path, broker_log: Callable[[], str]) -> None:
    """The test on any broker or cluster at `bootstrap` (test_apps_cluster.py: three nodes);
    `broker_log()` explains a failure."""
    python = app_python("bytewax")
    log = tmp_path / "app.log"

    def explain() -> str:
        return f"app log:\n{log.read_text(errors='replace')[-6000:]}\nbroker log:\n{broker_log()}"

    producer = PacedProducer(bootstrap, "events", RECORDS, rate=1e9, first=len(RECORDS))
    producer.run()  # here, to the end: the flow reads up to the end it finds
    assert producer.error is None, producer.error

    call = f"{HERE / 'bytewax_copy.py'}:flow({bootstrap!r}, 'events', 'copied')"
    app = App(python, ["-m", "bytewax.run", call], log, tmp_path).start()
    try:
        assert app.proc is not None
        assert app.proc.wait(60) == 0, explain()
    finally:
        app.stop()

    copied = wait_until(
        lambda: len(out := read_topic(bootstrap, "copied")) >= len(RECORDS) and out, 30, explain
    )
    assert copied == [(key, json.dumps(value).upper().encode()) for key, value in RECORDS], explain()
