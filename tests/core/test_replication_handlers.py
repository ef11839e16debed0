"""Replication between two cores' request handlers in one process: a leader and a follower, each
with its own data dir, exchanging ReplicaFetch frames through `RinglogAdapter.handle`, the outcomes
carried out here synchronously as a backend would (broker/backends/backend_core.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from broker.core import partition as partition_module
from broker.core.acks import Waits
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.outcomes import Append, Gather, Later, Outcome, Read, Reply, Silent, Wait
from broker.core.partition import Partition
from broker.core.producer_state import PredecessorPendingError
from broker.core.replica_fetcher import ReplicaFetcher
from broker.kafka.errors import kafka_error
from broker.kafka.leader_epoch import epoch_end
from broker.ringlog.adapter import RinglogAdapter
from broker.storage.fileio import SyncFileIO, run_ops
from broker.storage.log import LogConfig
from ringlog_proto import messages as m
from ringlog_proto.batch import encode_batch, read_header
from ringlog_proto.frames import Frame, FrameDecoder

IO = SyncFileIO()
NOW = 1_000


def frame_of(req: m.Request, cid: int = 1) -> Frame:
    return m.request_frame(req, cid)


def decoded(reply: Reply) -> m.Response:
    d = FrameDecoder()
    d.feed(b"".join(reply.buffers))
    return m.decode_response(d.next_frame())


def carry_out(outcome: Outcome, answers: list[Reply]) -> Wait | None:
    """What a backend does with `outcome`, synchronously; replies land in `answers` (acks=all
    ones when the high watermark passes them). Returns a Wait instead of parking it."""
    match outcome:
        case Reply():
            answers.append(outcome)
        case Silent():
            pass
        case Append():
            run_ops(IO, outcome.pending.ops)
            reply = outcome.complete()
            p = outcome.partition
            if outcome.waits is Waits.HIGH_WATERMARK:
                p.after_replicated(
                    outcome.pending.next_offset,
                    lambda: answers.append(reply),  # type: ignore[arg-type]
                    lambda exc: answers.append(outcome.fail(exc)),  # type: ignore[arg-type]
                )
            elif isinstance(reply, Reply):
                answers.append(reply)
        case Read():
            e = outcome.extent
            answers.append(outcome.finish(os.pread(e.segment.store_fd, e.length, e.position)))
        case Gather():
            ignored: list[Reply] = []
            for part in outcome.parts:
                assert carry_out(part, ignored) is None
            finished = outcome.finish()
            if isinstance(finished, Reply):
                answers.append(finished)
        case Later():
            outcome.start(answers.append)  # type: ignore[arg-type]
        case Wait():
            return outcome
        case _:
            raise AssertionError(outcome)
    return None


def ask(h: RinglogAdapter, req: m.Request) -> m.Response:
    answers: list[Reply] = []
    assert carry_out(h.handle(frame_of(req)), answers) is None
    (reply,) = answers
    return decoded(reply)


class Node:
    """One broker core of the test cluster: its handlers and its fetcher towards the leader."""

    def __init__(self, node_id: int, data_dir: Path) -> None:
        self.node_id = node_id
        self.handlers = RinglogAdapter(Core(BrokerConfig(data_dir=str(data_dir))))
        self.fetcher = ReplicaFetcher(node_id, max_wait_ms=0)
        resp = ask(self.handlers, m.CreateTopicRequest("t", 1))
        assert isinstance(resp, m.CreateTopicResponse)
        self.topic_id = resp.topic_id

    @property
    def partition(self) -> Partition:
        p = self.handlers.core.partition_named("t", 0)
        assert isinstance(p, Partition)
        return p

    def lead(self, epoch: int, replicas: tuple[int, ...], isr: tuple[int, ...]) -> None:
        self.partition.become_leader(epoch, replicas, isr, self.node_id, now=NOW)
        self.fetcher.remove(self.topic_id, 0)

    def follow(self, epoch: int, leader: int) -> None:
        self.partition.become_follower(epoch, leader)
        self.fetcher.add(self.partition)

    def produce(
        self, value: bytes, acks: int = m.Acks.WRITTEN, answers: list[Reply] | None = None
    ) -> Outcome:
        batch = encode_batch([value])
        outcome = self.handlers.handle(frame_of(m.ProduceRequest(self.topic_id, 0, acks, 1000, batch)))
        carry_out(outcome, [] if answers is None else answers)
        return outcome

    def fetch_from(self, leader: Node) -> m.ReplicaFetchResponse:
        """One round of this follower's fetching: request, the leader's answer, applied here."""
        req = self.fetcher.request(NOW)
        assert req is not None
        answers: list[Reply] = []
        assert carry_out(leader.handlers.handle(frame_of(req)), answers) is None
        (reply,) = answers
        resp = decoded(reply)
        assert isinstance(resp, m.ReplicaFetchResponse)
        applied = self.fetcher.apply(resp, NOW)
        assert not applied.errors, applied.errors
        for append in applied.appends:
            run_ops(IO, append.pending.ops)
            append.complete()
        return resp

    def stored(self) -> bytes:
        log_ = self.partition.log
        return log_.read(log_.start_offset, 1 << 20).data if log_.end_offset > log_.start_offset else b""

    def close(self) -> None:
        self.handlers.core.close()


@pytest.fixture
def pair(tmp_path: Path):
    a, b = Node(1, tmp_path / "a"), Node(2, tmp_path / "b")
    assert a.topic_id == b.topic_id
    a.lead(1, (1, 2), (1, 2))
    b.follow(1, leader=1)
    yield a, b
    a.close()
    b.close()


def test_produced_batches_reach_the_follower_byte_for_byte_and_move_the_hw(pair: tuple[Node, Node]) -> None:
    a, b = pair
    for v in (b"one", b"two", b"three"):
        a.produce(v)
    assert a.partition.high_watermark == 0
    resp = b.fetch_from(a)
    assert resp.partitions[0].high_watermark == 0, "the follower's fetch at 0 says it has nothing"
    assert b.stored() == a.stored() and len(a.stored()) > 0
    assert [read_header(b.stored()).partition_leader_epoch] == [1]
    assert a.partition.high_watermark == 0
    resp = b.fetch_from(a)  # at 3: it has everything
    assert a.partition.high_watermark == 3
    assert resp.partitions[0].high_watermark == 3 and b.partition.high_watermark == 3
    assert b.partition.epochs.entries() == [(1, 0)]


def test_consumers_read_below_the_high_watermark_only(pair: tuple[Node, Node]) -> None:
    a, b = pair
    a.produce(b"x")
    a.produce(b"y")
    fetch = m.FetchRequest(a.topic_id, 0, offset=0, max_wait_ms=0)
    resp = ask(a.handlers, fetch)
    assert isinstance(resp, m.FetchResponse) and (resp.records, resp.high_watermark) == (b"", 0)
    latest = ask(a.handlers, m.ListOffsetsRequest(a.topic_id, 0, m.OffsetSpec.LATEST))
    assert isinstance(latest, m.ListOffsetsResponse) and latest.offset == 0
    b.fetch_from(a)
    a.partition.replica_fetched(2, 1, NOW)  # the follower reported offset 1 only: HW 1
    resp = ask(a.handlers, fetch)
    assert isinstance(resp, m.FetchResponse) and resp.high_watermark == 1
    assert read_header(resp.records).next_offset == 1 and len(resp.records) == read_header(resp.records).size
    b.fetch_from(a)
    resp = ask(a.handlers, fetch)
    assert isinstance(resp, m.FetchResponse) and resp.high_watermark == 2
    assert resp.records == a.stored()
    refused = ask(b.handlers, m.FetchRequest(b.topic_id, 0, offset=0))
    assert refused.error == m.ErrorCode.NOT_OWNER, "a follower serves no consumer"


def test_acks_all_is_answered_once_the_follower_fetched_past_it(pair: tuple[Node, Node]) -> None:
    a, b = pair
    answers: list[Reply] = []
    outcome = a.produce(b"important", m.Acks.ALL, answers)
    assert isinstance(outcome, Append) and answers == []
    b.fetch_from(a)  # takes the batch, but its fetch offset (0) does not cover it yet
    assert answers == []
    b.fetch_from(a)
    (reply,) = answers
    resp = decoded(reply)
    assert isinstance(resp, m.ProduceResponse) and (resp.base_offset, resp.end_offset) == (0, 1)


def test_acks_all_needs_min_insync_replicas_and_a_leader(pair: tuple[Node, Node]) -> None:
    a, b = pair
    a.partition.update_isr((1,))  # the follower left the ISR
    outcome = a.produce(b"x", m.Acks.ALL)
    assert isinstance(outcome, Reply)
    assert decoded(outcome).error == m.ErrorCode.NOT_ENOUGH_REPLICAS
    assert a.partition.log.end_offset == 0, "nothing was stored"
    assert isinstance(a.produce(b"x", m.Acks.WRITTEN), Append), "acks=1 still goes"
    to_follower = b.produce(b"x")
    assert isinstance(to_follower, Reply) and decoded(to_follower).error == m.ErrorCode.NOT_OWNER
    stale = frame_of(
        m.ReplicaFetchRequest(2, 0, 1, 1 << 20, (m.ReplicaFetchPartition(a.topic_id, 0, 0, -1, 0),))
    )
    answers: list[Reply] = []
    carry_out(a.handlers.handle(stale), answers)
    resp = decoded(answers[0])
    assert isinstance(resp, m.ReplicaFetchResponse)
    assert resp.partitions[0].error == m.ErrorCode.NOT_OWNER, "a fetch at another leader epoch"


def test_a_replica_fetch_with_nothing_new_waits_on_its_partitions(pair: tuple[Node, Node]) -> None:
    a, b = pair
    b.fetcher.max_wait_ms = 500
    req = b.fetcher.request(NOW)
    assert req is not None
    outcome = a.handlers.handle(frame_of(req))
    assert isinstance(outcome, Wait) and outcome.partitions == (a.partition,)
    answers: list[Reply] = []
    carry_out(outcome.on_timeout(), answers)
    resp = decoded(answers[0])
    assert isinstance(resp, m.ReplicaFetchResponse) and resp.partitions[0].records == b""
    a.produce(b"x")
    again = a.handlers.handle(outcome.frame)  # what the backend does when the partition grows
    assert isinstance(again, Read | Gather)


def test_a_woken_replica_fetch_only_reads(pair: tuple[Node, Node]) -> None:
    """What the backend calls when an append wakes a parked follower's fetch (`Wait.again`): the
    one read is the request's own outcome, and it answers the new record with the high watermark
    at the answer. The follower's position is not counted again (it was when the fetch came): one
    the ISR dropped meanwhile is counted by its next fetch. A leader that stepped down answers
    NOT_OWNER, woken or not."""
    a, b = pair
    a.produce(b"x")
    b.fetch_from(a)
    b.fetch_from(a)  # at 1, the HW at 1
    b.fetcher.max_wait_ms = 500
    req = b.fetcher.request(NOW)
    assert req is not None
    parked = a.handlers.handle(frame_of(req))
    assert isinstance(parked, Wait) and parked.log_end and parked.again is not None
    replica = a.partition.replica
    assert replica is not None and replica.followers[b.node_id].log_end == 1
    replica.followers[b.node_id].log_end = -1  # as the ISR's dropping it does (`set_isr`)
    a.produce(b"y")
    woken = parked.again()
    assert isinstance(woken, Read), "one partition's records: no Gather around the read"
    answers: list[Reply] = []
    assert carry_out(woken, answers) is None
    resp = decoded(answers[0])
    assert isinstance(resp, m.ReplicaFetchResponse)
    (part,) = resp.partitions
    assert part.error == m.ErrorCode.NONE and read_header(part.records).base_offset == 1
    assert part.high_watermark == 1
    assert replica.followers[b.node_id].log_end == -1, "the woken fetch did not count b again"
    for append in b.fetcher.apply(resp, NOW).appends:
        run_ops(IO, append.pending.ops)
        append.complete()
    b.fetcher.max_wait_ms = 0
    b.fetch_from(a)  # its next fetch does
    assert replica.followers[b.node_id].log_end == 2
    b.fetcher.max_wait_ms = 500
    req = b.fetcher.request(NOW)
    assert req is not None
    parked = a.handlers.handle(frame_of(req))
    assert isinstance(parked, Wait) and parked.again is not None
    a.partition.become_follower(2, leader=2)
    answers.clear()
    assert carry_out(parked.again(), answers) is None
    resp = decoded(answers[0])
    assert isinstance(resp, m.ReplicaFetchResponse) and resp.partitions[0].error == m.ErrorCode.NOT_OWNER


def truncates_then_catches_up(a: Node, b: Node, epoch: int, end: int) -> None:
    """A fetches from its leader B and is told (KIP-320) that its `epoch` ends at `end`, without
    records; A truncates there, and its next fetch makes its log B's."""
    resp = a.fetch_from(b)
    (part,) = resp.partitions
    assert (part.diverging_epoch, part.diverging_end_offset, part.records) == (epoch, end, b"")
    assert a.partition.log.end_offset == end, "truncated to the end the leader named"
    a.fetch_from(b)
    assert a.stored() == b.stored()


