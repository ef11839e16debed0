"""One consumer-group member of kafka-python (2.x or 3.x, whichever PYTHONPATH gives) or aiokafka,
run as a script by tests/kafka/test_kafka_groups.py: one process per member, because kafka-python
consumers polled in turn from one thread keep rebalancing, and kafka-python 2 cannot share the
project's venv (the test puts .venv/compat/kafka-python-2 first on PYTHONPATH).

    python group_member.py kafka-python|aiokafka BOOTSTRAP GROUP TOPIC EVERY

It subscribes, commits what it has read every EVERY records and when partitions are revoked (not
kafka-python 3: see Listener), and
writes one JSON line per event on stdout, each stamped with time.time() so the test can order the
events of several members: ["assign", t, [partitions]], ["revoke", t, [partitions]],
["read", t, partition, offset, value], ["commit", t, {partition: offset}, t sent] (a commit
may be stored any time between it was sent and it returned). A line "stop" on stdin
commits what was read and closes; "crash" closes without that last commit (and EOF is "crash").

Only the client and the standard library are imported: the script must run without the project.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

SESSION = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 300}


def emit(kind: str, *args: object) -> None:
    sys.stdout.write(json.dumps([kind, time.time(), *args]) + "\n")
    sys.stdout.flush()


class Control:
    """The test's order, read from stdin in a thread: None until "stop" or "crash"."""

    def __init__(self) -> None:
        self.order: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        line = sys.stdin.readline().strip()
        self.order = line if line in ("stop", "crash") else "crash"


def kafka_python(bootstrap: str, group: str, topic: str, every: int) -> None:
    import kafka
    from kafka.structs import OffsetAndMetadata, TopicPartition

    pending: dict[int, int] = {}

    def commit() -> None:
        if not pending:
            return
        sending = dict(pending)
        offsets = {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in sending.items()}
        sent = time.time()
        try:
            consumer.commit(offsets)
        except kafka.errors.CommitFailedError:
            pass  # refused by a rebalance under way: not committed, read again by the next owner
        else:
            emit("commit", sending, sent)
        pending.clear()

    class Listener(kafka.ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: list) -> None:
            if kafka.__version__.startswith("2."):
                commit()
            # kafka-python 3 (3.0.12) runs a sync listener on its network loop, where commit()
            # waits on that same loop and never returns: there, only the loop's commits count
            pending.clear()  # what was not committed is no longer ours to commit
            emit("revoke", sorted(tp.partition for tp in revoked))

        def on_partitions_assigned(self, assigned: list) -> None:
            emit("assign", sorted(tp.partition for tp in assigned))

    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
        **SESSION,
    )
    consumer.subscribe([topic], listener=Listener())
    control = Control()
    n = 0
    while control.order is None:
        for records in consumer.poll(timeout_ms=100).values():
            for r in records:
                emit("read", r.partition, r.offset, r.value.decode())
                pending[r.partition] = r.offset + 1
                n += 1
                if n % every == 0:
                    commit()
    if control.order == "stop":
        commit()
    consumer.close(autocommit=False)


def aio(bootstrap: str, group: str, topic: str, every: int) -> None:
    import aiokafka
    from aiokafka.errors import CommitFailedError
    from aiokafka.structs import TopicPartition

    pending: dict[int, int] = {}

    async def run() -> None:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
            **SESSION,
        )

        async def commit() -> None:
            if not pending:
                return
            # What was sent, not `pending` once answered: the listener's commit (on revoke) runs
            # beside the reading loop, which may read on meanwhile, so the ledger could record
            # a commit of 32 that had sent 31 (the likely cause of a CI run's failed check of a
            # next owner's start at 31, with commits of 31 and 32 both in flight)
            sending = dict(pending)
            offsets = {TopicPartition(topic, p): o for p, o in sending.items()}
            sent = time.time()
            try:
                await consumer.commit(offsets)
            except CommitFailedError:
                pass  # as kafka_python's
            else:
                emit("commit", sending, sent)
            pending.clear()

        class Listener(aiokafka.ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: list) -> None:
                await commit()
                pending.clear()
                emit("revoke", sorted(tp.partition for tp in revoked))

            async def on_partitions_assigned(self, assigned: list) -> None:
                emit("assign", sorted(tp.partition for tp in assigned))

        consumer.subscribe([topic], listener=Listener())
        await consumer.start()
        control = Control()
        n = 0
        try:
            while control.order is None:
                batches = await consumer.getmany(timeout_ms=100)
                for records in batches.values():
                    for r in records:
                        emit("read", r.partition, r.offset, r.value.decode())
                        pending[r.partition] = r.offset + 1
                        n += 1
                        if n % every == 0:
                            await commit()
            if control.order == "stop":
                await commit()
        finally:
            await consumer.stop()

    asyncio.run(run())


def main() -> None:
    import logging
    import os

    if os.environ.get("GROUP_MEMBER_DEBUG"):  # the client's group logs on stderr
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
        for quiet in (
            "kafka.conn",
            "kafka.protocol",
            "kafka.consumer.fetcher",
            "kafka.client",
            "kafka.metrics",
        ):
            logging.getLogger(quiet).setLevel(logging.WARNING)
    client, bootstrap, group, topic, every = sys.argv[1:6]
    {"kafka-python": kafka_python, "aiokafka": aio}[client](bootstrap, group, topic, int(every))
    emit("closed")


if __name__ == "__main__":
    main()
