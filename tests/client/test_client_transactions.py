"""Our client's transactions (KIP-98 in our protocol, docs/PROTOCOL.md §4.17) against a real
`broker serve`: a transactional producer's commits and aborts interleaved over several
partitions, a read_committed consumer that sees exactly the committed records once and in order
per partition (and agrees with confluent-kafka's read_committed consumer on the same data, and
reads a confluent-kafka transactional producer's output right), zombie fencing, and
consume-transform-produce with send_offsets_to_transaction. Both backends; two cores once
(markers across cores). The state machine and the aborted-batch filter are tested without a
broker at the end.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from broker.client import (
    Admin,
    AsyncConsumer,
    AsyncProducer,
    ConsumerGroupMetadata,
    Producer,
    TransactionError,
)
from broker.client.errors import IllegalGenerationError, ProducerFencedError
from broker.client.fetcher import _aborted_filter
from broker.client.transactions import TransactionState, TxnState
from labkit.brokerproc import BrokerProcess
from ringlog_proto import messages as m
from ringlog_proto.batch_control import control_batch
from ringlog_proto.batch_encode import as_transactional, encode_batch
from ringlog_proto.batch_header import read_header
from ringlog_proto.frames import FLAG_RESPONSE, Frame

T = TypeVar("T")
TIMEOUT_S = 30

CONFIGS = [
    pytest.param({"cores": 1, "backend": "uvloop"}, id="uvloop-1core"),
    pytest.param({"cores": 2, "backend": "io_uring"}, id="io_uring-2cores"),
]


@pytest.fixture(scope="module", params=CONFIGS)
def txn_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker per configuration for the whole module (each test uses topics of its own)."""
    options = request.param
    tmp = tmp_path_factory.mktemp("txn")
    proc = BrokerProcess(
        tmp / "data",
        tmp / "broker.log",
        cores=options["cores"],
        backend=options["backend"],
        extra=("--group-initial-rebalance-delay-ms", "100"),
    ).start()
    yield proc
    if proc.running():
        assert proc.stop() == 0, f"broker did not exit cleanly on SIGTERM:\n{proc.log()}"


def arun(coro_fn: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro_fn(), timeout)

    return asyncio.run(main())


def create(broker: BrokerProcess, name: str, partitions: int) -> None:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name, partitions)


async def read_partitions(
    broker: BrokerProcess, topic: str, partitions: int, isolation: str, expect: int
) -> dict[int, list[bytes]]:
    """Every record of `topic` from the start, per partition in offset order, with our consumer."""
    c = AsyncConsumer(broker.bootstrap, auto_offset_reset="earliest", isolation_level=isolation)
    await c.start()
    try:
        await c.assign([(topic, p) for p in range(partitions)])
        got: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        n = 0
        deadline = time.monotonic() + TIMEOUT_S
        quiet = 0
        while time.monotonic() < deadline and (n < expect or quiet < 2):
            records = await c.poll(timeout_ms=300)
            quiet = 0 if records else quiet + 1
            for r in records:
                got[r.partition].append(r.value)
                n += 1
        return got
    finally:
        await c.close()


def confluent_read(broker: BrokerProcess, topic: str, expect: int) -> dict[int, list[bytes]]:
    ck = pytest.importorskip("confluent_kafka")
    c = ck.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.subscribe([topic])
    got: dict[int, list[bytes]] = {}
    n, idle = 0, 0
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline and (n < expect or idle < 3):
            msg = c.poll(0.3)
            if msg is None:
                idle += 1
                continue
            if msg.error():
                continue
            idle = 0
            got.setdefault(msg.partition(), []).append(msg.value())
            n += 1
    finally:
        c.close()
    return got


# ----------------------------------------------------------------------------------- end to end


