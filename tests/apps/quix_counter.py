"""A Quix Streams application, as a user would write it, run unchanged against `broker serve` by
test_quixstreams.py in Quix's own venv (scripts/setup_apps.sh).

It counts the records of each key in a state store (RocksDB, with its changelog topic) and writes
each record's count beside its sequence number: `{"key", "seq", "count"}`. Processing is
at-least-once, the input read from the earliest offset; every topic is Quix's to create. Its one
setting beyond the defaults is a short session, which a test that kills its app wants.

Usage: quix_counter.py BOOTSTRAP STATE_DIR INPUT OUTPUT GROUP
"""

import sys

from quixstreams import Application


def main() -> None:
    bootstrap, state_dir, input_name, output_name, group = sys.argv[1:6]
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        commit_interval=0.5,
        state_dir=state_dir,
        # A killed member's partitions wait out its session before the restarted app gets them:
        # Kafka's smallest (group.min.session.timeout.ms), not librdkafka's 45 s.
        consumer_extra_config={"session.timeout.ms": 6000},
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
