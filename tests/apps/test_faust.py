"""Faust (faust-streaming 0.15, on aiokafka) runs unchanged against `broker serve`: an agent
counting per key in a Table (faust_counter.py), SIGKILLed mid-stream and restarted, its table
restored from the changelog topic Faust created (the table lives in memory: nothing survives the
kill but the broker's topics). The input topic is auto-created by the test's producer, the output
by Faust's first send; the test creates none.

Faust's at-least-once commits the input offsets after the records they cover were sent, but its
changelog may run ahead of them at a kill: a record processed again after the restore counts once
more. So every output record's count is at least its sequence number (a count below it would be
the table lost) and every input record reaches the output. A restarted worker may pass over a few
input records for good, Faust's own recovery race (faust_passed_over): the test then kills and
restarts it again, and it reads them from the committed offset.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
import pytest
from apps_harness import (
    HERE,
    App,
    PacedProducer,
    app_python,
    json_records,
    keyed_records,
    read_topic,
    topic_names,
    wait_until,
)

from labkit.brokerproc import BrokerProcess

KEYS = 5
PER_KEY = 600
RATE = 500.0


def test_faust_table_killed_and_restored_from_changelog(app_broker: BrokerProcess, tmp_path: Path) -> None:
    check_faust_table(app_broker.bootstrap, tmp_path, lambda: app_broker.log_tail(40))


def test_faust_exactly_once_killed_mid_stream(eos_broker: BrokerProcess, tmp_path: Path) -> None:
    """The same agent with Faust's processing_guarantee="exactly_once": one transactional producer
    per assigned input partition, its id the app's, the group generation's and the partition's
    (`counter-0-0`), so the restarted worker's InitProducerId fences the killed one and aborts its
    open transaction, whose changelog writes and input offsets a read_committed reader then never
    sees. The broker's part is asserted: the fencing epoch bump, every input record in the output,
    and the changelog's aborted or unfinished writes left out read_committed.

    Exactly-once itself (no duplicate, every count exact) is Faust's to give, and faust-streaming
    0.15.3 does not give it on any broker: an agent's `topic.send` goes through
    `TransactionManager.send`, which names the transactional producer after the partition the
    record is sent TO, found in the consumer's metadata; the output topic is not consumed, so the
    lookup is None and the record goes through the plain producer, outside every transaction
    (faust-streaming/faust#177, open; #517, duplicates read_committed on Kafka clusters). Here the
    output's batches carry the plain producer's id with no transactional bit while the changelog's
    carry `counter-0-0`'s: what the killed worker sent is visible and is sent again after the
    restart. Counts are not always exact either, for reasons of Faust's own: its agent updates the
    table (a changelog write into the open transaction) before the record is acked, and a commit
    sends only acked offsets, so a transaction can hold record N's changelog write with offset N
    (seen: the committed changelog had k1=109, the committed offset was k1/109's, which the
    restart counted again); a restarted worker was also seen to skip a few records right after its
    recovery, whose fetch runs before its seek to the committed offset. In aiokafka's debug log the
    broker's OffsetFetch answered the last committed transaction's offset. And a restarted worker
    may restore nothing: in a transaction Faust takes the changelog's highwater from aiokafka's
    `last_stable_offset`, None until a Fetch of the newly assigned partition has answered, and it
    asks about 20 ms after the assignment; None reads as -1, an empty changelog (seen on three
    nodes: counts from 1 again at seq 102, the changelog holding commit markers up to offset 509).
    So those checks xfail with what they found; they pass the day Faust keeps its sends and commits
    in step."""
    bootstrap = eos_broker.bootstrap
    out = check_faust_table(bootstrap, tmp_path, lambda: eos_broker.log_tail(40), exactly_once=True)
    check_faust_exactly_once(bootstrap, out, eos_broker.log(), lambda: eos_broker.log_tail(60))


def check_faust_exactly_once(
    bootstrap: str, out: list[dict], coordinator_log: str, explain: Callable[[], str]
) -> None:
    """What the broker owes Faust's exactly_once, asserted on `out` (check_faust_table's output,
    read read_committed) and `coordinator_log` (the log of the broker or of every node, where the
    coordinator of `counter-0-0` logged its InitProducerIds); then the records twice or counted
    wrong, Faust's own (output sent outside its transactions: the module docstring), xfail."""
    # The restart's InitProducerId took the id at a higher epoch, fencing the killed worker (and
    # aborting its open transaction: nearly always one, as input flows between commits).
    inits = re.findall(r"transactional id counter-0-0: producer id \d+ epoch (\d+)", coordinator_log)
    epochs = [int(e) for e in inits]
    assert len(epochs) >= 2 and epochs == sorted(set(epochs)), explain()
    # The killed worker's open transaction, when the kill landed inside one (nearly always, not
    # always: a kill between two commits leaves none), was aborted: its changelog writes are not
    # read read_committed. An aborted one need not have written to the changelog yet (seen in CI
    # on three nodes: the changelog's abort marker at offset 579 right after the commit marker at
    # 578, the kill after the transaction added the partition, before its first record), nor need
    # every write left out be aborted (one still open when read), so the counts only bound each
    # other here; aborted records left out read_committed, exactly, are
    # tests/kafka/test_kafka_transactions.py's.
    changelog = "counter-counts-changelog"
    committed, written = (
        len(read_topic(bootstrap, changelog, "read_committed")),
        len(read_topic(bootstrap, changelog)),
    )
    assert committed <= written, explain()
    # Nothing of the output was aborted: it was never in a transaction.
    assert len(read_topic(bootstrap, "counts")) == len(out)
    twice = sorted(k for k, n in collections.Counter((r["key"], r["seq"]) for r in out).items() if n > 1)
    wrong = [r for r in out if r["count"] != r["seq"]]
    if twice or wrong:
        pytest.xfail(
            "Faust's exactly_once (faust-streaming#177, test_faust_exactly_once_killed_mid_stream): "
            f"{len(twice)} records twice read_committed (first {twice[:3]}), "
            f"{len(wrong)} counts not exact (first {wrong[:3]})"
        )


