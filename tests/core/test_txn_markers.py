"""MarkerSender (broker/core/txn_markers.py) on a real Core of a two-core node, in process: each
target routed to where it lives (a partition or group of this core written here, another core's
sent over the links in one request per core), retried after `RETRY_S` until written (a failed
append, links not there yet, an answer asking again), a marker the partition refuses as fenced
and a deleted topic's partition dropped, `done()` once when every target is written or dropped;
and PeerMarkerLinks' reading of the other core's answer."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.groups import Committed
from broker.core.outcomes import Append, Reply, Silent
from broker.core.partition import Partition, PendingProduce
from broker.core.txn_coordinator import MarkerRequest
from broker.core.txn_markers import RETRY_S, MarkerSender, PeerMarkerLinks
from broker.storage.fileio import SyncFileIO, run_ops
from ringlog_proto import messages as m
from ringlog_proto.batch import CRC_START, Record, encode_batch
from ringlog_proto.batch_header import TRANSACTIONAL_BIT
from ringlog_proto.frames import Frame, FrameDecoder
from ringlog_proto.routing import coordinator_for, shard_for

IO = SyncFileIO()
PID = 77


class Timers:
    """The core's `call_later`, run by hand."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, fn: Callable[[], None]) -> Any:
        self.due.append((delay, fn))
        return None

    def run(self) -> int:
        due, self.due = self.due, []
        for _delay, fn in due:
            fn()
        return len(due)


class Appends:
    """The backend's `run_own_append`, at once; the next `failing` ones fail their write."""

    def __init__(self) -> None:
        self.failing = 0
        self.count = 0

    def __call__(self, outcome: Append, done: Callable[[Reply | Silent], None]) -> None:
        self.count += 1
        if self.failing:
            self.failing -= 1
            outcome.partition.log.abort_append(outcome.pending)
            done(outcome.fail(OSError(5, "injected")))
            return
        run_ops(IO, outcome.pending.ops)
        done(outcome.complete())


class Links:
    """Another core, answering `ok` (or keeping the question when None)."""

    def __init__(self, ok: bool | None = True) -> None:
        self.ok = ok
        self.sent: list[tuple[int, list[tuple[int, int]], list[str]]] = []
        self.waiting: list[Callable[[bool], None]] = []

    def write_markers(
        self,
        core: int,
        request: MarkerRequest,
        partitions: list[tuple[int, int]],
        groups: list[str],
        done: Callable[[bool], None],
    ) -> None:
        self.sent.append((core, list(partitions), list(groups)))
        if self.ok is None:
            self.waiting.append(done)
        else:
            done(self.ok)


class Node:
    def __init__(self, core: Core, timers: Timers, appends: Appends, tid: int) -> None:
        self.core, self.timers, self.appends, self.tid = core, timers, appends, tid
        self.sender: MarkerSender = core.transactions.markers
        self.done = 0

    def finished(self) -> None:
        self.done += 1

    def index_on(self, core: int) -> int:
        return next(i for i in range(8) if shard_for(self.tid, i, 2) == core)

    def mine(self) -> Partition:
        return self.core.partition(self.tid, self.index_on(0))


def group_on(core: int) -> str:
    return next(g for g in (f"g{i}" for i in range(64)) if coordinator_for(g, 2) == core)


def request(
    parts: frozenset[tuple[int, int]] = frozenset(),
    groups: frozenset[str] = frozenset(),
    epoch: int = 0,
    coordinator_epoch: int = 0,
    commit: bool = True,
) -> MarkerRequest:
    return MarkerRequest("tx", PID, epoch, coordinator_epoch, commit, parts, groups)


def open_txn(p: Partition, core: Core, epoch: int = 0) -> None:
    out = bytearray(encode_batch([Record(b"v")], producer_id=PID, producer_epoch=epoch, base_sequence=0))
    struct.pack_into(">h", out, 21, TRANSACTIONAL_BIT)
    struct.pack_into(">I", out, 17, crc32c(bytes(out[CRC_START:])))
    produced = p.produce(bytes(out), core.space, transactional=True)
    assert isinstance(produced, PendingProduce)
    run_ops(IO, produced.pending.ops)
    produced.complete()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    timers = Timers()
    core = Core(BrokerConfig(data_dir=str(tmp_path), cores=2, core_id=0), call_later=timers.call_later)
    appends = Appends()
    core.transactions.own_append = appends
    tid = core.create_topic("data", 8).topic_id
    yield Node(core, timers, appends, tid)
    core.close()


def test_a_partition_of_this_core_gets_its_marker_here(node: Node) -> None:
    p = node.mine()
    open_txn(p, node.core)
    node.sender.links = Links(ok=False)  # not asked: nothing is on the other core
    node.sender.send(request(frozenset({(node.tid, p.index)})), node.finished)
    assert node.done == 1 and node.appends.count == 1
    assert p.last_stable_offset == p.high_watermark == 2
    assert node.sender.links.sent == []  # type: ignore[union-attr]


def test_another_cores_targets_go_in_one_request_to_it(node: Node) -> None:
    p = node.mine()
    other = node.index_on(1)
    links = node.sender.links = Links()
    targets = frozenset({(node.tid, p.index), (node.tid, other)})
    node.sender.send(request(targets, frozenset({group_on(1), group_on(0)})), node.finished)
    assert links.sent == [(1, [(node.tid, other)], [group_on(1)])]
    assert node.done == 1 and node.appends.count == 1  # this core's partition; its group: offsets


def test_another_core_asking_again_is_retried_after_the_backoff(node: Node) -> None:
    links = node.sender.links = Links(ok=False)
    node.sender.send(request(frozenset({(node.tid, node.index_on(1))})), node.finished)
    assert node.done == 0 and [d for d, _ in node.timers.due] == [RETRY_S]
    links.ok = True
    node.timers.run()
    assert node.done == 1 and len(links.sent) == 2 and node.timers.due == []