def test_a_divergent_follower_truncates_after_a_leader_change(pair: tuple[Node, Node]) -> None:
    """KIP-101's scenario: A leads epoch 1, writes m1 (replicated) and m2 (not); A fails, B leads
    epoch 2 and writes m3 at m2's offset; A returns as a follower, is told its epoch 1 ends at 1,
    drops m2 and takes m3."""
    a, b = pair
    a.produce(b"m1")
    b.fetch_from(a)
    a.produce(b"m2")  # A alone has it
    b.lead(2, (1, 2), (2,))
    a.follow(2, leader=2)
    b.produce(b"m3")
    assert a.partition.log.end_offset == b.partition.log.end_offset == 2
    truncates_then_catches_up(a, b, 1, 1)  # m2 is gone, m3 taken
    assert a.partition.epochs.entries() == [(1, 0), (2, 1)]
    assert a.partition.end_offset_for_epoch(1) == (1, 1)


def test_a_follower_whose_last_epoch_is_older_than_the_new_leaders_log_truncates(
    pair: tuple[Node, Node],
) -> None:
    """A leads epoch 1 and writes m1 before B (empty) took any of it; B leads epoch 2, where its
    log starts, and takes m1 again from the producer's retry with acks=all. A's epoch 1 is older
    than every epoch B knows: B answers it ends at B's first epoch's start (Kafka's rule), A drops
    its m1 and takes B's. It was answered (-1, -1), which says no divergence: A fetched at 1 past
    B's m1 forever, never counted, and the acks=all produce waited until A left the ISR (seen in
    CI: a transactional produce timed out after its leader moved back to a restarted node)."""
    a, b = pair
    a.produce(b"m1")  # A alone has it, at epoch 1
    b.lead(2, (1, 2), (1, 2))
    a.follow(2, leader=2)
    answers: list[Reply] = []
    b.produce(b"m1", m.Acks.ALL, answers)
    assert a.partition.log.end_offset == b.partition.log.end_offset == 1
    assert b.partition.epochs.entries() == [(2, 0)]
    truncates_then_catches_up(a, b, 1, 0)  # A's m1 of epoch 1 is gone, B's taken
    assert a.partition.epochs.entries() == [(2, 0)]
    assert answers == []
    a.fetch_from(b)  # at 1: B's m1 is on both
    (reply,) = answers
    resp = decoded(reply)
    assert isinstance(resp, m.ProduceResponse) and resp.error == m.ErrorCode.NONE
    assert b.partition.high_watermark == 1


