"""ReplicaFetch: a follower's fetch, from its leader, of every partition it follows on this core.

Rules this module keeps:
- Per partition, one door of `Partition` (`read_for_follower`): a diverging epoch (KIP-320) is
  answered instead of records, for the follower to truncate; otherwise the fetch offset is the
  follower's log end, which the leader takes (it may advance the high watermark, answering acks=all
  produces), and the batches from it are read up to the log end: a follower reads past the high
  watermark, a consumer never does.
- The high watermark each partition answers is the one at the answer, not at the request: this
  fetch may move it. A fetch below the log start is OFFSET_OUT_OF_RANGE with the log start, where
  the follower may start over; any other error is that partition's alone.
- The fetch reads within the request's max_bytes (at most `FETCH_MAX_BYTES_MAX`), as Kafka's
  follower fetch does (broker/core/read_budget.py: the first batch of the first partition with
  records whole, then what fits). When nothing is there it waits like Fetch, on all its
  partitions, at most `FETCH_WAIT_MS_MAX`, but for their log ends only (`Wait.log_end`): a high
  watermark moved by another follower's fetch does not wake it (it would find nothing new).
  Woken by an append, it is handled again as `woken`: it reads, its position already counted.
- An answer with one partition's records is that read's own outcome (no `Gather`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.core.errors import error_of
from broker.core.limits import FETCH_MAX_BYTES_MAX, FETCH_WAIT_MS_MAX
from broker.core.outcomes import Gather, Outcome, Read, Reply, Wait
from broker.core.partition import Diverging, Partition, PendingRead
from broker.core.read_budget import ReadBudget
from broker.ringlog.context import Context
from broker.storage.errors import OffsetOutOfRangeError
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Buffer, Frame

log = logging.getLogger("broker.ringlog.adapter")  # the adapter's lines, as before this module was apart


def replica_fetch(ctx: Context, req: m.Request, frame: Frame, woken: bool = False) -> Outcome:
    """A follower's fetch of every partition it follows on this core (module rules); `woken`,
    the same fetch again, parked and woken by an append (`Partition.read_for_follower` says
    what it skips)."""
    assert isinstance(req, m.ReplicaFetchRequest)
    if req.max_bytes <= 0 or req.max_wait_ms < 0:
        raise ValueError(f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})")
    now = now_ms()
    results: list[m.ReplicaFetchPartitionData] = []
    parts: list[Outcome] = []
    ours: list[Partition] = []
    budget = ReadBudget(min(req.max_bytes, FETCH_MAX_BYTES_MAX))
    readable = 0
    for i, fp in enumerate(req.partitions):
        tid, index = fp.topic_id, fp.partition
        try:
            p = ctx.core.partition_by_id(tid, index)
            limit = budget.limit(FETCH_MAX_BYTES_MAX)
            read = p.read_for_follower(
                req.replica_node,
                fp.fetch_offset,
                fp.last_fetched_epoch,
                fp.current_leader_epoch,
                limit,
                now,
                woken,
            )
        except OffsetOutOfRangeError as exc:  # where the follower may start over, if below
            log.info("replica fetch of %d/%d by node %d: %s", tid, index, req.replica_node, exc)
            results.append(
                m.ReplicaFetchPartitionData(
                    tid, index, m.ErrorCode.OFFSET_OUT_OF_RANGE, p.high_watermark, p.log_start_offset
                )
            )
            continue
        except Exception as exc:
            results.append(m.ReplicaFetchPartitionData(tid, index, error_of(exc)[0]))
            continue
        if isinstance(read, Diverging):
            results.append(
                m.ReplicaFetchPartitionData(
                    tid, index, m.ErrorCode.NONE, p.high_watermark, p.log_start_offset, *read
                )
            )
            continue
        # the high watermark is the one at the answer: this fetch may move it
        results.append(m.ReplicaFetchPartitionData(tid, index, m.ErrorCode.NONE, -1, p.log_start_offset))
        ours.append(p)
        read = budget.take(read, limit)
        if read.extent is not None:
            readable += read.extent.length
            parts.append(_replica_read(read, results, i))

    def answer() -> Reply:
        final = tuple(
            r
            if r.error != m.ErrorCode.NONE or r.high_watermark != -1
            else m.ReplicaFetchPartitionData(
                r.topic_id,
                r.partition,
                r.error,
                _hw_of(ctx, r.topic_id, r.partition),
                r.log_start_offset,
                r.diverging_epoch,
                r.diverging_end_offset,
                r.records,
            )
            for r in results
        )
        return ctx.reply(frame, m.ReplicaFetchResponse(partitions=final))

    enough = budget.full or readable >= max(1, req.min_bytes) or req.min_bytes <= 0
    if not enough and ours and len(results) == len(ours) and req.max_wait_ms > 0:
        deadline = now + min(req.max_wait_ms, FETCH_WAIT_MS_MAX)
        if not parts:
            again = ctx.again(_woken, req, frame)
            return Wait(tuple(ours), frame, deadline, answer, again, log_end=True)
    if not parts:
        return answer()
    if len(parts) == 1:  # the usual answer, one partition's records: the read answers it all
        return _answering(parts[0], answer)
    return Gather(parts, answer)


def _woken(ctx: Context, req: m.Request, frame: Frame) -> Outcome:
    """`replica_fetch` of a parked fetch that an append woke (its `Wait.again`)."""
    return replica_fetch(ctx, req, frame, woken=True)


def _answering(part: Outcome, answer: Callable[[], Reply]) -> Read:
    """The one read of an answer as the request's own outcome: the read's finish (or failure)
    records its partition's result, then makes the whole answer, with no `Gather` around one part
    (its part slot, its placeholder reply, its second fill), which every acks=all record costs
    the leader once per follower."""
    assert isinstance(part, Read) and part.fail is not None
    read_finish, read_fail = part.finish, part.fail

    def finish(data: Buffer) -> Reply:
        read_finish(data)
        return answer()

    def fail(exc: BaseException) -> Reply:
        read_fail(exc)
        return answer()

    return Read(part.extent, finish, fail)


def _hw_of(ctx: Context, topic_id: int, index: int) -> int:
    p = ctx.core.partitions.get((topic_id, index))
    return -1 if p is None else p.high_watermark


def _replica_read(read: PendingRead, results: list[m.ReplicaFetchPartitionData], i: int) -> Read:
    assert read.extent is not None

    def finish(data: Buffer) -> Reply:
        found = read.finish(data)
        r = results[i]
        results[i] = m.ReplicaFetchPartitionData(
            r.topic_id, r.partition, r.error, -1, found.log_start_offset, records=found.records
        )
        return Reply([])

    def fail(exc: BaseException) -> Reply:
        r = results[i]
        results[i] = m.ReplicaFetchPartitionData(r.topic_id, r.partition, error_of(exc)[0])
        return Reply([])

    return Read(read.extent, finish, fail)
