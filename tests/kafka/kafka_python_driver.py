"""kafka-python's side of the client matrix (tests/kafka/test_client_matrix.py), for 2.x and 3.x.

The two majors cannot share a venv, so the same functions serve both: kafka-python 3 calls them in
the test process; kafka-python 2 runs this file as a script, installed apart
(`pip install --target .venv/compat/kafka-python-2`, see scripts/setup.sh) and put first on
PYTHONPATH by the test. As a script it reads one pickled call `(function name, kwargs)` on stdin and
writes the pickled result (or the exception's text) on stdout.

Only kafka-python is imported here (and the standard library): the script must not pull the
project's modules, which would need the project's venv.

`stream` (the broker-kill case of tests/kafka/test_kafka_idempotence.py) is the exception: run as
`driver.py stream BOOTSTRAP TOPIC`, it produces until its stdin closes and prints each acknowledged
value on its own line as the acknowledgement arrives, so the test can kill the broker mid-stream.

Records cross as plain tuples, so both sides compare them without this module's types:
produce takes `(partition, key, value, headers, timestamp_ms)` groups; reads answer
`(partition, offset, timestamp_ms, key, value, headers)`, headers a tuple of (str, bytes | None).
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import kafka
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.codec import has_gzip, has_lz4, has_snappy, has_zstd

BIG = 2 << 20  # request and fetch sizes that let 1 MiB records through (the broker's limit is raised too)


def version() -> str:
    return kafka.__version__


def codecs() -> list[str]:
    """The compression codecs this kafka-python can write and read here (its libraries installed)."""
    have = {"gzip": has_gzip(), "snappy": has_snappy(), "lz4": has_lz4(), "zstd": has_zstd()}
    return [name for name, ok in have.items() if ok]


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, groups: list[tuple[str, list[tuple]]]) -> None:
    """Each group `(codec, records)` through its own producer, flushed before the next: one codec
    per batch. Idempotent (3.x's default; 2.x is asked for it), so acks=all."""
    for codec, records in groups:
        producer = kafka.KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            compression_type=None if codec == "none" else codec,
            max_request_size=BIG,
            linger_ms=50,
            request_timeout_ms=10_000,
        )
        try:
            futures = [
                producer.send(
                    topic, key=key, value=value, headers=list(headers), partition=partition, timestamp_ms=ts
                )
                for partition, key, value, headers, ts in records
            ]
            producer.flush(30)
            for f in futures:
                f.get(10)  # raises the broker's error, if any
        finally:
            producer.close(10)


def read(
    bootstrap: str, keys: list[tuple[str, int]], counts: dict[tuple[str, int], int], lookups: dict
) -> dict:
    """The partitions `keys` ((topic, partition)) from earliest, `counts[key]` records each, with
    assign() (no group: groups come with the coordinator). Then, for each
    `lookups[(topic, partition)] = k`, offsets_for_times at the timestamp of record k as read, and
    the records from the offset found to the end. Also beginning and end offsets.
    Groups (subscribe, commit, resume) are tests/kafka/group_member.py's, for both majors."""
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=BIG,
        fetch_max_wait_ms=100,
        request_timeout_ms=15_000,
    )
    try:
        tps = [kafka.TopicPartition(t, p) for t, p in keys]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        earliest = _drain(
            consumer, {(tp.topic, tp.partition): counts[(tp.topic, tp.partition)] for tp in tps}
        )
        bounds = {
            (tp.topic, tp.partition): (consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp])
            for tp in tps
        }
        by_time = {}
        for (t, p), k in lookups.items():
            tp = kafka.TopicPartition(t, p)
            ts = earliest[(t, p)][k][2]
            found = consumer.offsets_for_times({tp: ts})[tp]
            beyond = consumer.offsets_for_times({tp: _last_ts(earliest[(t, p)]) + 1})[tp]  # None: none is
            got = []
            if found is not None:
                consumer.assign([tp])
                consumer.seek(tp, found.offset)
                got = _drain(consumer, {(t, p): counts[(t, p)] - found.offset})[(t, p)]
            by_time[(t, p)] = (
                ts,
                -1 if found is None else found.offset,
                -1 if beyond is None else beyond.offset,
                got,
            )
        return {"earliest": earliest, "bounds": bounds, "by_time": by_time}
    finally:
        consumer.close()


def _last_ts(records: list[tuple]) -> int:
    return max(r[2] for r in records)


def _drain(consumer: Any, want: dict[tuple[str, int], int]) -> dict[tuple[str, int], list[tuple]]:
    out: dict[tuple[str, int], list[tuple]] = {key: [] for key in want}
    deadline = time.monotonic() + 30
    while any(len(out[k]) < n for k, n in want.items()) and time.monotonic() < deadline:
        for tp, msgs in consumer.poll(timeout_ms=200).items():
            out[(tp.topic, tp.partition)].extend(
                (tp.partition, m.offset, m.timestamp, m.key, m.value, tuple((h[0], h[1]) for h in m.headers))
                for m in msgs
            )
    return out


def stream(bootstrap: str, topic: str, stop: threading.Event, emit: Callable[[str, str], None]) -> int:
    """Numbered values (`%07d`, keys cycling over 7) to `topic`, idempotent and acks=all, until
    `stop` is set, then flushed; `emit("ack", value)` for each acknowledged record, `emit("fail",
    error)` for each failed one, from the producer's I/O thread. Retries without end through a
    broker restart: short backoffs and metadata age, requests timing out after 5 s. The number sent."""
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=2,
        retry_backoff_ms=50,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=200,
        metadata_max_age_ms=1000,
        request_timeout_ms=5000,
        delivery_timeout_ms=60_000,
    )
    i = 0
    try:
        while not stop.is_set():
            value = f"{i:07d}".encode()
            future = producer.send(topic, key=f"k{i % 7}".encode(), value=value)
            future.add_callback(lambda _md, v=value: emit("ack", v.decode()))
            future.add_errback(lambda e: emit("fail", f"{type(e).__name__}: {e}"))
            i += 1
            if i % 20 == 0:
                time.sleep(0.002)
        producer.flush(60)
    finally:
        producer.close(10)
    return i


def _stream_main(bootstrap: str, topic: str) -> None:
    lock = threading.Lock()

    def emit(kind: str, text: str) -> None:
        with lock:
            sys.stdout.write(f"{kind} {text}\n")
            sys.stdout.flush()

    stop = threading.Event()

    def watch() -> None:
        sys.stdin.buffer.read()  # EOF: the test is done killing
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    emit("sent", str(stream(bootstrap, topic, stop, emit)))


def main() -> None:
    if sys.argv[1:2] == ["stream"]:
        _stream_main(*sys.argv[2:4])
        return
    name, kwargs = pickle.load(sys.stdin.buffer)
    try:
        result: Any = ("ok", globals()[name](**kwargs))
    except Exception as e:  # the caller raises it with the script's stderr
        result = ("error", f"{type(e).__name__}: {e}")
    pickle.dump(result, sys.stdout.buffer)


if __name__ == "__main__":
    main()