def test_no_links_yet_waits_for_them(node: Node) -> None:
    node.sender.links = None
    node.sender.send(request(frozenset({(node.tid, node.index_on(1))})), node.finished)
    node.timers.run()
    assert node.done == 0
    links = node.sender.links = Links()
    node.timers.run()
    assert node.done == 1 and len(links.sent) == 1


def test_a_failed_append_is_retried_until_written(node: Node) -> None:
    p = node.mine()
    open_txn(p, node.core)
    node.appends.failing = 2
    node.sender.send(request(frozenset({(node.tid, p.index)}), commit=False), node.finished)
    assert node.done == 0
    node.timers.run()
    assert node.done == 0
    node.timers.run()
    assert node.done == 1 and node.appends.count == 3
    assert p.last_stable_offset == 2 and p.producers.open_transactions() == []


@pytest.mark.parametrize(("epoch", "coordinator_epoch"), [(0, 2), (1, 1)])
def test_a_fenced_marker_is_dropped(node: Node, epoch: int, coordinator_epoch: int) -> None:
    """Producer epoch 1 and coordinator epoch 2 ended a transaction here: a marker of epoch 0,
    or of coordinator epoch 1, is refused by the partition and dropped, not retried."""
    p = node.mine()
    open_txn(p, node.core, epoch=1)
    node.sender.send(request(frozenset({(node.tid, p.index)}), epoch=1, coordinator_epoch=2), node.finished)
    end = p.high_watermark
    node.sender.send(
        request(frozenset({(node.tid, p.index)}), epoch=epoch, coordinator_epoch=coordinator_epoch),
        node.finished,
    )
    assert node.done == 2 and node.timers.due == [] and p.high_watermark == end


def test_a_deleted_topics_partition_is_dropped(node: Node) -> None:
    gone = node.tid + 100
    index = next(i for i in range(8) if node.core.owner(gone, i) == 0)
    node.sender.send(request(frozenset({(gone, index)})), node.finished)
    assert node.done == 1 and node.timers.due == [] and node.appends.count == 0


def test_a_group_of_this_core_commits_the_pending_offsets(node: Node) -> None:
    group = group_on(0)
    offsets = node.core.coordinator.offsets
    offsets.commit_pending(group, PID, 0, {(node.tid, 0): Committed(5, "")})
    assert offsets.committed(group, node.tid, 0).offset == -1
    node.sender.send(request(groups=frozenset({group})), node.finished)
    assert node.done == 1 and offsets.committed(group, node.tid, 0).offset == 5


def test_a_group_whose_store_fails_is_retried(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    group = group_on(0)
    results: list[bool | BaseException] = [OSError(28, "full"), True]
    monkeypatch.setattr(
        node.core, "complete_txn_offsets", lambda _g, _pid, _commit, done: done(results.pop(0))
    )
    node.sender.send(request(groups=frozenset({group})), node.finished)
    assert node.done == 0
    node.timers.run()
    assert node.done == 1 and results == []


def test_write_local_writes_what_another_core_asked(node: Node) -> None:
    """The receiving side writes the markers of the targets it leads and says all were written;
    a target it does not lead is answered not written, for the sender to route again."""
    p = node.mine()
    open_txn(p, node.core)
    written: list[bool] = []
    node.sender.write_local(
        request(frozenset({(node.tid, p.index)})), [(node.tid, p.index)], [], written.append
    )
    assert written == [True] and p.last_stable_offset == 2
    node.sender.write_local(request(), [], [], written.append)
    assert written == [True, True]
    elsewhere = node.index_on(1)
    node.sender.write_local(
        request(frozenset({(node.tid, elsewhere)})), [(node.tid, elsewhere)], [], written.append
    )
    assert written == [True, True, False]


def test_a_closed_sender_stops_retrying(node: Node) -> None:
    node.sender.links = Links(ok=False)
    node.sender.send(request(frozenset({(node.tid, node.index_on(1))})), node.finished)
    node.sender.close()
    node.timers.run()
    assert node.timers.due == [] and node.done == 0


def answer_frame(resp: m.Response) -> Frame:
    decoder = FrameDecoder()
    decoder.feed(b"".join(m.encode_response(resp, 1, resp.API_KEY, 0, 0)))
    frame = decoder.next_frame()
    assert isinstance(frame, Frame)
    return frame


@pytest.mark.parametrize(
    ("answer", "ok"),
    [
        (ConnectionResetError("gone"), False),
        (m.error_response(m.ApiKey.WRITE_TXN_MARKERS, m.ErrorCode.STORAGE_ERROR, "disk"), False),
        (m.WriteTxnMarkersResponse(), True),
    ],
)
def test_peer_links_read_the_other_cores_answer(answer: object, ok: bool) -> None:
    sent: list[tuple[int, m.Request]] = []
    got: list[bool] = []

    def send_to_core(
        core: int, frame: Frame, long_poll: bool, done: Callable[[Frame | BaseException], None]
    ) -> None:
        sent.append((core, m.decode_request(frame)))
        done(answer if isinstance(answer, BaseException) else answer_frame(answer))  # type: ignore[arg-type]

    PeerMarkerLinks(send_to_core).write_markers(1, request(), [(3, 4)], ["g"], got.append)
    assert got == [ok]
    ((core, req),) = sent
    assert core == 1 and isinstance(req, m.WriteTxnMarkersRequest)
    assert (req.producer_id, req.partitions, req.groups, req.txn_id) == (PID, ((3, 4),), ("g",), "tx")
