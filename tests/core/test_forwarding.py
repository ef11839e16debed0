"""Forwarding without I/O: PeerLink's correlation ids, the Forwarder's limits and failures, and
RinglogAdapter of two cores sharing one data dir (ownership, misses, delete notices)."""

from __future__ import annotations

from pathlib import Path

import pytest
from blocking_kit import Blocking

from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.forwarding import NO_DEADLINE, PEER_WATCH_S, Forwarder, PeerLink, PeerLinkError, PeerPool
from broker.core.outcomes import Forward, Later, Notify, Reply, Silent
from broker.ringlog.adapter import RinglogAdapter
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch
from ringlog_proto.frames import LENDING_DECODER, Frame, FrameDecoder
from ringlog_proto.routing import shard_for


def frame_of(req: m.Request, cid: int = 1) -> Frame:
    return m.request_frame(req, cid)


def frames_in(data: bytes) -> list[Frame]:
    d = FrameDecoder()
    d.feed(data)
    out = []
    while isinstance(f := d.next_frame(), Frame):
        out.append(f)
    return out


def answer_bytes(request_bytes: bytes, resp: m.Response) -> bytes:
    """What the owner would send back for the frame in `request_bytes`."""
    (req,) = frames_in(request_bytes)
    return b"".join(m.encode_response(resp, req.correlation_id, None, req.topic_id, req.partition))


# ----------------------------------------------------------------------------------- PeerLink


def test_peer_link_assigns_its_own_ids_and_matches_answers_in_any_order_and_any_pieces() -> None:
    link = PeerLink(core=1)
    got: dict[str, object] = {}
    sent = [
        b"".join(
            link.request(frame_of(m.ListOffsetsRequest(7, p), cid=500), lambda r, p=p: got.__setitem__(p, r))
        )
        for p in range(3)
    ]
    ids = [frames_in(s)[0].correlation_id for s in sent]
    assert len(set(ids)) == 3 and 500 not in ids
    assert link.pending == 3
    answers = [answer_bytes(sent[i], m.ListOffsetsResponse(offset=10 + i)) for i in (2, 0, 1)]
    for byte in b"".join(answers):  # one byte at a time
        link.receive(bytes([byte]))
    assert link.pending == 0
    for p in range(3):
        frame = got[p]
        assert isinstance(frame, Frame)
        resp = m.decode_response(frame)
        assert isinstance(resp, m.ListOffsetsResponse) and resp.offset == 10 + p


@pytest.mark.skipif(LENDING_DECODER is None, reason="native/frames.c is not built: no decoder lends")
def test_peer_link_received_into_lent_space_gives_the_same_answers_and_large_records_uncopied() -> None:
    """What the io_uring backend's peer streams do: receive into the space the link's decoder
    lends. A follower's fetch answer keeps its records where they arrived (a view, not bytes)."""
    link = PeerLink(core=-1, peer="leader")
    got: list[Frame] = []
    records = encode_batch([bytes([i % 251]) * 1000 for i in range(40)])
    sent = [b"".join(link.request(frame_of(m.ListOffsetsRequest(7, p)), got.append)) for p in range(3)]
    answers = [
        answer_bytes(sent[0], m.ListOffsetsResponse(offset=10)),
        answer_bytes(
            sent[1],
            m.ReplicaFetchResponse(
                partitions=(m.ReplicaFetchPartitionData(7, 1, m.ErrorCode.NONE, 40, 0, records=records),)
            ),
        ),
        answer_bytes(sent[2], m.ListOffsetsResponse(offset=12)),
    ]
    stream = b"".join(answers)
    at = 0
    for size in (5, 100, 4096, 65536, len(stream)):  # a receive's pieces, as the ring hands them over
        space = link.lend(size)
        assert isinstance(space, memoryview) and len(space) == size
        n = min(size, len(stream) - at)
        space[:n] = stream[at : at + n]
        space.release()
        link.received_lent(n)
        at += n
        if at == len(stream):
            break
    assert link.pending == 0 and len(got) == 3
    first, fetched, last = (m.decode_response(f) for f in got)
    assert isinstance(first, m.ListOffsetsResponse) and first.offset == 10
    assert isinstance(last, m.ListOffsetsResponse) and last.offset == 12
    assert isinstance(fetched, m.ReplicaFetchResponse)
    (part,) = fetched.partitions
    assert bytes(part.records) == records
    assert isinstance(got[1].body, memoryview)  # the body where it was received: no copy out