def check_faust_table(
    bootstrap: str, tmp_path: Path, broker_log: Callable[[], str], exactly_once: bool = False
) -> list[dict]:
    """The test on any broker or cluster at `bootstrap` (test_apps_cluster.py: three nodes);
    `broker_log()` explains a failure; the output is returned. `exactly_once`: the worker runs with
    that guarantee and the output is read read_committed (its checks are the caller's)."""
    python = app_python("faust")
    guarantee = "exactly_once" if exactly_once else "at_least_once"
    isolation = "read_committed" if exactly_once else "read_uncommitted"
    env = {"BOOTSTRAP": bootstrap, "APP_ID": "counter", "INPUT": "events", "OUTPUT": "counts"}
    env["GUARANTEE"] = guarantee
    log = tmp_path / "app.log"
    expected = {(f"k{k}", seq) for k in range(KEYS) for seq in range(1, PER_KEY + 1)}

    seen: dict[str, object] = {}  # what the last look at the output found, for a failure's message

    def committed_offset() -> object:
        consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": env["APP_ID"], "enable.auto.commit": False}
        )
        try:
            [tp] = consumer.committed([confluent_kafka.TopicPartition(env["INPUT"], 0)], timeout=10)
            return tp.offset
        except Exception as exc:
            return exc
        finally:
            consumer.close()

    def explain() -> str:
        return (
            f"output: {seen or 'not read yet'}; the group's committed input offset: {committed_offset()}\n"
            f"app log:\n{log.read_text(errors='replace')[-6000:]}\nbroker log:\n{broker_log()}"
        )

    def worker(n: int) -> App:
        return App(
            python,
            # Faust's worker command starts its web server whatever `web_enabled` says (its
            # --with-web default overrides it), on port 6066: two apps at once (the other
            # pytest worker's test, another run on the machine) then fail to bind.
            [str(HERE / "faust_counter.py"), "worker", "--without-web", "-l", "info"],
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

        last = end_offset(bootstrap, env["INPUT"]) - 1  # every input is written
        ends = 0  # outputs of the last input when the worker last restarted

        def progress() -> str | tuple[range, int] | None:
            out = json_records(bootstrap, "counts", isolation)
            reached = sum(1 for r in out if r["offset"] == last)
            missing = sorted(set(range(last + 1)) - {r["offset"] for r in out})
            seen.update(
                records=len(out),
                last_input=last,
                highest_input_done=max((r["offset"] for r in out), default=-1),
                outputs_of_last=reached,
                at_restart=ends,
                inputs_not_done=f"{len(missing)}, first {missing[:8]}",
            )
            if reached <= ends:
                return None  # this worker is not at the end yet
            if expected <= {(r["key"], r["seq"]) for r in out}:
                return "complete"
            hole = faust_passed_over(bootstrap, out, env["APP_ID"], env["INPUT"], last)
            return (hole, reached) if hole else None

        restarts = 0
        while (done := wait_until(progress, 90, explain)) != "complete":
            # Faust's own race, not the broker's (faust_passed_over): what a user does about it
            # is restart the worker, which reads on from the committed offset before the hole
            # (and is done once it has reached the end again, its counts past the hole redone).
            # Killed, not stopped: a stop lets Faust commit on its way out, and once (a CI run
            # of 2026-12-03) the group's offset was past the hole when the next worker started,
            # which then had nothing to read again; a kill leaves it where the check found it.
            hole, ends = done  # type: ignore[misc]
            assert restarts < 2, f"input offsets {hole} passed over after {restarts} restarts"
            app.kill()
            restarts += 1
            app = worker(2 + restarts).start()
    finally:
        app.stop()

    out = json_records(bootstrap, "counts", isolation)
    assert before < len(expected), "the kill came after the app had done everything"
    changelogs = [t for t in topic_names(bootstrap) if t.endswith("-changelog")]
    assert changelogs == ["counter-counts-changelog"], topic_names(bootstrap)
    if not exactly_once:
        # Each record's count, or after a restart over a hole the best of its counts: the first
        # pass counted the records after the hole one short, the pass after the restart (its
        # table restored with those counts) counts them again, past their sequence numbers.
        best: dict[tuple[str, int], int] = {}
        for r in out:
            best[r["key"], r["seq"]] = max(r["count"], best.get((r["key"], r["seq"]), 0))
        lost = [r for r in out if (best[r["key"], r["seq"]] if restarts else r["count"]) < r["seq"]]
        assert not lost, f"table not restored from the changelog: {lost[:10]}\n{explain()}"
    return out


def end_offset(bootstrap: str, topic: str) -> int:
    """The high watermark of `topic`'s partition 0."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "tests-apps-reader"})
    try:
        return consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def faust_passed_over(bootstrap: str, out: list[dict], group: str, topic: str, last: int) -> range | None:
    """The input offsets up to `last` that a worker which has reached `last` passed over for
    good: a contiguous run at or after the group's committed offset, where Faust's commits then
    stay (they cover only a contiguous run of acknowledged offsets). Between the two may be
    outputs that the worker killed before this one wrote (a CI run of 2026-12-03 saw the group's
    offset at 645, the outputs up to 782 written, and 57 inputs from 783 missing, for 90 s). None
    when the output shows no such run, or the committed offset is past it.

    Faust's recovery race (faust-streaming#596, open): its fetcher hands the stream what aiokafka
    fetched before Faust's seek to the committed offset; with the flow suspended by the recovery
    those records are dropped unprocessed, but Faust's read offset moves past them, so after the
    seek the same records, fetched again, are dropped as already read
    (`Consumer._drain_messages`). Seen under load: input offsets 497-500 never processed, the
    committed offset at 497 while the worker went on to the end. The broker's part is checked:
    the run is at or after the committed offset, and a restarted worker must read it from there."""
    missing = sorted(set(range(last + 1)) - {r["offset"] for r in out})
    if not missing or missing[-1] - missing[0] + 1 != len(missing):
        return None
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    try:
        [committed] = consumer.committed([confluent_kafka.TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    return range(missing[0], missing[-1] + 1) if 0 <= committed.offset <= missing[0] else None
