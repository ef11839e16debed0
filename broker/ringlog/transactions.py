"""Our protocol's transaction messages: WRITE_TXN_MARKERS, between brokers' cores only.

Rules this module keeps:
- A transaction coordinator on another core, of this node or (in a cluster) of another, asks
  this core to write one transaction's markers to the partitions and groups it leads
  (broker/core/txn_markers.py `write_local`, the same writes the coordinator makes on its own
  core); the answer, NONE, leaves once each is written or dropped, NOT_OWNER when any is not led
  here (any more): the coordinator routes those again. A client's is refused before it gets
  here (broker/ringlog/adapter.py: on one node it comes from peer cores only; in a cluster
  from the nodes' links, which need the cluster's alter where ACLs are on, as REPLICA_FETCH).
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
        def written(all_here: bool) -> None:
            if all_here:
                answer(ctx.reply(frame, m.WriteTxnMarkersResponse()))
            else:
                answer(ctx.error(frame, m.ErrorCode.NOT_OWNER, "a partition is not led here"))

        ctx.core.transactions.markers.write_local(request, list(req.partitions), list(req.groups), written)

    return Later(start)
