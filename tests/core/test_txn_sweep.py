"""The hanging-transaction sweep (broker/core/txn_sweep.py) on a real Core, in process: a
transaction open past the threshold and held by no coordinator is aborted through the
partition's door; one a coordinator holds (Ongoing or prepared with that partition, or with a
change under way), one idle for less than the threshold, one whose producer wrote while the
coordinators were asked, and any when a coordinator cannot be asked, are left alone. The
coordinators' answers are `holds` (this core) and FIND_HELD_TXNS (another core), read back."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from crc32c import crc32c

from broker.core.cluster_view import ClusterView, NodeAddress, PartitionState
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Reply, Silent
from broker.core.partition import Partition, PendingProduce
from broker.core.txn_log import TxnRecord, TxnState
from broker.core.txn_sweep import Answer, HangSweep, Question, holds
from broker.ringlog.adapter import RinglogAdapter
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto import messages as m
from ringlog_proto.batch import CRC_START, Record, encode_batch
from ringlog_proto.batch_header import TRANSACTIONAL_BIT
from ringlog_proto.frames import Frame, FrameDecoder
from ringlog_proto.routing import shard_for

IO = SyncFileIO()
PID = 4242
LATER_MS = 10**13  # far past any threshold


def own_append(outcome: Append, done: Callable[[Reply | Silent], None]) -> None:
    """A backend's `run_own_append`, at once (no flush)."""
    try:
        run_ops(IO, outcome.pending.ops)
    except Exception as exc:
        done(outcome.fail(exc))
        return
    done(outcome.complete())


def txn_batch(pid: int, seq: int, value: bytes = b"v") -> bytes:
    out = bytearray(encode_batch([Record(value)], producer_id=pid, producer_epoch=0, base_sequence=seq))
    struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    return bytes(out)


def produce(core: Core, p: Partition, records: bytes) -> None:
    out = p.produce(records, core.space, transactional=True)
    assert isinstance(out, PendingProduce)
    run_ops(IO, out.pending.ops)
    out.complete()


class Links:
    """Another core's coordinator: answers as told, or keeps the question for later."""

    def __init__(self, held: list[bool] | None = None, defer: bool = False) -> None:
        self.held = held
        self.defer = defer
        self.asked: list[tuple[int, list[Question], Callable[[Answer | None], None]]] = []

    def ask(self, core: int, questions: Sequence[Question], done: Callable[[Answer | None], None]) -> None:
        self.asked.append((core, list(questions), done))
        if not self.defer:
            done(None if self.held is None else (list(self.held), frozenset()))


def make_core(tmp_path: Path, cores: int = 1) -> Core:
    core = Core(BrokerConfig(data_dir=str(tmp_path), cores=cores, core_id=0))
    core.transactions.own_append = own_append
    return core


def own_partition(core: Core, tid: int, cores: int) -> Partition:
    index = next(i for i in range(16) if shard_for(tid, i, cores) == 0)
    return core.partition(tid, index)


@pytest.fixture
def one(tmp_path: Path) -> Iterator[tuple[Core, Partition]]:
    core = make_core(tmp_path)
    tid = core.create_topic("data", 1).topic_id
    p = core.partition(tid, 0)
    produce(core, p, txn_batch(PID, 0))
    yield core, p
    core.close()


def sweep(core: Core, links: Links | None = None, now_ms: int = LATER_MS) -> HangSweep:
    return HangSweep(core, own_append, links, clock_ms=lambda: now_ms)


def held_by(core: Core, state: TxnState, partitions: frozenset[tuple[int, int]], pid: int = PID) -> None:
    """The coordinator holds id "tx" of producer `pid` in `state` with `partitions` (a prepared
    one set after the load, which would send its markers)."""
    coordinator = core.transactions.coordinator
    loaded = TxnState.ONGOING if state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) else state
    record = TxnRecord(pid, 0, -1, -1, 60_000, loaded, partitions, frozenset(), 0, 0)
    coordinator.load(core.transactions.partition_for("tx"), 0, {"tx": record})
    md = coordinator.metadata("tx")
    assert md is not None
    md.state = state


def test_a_transaction_no_coordinator_holds_is_aborted(one: tuple[Core, Partition]) -> None:
    core, p = one
    assert p.last_stable_offset == 0
    s = sweep(core)
    s.run()
    assert s.aborted == 1
    assert p.last_stable_offset == p.high_watermark == 2  # the batch, the ABORT marker
    assert p.producers.open_transactions() == []
    s.run()
    assert s.aborted == 1  # nothing open any more


@pytest.mark.parametrize("state", [TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT])
def test_a_transaction_its_coordinator_holds_is_left_alone(
    one: tuple[Core, Partition], state: TxnState
) -> None:
    core, p = one
    held_by(core, state, frozenset({(p.topic_id, p.index)}))
    s = sweep(core)
    s.run()
    assert (s.aborted, p.last_stable_offset) == (0, 0)


