"""Produce, Fetch and ListOffsets of our protocol: the APIs of one partition's records.

Rules this module keeps:
- Each is one door of `Partition` (`produce`, `read`, `list_offset`): the function turns the
  partition's answer, or its exception, into an outcome, and never drives the log or the
  producer state itself.
- They are served on the core that owns the partition: the adapter forwards them there before
  their body is decoded (broker/ringlog/adapter.py).
- acks=0 gets no answer at all, not even an error (docs/PROTOCOL.md §1): an error answer would be
  taken for the reply to the client's next request. A retry of batches already stored is answered
  with their offsets, and waits for what its acks wait for (the core's `stored_reply`).
- A fetch reads at most `FETCH_MAX_BYTES_MAX` and waits at most `FETCH_WAIT_MS_MAX`
  (broker/core/limits.py); with nothing to read it waits on the partition (`Wait`), re-handled
  when it grows or the deadline passes.
- Transactions as Kafka's (KIP-98): a produce naming a transactional id (v2) may carry
  transactional batches (the ACL on the id is checked before, broker/ringlog/access.py; a node
  that serves no transactions refuses it, `broker/ringlog/transactions.py refusal`); a read_committed fetch
  (v2) reads below the last stable offset and is told the aborted transactions its batches
  overlap, and a read_committed ListOffsets' latest is the last stable offset. Every v2 fetch
  answer carries the last stable offset; a v1 request is answered in v1's layout.
"""

from __future__ import annotations

from broker.core.acks import check_acks
from broker.core.limits import FETCH_MAX_BYTES_MAX, FETCH_WAIT_MS_MAX
from broker.core.outcomes import Append, Outcome, Read, Reply, Silent, Wait
from broker.core.partition import Isolation, ReadAnswer, Stored
from broker.ringlog.context import Context
from broker.ringlog.transactions import refusal as txn_refusal
from broker.storage.diskspace import is_out_of_space
from broker.storage.errors import OutOfSpaceError
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Frame


def produce(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.ProduceRequest)
    check_acks(req.acks)  # before the lookup: a bad acks is INVALID_REQUEST whatever the partition
    transactional = req.transactional_id is not None
    if transactional:
        refusal = txn_refusal(ctx.core)
        if refusal is not None:
            if req.acks == m.Acks.NONE:
                return Silent()
            return ctx.error(frame, m.ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refusal)
    p = ctx.core.partition(frame.topic_id, frame.partition)
    try:
        produced = p.produce(req.records, ctx.core.space, req.acks, transactional)
    except OutOfSpaceError:
        if req.acks == m.Acks.NONE:
            return Silent()  # acks=0 gets no answer, not even this one (docs/PROTOCOL.md)
        raise
    if isinstance(produced, Stored):
        # A retry of batches already stored, which the log stands behind: answer with their
        # offsets; a durable retry waits for a flush covering the original, a replicated
        # acks=all retry for the high watermark to pass it.
        if req.acks == m.Acks.NONE:
            return Silent()
        reply = _produced(frame, produced)
        return ctx.core.stored_reply(p, produced, reply, lambda exc: ctx.error_reply(frame, exc))

    def answer() -> Reply | Silent:
        if req.acks == m.Acks.NONE:
            return Silent()
        return _produced(frame, produced.stored())

    def fail(exc: BaseException) -> Reply | Silent:
        produced.fail()
        if is_out_of_space(exc):
            ctx.core.space.saw_full(exc)
        if req.acks == m.Acks.NONE:
            return Silent()
        return ctx.error_reply(frame, exc)

    return Append(p, produced.pending, produced.waits, produced.complete, answer, fail)


def _produced(frame: Frame, stored: Stored) -> Reply:
    return Reply(
        m.encode_produced(
            frame.correlation_id,
            frame.topic_id,
            frame.partition,
            stored.base_offset,
            stored.end_offset,
            stored.log_start_offset,
        )
    )


def fetch(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.FetchRequest)
    if req.max_bytes <= 0 or req.max_wait_ms < 0:
        raise ValueError(f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})")
    p = ctx.core.partition(frame.topic_id, frame.partition)
    isolation = _ISOLATIONS[req.isolation]
    read = p.read(req.offset, min(req.max_bytes, FETCH_MAX_BYTES_MAX), isolation)
    layout = frame.api_version

    def answer(found: ReadAnswer) -> Reply:
        resp = m.FetchResponse(
            high_watermark=found.high_watermark,
            log_start_offset=found.log_start_offset,
            records=found.records,
            last_stable_offset=found.last_stable_offset,
            aborted=tuple((a.producer_id, a.first_offset) for a in found.aborted),
            layout=layout,
        )
        return Reply(
            m.encode_response(resp, frame.correlation_id, None, frame.topic_id, frame.partition, layout)
        )

    if read.extent is not None:
        return Read(read.extent, lambda data: answer(read.finish(data)))
    if req.max_wait_ms == 0:
        return answer(read.nothing())
    deadline = now_ms() + min(req.max_wait_ms, FETCH_WAIT_MS_MAX)
    return Wait((p,), frame, deadline, lambda: answer(read.nothing()), ctx.again(fetch, req, frame))


def list_offsets(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.ListOffsetsRequest)
    p = ctx.core.partition(frame.topic_id, frame.partition)
    offset = p.list_offset(req.spec, isolation=_ISOLATIONS[req.isolation])
    return ctx.reply(frame, m.ListOffsetsResponse(offset=offset))


_ISOLATIONS: dict[int, Isolation] = {
    m.Isolation.READ_UNCOMMITTED: Isolation.HIGH_WATERMARK,
    m.Isolation.READ_COMMITTED: Isolation.LAST_STABLE,
}