def test_commits_and_aborts_interleaved_read_committed(txn_broker: BrokerProcess) -> None:
    """12 transactions over 4 partitions, every third aborted (its records sent first, so they
    are in the log): read_committed sees each committed record once, in order per partition,
    nothing aborted; read_uncommitted sees everything; confluent-kafka's read_committed
    consumer sees the same as ours."""
    topic = "tx-ours"
    create(txn_broker, topic, 4)
    committed: dict[int, list[bytes]] = {p: [] for p in range(4)}
    everything = 0

    async def produce() -> None:
        nonlocal everything
        async with AsyncProducer(txn_broker.bootstrap, transactional_id="tx-ours", linger_ms=1) as p:
            await p.init_transactions()
            for t in range(12):
                p.begin_transaction()
                sent = []
                for i in range(10):
                    part = (t + i) % 4
                    value = f"t{t}-{i}".encode()
                    sent.append((part, value))
                    await p.send(topic, value, partition=part)
                everything += len(sent)
                if t % 3 == 2:
                    await p.flush()
                    await p.abort_transaction()
                else:
                    await p.commit_transaction()
                    for part, value in sent:
                        committed[part].append(value)

    arun(produce)
    n = sum(map(len, committed.values()))
    ours = arun(lambda: read_partitions(txn_broker, topic, 4, "read_committed", n))
    assert ours == committed
    raw = arun(lambda: read_partitions(txn_broker, topic, 4, "read_uncommitted", everything))
    assert sum(map(len, raw.values())) == everything
    theirs = confluent_read(txn_broker, topic, n)
    assert {p: v for p, v in theirs.items() if v} == {p: v for p, v in ours.items() if v}


def test_an_open_transaction_holds_read_committed_back(txn_broker: BrokerProcess) -> None:
    """While a transaction is open, read_committed's end is its first offset (the last stable
    offset) and a read_committed consumer waiting there gets nothing of it; its commit
    releases the records to that waiting consumer. read_uncommitted sees them at once."""
    topic = "tx-open"
    create(txn_broker, topic, 1)

    async def scenario() -> None:
        committed = AsyncConsumer(txn_broker.bootstrap, isolation_level="read_committed")
        raw = AsyncConsumer(txn_broker.bootstrap)
        async with (
            AsyncProducer(txn_broker.bootstrap, transactional_id="tx-open", linger_ms=0) as p,
            committed,
            raw,
        ):
            await p.init_transactions()
            p.begin_transaction()
            await p.send_and_wait(topic, b"first")
            await p.send_and_wait(topic, b"second")
            for c in (committed, raw):
                await c.assign([(topic, 0)])
            assert await committed.seek_to_end() == {(topic, 0): 0}  # the last stable offset
            assert await raw.seek_to_end() == {(topic, 0): 2}  # the high watermark
            committed.seek((topic, 0), 0)
            raw.seek((topic, 0), 0)
            assert [r.value for r in await raw.poll(timeout_ms=2000)] == [b"first", b"second"]
            assert await committed.poll(timeout_ms=300) == []
            await p.commit_transaction()
            got: list[bytes] = []
            deadline = time.monotonic() + TIMEOUT_S
            while len(got) < 2 and time.monotonic() < deadline:
                got += [r.value for r in await committed.poll(timeout_ms=500)]
            assert got == [b"first", b"second"]

    arun(scenario)


def test_a_confluent_transactional_producer_read_by_ours(txn_broker: BrokerProcess) -> None:
    ck = pytest.importorskip("confluent_kafka")
    topic = "tx-theirs"
    create(txn_broker, topic, 3)
    p = ck.Producer({"bootstrap.servers": txn_broker.bootstrap, "transactional.id": "tx-ck-ours"})
    p.init_transactions(TIMEOUT_S)
    committed: dict[int, list[bytes]] = {q: [] for q in range(3)}
    for t in range(6):
        p.begin_transaction()
        batch = [(i % 3, f"c{t}-{i}".encode()) for i in range(6)]
        for part, value in batch:
            p.produce(topic, value, partition=part)
        if t % 2:
            assert p.flush(TIMEOUT_S) == 0  # librdkafka's abort drops what it has not sent
            p.abort_transaction(TIMEOUT_S)
        else:
            p.commit_transaction(TIMEOUT_S)
            for part, value in batch:
                committed[part].append(value)
    n = sum(map(len, committed.values()))
    assert arun(lambda: read_partitions(txn_broker, topic, 3, "read_committed", n)) == committed


def test_a_second_producer_fences_the_first(txn_broker: BrokerProcess) -> None:
    """Two of our producers with one transactional id: the second's init aborts the first's
    open transaction and fences it; the first's commit fails fatally, and it can do nothing
    more. The blocking producer's face."""
    topic = "tx-zombie"
    create(txn_broker, topic, 1)
    with Producer(txn_broker.bootstrap, transactional_id="tx-z", linger_ms=0) as old:
        old.init_transactions()
        old.begin_transaction()
        old.send(topic, b"zombie").result(TIMEOUT_S)
        with Producer(txn_broker.bootstrap, transactional_id="tx-z", linger_ms=0) as new:
            new.init_transactions()
            assert new.producer_epoch > old.producer_epoch
            new.begin_transaction()
            new.send(topic, b"live")
            new.commit_transaction()
        with pytest.raises(TransactionError) as info:
            old.commit_transaction()
        assert info.value.fatal and isinstance(info.value.__cause__, ProducerFencedError)
        with pytest.raises(TransactionError):
            old.begin_transaction()
    got = arun(lambda: read_partitions(txn_broker, topic, 1, "read_committed", 1))
    assert got == {0: [b"live"]}