def test_peer_link_ignores_answers_nobody_waits_for_and_fails_everything_when_lost() -> None:
    link = PeerLink(core=0)
    silent = b"".join(link.request(frame_of(m.ProduceRequest(1, 0, 0, 1000, encode_batch([b"x"]))), None))
    link.receive(answer_bytes(silent, m.ProduceResponse(m.ErrorCode.STORAGE_ERROR, "no")))  # ignored
    results: list[object] = []
    link.request(frame_of(m.FetchRequest(1, 0)), results.append)
    link.request(frame_of(m.FetchRequest(1, 1)), results.append)
    link.lost(ConnectionResetError("gone"))
    assert len(results) == 2 and all(isinstance(r, PeerLinkError) for r in results)
    assert "core 0" in str(results[0])
    with pytest.raises(PeerLinkError):
        link.request(frame_of(m.FetchRequest(1, 0)), results.append)


# ----------------------------------------------------------------------------------- Forwarder


class FakeBackend:
    """send_to_core and call_later recorded; the test plays the owner core."""

    def __init__(self) -> None:
        self.links: dict[int, PeerLink] = {}
        self.wire: dict[int, list[bytes]] = {}
        self.long_polls: list[bool] = []
        self.timers: list[object] = []
        self.refuse = False

    def send_to_core(self, core, frame, long_poll, done) -> None:
        if self.refuse:
            raise ConnectionRefusedError("no such core")
        link = self.links.setdefault(core, PeerLink(core))
        self.wire.setdefault(core, []).append(b"".join(link.request(frame, done)))
        self.long_polls.append(long_poll)

    def call_later(self, delay, fn) -> None:
        self.timers.append(fn)

    def answer_all(self, core: int, make=lambda: m.ListOffsetsResponse(offset=3)) -> None:
        sent, self.wire[core] = self.wire.get(core, []), []
        for s in sent:
            self.links[core].receive(answer_bytes(s, make()))


@pytest.fixture
def h0(tmp_path: Path):
    h = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path), cores=2, core_id=0)))
    yield h
    h.core.close()


@pytest.fixture
def h1(tmp_path: Path):
    h = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path), cores=2, core_id=1)))
    yield h
    h.core.close()


def partition_of(core: int, topic_id: int = 1) -> int:
    return next(p for p in range(64) if shard_for(topic_id, p, 2) == core)


def decoded(outcome: object) -> tuple[int, m.Response]:
    assert isinstance(outcome, Reply), outcome
    (frame,) = frames_in(b"".join(outcome.buffers))
    return frame.correlation_id, m.decode_response(frame)


def test_handlers_forward_another_cores_partition_before_decoding_and_never_reforward(
    h0: RinglogAdapter,
) -> None:
    p1 = partition_of(1)
    out = h0.handle(frame_of(m.FetchRequest(1, p1, 0, 1024, max_wait_ms=500)))
    assert isinstance(out, Forward) and (out.core, out.long_poll, out.expects_reply) == (1, True, True)
    out = h0.handle(frame_of(m.ProduceRequest(1, p1, m.Acks.NONE, 1000, b"not even a batch")))
    assert isinstance(out, Forward) and not out.expects_reply and not out.long_poll
    _, resp = decoded(h0.handle(frame_of(m.FetchRequest(1, p1)), from_peer=True))
    assert resp.error == m.ErrorCode.NOT_OWNER
    # Its own partition, and requests about no partition, are served here.
    _, resp = decoded(h0.handle(frame_of(m.FetchRequest(1, partition_of(0)))))
    assert resp.error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert isinstance(h0.handle(frame_of(m.MetadataRequest())), Reply)


def test_forwarder_relays_the_answer_under_the_clients_correlation_id(h0: RinglogAdapter) -> None:
    backend = FakeBackend()
    fw = Forwarder(h0, backend.send_to_core, backend.call_later)
    replies: list[object] = []
    fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=4242)), replies.append)
    assert fw.pending == 1 and h0.metrics.forwarded_out == 1
    backend.answer_all(1)
    cid, resp = decoded(replies[0])
    assert cid == 4242 and isinstance(resp, m.ListOffsetsResponse) and resp.offset == 3
    assert fw.pending == 0


