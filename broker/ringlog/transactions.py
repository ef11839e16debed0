"""Our protocol's transaction APIs: a transactional producer's INIT_PRODUCER_ID,
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN and TXN_OFFSET_COMMIT, and WRITE_TXN_MARKERS
between brokers' cores.

Rules this module keeps:
- The producer's APIs are the Kafka adapter's (broker/kafka/transactions.py) over the same
  protocol-neutral coordinator (`Core.transactions`): `ready` first (NOT_COORDINATOR, loading),
  then the coordinator's call, answered once its change is durable (`Later`). The adapter sends
  each to the core coordinating its transactional id before it gets here
  (broker/ringlog/adapter.py), so NOT_COORDINATOR (NOT_OWNER in our codes) is seen only while
  cores disagree. Our protocol has no find-coordinator, so a clustered node refuses our
  producer's transactions (Kafka clients' are served there).
- The coordinator's `TxnCode`s are answered in our codes (`_TXN_CODES`); our protocol is new,
  so PRODUCER_FENCED is always said as such (Kafka downgrades it for old versions).
- ADD_PARTITIONS_TO_TXN names topic ids: an unknown one, or the internal state topic, refuses
  the whole request with nothing added (Kafka answers per partition; ours has one error).
- TXN_OFFSET_COMMIT is a group request, on the group's coordinator core (routed by its `group`
  field as OffsetCommit is): checked as a commit is (KIP-447: a member of an old generation is
  ILLEGAL_GENERATION; none named, -1: stored whatever the members), then kept pending for the
  producer in the group's store until the transaction's marker (broker/core/groups.py).
- WRITE_TXN_MARKERS: a transaction coordinator on another core, of this node or (in a cluster)
  of another, asks this core to write one transaction's markers to the partitions and groups
  it leads (broker/core/txn_markers.py `write_local`, the same writes the coordinator makes on
  its own core); the answer, NONE, leaves once each is written or dropped, NOT_OWNER when any
  is not led here (any more): the coordinator routes those again. A client's is refused before
  it gets here (broker/ringlog/adapter.py: on one node it comes from peer cores only; in a
  cluster from the nodes' links, which need the cluster's alter where ACLs are on, as
  REPLICA_FETCH).
- FIND_HELD_TXNS: the hanging-transaction sweep of another core, of this node or (in a cluster)
  of another, asks whether this core's coordinator holds transactions open
  (broker/core/txn_sweep.py `holds`), and which state partitions it has loaded; it answers at
  once, or REQUEST_TIMED_OUT when it cannot tell yet. A client's is refused as WRITE_TXN_MARKERS
  is (on one node it comes from peer cores only; in a cluster from the nodes' links, which need
  the cluster's alter where ACLs are on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.core.coordinator import GroupCode
from broker.core.groups import OFFSET_METADATA_MAX, Committed, StaleProducerEpoch, check_group
from broker.core.outcomes import Later, Outcome, Reply, Silent
from broker.core.transactions import is_internal
from broker.core.txn_coordinator import Done, InitResult, MarkerRequest, TxnCode
from broker.core.txn_sweep import holds
from broker.ringlog.context import Context
from broker.ringlog.groups import group_error
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame

E = m.ErrorCode
_TXN_CODES: dict[TxnCode, m.ErrorCode] = {
    TxnCode.NONE: E.NONE,
    TxnCode.INVALID_REQUEST: E.INVALID_REQUEST,
    TxnCode.INVALID_TRANSACTION_TIMEOUT: E.INVALID_TRANSACTION_TIMEOUT,
    TxnCode.CONCURRENT_TRANSACTIONS: E.CONCURRENT_TRANSACTIONS,
    TxnCode.PRODUCER_FENCED: E.PRODUCER_FENCED,
    TxnCode.INVALID_PRODUCER_EPOCH: E.INVALID_PRODUCER_EPOCH,
    TxnCode.INVALID_PRODUCER_ID_MAPPING: E.INVALID_PRODUCER_ID_MAPPING,
    TxnCode.INVALID_TXN_STATE: E.INVALID_TXN_STATE,
    TxnCode.NOT_COORDINATOR: E.NOT_OWNER,
    TxnCode.COORDINATOR_LOAD_IN_PROGRESS: E.COORDINATOR_NOT_AVAILABLE,
    TxnCode.COORDINATOR_NOT_AVAILABLE: E.COORDINATOR_NOT_AVAILABLE,
    TxnCode.TRANSACTIONAL_ID_NOT_FOUND: E.INVALID_REQUEST,
    TxnCode.LIMIT_EXCEEDED: E.LIMIT_EXCEEDED,
    TxnCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def refusal(core: Any) -> str | None:
    """Why this node serves none of our producer's transactions (module rules), or None."""
    if core.config.cluster is not None:
        return (
            "ringlog's own protocol serves transactions on a single node only: this node is in a "
            "cluster, where a transaction's coordinator may be another node (Kafka clients' "
            "transactions are served here)"
        )
    return None