def test_offset_for_leader_epoch_answers_from_the_epoch_history(pair: tuple[Node, Node]) -> None:
    a, b = pair
    a.produce(b"m1")
    b.fetch_from(a)
    b.fetch_from(a)
    b.lead(2, (1, 2), (1, 2))
    a.follow(2, leader=2)
    b.produce(b"m2")
    b.produce(b"m3")
    assert epoch_end(b.handlers.core, "t", 0, -1, 1) == (ErrorCode.none, 1, 1)
    assert epoch_end(b.handlers.core, "t", 0, 2, 2) == (ErrorCode.none, 2, 3)
    assert epoch_end(b.handlers.core, "t", 0, -1, 0) == (ErrorCode.none, 0, 0), "below the first epoch"
    assert epoch_end(b.handlers.core, "t", 0, -1, 3) == (ErrorCode.none, -1, -1), "above ours"
    assert epoch_end(b.handlers.core, "t", 0, 3, 2)[0] == ErrorCode.unknown_leader_epoch
    assert epoch_end(b.handlers.core, "t", 0, 1, 1)[0] == ErrorCode.fenced_leader_epoch
    assert epoch_end(a.handlers.core, "t", 0, -1, 1)[0] == ErrorCode.not_leader_or_follower


def test_a_follower_behind_the_leaders_log_start_starts_over_there(pair: tuple[Node, Node]) -> None:
    a, b = pair
    a.partition.log.config = LogConfig(segment_bytes=400, max_batch_bytes=400, retention_bytes=1)
    for i in range(12):
        a.produce(b"v%d" % i)
    assert a.partition.apply_retention() > 0
    start = a.partition.log.start_offset
    assert start > 0
    b.fetch_from(a)  # offset 0 is gone there
    assert (b.partition.log.start_offset, b.partition.log.end_offset) == (start, start)
    b.fetch_from(a)
    assert b.stored() == a.stored() and b.partition.log.end_offset == 12
    assert b.partition.high_watermark >= start