def test_consume_transform_produce(txn_broker: BrokerProcess) -> None:
    """Records read in a group, transformed and written in a transaction with the group's
    offsets: an aborted transaction leaves neither output nor offsets; a committed one both; a
    stale generation's offsets are refused."""
    src, dst, group = "ctp-in", "ctp-out", "ctp-group"
    create(txn_broker, src, 2)
    create(txn_broker, dst, 2)

    async def run() -> tuple[int | None, int | None]:
        async with AsyncProducer(txn_broker.bootstrap, linger_ms=0) as plain:
            for i in range(10):
                await plain.send_and_wait(src, f"in-{i}".encode(), partition=i % 2)
        consumer = AsyncConsumer(
            txn_broker.bootstrap, group=group, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        producer = AsyncProducer(txn_broker.bootstrap, transactional_id="tx-ctp", linger_ms=1)
        await producer.start()
        try:
            await consumer.subscribe(src)
            await producer.init_transactions()
            records = []
            deadline = time.monotonic() + TIMEOUT_S
            while len(records) < 10 and time.monotonic() < deadline:
                records += await consumer.poll(timeout_ms=300)
            assert len(records) == 10
            positions = {}
            for r in records:
                positions[(r.topic, r.partition)] = r.offset + 1
            meta = consumer.group_metadata()
            assert isinstance(meta, ConsumerGroupMetadata) and meta.generation >= 0
            for attempt in ("abort", "commit"):
                producer.begin_transaction()
                for r in records:
                    await producer.send(dst, r.value.upper(), partition=r.partition)
                await producer.send_offsets_to_transaction(positions, meta)
                if attempt == "abort":
                    await producer.flush()
                    await producer.abort_transaction()
                    assert await consumer.committed((src, 0)) is None
                else:
                    await producer.commit_transaction()
            # KIP-447: offsets of a generation the group is not at are refused, the transaction
            # made abortable
            producer.begin_transaction()
            stale = ConsumerGroupMetadata(group, meta.generation + 1, meta.member_id)
            with pytest.raises(TransactionError) as info:
                await producer.send_offsets_to_transaction(positions, stale)
            assert info.value.abortable and isinstance(info.value.__cause__, IllegalGenerationError)
            await producer.abort_transaction()
            return await consumer.committed((src, 0)), await consumer.committed((src, 1))
        finally:
            await producer.close()
            await consumer.close()

    assert arun(run) == (5, 5)
    out = arun(lambda: read_partitions(txn_broker, dst, 2, "read_committed", 10))
    assert sorted(v for vs in out.values() for v in vs) == sorted(f"IN-{i}".encode() for i in range(10))


def test_misuse_is_refused_at_once(txn_broker: BrokerProcess) -> None:
    async def run() -> None:
        async with AsyncProducer(txn_broker.bootstrap, transactional_id="tx-misuse") as p:
            with pytest.raises(TransactionError, match="init_transactions"):
                p.begin_transaction()
            await p.init_transactions()
            with pytest.raises(TransactionError, match="begin_transaction"):
                await p.send("anything", b"x")
            p.begin_transaction()
            with pytest.raises(TransactionError):
                p.begin_transaction()
            await p.commit_transaction()  # nothing sent: nothing for the coordinator to end
            with pytest.raises(TransactionError):
                await p.commit_transaction()

    arun(run)
    with pytest.raises(ValueError):
        AsyncProducer(txn_broker.bootstrap, transactional_id="x", enable_idempotence=False)


# ----------------------------------------------------------------------------------- no broker


def test_the_state_machine() -> None:
    s = TransactionState("t")
    with pytest.raises(TransactionError):
        s.begin()
    s.initialized(7, 0)
    assert s.state is TxnState.READY
    s.begin()
    s.check_send()
    assert s.ask_add(("a", 0)) and not s.ask_add(("a", 0))
    s.added_partitions({("a", 0)})
    assert s.started and ("a", 0) in s.added
    s.failed(RuntimeError("a batch failed"))
    assert s.state is TxnState.ABORTABLE_ERROR
    with pytest.raises(TransactionError) as info:
        s.begin_commit()
    assert info.value.abortable and not info.value.fatal
    s.begin_abort()
    assert s.needs_epoch_bump()
    s.completed()
    assert s.state is TxnState.READY and not s.added and s.error is None
    s.begin()
    s.failed(ProducerFencedError(m.ErrorCode.PRODUCER_FENCED, "newer"))
    assert s.state is TxnState.FATAL_ERROR
    for call in (s.begin_abort, s.begin_commit, s.check_send):
        with pytest.raises(TransactionError) as info:
            call()
        assert info.value.fatal


def test_aborted_batches_are_dropped_up_to_their_marker() -> None:
    """Kafka's consumer rule: a producer's transactional batches from its aborted transaction's
    first offset to its ABORT marker are dropped; another producer's, and the same producer's
    after the marker, are not."""

    def txn_batch(base: int, pid: int) -> bytes:
        raw = bytearray(
            as_transactional(encode_batch([b"v"], producer_id=pid, producer_epoch=0, base_sequence=0))
        )
        raw[0:8] = base.to_bytes(8, "big")
        return bytes(raw)

    def marker(base: int, pid: int, commit: bool) -> bytes:
        raw = bytearray(control_batch(pid, 0, commit, 0, 0, 0))
        raw[0:8] = base.to_bytes(8, "big")
        return bytes(raw)

    batches = [
        txn_batch(10, 1),
        txn_batch(11, 2),
        marker(12, 1, False),
        txn_batch(13, 1),
        marker(14, 2, True),
    ]
    data = b"".join(batches)
    dropped = _aborted_filter(((1, 10),), data)
    pos, verdicts = 0, []
    for b in batches:
        verdicts.append(dropped(pos, read_header(data, pos)))
        pos += len(b)
    assert verdicts == [True, False, True, False, True]


def test_transaction_messages_read_back() -> None:
    reqs: list[m.Request] = [
        m.InitProducerIdRequest("t", 5000, 3, 1),
        m.AddPartitionsToTxnRequest("t", 3, 1, ((1, 0), (1, 2))),
        m.AddOffsetsToTxnRequest("t", 3, 1, "g"),
        m.EndTxnRequest("t", 3, 1, True),
        m.TxnOffsetCommitRequest("t", "g", 3, 1, 4, "member", ((1, 0, 42, "meta"),)),
        m.FetchRequest(1, 0, 5, 100, 0, 1, m.Isolation.READ_COMMITTED),
        m.ListOffsetsRequest(1, 0, -1, m.Isolation.READ_COMMITTED),
        m.ProduceRequest(1, 0, 1, 1000, encode_batch([b"x"]), "t"),
    ]
    for req in reqs:
        frame = m.request_frame(req)
        back = m.decode_request(frame)
        assert back == req or (isinstance(req, m.ProduceRequest) and bytes(back.records) == req.records)  # type: ignore[attr-defined]
    assert m.request_frame(m.ProduceRequest(1, 0, 1, 1000, b"")).api_version == 1
    assert m.request_frame(reqs[-1]).api_version == 2
    resp = m.FetchResponse(
        high_watermark=9, log_start_offset=0, records=b"", last_stable_offset=4, aborted=((3, 1),)
    )
    body = b"".join(m.encode_response(resp, 1, None, 1, 0)[1:])
    read = m.read_fetch_response(Frame(m.ApiKey.FETCH, 2, FLAG_RESPONSE, 1, 1, 0, body))
    assert (read.high_watermark, read.last_stable_offset, read.aborted) == (9, 4, ((3, 1),))
    v1 = m.encode_response(m.FetchResponse(high_watermark=9, log_start_offset=0, layout=1), 1, None, 1, 0, 1)
    assert len(b"".join(v1[1:])) == 2 + 2 + 8 + 8 + 4  # v1's layout: no last stable offset or list


def test_the_cli_produces_one_transaction(txn_broker: BrokerProcess) -> None:
    """`broker produce --transactional-id`: the whole input is one committed transaction;
    `broker consume --isolation-level read_committed` reads it."""
    create(txn_broker, "tx-cli", 1)
    b = ("-b", f"127.0.0.1:{txn_broker.port}")

    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "broker.cli", *args, *b]
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False)

    lines = "".join(f"line {i}\n" for i in range(20))
    out = cli("produce", "tx-cli", "--transactional-id", "tx-cli-1", stdin=lines)
    assert out.returncode == 0, out.stderr
    got = cli(
        "consume", "tx-cli", "--from-beginning", "--max-records", "20", "--isolation-level", "read_committed"
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == [f"line {i}" for i in range(20)]