def test_held_by_the_producer_id_but_not_with_this_partition_or_ended_is_hanging(
    one: tuple[Core, Partition],
) -> None:
    core, p = one
    held_by(core, TxnState.ONGOING, frozenset({(p.topic_id + 1, 0)}))
    assert holds(core, [(PID, p.topic_id, p.index)]) == [False]
    held_by(core, TxnState.COMPLETE_ABORT, frozenset())
    assert holds(core, [(PID, p.topic_id, p.index)]) == [False]
    s = sweep(core)
    s.run()
    assert (s.aborted, p.last_stable_offset) == (1, 2)


def test_a_change_under_way_counts_as_held(one: tuple[Core, Partition]) -> None:
    core, p = one
    held_by(core, TxnState.EMPTY, frozenset())
    md = core.transactions.coordinator.metadata("tx")
    assert md is not None
    md.pending = TxnState.ONGOING  # an AddPartitionsToTxn being written
    assert holds(core, [(PID, p.topic_id, p.index)]) == [True]


def test_a_loading_coordinator_cannot_tell(one: tuple[Core, Partition]) -> None:
    core, p = one
    core.transactions.coordinator.begin_load(3, 0)
    assert holds(core, [(PID, p.topic_id, p.index)]) is None
    s = sweep(core)
    s.run()
    assert (s.aborted, p.last_stable_offset) == (0, 0)


def test_younger_than_the_threshold_is_not_asked_about(one: tuple[Core, Partition]) -> None:
    core, p = one
    config = core.config
    threshold = config.transaction_max_timeout_ms + 2 * config.transaction_abort_interval_ms
    (open_txn,) = p.producers.open_transactions()
    s = sweep(core, now_ms=open_txn[3] + threshold - 1)
    s.run()
    assert (s.aborted, p.last_stable_offset) == (0, 0)
    s = sweep(core, now_ms=open_txn[3] + threshold)
    s.run()
    assert s.aborted == 1


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Core, Partition]]:
    core = make_core(tmp_path, cores=2)
    tid = core.create_topic("data", 16).topic_id
    p = own_partition(core, tid, 2)
    produce(core, p, txn_batch(PID, 0))
    yield core, p
    core.close()


@pytest.mark.parametrize(("answer", "aborted"), [(None, 0), ([True], 0), ([False], 1)])
def test_the_other_cores_coordinator_is_asked(
    two: tuple[Core, Partition], answer: list[bool] | None, aborted: int
) -> None:
    core, p = two
    links = Links(answer)
    s = sweep(core, links)
    s.run()
    assert [(c, q) for c, q, _ in links.asked] == [(1, [(PID, p.topic_id, p.index)])]
    assert s.aborted == aborted
    assert p.last_stable_offset == (2 if aborted else 0)


def test_a_producer_that_wrote_while_coordinators_were_asked_is_left_alone(
    two: tuple[Core, Partition],
) -> None:
    core, p = two
    links = Links([False], defer=True)
    s = sweep(core, links)
    s.run()
    s.run()  # a round is still waiting: this one skips
    assert len(links.asked) == 1
    produce(core, p, txn_batch(PID, 1))  # the producer came back
    links.asked[0][2](([False], frozenset()))
    assert (s.aborted, p.last_stable_offset) == (0, 0)


def test_no_links_to_the_other_cores_means_no_abort(two: tuple[Core, Partition]) -> None:
    core, p = two
    s = sweep(core, None)
    s.run()
    assert (s.aborted, p.last_stable_offset) == (0, 0)


def test_find_held_txns_answers_for_this_cores_coordinator(two: tuple[Core, Partition]) -> None:
    """The frame another core's sweep sends, through our protocol's handler, from a peer."""
    core, p = two
    held_by(core, TxnState.ONGOING, frozenset({(p.topic_id, p.index)}))
    req = m.FindHeldTxnsRequest(((PID, p.topic_id, p.index), (PID + 1, p.topic_id, p.index)))
    assert m.decode_request(m.request_frame(req, 5)) == req
    adapter = RinglogAdapter(core)
    decoder = FrameDecoder()
    decoder.feed(b"".join(m.encode_request(req, 5)))
    frame = decoder.next_frame()
    outcome = adapter.handle(frame, from_peer=True)  # type: ignore[arg-type]
    assert isinstance(outcome, Reply)
    decoder = FrameDecoder()
    decoder.feed(b"".join(outcome.buffers))
    resp = m.decode_response(decoder.next_frame())  # type: ignore[arg-type]
    assert isinstance(resp, m.FindHeldTxnsResponse) and resp.held == (True, False)
    # a client's is refused
    outcome = adapter.handle(frame)  # type: ignore[arg-type]
    assert isinstance(outcome, Reply)
    decoder = FrameDecoder()
    decoder.feed(b"".join(outcome.buffers))
    assert m.decode_response(decoder.next_frame()).error == m.ErrorCode.INVALID_REQUEST  # type: ignore[arg-type]