def test_a_new_leader_answers_a_sequence_gap_retriably_while_its_predecessors_may_follow(
    pair: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idempotent producer's pipeline reaches a follower just as it is made
    leader. s0 (which it holds) and s1 (which it lacks) come while it still follows and are
    refused NOT_OWNER; s2 comes once it leads. Kafka's answer to that gap, OUT_OF_ORDER_SEQUENCE,
    makes librdkafka bump its epoch and resend s0 too: stored twice. A retriable answer lets
    the producer resend s0, s1, s2 in order: s0 recognised, s1 and s2 stored, each once."""
    a, b = pair
    s = [encode_batch([b"s%d" % i], producer_id=7, producer_epoch=0, base_sequence=i) for i in range(5)]

    def send(node: Node, records: bytes) -> m.ProduceResponse:
        answers: list[Reply] = []
        frame = frame_of(m.ProduceRequest(node.topic_id, 0, m.Acks.WRITTEN, 1000, records))
        carry_out(node.handlers.handle(frame), answers)
        (reply,) = answers
        resp = decoded(reply)
        assert isinstance(resp, m.ProduceResponse)
        return resp

    assert send(a, s[0]).error == m.ErrorCode.NONE
    b.fetch_from(a)  # B holds s0
    assert send(a, s[1]).error == m.ErrorCode.NONE  # A alone holds s1, and dies unanswered
    assert send(b, s[0]).error == send(b, s[1]).error == m.ErrorCode.NOT_OWNER
    b.lead(2, (1, 2), (2,))
    gap = send(b, s[2])
    assert gap.error == m.ErrorCode.REQUEST_TIMED_OUT and gap.error.retriable, gap
    pending = PredecessorPendingError("s1 missing")
    assert kafka_error(pending)[0] == ErrorCode.request_timed_out, "librdkafka retries it, in order"
    assert b.partition.log.end_offset == 1, "nothing stored"
    resent = [send(b, s[i]) for i in range(3)]
    assert [(r.error, r.base_offset) for r in resent] == [(m.ErrorCode.NONE, i) for i in range(3)]
    assert b.partition.log.end_offset == 3, "s0 once, then s1 and s2"
    assert send(b, s[4]).error == m.ErrorCode.REQUEST_TIMED_OUT, "a gap early in the term"
    monkeypatch.setattr(partition_module, "SEQUENCE_GAP_GRACE_S", 0.0)
    assert send(b, s[4]).error == m.ErrorCode.OUT_OF_ORDER_SEQUENCE, "later, a gap is a gap (Kafka's answer)"
    assert send(b, s[3]).error == m.ErrorCode.NONE


def test_a_replica_fetch_keeps_its_max_bytes_and_every_partition_gets_a_turn(tmp_path: Path) -> None:
    """The leader fills a ReplicaFetch answer in request order up to its max_bytes (the first
    batch whole, then what fits: Kafka's follower fetch), and the follower puts a partition that
    got records at the back of its next request, so each partition is first in turn."""
    a, b = Node(1, tmp_path / "a"), Node(2, tmp_path / "b")
    try:
        ask(a.handlers, m.CreateTopicRequest("wide", 3))
        ask(b.handlers, m.CreateTopicRequest("wide", 3))
        leaders, followers = [], []
        for index in range(3):
            lp, fp = (
                a.handlers.core.partition_named("wide", index),
                b.handlers.core.partition_named("wide", index),
            )
            assert isinstance(lp, Partition) and isinstance(fp, Partition)
            lp.become_leader(1, (1, 2), (1, 2), 1, now=NOW)
            fp.become_follower(1, 1)
            leaders.append(lp)
            followers.append(fp)
        batch = encode_batch([b"v" * 1000])
        for lp in leaders:
            for _ in range(4):
                carry_out(
                    a.handlers.handle(frame_of(m.ProduceRequest(lp.topic_id, lp.index, 1, 1000, batch))), []
                )
        size = len(batch)
        fetcher = ReplicaFetcher(2, max_wait_ms=0, max_bytes=int(size * 2.5))
        for fp in followers:
            fetcher.add(fp)
        firsts = []
        for _ in range(6):
            req = fetcher.request(NOW)
            assert req is not None
            answers: list[Reply] = []
            assert carry_out(a.handlers.handle(frame_of(req)), answers) is None
            resp = decoded(answers[0])
            assert isinstance(resp, m.ReplicaFetchResponse)
            got = [len(p.records) // size for p in resp.partitions]
            assert sorted(got) == [0, 0, 2], got
            firsts.append(resp.partitions[got.index(2)].partition)
            applied = fetcher.apply(resp, NOW)
            for append in applied.appends:
                run_ops(IO, append.pending.ops)
                append.complete()
        assert firsts == [0, 1, 2, 0, 1, 2], "each partition first in turn"
        assert [fp.log.end_offset for fp in followers] == [4, 4, 4]
    finally:
        a.close()
        b.close()


def test_one_followers_fetch_does_not_wake_the_others_parked_one(tmp_path: Path) -> None:
    """RF 3: follower C's fetch is parked at the leader's log end; follower B's fetch moves the HW,
    which wakes consumers but not C's fetch (it would be handled again for nothing); an append
    does wake it, and so does the leader's stepping down."""
    a, b, c = Node(1, tmp_path / "a"), Node(2, tmp_path / "b"), Node(3, tmp_path / "c")
    try:
        a.lead(1, (1, 2, 3), (1, 2, 3))
        b.follow(1, leader=1)
        c.follow(1, leader=1)
        a.produce(b"x")
        b.fetch_from(a)
        c.fetch_from(a)
        c.fetcher.max_wait_ms = 500
        woken: list[Outcome] = []

        def park_c() -> Wait:
            req = c.fetcher.request(NOW)
            assert req is not None
            outcome = a.handlers.handle(frame_of(req))
            assert isinstance(outcome, Wait) and outcome.log_end
            # as backend_core._park: a follower's fetch waits on the log end only
            a.partition.replica_waiters.append(lambda: woken.append(a.handlers.handle(outcome.frame)))
            return outcome

        park_c()
        consumer: list[int] = []
        a.partition.waiters.append(lambda: consumer.append(1))
        b.fetch_from(a)  # B at 1: the HW moves to 1 (C said 1 in its parked fetch)
        assert a.partition.high_watermark == 1
        assert consumer == [1] and woken == [], "an HW move: consumers woken, C's fetch not"
        a.produce(b"y")
        (again,) = woken
        assert isinstance(again, Read | Gather), "an append wakes it, and it reads"
        woken.clear()
        c.fetch_from(a)  # C takes `y` and parks again at the leader's new end
        park_c()
        a.partition.become_follower(2, leader=2)
        (answered,) = woken
        answers: list[Reply] = []
        assert carry_out(answered, answers) is None
        resp = decoded(answers[0])
        assert isinstance(resp, m.ReplicaFetchResponse)
        assert resp.partitions[0].error == m.ErrorCode.NOT_OWNER, "leadership lost: answered at once"
    finally:
        for n in (a, b, c):
            n.close()


def test_a_leaders_answer_with_a_corrupt_batch_is_refused_by_the_follower(pair: tuple[Node, Node]) -> None:
    """Bytes damaged between the leader's disk and the follower's (its crc no longer matches):
    the follower names the batch and why, writes nothing, and backs off before fetching again."""
    a, b = pair
    a.produce(b"one")
    a.produce(b"two")
    req = b.fetcher.request(NOW)
    assert req is not None
    answers: list[Reply] = []
    carry_out(a.handlers.handle(frame_of(req)), answers)
    resp = decoded(answers[0])
    assert isinstance(resp, m.ReplicaFetchResponse)
    (part,) = resp.partitions
    damaged = bytearray(part.records)
    damaged[-1] ^= 0x01
    bad = m.ReplicaFetchResponse(partitions=(part._replace(records=bytes(damaged)),))
    applied = b.fetcher.apply(bad, NOW)
    assert not applied.appends
    (exc,) = applied.errors.values()
    assert isinstance(exc, Exception) and "crc32c mismatch" in str(exc)
    assert b.partition.log.end_offset == 0 and b.stored() == b""
    assert b.fetcher.request(NOW) is None, "it backs off"


def test_a_replica_moved_away_closes_and_goes_once_no_append_of_it_is_in_flight(tmp_path: Path) -> None:
    """`Core.remove_moved_away` (a reassignment took the replica off this node): an append in
    flight keeps it open, files and all, and it is answered as left for later; once that append
    completed it closes, leaves the core's partitions and its directory goes."""
    node = Node(2, tmp_path / "b")
    try:
        core = node.handlers.core
        p = node.partition
        key = (node.topic_id, 0)
        directory = p.directory
        pending = p.produce(encode_batch([b"in flight"]), core.space)
        assert isinstance(pending, partition_module.PendingProduce)
        assert core.remove_moved_away([key]) == [key]
        assert core.partitions.get(key) is p and os.path.isdir(directory)
        run_ops(IO, pending.pending.ops)
        pending.complete()
        assert core.remove_moved_away([key]) == []
        assert key not in core.partitions and p.log.closed
        assert not os.path.exists(directory)
        assert os.listdir(os.path.dirname(directory)) == []  # nothing set aside left behind
        assert core.remove_moved_away([key]) == []  # gone already: nothing to do
    finally:
        node.handlers.core.close()
