"""Our protocol's transaction messages: WRITE_TXN_MARKERS, between cores of a node only.

Rules this module keeps:
- A transaction coordinator on another core asks this core to write one transaction's markers
  to the partitions and groups it owns (broker/core/txn_markers.py `write_local`, the same
  writes the coordinator makes on its own core); the answer, NONE, leaves once each is written
  or dropped. A client's is refused before it gets here (broker/ringlog/adapter.py).
"""

from __future__ import annotations

from collections.abc import Callable

from broker.core.outcomes import Later, Outcome, Reply, Silent
from broker.core.txn_coordinator import MarkerRequest
from broker.ringlog.context import Context
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame


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
        ctx.core.transactions.markers.write_local(
            request,
            list(req.partitions),
            list(req.groups),
            lambda: answer(ctx.reply(frame, m.WriteTxnMarkersResponse())),
        )

    return Later(start)