def test_forwarder_answers_acks_zero_at_once_and_fails_retriably_when_the_peer_is_gone(
    h0: RinglogAdapter,
) -> None:
    backend = FakeBackend()
    fw = Forwarder(h0, backend.send_to_core, backend.call_later)
    replies: list[object] = []
    fw.forward(h0.handle(frame_of(m.ProduceRequest(1, partition_of(1), 0, 1000, b"x"))), replies.append)
    assert isinstance(replies[0], Silent) and fw.pending == 0
    fw.forward(h0.handle(frame_of(m.FetchRequest(1, partition_of(1)), cid=9)), replies.append)
    backend.links[1].lost(None)
    cid, resp = decoded(replies[1])
    assert cid == 9 and resp.error == m.ErrorCode.NOT_OWNER and resp.error.retriable
    backend.refuse = True
    fw.forward(h0.handle(frame_of(m.FetchRequest(1, partition_of(1)), cid=10)), replies.append)
    assert decoded(replies[2])[1].error == m.ErrorCode.NOT_OWNER
    assert fw.pending == 0


def test_forwarder_bounds_what_is_in_flight_per_peer_and_says_when_there_is_room(h0: RinglogAdapter) -> None:
    backend = FakeBackend()
    fw = Forwarder(h0, backend.send_to_core, backend.call_later, inflight_max=2)
    replies: list[object] = []
    for cid in range(5):
        fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=cid)), replies.append)
    assert len(backend.wire[1]) == 2 and fw.pending == 5 and fw.blocked(1) and not fw.blocked(0)
    resumed: list[bool] = []
    fw.when_room(1, lambda: resumed.append(True))
    backend.answer_all(1)  # two answered: the next two go out, still at the limit
    assert len(backend.wire[1]) == 2 and not resumed
    backend.answer_all(1)
    backend.answer_all(1)
    assert resumed == [True] and fw.pending == 0
    assert [decoded(r)[0] for r in replies] == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------------- shared topics


def test_two_cores_share_topics_a_miss_reloads_and_a_delete_waits_for_the_peer(
    h0: RinglogAdapter, h1: RinglogAdapter, tmp_path: Path
) -> None:
    _, created = decoded(h0.handle(frame_of(m.CreateTopicRequest("t", 8))))
    assert isinstance(created, m.CreateTopicResponse)
    tid = created.topic_id
    mine = [p for p in range(8) if shard_for(tid, p, 2) == 1]
    # Core 1 learns of the topic on its first request for one of its partitions, and opens
    # (makes) that partition only: the others are made on their own first use.
    out = h1.handle(frame_of(m.ListOffsetsRequest(tid, mine[0])))
    assert decoded(out)[1].error == m.ErrorCode.NONE
    assert {p for (t, p) in h1.core.partitions if t == tid} == {mine[0]}
    assert not any(t == tid for (t, _) in h0.core.partitions), "the creating core made no partition"
    # A second create of the name by the other core is refused; ids never collide.
    assert (
        decoded(h1.handle(frame_of(m.CreateTopicRequest("t", 1))))[1].error
        == m.ErrorCode.TOPIC_ALREADY_EXISTS
    )
    _, other = decoded(h1.handle(frame_of(m.CreateTopicRequest("u", 1))))
    assert isinstance(other, m.CreateTopicResponse) and other.topic_id == tid + 1
    # Delete on core 0: a notice for core 1, files removed only when finishing.
    delete = frame_of(m.DeleteTopicRequest("t"))
    notice = h0.handle(delete)
    assert isinstance(notice, Notify) and notice.cores == (1,)
    assert (tmp_path / "topics" / str(tid)).exists()
    ack = h1.handle(notice.frame, from_peer=True)
    assert decoded(ack)[1].error == m.ErrorCode.NONE
    assert not any(t == tid for (t, _) in h1.core.partitions)
    produce = frame_of(m.ProduceRequest(tid, mine[0], 1, 1000, encode_batch([b"late"])))
    assert decoded(h1.handle(produce))[1].error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert decoded(notice.finish())[1].error == m.ErrorCode.NONE
    assert not (tmp_path / "topics" / str(tid)).exists()


