"""Talking to ringlog from Spark's driver and tasks: offsets, ranges of records, idempotent writes.

Rules this module keeps:
- It imports only `broker.client` and `ringlog_proto` (and pyarrow inside functions): executors
  install the client, never the server.
- No connection outlives the call that made it. Spark pickles readers, writers and partitions to
  ship them to executors; a socket or an event loop in them would not survive that, so every
  function here opens its own `AsyncClient`, uses it, and closes it.
- Errors reach the user as `RinglogSparkError` naming the broker, the topic and what to check:
  Spark wraps them in Py4J and JVM traces, where a bare `BrokerUnavailable()` says nothing.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from broker.client import (
    AsyncClient,
    AuthenticationError,
    BrokerUnavailable,
    ClientError,
    OffsetOutOfRangeError,
    RingLogError,
    Security,
    UnknownTopicError,
)
from ringlog_proto.batch import BROKER_PRODUCER_ID_LIMIT, decode_records, iter_batches
from ringlog_proto.messages import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetSpec,
)

T = TypeVar("T")

FETCH_BYTES_DEFAULT = 4 * 1024 * 1024  # the broker's cap on one fetch answer (limits.FETCH_MAX_BYTES_MAX)
CLIENT_NAME = "ringlog-spark"


class RinglogSparkError(RuntimeError):
    """A ringlog data source failure with a message meant for the person running the job."""


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a fresh event loop (Spark calls us from plain threads, never from a loop)."""
    return asyncio.run(coro)


@dataclass(frozen=True, slots=True)
class Broker:
    """The broker a job reads or writes and how to reach it: the 'bootstrap' option and the TLS
    and SASL options (docs/SPARK.md). Plain values, so it pickles to the executors, each of which
    makes its own `Security` from it; the password never shows in its repr (Spark logs plans)."""

    bootstrap: str
    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)

    def __str__(self) -> str:
        return self.bootstrap

    def security(self) -> Security | None:
        """The client's settings (None: plaintext, no authentication); raises ValueError for
        settings that do not go together."""
        if not self.tls and self.sasl_mechanism is None:
            return None
        return Security(
            tls=self.tls,
            cafile=self.tls_ca,
            certfile=self.tls_cert,
            keyfile=self.tls_key,
            sasl_mechanism=self.sasl_mechanism,
            username=self.sasl_username,
            password=self.sasl_password,
        )


async def _client(broker: Broker) -> AsyncClient:
    client = AsyncClient(
        broker.bootstrap, client_name=CLIENT_NAME, connect_timeout_ms=5_000, security=broker.security()
    )
    try:
        await client.start()
    except AuthenticationError as exc:
        await client.close()
        raise RinglogSparkError(
            f"ringlog: the broker at {broker} refused the login ({exc}); check the 'sasl.mechanism', "
            "'sasl.username' and 'sasl.password' options"
        ) from exc
    except (BrokerUnavailable, OSError) as exc:
        await client.close()
        raise RinglogSparkError(
            f"ringlog: cannot reach the broker at {broker} ({exc}); check the 'bootstrap' option "
            "(and the 'tls' options where the broker serves TLS) and that the broker is running and "
            "reachable from the driver and every executor"
        ) from exc
    return client


async def _topic_partitions(client: AsyncClient, topic: str) -> int:
    try:
        info = await client.topic(topic, refresh=True)
    except UnknownTopicError as exc:
        raise RinglogSparkError(
            f"ringlog: topic {topic!r} does not exist on the broker at {client.bootstrap} "
            "(create it first: `broker create-topic` or Admin.create_topic)"
        ) from exc
    return info.partitions


async def _list_offset(client: AsyncClient, topic: str, partition: int, spec: int) -> int:
    resp = await client.partition_request(
        topic, partition, lambda tid: ListOffsetsRequest(tid, partition, spec)
    )
    assert isinstance(resp, ListOffsetsResponse)
    return resp.offset