def _refused(ctx: Context, frame: Frame, txn_id: str, code: TxnCode) -> Reply:
    if code is TxnCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return ctx.error(frame, _TXN_CODES[code], refusal(ctx.core) or "not allowed")
    return ctx.error(frame, _TXN_CODES[code], f"transactional id {txn_id!r}: {code.value}")


def _not_ready(ctx: Context, frame: Frame, txn_id: str) -> Reply | None:
    """The refusal of a producer's request for `txn_id` while this node serves none (`refusal`)
    or its coordinator cannot take it now (`ready`), or None."""
    if (why := refusal(ctx.core)) is not None:
        return ctx.error(frame, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, why)
    ready = ctx.core.transactions.ready(txn_id)
    if ready is not TxnCode.NONE:
        return _refused(ctx, frame, txn_id, ready)
    return None


def _coordinator_later(
    ctx: Context, frame: Frame, txn_id: str, ok: m.Response, call: Callable[[Done], None]
) -> Later:
    """`call(done)` on the coordinator, answered `ok` (or its refusal) once the change is durable."""

    def answer(code: TxnCode) -> Reply:
        return ctx.reply(frame, ok) if code is TxnCode.NONE else _refused(ctx, frame, txn_id, code)

    return Later(lambda send: call(lambda code: send(answer(code))))


def init_producer_id(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.InitProducerIdRequest)
    transactions = ctx.core.transactions
    if (refused := _not_ready(ctx, frame, req.txn_id)) is not None:
        return refused
    expected = (req.producer_id, req.producer_epoch) if req.producer_id >= 0 else None

    def answer(result: InitResult) -> Reply:
        if result.code is not TxnCode.NONE:
            return _refused(ctx, frame, req.txn_id, result.code)
        resp = m.InitProducerIdResponse(producer_id=result.producer_id, producer_epoch=result.producer_epoch)
        return ctx.reply(frame, resp)

    def start(send: Callable[[Reply | Silent], None]) -> None:
        transactions.coordinator.init_producer_id(
            req.txn_id, req.timeout_ms, lambda result: send(answer(result)), expected=expected
        )

    return Later(start)


def add_partitions_to_txn(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.AddPartitionsToTxnRequest)
    core = ctx.core
    if (refused := _not_ready(ctx, frame, req.txn_id)) is not None:
        return refused
    for topic_id, partition in req.partitions:
        name = core.topic_of(topic_id, partition).name  # UNKNOWN_TOPIC_OR_PARTITION when it is not
        if is_internal(name):
            return ctx.error(frame, E.INVALID_TOPIC, f"{name} cannot join a transaction")
    return _coordinator_later(
        ctx,
        frame,
        req.txn_id,
        m.AddPartitionsToTxnResponse(),
        lambda done: core.transactions.coordinator.add_partitions(
            req.txn_id, req.producer_id, req.producer_epoch, set(req.partitions), done
        ),
    )


