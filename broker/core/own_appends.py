"""The appends a core makes itself, with no client to answer: a transaction coordinator's state
records (broker/core/transactions.py), its markers (broker/core/txn_markers.py) and the aborts of
hanging transactions (broker/core/txn_sweep.py).

Rules this module keeps:
- Each is prepared through the partition's door (`Partition.produce`, `Partition.write_marker`),
  so it is ordered, sequenced and published as a client's append, and carried out by the
  backend's `run_own_append` (broker/backends/appends.py), in order with the partition's other
  appends.
- Its caller hears one thing once: None when it is written (what its `waits` names happened),
  else the first failure, after the append's sequences were released (`PendingProduce.fail`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.core.outcomes import Append, Reply, Silent

if TYPE_CHECKING:
    from broker.core.partition import Partition, PendingProduce

# the backend's `run_own_append`: carry out the append, then `done(answer)`
OwnAppend = Callable[[Append, Callable[[Reply | Silent], None]], None]


def append_own(
    own_append: OwnAppend,
    partition: Partition,
    produced: PendingProduce,
    done: Callable[[BaseException | None], None],
) -> None:
    """Carry out `produced`, prepared in `partition`, as the core's own append; `done(None)` once
    written, `done(exc)` with the first failure."""
    failed: list[BaseException] = []

    def fail(exc: BaseException) -> Silent:
        produced.fail()
        failed.append(exc)
        return Silent()

    def delivered(_answer: Reply | Silent) -> None:
        done(failed[0] if failed else None)

    own_append(
        Append(partition, produced.pending, produced.waits, produced.complete, Silent, fail), delivered
    )
