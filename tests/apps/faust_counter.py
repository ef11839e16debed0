"""A Faust application (faust-streaming 0.15, on aiokafka), as a user would write it, run unchanged
against `broker serve` by test_faust.py in Faust's own venv (scripts/setup_apps.sh).

An agent counts the records of each key in a Table (in memory, so a restarted worker has only its
changelog topic to restore it from) and sends each record's count beside its sequence number and
its input offset to the output topic: `{"key", "seq", "count", "offset"}`. Faust creates its
changelog topic; the output topic is auto-created when it is first sent to.

Run as Faust's worker: `faust_counter.py worker`, the broker and names from the environment
(Faust's command line owns argv): BOOTSTRAP, APP_ID, INPUT, OUTPUT, DATADIR, and GUARANTEE, Faust's
own processing_guarantee (at_least_once unless it says exactly_once).
"""

import os

import faust

app = faust.App(
    os.environ["APP_ID"],
    broker=f"kafka://{os.environ['BOOTSTRAP']}",
    store="memory://",
    datadir=os.environ["DATADIR"],
    web_enabled=False,  # the worker command needs --without-web too (test_faust.py)
    topic_partitions=1,
    consumer_auto_offset_reset="earliest",
    processing_guarantee=os.environ.get("GUARANTEE", "at_least_once"),
    broker_commit_interval=0.5,
    # A killed worker's partitions wait out its session before the restarted one gets them:
    # Kafka's smallest (group.min.session.timeout.ms), not Faust's 60 s.
    broker_session_timeout=6.0,
    broker_heartbeat_interval=1.0,
)
events = app.topic(os.environ["INPUT"], key_serializer="raw", value_serializer="json")
counted = app.topic(os.environ["OUTPUT"], key_serializer="raw", value_serializer="json")
counts = app.Table("counts", default=int, partitions=1)


@app.agent(events)
async def count(stream):
    async for event in stream.events():
        name = event.key.decode()
        counts[name] += 1
        offset = event.message.offset
        value = {"key": name, "seq": event.value["seq"], "count": counts[name], "offset": offset}
        await counted.send(key=event.key, value=value)


if __name__ == "__main__":
    app.main()