@pytest.mark.parametrize("cores", [1, 2])
def test_a_deleted_topics_files_go_off_the_loop_and_the_answer_after_them(tmp_path: Path, cores: int) -> None:
    held = Blocking()
    h0 = RinglogAdapter(Core(BrokerConfig(data_dir=str(tmp_path), cores=cores, core_id=0), run_blocking=held))
    _, created = decoded(h0.handle(frame_of(m.CreateTopicRequest("t", 4))))
    assert isinstance(created, m.CreateTopicResponse)
    tid = created.topic_id
    mine = [p for p in range(4) if shard_for(tid, p, cores) == 0]
    assert mine
    offsets = frame_of(m.ListOffsetsRequest(tid, mine[0]))  # opens (makes) the partition's files
    assert decoded(h0.handle(offsets))[1].error == m.ErrorCode.NONE
    outcome = h0.handle(frame_of(m.DeleteTopicRequest("t"), cid=9))
    if cores > 1:  # the peers are told first; what follows their answers is the same
        assert isinstance(outcome, Notify) and outcome.cores == (1,)
        outcome = outcome.finish()
    assert isinstance(outcome, Later)
    replies: list[object] = []
    outcome.start(replies.append)
    # The removal is on the pool, not done: the files are still there and nothing is answered,
    # while the core already answers as if the topic were gone.
    assert len(held.calls) == 1 and not replies
    assert (tmp_path / "topics" / str(tid)).exists()
    assert decoded(h0.handle(offsets))[1].error == m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert held.run() == 1
    assert not (tmp_path / "topics" / str(tid)).exists()
    cid, resp = decoded(replies[0])
    assert cid == 9 and isinstance(resp, m.DeleteTopicResponse) and resp.error == m.ErrorCode.NONE
    # The name is free again: a new topic of it has a new id, its own directory.
    _, again = decoded(h0.handle(frame_of(m.CreateTopicRequest("t", 1))))
    assert isinstance(again, m.CreateTopicResponse) and again.topic_id != tid


def test_a_notice_answers_when_every_peer_answered_or_at_the_timeout(h0: RinglogAdapter) -> None:
    backend = FakeBackend()
    fw = Forwarder(h0, backend.send_to_core, backend.call_later)
    h0.handle(frame_of(m.CreateTopicRequest("t", 1)))
    replies: list[object] = []
    notice = h0.handle(frame_of(m.DeleteTopicRequest("t"), cid=77))
    assert isinstance(notice, Notify)
    fw.notify(notice, replies.append)
    assert not replies and len(backend.timers) == 1
    backend.answer_all(1, m.DeleteTopicResponse)
    assert decoded(replies[0])[0] == 77
    backend.timers[0]()  # the timeout fires later: nothing is answered twice
    assert len(replies) == 1
    # A peer that never answers: the timeout answers.
    h0.handle(frame_of(m.CreateTopicRequest("v", 1)))
    fw.notify(h0.handle(frame_of(m.DeleteTopicRequest("v"))), replies.append)  # type: ignore[arg-type]
    backend.timers[-1]()
    assert len(replies) == 2 and decoded(replies[1])[1].error == m.ErrorCode.NONE


def test_forwarder_bounds_bytes_in_flight_but_always_lets_one_request_through(h0: RinglogAdapter) -> None:
    backend = FakeBackend()
    fw = Forwarder(h0, backend.send_to_core, backend.call_later, inflight_bytes_max=1000)
    replies: list[object] = []
    big = encode_batch([b"x" * 3000])  # one request over the byte limit still goes
    for cid in range(3):
        produce = frame_of(m.ProduceRequest(1, partition_of(1), 1, 1000, big), cid=cid)
        fw.forward(h0.handle(produce), replies.append)
    assert len(backend.wire[1]) == 1 and fw.blocked(1) and fw.pending == 3
    for _ in range(3):
        backend.answer_all(1, lambda: m.ProduceResponse(base_offset=0, end_offset=1, log_start_offset=0))
    assert fw.pending == 0 and not fw.blocked(1)
    assert [decoded(r)[0] for r in replies] == [0, 1, 2]


# ----------------------------------------------------------------------------------- PeerPool


class FakeChannel:
    """A backend's end of an inter-core connection: records what was sent, closes like one."""

    def __init__(self, pool_ref: list[PeerPool], core: int) -> None:
        self.pool_ref = pool_ref
        self.link = PeerLink(core)
        self.sent: list[bytes] = []
        self.closed = False

    def send(self, frame: Frame, done, deadline: float = NO_DEADLINE) -> None:
        self.sent.append(b"".join(self.link.request(frame, done, deadline)))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool_ref[0].gone(self)
            self.link.lost(None)


