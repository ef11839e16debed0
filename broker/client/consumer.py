"""The consumer: fetch records from assigned partitions, track positions, commit them for a group.

Positions and groups:
- With a `group`, a newly assigned partition starts at the group's committed offset (OffsetFetch),
  else at `auto_offset_reset` ("earliest" or "latest", through ListOffsets). A fetch answered
  OFFSET_OUT_OF_RANGE (the position fell off the log's start, say) resets the same way.
- `commit()` stores the current positions (the next offset to consume, by convention). With
  `enable_auto_commit` (the default with a group), `poll` commits every `auto_commit_interval_ms`:
  positions then cover only records returned by earlier polls (at-least-once).
- `subscribe` with a group joins it (broker/client/group.py): the group's members share the
  topics' partitions (Kafka's range assignor, rebalanced when members join, leave or stop
  heartbeating), and Kafka consumers of the same group id share them too. On a rebalance the
  consumer commits its positions (with auto-commit) and gives up every partition before taking
  its new share, so delivery is at-least-once across members. `subscribe` returns once the first
  share is assigned. Without a group, `subscribe` assigns every partition of the topics.

Fetching (pipelined fetches, prefetch, long polls, routing, damaged data): broker/client/fetcher.py
(`Fetcher`, this class's base). The blocking `Consumer`: broker/client/blocking_consumer.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Final

from broker.client.client import DEFAULT_BOOTSTRAP, AsyncClient, TopicPartition
from broker.client.errors import (
    ClientError,
)
from broker.client.fetcher import Fetcher, _Assigned
from broker.client.group import GroupMembership
from broker.client.records import ConsumerRecord
from broker.client.security import Security
from broker.client.transactions import ConsumerGroupMetadata
from ringlog_proto.messages import (
    Isolation,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetSpec,
)

log = logging.getLogger(__name__)

RESETS: Final = {"earliest": OffsetSpec.EARLIEST, "latest": OffsetSpec.LATEST}
TPLike = TopicPartition | tuple[str, int]


def _tp(tp: TPLike) -> TopicPartition:
    topic, partition = tp
    if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
        raise TypeError(f"{tp!r} is not a (topic, partition) pair")
    return TopicPartition(topic, partition)


ISOLATION_LEVELS: Final = {
    "read_uncommitted": Isolation.READ_UNCOMMITTED,
    "read_committed": Isolation.READ_COMMITTED,
}


class AsyncConsumer(Fetcher):
    """An asyncio consumer. `await start()` (or `async with`), `await assign(...)` or
    `await subscribe(...)`, then `await poll()` or `async for record in consumer`.

    Parameters (times in milliseconds, sizes in bytes):
      group: consumer group for committed offsets (None: no commits).
      auto_offset_reset: where to start without a committed offset, or after OFFSET_OUT_OF_RANGE:
        "earliest" or "latest" (default).
      enable_auto_commit: commit positions every `auto_commit_interval_ms` from `poll` and on
        `close` (default: True when there is a group).
      fetch_max_bytes: per partition and fetch (the broker returns at least one whole batch).
      fetch_max_wait_ms: how long a fetch may wait on the broker for new data (long poll).
      fetch_min_bytes: new data that ends a long poll early.
      fetch_idle_ms: re-fetch interval of idle partitions sharing a fetch connection.
      max_poll_records: default `max_records` of `poll`.
      max_fetch_connections: fetch connections per core (see broker/client/fetcher.py).
      iter_timeout_ms: iteration stops after this long without a record (None: never).
      check_crcs: verify every batch's crc32c before decoding (the protocol requires it).
      session_timeout_ms, heartbeat_interval_ms, rebalance_timeout_ms: group membership (with a
        group and `subscribe`): a member silent for `session_timeout_ms` is removed; a rebalance
        waits up to `rebalance_timeout_ms` for every member to rejoin.
      metadata_max_age_ms: how old cached metadata may grow; in a group, the leader compares the
        subscribed topics' partition counts with the broker's this often and rebalances the group
        when one grew (Kafka's metadata.max.age.ms, 5 minutes).
      storage_error_retries: STORAGE_ERROR answers in a row for one partition before `poll`
        raises `BrokerStorageError` (default 5: with the default backoff of 100 ms doubling to
        1 s, about 2.5 s after the first). See "Damaged data" in broker/client/fetcher.py.
      isolation_level: "read_uncommitted" (the default, as Kafka's: every record up to the high
        watermark, those of open and aborted transactions too) or "read_committed" (records up
        to the last stable offset, none of an aborted transaction; "latest" is the last stable
        offset).
    """

    def __init__(
        self,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        *,
        group: str | None = None,
        auto_offset_reset: str = "latest",
        enable_auto_commit: bool | None = None,
        auto_commit_interval_ms: int = 5000,
        fetch_max_bytes: int = 1024 * 1024,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_idle_ms: int = 100,
        max_poll_records: int = 500,
        max_fetch_connections: int = 16,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        iter_timeout_ms: int | None = None,
        check_crcs: bool = True,
        storage_error_retries: int = 5,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3_000,
        rebalance_timeout_ms: int = 300_000,
        metadata_max_age_ms: int = 300_000,
        client: AsyncClient | None = None,
        client_name: str = "ringlog-python-consumer",
        security: Security | None = None,
        isolation_level: str = "read_uncommitted",
    ) -> None:
        if isolation_level not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level must be 'read_uncommitted' or 'read_committed', not {isolation_level!r}"
            )
        if auto_offset_reset not in RESETS:
            raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}")
        if group is not None and not 1 <= len(group) <= 255:
            raise ValueError("a group id must be 1-255 characters")
        if enable_auto_commit and group is None:
            raise ValueError("enable_auto_commit needs a group")
        if (
            fetch_max_bytes <= 0
            or fetch_max_wait_ms < 0
            or max_poll_records <= 0
            or max_fetch_connections <= 0
        ):
            raise ValueError("fetch_max_bytes, max_poll_records, max_fetch_connections must be > 0")
        if storage_error_retries < 0:
            raise ValueError("storage_error_retries must be >= 0")
        self.group = group
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = group is not None if enable_auto_commit is None else enable_auto_commit
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.isolation_level = isolation_level
        self.isolation = ISOLATION_LEVELS[isolation_level]
        self.fetch_idle = fetch_idle_ms / 1000
        self.max_poll_records = max_poll_records
        self.max_fetch_connections = max_fetch_connections
        self.request_timeout = request_timeout_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.retry_backoff_max = max(retry_backoff_ms, retry_backoff_max_ms) / 1000
        self.iter_timeout_ms = iter_timeout_ms
        self.check_crcs = check_crcs
        self.storage_error_retries = storage_error_retries
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self._membership: GroupMembership | None = None
        self._commit_on_revoke = self.enable_auto_commit
        self._own_client = client is None
        self._client = client or AsyncClient(
            bootstrap,
            client_name=client_name,
            request_timeout_ms=request_timeout_ms,
            security=security,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self._assigned: dict[TopicPartition, _Assigned] = {}
        # Held while buffered records change hands: the blocking Consumer takes them from its
        # caller's thread (`poll_buffered`) while this loop appends fetched ones.
        self._take = threading.Lock()
        self._order: list[_Assigned] = []  # poll's round-robin order
        self._rr = 0
        self._errors: list[BaseException] = []  # raised by the next poll
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_commit = 0.0
        self._commit_task: asyncio.Task[None] | None = None
        self._closed = False

    # ----------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        await self._client.start()
        self._next_commit = time.monotonic() + self.auto_commit_interval

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def close(self, *, commit: bool | None = None) -> None:
        """Stop fetching; commit positions first when auto-commit is on (or `commit=True`)."""
        if self._closed:
            return
        if self._membership is not None:  # commits (auto-commit) as it gives the partitions up
            self._commit_on_revoke = commit if commit is not None else self.enable_auto_commit
            await self._membership.close()
            self._membership = None
        try:
            if commit if commit is not None else self.enable_auto_commit:
                with contextlib.suppress(ClientError):
                    await self.commit()
        finally:
            self._closed = True
            for st in self._order:
                st.seek(st.position or 0)
            for task in list(self._tasks):
                task.cancel()
            if self._commit_task is not None:
                self._commit_task.cancel()
            if self._wakeup is not None:
                self._wakeup.set()
            if self._own_client:
                await self._client.close()

    # ----------------------------------------------------------------------------------- assignment

    async def assign(self, partitions: Iterable[TPLike]) -> None:
        """Consume exactly these partitions (replacing any previous assignment). Each starts at the
        group's committed offset if there is one, else per `auto_offset_reset`; partitions kept
        from the previous assignment keep their positions."""
        self._loop_or_fail()
        tps = list(dict.fromkeys(_tp(tp) for tp in partitions))
        for tp in tps:
            await self._client.route(tp.topic, tp.partition)  # unknown topic/partition raises here
        old = self._assigned
        self._assigned = {tp: old.get(tp) or _Assigned(tp, self._take) for tp in tps}
        for tp, st in old.items():
            if tp not in self._assigned:
                st.seek(0)  # drop its buffer; its fetch in flight is ignored
        self._order = list(self._assigned.values())
        self._assign_lanes()
        fresh = [st for st in self._order if st.position is None]
        if fresh:
            await self._initial_positions(fresh)
        for st in self._order:
            self._start_fetch(st)

    async def subscribe(self, *topics: str) -> None:
        """With a group: join it and consume this member's share of `topics` (module docstring),
        returning once the first share is assigned. Without one: assign every partition."""
        if self.group is not None:
            self._loop_or_fail()
            for topic in topics:
                await self._client.topic(topic, refresh=True)  # an unknown topic raises here
            if self._membership is not None:
                await self._membership.close()
            self._membership = GroupMembership(
                self._client,
                self.group,
                topics,
                assigned=self.assign,
                revoked=self._revoked,
                session_timeout_ms=self.session_timeout_ms,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                heartbeat_interval_ms=self.heartbeat_interval_ms,
                on_failure=self._membership_failed,
            )
            membership = self._membership
            membership.start()
            waits = [
                asyncio.ensure_future(membership.joined.wait()),
                asyncio.ensure_future(membership.failed.wait()),
            ]
            try:
                await asyncio.wait(
                    waits, timeout=self.rebalance_timeout_ms / 1000 + 5, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for w in waits:
                    w.cancel()
            if membership.failure is not None:
                self._errors.clear()  # raised here rather than by the next poll
                raise membership.failure
            if not membership.joined.is_set():
                raise TimeoutError(f"group {self.group!r}: no assignment within the rebalance timeout")
            return
        tps: list[TopicPartition] = []
        for topic in topics:
            info = await self._client.topic(topic, refresh=True)
            tps.extend(TopicPartition(topic, p) for p in range(info.partitions))
        await self.assign(tps)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group, generation and member id, for a transactional producer's
        `send_offsets_to_transaction` (KIP-447: offsets of an old generation are refused)."""
        if self.group is None:
            raise ValueError("the consumer has no group")
        membership = self._membership
        generation, member_id = membership.identity if membership is not None else (-1, "")
        return ConsumerGroupMetadata(self.group, generation, member_id)

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    async def _revoked(self) -> None:
        """A rebalance (or close) takes this member's partitions: stop fetching them, then commit
        the positions reached (auto-commit), so their next owner resumes there."""
        offsets = {st.tp: st.position for st in self._order if st.position is not None}
        if not self._closed:
            await self.assign([])
        if offsets and self._commit_on_revoke:
            try:
                await self.commit(offsets)  # type: ignore[arg-type]
            except ClientError as exc:
                log.warning("commit on rebalance failed (the next owner may repeat records): %s", exc)

    def _assign_lanes(self) -> None:
        by_core: dict[int, list[_Assigned]] = {}
        for st in self._order:
            info = self._client.cached_topic(st.tp.topic)
            core = info.owners[st.tp.partition] if info is not None else 0
            by_core.setdefault(core, []).append(st)
        for sts in by_core.values():
            lanes = min(len(sts), self.max_fetch_connections)
            sharing: dict[str, int] = {}
            for i, st in enumerate(sts):
                st.lane = f"fetch-{i % lanes}"
                sharing[st.lane] = sharing.get(st.lane, 0) + 1
            for st in sts:
                st.solo = sharing[st.lane] == 1

    async def _initial_positions(self, sts: list[_Assigned]) -> None:
        committed: list[int | None] = [None] * len(sts)
        if self.group is not None:
            committed = list(await asyncio.gather(*(self.committed(st.tp) for st in sts)))
        reset = [st for st, c in zip(sts, committed, strict=True) if c is None]
        for st, c in zip(sts, committed, strict=True):
            if c is not None:
                st.seek(c)
        if reset:
            await self._reset(reset, RESETS[self.auto_offset_reset])

    async def _reset(self, sts: list[_Assigned], spec: int) -> list[int]:
        offsets = await asyncio.gather(*(self._list_offset(st.tp, spec) for st in sts))
        for st, off in zip(sts, offsets, strict=True):
            st.seek(off)
            self._start_fetch(st)
        return list(offsets)

    async def _list_offset(self, tp: TopicPartition, spec: int) -> int:
        resp = await self._client.partition_request(
            tp.topic, tp.partition, lambda tid: ListOffsetsRequest(tid, tp.partition, spec, self.isolation)
        )
        assert isinstance(resp, ListOffsetsResponse)
        return resp.offset

    # ----------------------------------------------------------------------------------- positions

    def _state(self, tp: TPLike) -> _Assigned:
        st = self._assigned.get(_tp(tp))
        if st is None:
            raise ValueError(f"{tuple(tp)} is not assigned to this consumer")
        return st

    def position(self, tp: TPLike) -> int | None:
        """The offset of the next record `poll` returns for `tp`."""
        return self._state(tp).position

    def highwater(self, tp: TPLike) -> int:
        """The partition's end offset as of the last fetch answer (-1 before any)."""
        return self._state(tp).high_watermark

    def seek(self, tp: TPLike, offset: int) -> None:
        """Continue `tp` from `offset` (buffered records and the fetch in flight are dropped)."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        st = self._state(tp)
        st.seek(offset)
        if self._loop is not None and not self._closed:
            self._start_fetch(st)

    def _targets(self, tps: tuple[TPLike, ...]) -> list[_Assigned]:
        return [self._state(tp) for tp in tps] if tps else list(self._order)

    async def seek_to_beginning(self, *tps: TPLike) -> dict[TopicPartition, int]:
        """Move `tps` (default: all assigned) to their log start; returns the new positions."""
        sts = self._targets(tps)
        return dict(zip([st.tp for st in sts], await self._reset(sts, OffsetSpec.EARLIEST), strict=True))

    async def seek_to_end(self, *tps: TPLike) -> dict[TopicPartition, int]:
        """Move `tps` (default: all assigned) to their log end: only new records follow."""
        sts = self._targets(tps)
        return dict(zip([st.tp for st in sts], await self._reset(sts, OffsetSpec.LATEST), strict=True))

    async def seek_to_timestamp(self, timestamp: int, *tps: TPLike) -> dict[TopicPartition, int]:
        """Move `tps` (default: all assigned) to the first record with a timestamp >= `timestamp`
        (ms since the epoch), or to the end where there is none. Returns the new positions."""
        if timestamp < 0:
            raise ValueError("timestamp must be >= 0 (ms since the epoch)")
        sts = self._targets(tps)
        found = await asyncio.gather(*(self._list_offset(st.tp, timestamp) for st in sts))
        at_end = [st for st, off in zip(sts, found, strict=True) if off < 0]
        ends = dict(
            zip(
                at_end,
                await asyncio.gather(*(self._list_offset(st.tp, OffsetSpec.LATEST) for st in at_end)),
                strict=True,
            )
        )
        out: dict[TopicPartition, int] = {}
        for st, off in zip(sts, found, strict=True):
            target = ends[st] if off < 0 else off
            st.seek(target)
            self._start_fetch(st)
            out[st.tp] = target
        return out

    # ----------------------------------------------------------------------------------- groups

    def _group(self) -> str:
        if self.group is None:
            raise ValueError("this consumer has no group")
        return self.group

    async def commit(self, offsets: Mapping[TPLike, int] | None = None, metadata: str = "") -> None:
        """Commit `offsets` (default: the current position of every assigned partition, i.e. the
        next offset to consume) for the group. All partitions are committed concurrently."""
        group = self._group()
        membership = self._membership
        generation, member_id = (-1, "") if membership is None else membership.identity
        if offsets is None:
            todo = {st.tp: st.position for st in self._order if st.position is not None}
        else:
            todo = {_tp(tp): off for tp, off in offsets.items()}
        results = await asyncio.gather(
            *(
                self._client.partition_request(
                    tp.topic,
                    tp.partition,
                    functools.partial(
                        _commit_request,
                        group=group,
                        partition=tp.partition,
                        offset=off,
                        metadata=metadata,
                        generation=generation,
                        member_id=member_id,
                    ),
                    group=group,
                )
                for tp, off in todo.items()
            ),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def committed(self, tp: TPLike) -> int | None:
        """The group's committed offset for `tp`, or None if it has committed nothing."""
        group = self._group()
        t = _tp(tp)
        resp = await self._client.partition_request(
            t.topic, t.partition, lambda tid: OffsetFetchRequest(tid, t.partition, group), group=group
        )
        assert isinstance(resp, OffsetFetchResponse)
        return None if resp.offset < 0 else resp.offset

    def _maybe_auto_commit(self) -> None:
        if not self.enable_auto_commit or self._commit_task is not None:
            return
        now = time.monotonic()
        if now < self._next_commit:
            return
        self._next_commit = now + self.auto_commit_interval
        # The positions now, before this poll hands out more: only records already returned.
        offsets = {st.tp: st.position for st in self._order if st.position is not None}
        if offsets:
            loop = self._loop_or_fail()
            self._commit_task = loop.create_task(self._auto_commit(offsets))

    async def _auto_commit(self, offsets: dict[TopicPartition, int]) -> None:
        try:
            await self.commit(offsets)  # type: ignore[arg-type]
        except ClientError as exc:
            log.warning("auto-commit failed (will retry at the next interval): %s", exc)
        finally:
            self._commit_task = None

    # ----------------------------------------------------------------------------------- polling

    async def poll(self, timeout_ms: float = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Records from the assigned partitions: at once if some are buffered, else as soon as a
        fetch brings some, else `[]` after `timeout_ms`. At most `max_records` (default
        `max_poll_records`). Raises errors fetches met that need the caller (a deleted topic,
        repeated STORAGE_ERROR) once each, and `UndecodableBatchError` for a partition whose
        records before the bad batch are all handed out, until a seek moves it."""
        self._loop_or_fail()
        assert self._wakeup is not None
        limit = self.max_poll_records if max_records is None else max_records
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000
        while True:
            self._maybe_auto_commit()
            if self._errors:
                raise self._errors.pop(0)
            for st in self._order:
                if st.poison is not None and not st.chunks:
                    raise st.poison
            pending = [st for st in self._order if st.position is None]
            if pending:
                await self._reset(pending, RESETS[self.auto_offset_reset])
            records = self._drain(limit)
            if records:
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._closed:
                return []
            self._wakeup.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                return []

    def _drain(self, limit: int) -> list[ConsumerRecord]:
        """Take up to `limit` buffered records, round-robin over partitions, advancing positions."""
        out, emptied = self._take_buffered(limit)
        for st in emptied:
            self._start_fetch(st)  # room for another prefetched response
        return out

    def _take_buffered(self, limit: int) -> tuple[list[ConsumerRecord], list[_Assigned]]:
        """`_drain`'s records, and the partitions that handed out a whole response (each may
        fetch again), from any thread."""
        out: list[ConsumerRecord] = []
        emptied: list[_Assigned] = []
        order = self._order
        n = len(order)
        if not n:
            return out, emptied
        with self._take:
            start = self._rr % n
            self._rr = start + 1
            for i in range(n):
                st = order[(start + i) % n]
                while st.chunks and len(out) < limit:
                    chunk = st.chunks[0]
                    take = chunk[st.chunk_pos : st.chunk_pos + limit - len(out)]
                    out.extend(take)
                    st.chunk_pos += len(take)
                    st.position = take[-1].offset + 1
                    if st.chunk_pos >= len(chunk):
                        st.chunks.popleft()
                        st.chunk_pos = 0
                        emptied.append(st)
                if len(out) >= limit:
                    break
        return out, emptied

    def poll_buffered(self, max_records: int | None = None) -> list[ConsumerRecord] | None:
        """`poll`'s answer when records are buffered and nothing else needs doing, taken from the
        calling thread without a trip through the event loop (the blocking Consumer's fast path);
        None when `poll` itself must run: nothing buffered, an error or a damaged batch to raise,
        a position to reset, or an auto-commit due. Fetches freed by what was taken are sent
        from the loop."""
        loop = self._loop
        if self._closed or loop is None or self._errors:
            return None
        if self.enable_auto_commit and self._commit_task is None and time.monotonic() >= self._next_commit:
            return None
        for st in self._order:
            if st.position is None or (st.poison is not None and not st.chunks):
                return None
        out, emptied = self._take_buffered(self.max_poll_records if max_records is None else max_records)
        if emptied:
            loop.call_soon_threadsafe(self._refill, emptied)
        return out or None

    def _refill(self, sts: list[_Assigned]) -> None:
        for st in sts:
            self._start_fetch(st)

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumerRecord]:
        """One record at a time; positions advance per record, so a commit covers exactly what
        the loop has seen. Ends when the consumer closes or after `iter_timeout_ms` idle."""
        idle_ms = self.iter_timeout_ms
        current: _Assigned | None = None  # stay on one fetched chunk while it lasts
        while not self._closed:
            self._maybe_auto_commit()  # before taking the next record: it is not processed yet
            if current is not None and current.chunks:
                # The per-record fast path: no round robin, no list, one position update.
                chunk = current.chunks[0]
                rec = chunk[current.chunk_pos]
                current.chunk_pos += 1
                current.position = rec.offset + 1
                if current.chunk_pos >= len(chunk):
                    current.chunks.popleft()
                    current.chunk_pos = 0
                    self._start_fetch(current)  # room for another prefetched response
                    current = None  # next chunk: give the other partitions their turn
                yield rec
                continue
            got = self._drain(1)
            if got:
                current = self._assigned.get(TopicPartition(got[0].topic, got[0].partition))
            if not got:
                got = await self.poll(1000 if idle_ms is None else idle_ms, max_records=1)
                if not got:
                    if idle_ms is not None:
                        return
                    continue
            yield got[0]

    def _membership_failed(self, exc: BaseException) -> None:
        """The group refused this member for good (an ACL): the next poll raises it."""
        self._errors.append(exc)
        self._wake()


def _commit_request(
    topic_id: int, *, group: str, partition: int, offset: int, metadata: str, generation: int, member_id: str
) -> OffsetCommitRequest:
    return OffsetCommitRequest(topic_id, partition, group, offset, metadata, generation, member_id)