async def _offsets(broker: Broker, topic: str) -> tuple[list[int], list[int]]:
    client = await _client(broker)
    try:
        n = await _topic_partitions(client, topic)
        starts = await asyncio.gather(
            *(_list_offset(client, topic, p, OffsetSpec.EARLIEST) for p in range(n))
        )
        ends = await asyncio.gather(*(_list_offset(client, topic, p, OffsetSpec.LATEST) for p in range(n)))
        return list(starts), list(ends)
    finally:
        await client.close()


def partition_offsets(broker: Broker, topic: str) -> tuple[list[int], list[int]]:
    """(log start offsets, log end offsets), one per partition of `topic`, now."""
    return run(_offsets(broker, topic))


def commit_group_offsets(broker: Broker, topic: str, group: str, offsets: dict[int, int]) -> None:
    """Commit `offsets` (partition -> next offset to read) for `group`: the broker then reports the
    group's position, so lag = end offset - committed offset, as for any consumer group."""

    async def go() -> None:
        client = await _client(broker)
        try:
            await asyncio.gather(
                *(
                    client.partition_request(
                        topic,
                        p,
                        functools.partial(
                            OffsetCommitRequest, partition=p, group=group, offset=o, metadata="spark"
                        ),
                        group=group,
                    )
                    for p, o in offsets.items()
                )
            )
        finally:
            await client.close()

    run(go())