def test_a_round_still_writing_its_markers_makes_the_next_skip(one: tuple[Core, Partition]) -> None:
    core, p = one
    waiting: list[Callable[[], None]] = []

    def slow_append(outcome: Append, done: Callable[[Reply | Silent], None]) -> None:
        waiting.append(lambda: own_append(outcome, done))

    s = HangSweep(core, slow_append, None, clock_ms=lambda: LATER_MS)
    s.run()
    s.run()
    assert len(waiting) == 1
    waiting.pop()()
    assert (s.aborted, p.last_stable_offset) == (1, 2)
    s.run()
    assert waiting == [] and s.aborted == 1


class RemoteLinks:
    """Another node's core, reached over the core's remote links: answers as told."""

    def __init__(self, answer: m.FindHeldTxnsResponse | None) -> None:
        self.answer = answer
        self.asked: list[tuple[tuple[str, int], m.Request]] = []

    def request(
        self,
        address: tuple[str, int],
        frame: Frame,
        deadline: float,
        done: Callable[[Frame | BaseException], None],
    ) -> None:
        self.asked.append((address, m.decode_request(frame)))
        if self.answer is None:
            done(ConnectionError("refused"))
            return
        decoder = FrameDecoder()
        decoder.feed(b"".join(m.encode_response(self.answer, frame.correlation_id, frame.api_key)))
        reply = decoder.next_frame()
        assert reply is not None
        done(reply)


def clustered(core: Core, *, down: bool = False, leaderless: bool = False) -> int:
    """Make `core` node 1 of a cluster (one core a node) whose node 2 is live and leads every
    state partition (`leaderless`: the last has no live leader); `down`: node 3 is in the view,
    not live. The number of state partitions."""
    state = core.transactions.ensure_topic()  # made as on one node, before the switch
    assert state is not None
    core.config = dataclasses.replace(core.config, node_id=1, cluster=cast(Any, object()))
    nodes = {n: NodeAddress(n, "127.0.0.1", 9000 + n, (9100 + n,)) for n in (1, 2, 3)}
    if not down:
        del nodes[3]
    leaders = {i: 2 for i in range(state.partitions)}
    if leaderless:
        leaders[state.partitions - 1] = 3
    core.cluster = ClusterView(
        node_id=1,
        generation=1,
        clustered=True,
        nodes=nodes,
        partitions={(state.topic_id, i): PartitionState((2, 1), n, 1, (2, 1)) for i, n in leaders.items()},
        live=frozenset({1, 2}),
    )
    return state.partitions


def answer(held: bool, loaded: range | tuple[int, ...]) -> m.FindHeldTxnsResponse:
    return m.FindHeldTxnsResponse(held=(held,), loaded=tuple(loaded))


@pytest.mark.parametrize(
    ("case", "aborted"),
    [("hanging", 1), ("held", 0), ("not loaded", 0), ("cannot be asked", 0), ("down", 0), ("leaderless", 0)],
)
def test_in_a_cluster_every_live_nodes_cores_are_asked(
    one: tuple[Core, Partition], case: str, aborted: int
) -> None:
    """A cluster's round asks every core of every live node over the remote links, and aborts
    only when every one answered, none holds it, and every state partition is loaded by one of
    them; a node of the view not live, or a state partition with no live leader, means no
    round at all."""
    core, p = one
    partitions = clustered(core, down=case == "down", leaderless=case == "leaderless")
    given = {
        "hanging": answer(False, range(partitions)),
        "held": answer(True, range(partitions)),
        "not loaded": answer(False, range(partitions - 1)),
        "cannot be asked": None,
    }.get(case, answer(False, range(partitions)))
    remote = RemoteLinks(given)
    core.remote_links = cast(Any, remote)
    s = sweep(core)
    s.run()
    asked = [] if case in ("down", "leaderless") else [(("127.0.0.1", 9102), (PID, p.topic_id, p.index))]
    assert [(a, q.questions[0]) for a, q in remote.asked if isinstance(q, m.FindHeldTxnsRequest)] == asked
    assert (s.aborted, p.last_stable_offset) == (aborted, 2 if aborted else 0)


def test_in_a_cluster_a_client_may_ask_find_held_txns(one: tuple[Core, Partition]) -> None:
    """Another node's sweep comes over the nodes' links, as a client's frame would (ACLs, where on,
    need alter on the cluster): answered, with the state partitions loaded here."""
    core, p = one
    clustered(core)
    req = m.FindHeldTxnsRequest(((PID, p.topic_id, p.index),))
    outcome = RinglogAdapter(core).handle(m.request_frame(req, 5))
    assert isinstance(outcome, Reply)
    decoder = FrameDecoder()
    decoder.feed(b"".join(outcome.buffers))
    resp = m.decode_response(decoder.next_frame())  # type: ignore[arg-type]
    assert isinstance(resp, m.FindHeldTxnsResponse) and resp.held == (False,), resp
    assert resp.loaded == tuple(core.transactions.coordinator.loaded())