class PoolRig:
    """A PeerPool with a hand-driven clock, liveness and timers."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.now = 100.0
        self.up = {0: True, 1: True}
        self.timers: list[tuple[float, object]] = []
        self.opened: list[FakeChannel] = []
        ref: list[PeerPool] = []

        def open_peer(core: int, long_poll: bool) -> FakeChannel:
            ch = FakeChannel(ref, core)
            self.opened.append(ch)
            return ch

        self.pool = PeerPool(
            open_peer,
            lambda: False,
            lambda delay, fn: self.timers.append((self.now + delay, fn)),
            alive=lambda core: self.up[core],
            timeout_s=timeout_s,
            clock=lambda: self.now,
        )
        ref.append(self.pool)

    def advance(self, seconds: float) -> None:
        """Move the clock, firing the timers that come due (and those they set, if due)."""
        self.now += seconds
        while due := [t for t in self.timers if t[0] <= self.now]:
            for t in due:
                self.timers.remove(t)
                t[1]()  # type: ignore[operator]


def test_peer_pool_answers_forwards_to_a_down_core_at_once_and_fails_its_pending_when_it_goes_down(
    h0: RinglogAdapter,
) -> None:
    rig = PoolRig()
    fw = Forwarder(h0, rig.pool.send_to_core, lambda d, fn: None)
    replies: list[object] = []
    fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=1)), replies.append)
    fw.forward(h0.handle(frame_of(m.FetchRequest(1, partition_of(1), 0, 1024, 5000), cid=2)), replies.append)
    assert len(rig.opened) == 2 and not replies  # connected (into the backlog): nobody answers
    # Core 1's worker dies: its connections still sit in the listener's backlog (the supervisor
    # holds it), so the watch must notice the liveness table, not a closed socket.
    rig.up[1] = False
    rig.advance(PEER_WATCH_S)
    assert sorted(decoded(r)[0] for r in replies) == [1, 2]
    assert all(decoded(r)[1].error == m.ErrorCode.NOT_OWNER for r in replies)
    assert all(ch.closed for ch in rig.opened) and not rig.pool.channels
    # While it is down, a forward is answered at once, without a connection.
    fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=3)), replies.append)
    assert decoded(replies[-1])[0] == 3 and len(rig.opened) == 2
    assert decoded(replies[-1])[1].error == m.ErrorCode.NOT_OWNER and fw.pending == 0
    rig.up[1] = True  # back: forwards go out again
    fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=4)), replies.append)
    assert len(rig.opened) == 3 and len(replies) == 3


def test_forwards_queued_behind_the_limit_all_fail_at_once_when_the_peer_goes_down(
    h0: RinglogAdapter,
) -> None:
    """Each queued forward then fails inside the one before it's answer: no recursion per request."""
    rig = PoolRig()
    fw = Forwarder(h0, rig.pool.send_to_core, lambda d, fn: None, inflight_max=1)
    replies: list[object] = []
    for cid in range(5000):
        fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=cid)), replies.append)
    assert fw.pending == 5000 and not replies
    rig.up[1] = False
    rig.advance(PEER_WATCH_S)
    assert [decoded(r)[0] for r in replies] == list(range(5000)) and fw.pending == 0
    assert {decoded(r)[1].error for r in replies} == {m.ErrorCode.NOT_OWNER}


def test_peer_pool_deadline_answers_request_timed_out_and_a_long_poll_gets_its_max_wait_first(
    h0: RinglogAdapter,
) -> None:
    rig = PoolRig(timeout_s=1.0)
    fw = Forwarder(h0, rig.pool.send_to_core, lambda d, fn: None)
    replies: list[object] = []
    fw.forward(h0.handle(frame_of(m.FetchRequest(1, partition_of(1), 0, 1024, 5000), cid=1)), replies.append)
    fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=2)), replies.append)
    rig.advance(0.5)
    assert not replies
    rig.advance(0.6)  # the ordinary forward is 1.1 s old: its connection is given up
    assert [decoded(r)[0] for r in replies] == [2]
    assert decoded(replies[0])[1].error == m.ErrorCode.REQUEST_TIMED_OUT
    assert decoded(replies[0])[1].error.retriable
    rig.advance(4.0)  # the long poll may be held for its 5 s max_wait, and then some
    assert len(replies) == 1
    rig.advance(1.0)
    assert [decoded(r)[0] for r in replies] == [2, 1]
    assert decoded(replies[1])[1].error == m.ErrorCode.REQUEST_TIMED_OUT
    assert not rig.timers  # nothing pending: the watch stops


def test_peer_pool_watch_leaves_answered_forwards_alone(h0: RinglogAdapter) -> None:
    rig = PoolRig(timeout_s=1.0)
    fw = Forwarder(h0, rig.pool.send_to_core, lambda d, fn: None)
    replies: list[object] = []
    fw.forward(h0.handle(frame_of(m.ListOffsetsRequest(1, partition_of(1)), cid=7)), replies.append)
    (ch,) = rig.opened
    ch.link.receive(answer_bytes(ch.sent[0], m.ListOffsetsResponse(offset=3)))
    rig.advance(5.0)
    assert [decoded(r) for r in replies] == [(7, m.ListOffsetsResponse(offset=3))]
    assert not ch.closed and rig.pool.channels == {ch}