def group_lag(broker: Broker | str, topic: str, group: str) -> dict[int, int | None]:
    """Per partition: records between the group's committed offset and the log end (None when
    the group has committed nothing for that partition). `broker`: a bootstrap address, or a
    `Broker` with TLS and SASL settings."""
    where = Broker(broker) if isinstance(broker, str) else broker

    async def go() -> dict[int, int | None]:
        client = await _client(where)
        try:
            n = await _topic_partitions(client, topic)
            out: dict[int, int | None] = {}
            for p in range(n):
                end = await _list_offset(client, topic, p, OffsetSpec.LATEST)
                resp = await client.partition_request(
                    topic, p, functools.partial(OffsetFetchRequest, partition=p, group=group), group=group
                )
                assert isinstance(resp, OffsetFetchResponse)
                out[p] = None if resp.offset < 0 else end - resp.offset
            return out
        finally:
            await client.close()

    return run(go())


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one fetch brought that falls in the requested range: columns of plain lists."""

    offsets: list[int]
    timestamps: list[int | None]  # a decoded record has one; `Record` allows none (a send's)
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes | None]]]


def fetch_range(
    broker: Broker,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    fail_on_data_loss: bool = True,
    fetch_bytes: int = FETCH_BYTES_DEFAULT,
) -> Iterator[Chunk]:
    """Records of `topic`/`partition` with start <= offset < end, one `Chunk` per fetch.

    A generator that drives its own event loop between yields: the caller (a Spark task) converts
    one chunk to Arrow while nothing else is in flight, which keeps this a plain loop. Offsets the
    log no longer holds (retention, truncation) raise, or are skipped with
    `fail_on_data_loss=False`.
    """
    loop = asyncio.new_event_loop()
    try:
        client = loop.run_until_complete(_client(broker))
        try:
            loop.run_until_complete(_topic_partitions(client, topic))
            pos = start
            while pos < end:
                try:
                    resp = loop.run_until_complete(
                        client.partition_request(
                            topic,
                            partition,
                            functools.partial(
                                FetchRequest, partition=partition, offset=pos, max_bytes=fetch_bytes
                            ),
                        )
                    )
                except OffsetOutOfRangeError as exc:
                    log_start = loop.run_until_complete(
                        _list_offset(client, topic, partition, OffsetSpec.EARLIEST)
                    )
                    if fail_on_data_loss or log_start <= pos:
                        raise _data_loss(topic, partition, pos, end, log_start) from exc
                    pos = log_start
                    continue
                assert isinstance(resp, FetchResponse)
                if pos < resp.log_start_offset:  # the broker may answer from its log start
                    if fail_on_data_loss:
                        raise _data_loss(topic, partition, pos, end, resp.log_start_offset)
                    pos = resp.log_start_offset
                    continue
                data = resp.records
                if not data:
                    if resp.high_watermark <= pos:
                        if fail_on_data_loss:
                            raise RinglogSparkError(
                                f"ringlog: {topic}/{partition} ends at offset {resp.high_watermark}, before "
                                f"the planned end {end} (was the topic re-created or truncated?); set "
                                "failOnDataLoss=false to read what is there"
                            )
                        return
                    continue
                chunk = Chunk([], [], [], [], [])
                nxt = pos
                for bpos, h in iter_batches(data):
                    batch_end = h.next_offset
                    if batch_end <= pos:
                        continue
                    nxt = batch_end
                    # a control batch (a transaction's marker) holds no row
                    records = [] if h.control else decode_records(data, bpos, True)
                    for r in records:
                        off = r.offset
                        if pos <= off < end:
                            chunk.offsets.append(off)
                            chunk.timestamps.append(r.timestamp)
                            chunk.keys.append(r.key)
                            chunk.values.append(r.value)
                            chunk.headers.append(list(r.headers))
                    if nxt >= end:
                        break
                if nxt <= pos:
                    raise RinglogSparkError(f"ringlog: {topic}/{partition}: no whole batch at offset {pos}")
                pos = nxt
                if chunk.offsets:
                    yield chunk
        finally:
            loop.run_until_complete(client.close())
    except (RingLogError, ClientError, BrokerUnavailable) as exc:
        raise RinglogSparkError(f"ringlog: reading {topic}/{partition} [{start}, {end}): {exc}") from exc
    finally:
        loop.close()


def _data_loss(topic: str, partition: int, pos: int, end: int, log_start: int) -> RinglogSparkError:
    return RinglogSparkError(
        f"ringlog: {topic}/{partition}: offsets {pos}..{min(end, log_start) - 1} are no longer in the log "
        f"(it starts at {log_start}: retention removed them); set failOnDataLoss=false to skip them"
    )


def records_by_producer(
    broker: Broker, topic: str, starts: dict[int, int], producer_id: int
) -> dict[int, int]:
    """Per partition: how many records batches of `producer_id` hold at or after `starts[p]`.

    A retried write task asks this to learn how far its failed attempt got. Sequence numbers
    leave no gaps (the broker refuses them), so "how many" is also "which": the first n records
    this task routed to the partition.
    """

    async def go() -> dict[int, int]:
        client = await _client(broker)
        try:
            out: dict[int, int] = {}
            for p, start in starts.items():
                end = await _list_offset(client, topic, p, OffsetSpec.LATEST)
                pos, count = start, 0
                while pos < end:
                    resp = await client.partition_request(
                        topic,
                        p,
                        functools.partial(
                            FetchRequest, partition=p, offset=pos, max_bytes=FETCH_BYTES_DEFAULT
                        ),
                    )
                    assert isinstance(resp, FetchResponse)
                    nxt = pos
                    for _, h in iter_batches(resp.records):
                        if h.next_offset <= pos:
                            continue
                        nxt = h.next_offset
                        if h.producer_id == producer_id and not h.control:  # a marker is no record
                            count += h.record_count
                    if nxt <= pos:
                        break
                    pos = nxt
                out[p] = count
            return out
        finally:
            await client.close()

    return run(go())


def producer_id_for(*parts: object) -> int:
    """A producer id that is a pure function of `parts` (run id, task partition, ...): the same on
    every attempt of a task, different between tasks and runs, in the clients' id space (at or
    above `BROKER_PRODUCER_ID_LIMIT`: never an id the broker assigns to a Kafka client)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    span = (1 << 63) - BROKER_PRODUCER_ID_LIMIT
    return BROKER_PRODUCER_ID_LIMIT + int.from_bytes(digest[:8], "big") % span