def add_offsets_to_txn(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.AddOffsetsToTxnRequest)
    check_group(req.group_id)
    if (refused := _not_ready(ctx, frame, req.txn_id)) is not None:
        return refused
    return _coordinator_later(
        ctx,
        frame,
        req.txn_id,
        m.AddOffsetsToTxnResponse(),
        lambda done: ctx.core.transactions.coordinator.add_offsets(
            req.txn_id, req.producer_id, req.producer_epoch, req.group_id, done
        ),
    )


def end_txn(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.EndTxnRequest)
    if (refused := _not_ready(ctx, frame, req.txn_id)) is not None:
        return refused
    return _coordinator_later(
        ctx,
        frame,
        req.txn_id,
        m.EndTxnResponse(),
        lambda done: ctx.core.transactions.coordinator.end_txn(
            req.txn_id, req.producer_id, req.producer_epoch, req.commit, done
        ),
    )


def txn_offset_commit(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.TxnOffsetCommitRequest)
    core = ctx.core
    check_group(req.group)
    if (why := refusal(core)) is not None:
        return ctx.error(frame, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, why)
    offsets: dict[tuple[int, int], Committed] = {}
    for topic_id, partition, offset, metadata in req.offsets:
        core.topic_of(topic_id, partition)
        if offset < 0:
            raise ValueError(f"cannot commit negative offset {offset}")
        if len(metadata) > OFFSET_METADATA_MAX:
            return ctx.error(
                frame,
                E.LIMIT_EXCEEDED,
                f"offset metadata of {len(metadata)} characters: at most {OFFSET_METADATA_MAX}",
            )
        offsets[(topic_id, partition)] = Committed(offset, metadata)
    if offsets:
        core.space.check_writable()

    def start(answer: Callable[[Reply | Silent], None]) -> None:
        try:
            code = core.coordinator.commit_check(
                req.group, req.generation, req.member_id, None, transactional=True
            )
        except Exception as exc:  # an error answer, as in the adapter's `handle`
            answer(ctx.error_reply(frame, exc))
            return
        if code != GroupCode.NONE:
            answer(group_error(ctx, frame, req.group, code))
            return
        if not offsets:
            answer(ctx.reply(frame, m.TxnOffsetCommitResponse()))
            return
        live = frozenset(core.registry.by_id).__contains__

        def stored(result: object) -> None:
            if isinstance(result, StaleProducerEpoch):
                answer(ctx.error(frame, E.INVALID_PRODUCER_EPOCH, str(result)))
            elif isinstance(result, BaseException):  # the store's write failed
                answer(ctx.error_reply(frame, result))
            else:
                core.coordinator.offsets_exist(req.group)
                answer(ctx.reply(frame, m.TxnOffsetCommitResponse()))

        store = core.coordinator.offsets
        core.offsets_run(
            lambda: store.commit_pending(req.group, req.producer_id, req.producer_epoch, offsets, live),
            stored,
        )

    return Later(start)


def write_txn_markers(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.WriteTxnMarkersRequest)
    request = MarkerRequest(
        req.txn_id,
        req.producer_id,
        req.producer_epoch,
        req.coordinator_epoch,
        req.commit,
        frozenset(req.partitions),
        frozenset(req.groups),
    )

    def start(answer: Callable[[Reply | Silent], None]) -> None:
        def written(all_here: bool) -> None:
            if all_here:
                answer(ctx.reply(frame, m.WriteTxnMarkersResponse()))
            else:
                answer(ctx.error(frame, m.ErrorCode.NOT_OWNER, "a partition is not led here"))

        ctx.core.transactions.markers.write_local(request, list(req.partitions), list(req.groups), written)

    return Later(start)


def find_held_txns(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    assert isinstance(req, m.FindHeldTxnsRequest)
    held = holds(ctx.core, req.questions)
    if held is None:
        return ctx.error(frame, m.ErrorCode.REQUEST_TIMED_OUT, "transaction state not loaded yet")
    loaded = tuple(ctx.core.transactions.coordinator.loaded())
    return ctx.reply(frame, m.FindHeldTxnsResponse(held=tuple(held), loaded=loaded))
