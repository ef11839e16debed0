"""A Quix Streams application, as a user would write it, run unchanged against `broker serve` by
test_quixstreams.py in Quix's own venv (scripts/setup_apps.sh).

It counts the records of each key in a state store (RocksDB, with its changelog topic) and writes
each record's count beside its sequence number: `{"key", "seq", "count"}`. The input is read
from the earliest offset; every topic is Quix's to create. Its one setting beyond the defaults is a
short session and
transaction timeout, which a test that kills its app wants. The processing guarantee is Quix's own
setting, given on the command line: at-least-once unless told exactly-once.

Usage: quix_counter.py BOOTSTRAP STATE_DIR INPUT OUTPUT GROUP [at-least-once|exactly-once]
"""

import sys

from quixstreams import Application


def main() -> None:
    bootstrap, state_dir, input_name, output_name, group = sys.argv[1:6]
    guarantee = sys.argv[6] if len(sys.argv) > 6 else "at-least-once"
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee=guarantee,
        commit_interval=0.5,
        state_dir=state_dir,
        # A killed member's partitions wait out its session before the restarted app gets them:
        # Kafka's smallest (group.min.session.timeout.ms), not librdkafka's 45 s.
        consumer_extra_config={"session.timeout.ms": 6000},
        # Exactly-once names a new transactional id each run, so nothing fences a killed app's open
        # transaction: it holds the last stable offset of what it wrote until it times out. 10 s,
        # not librdkafka's 60 s (unused at-least-once).
        producer_extra_config={"transaction.timeout.ms": 10000},
    )
    source = app.topic(input_name, key_deserializer="str", value_deserializer="json")
    sink = app.topic(output_name, key_serializer="str", value_serializer="json")

    def count(value: dict, key: str, _timestamp: int, _headers: object, state) -> dict:
        n = state.get("count", 0) + 1
        state.set("count", n)
        return {"key": key, "seq": value["seq"], "count": n}

    sdf = app.dataframe(source)
    sdf = sdf.apply(count, stateful=True, metadata=True)
    sdf.to_topic(sink)
    app.run()


if __name__ == "__main__":
    main()
