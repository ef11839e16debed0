"""Fetch (api 1, v4-11): each partition's batches through its read door, sent as stored.

Rules this module keeps:
- Each partition is read through `Partition.read` (below the high watermark; the leader's epoch
  checked when the client names one): one `Read` part per partition that has batches, the
  stored bytes sent as they are, and the request one `Gather`; the response is written by
  broker/kafka/fast_encode.py (the hot path).
- The response holds at most the request's max_bytes of records (KIP-74; Kafka's broker
  `fetch.max.bytes` caps that in turn): partitions are filled in request order, each up to its
  partition_max_bytes, and the first batch of the first partition with records goes whole
  whatever its size; a partition left without room answers its bounds and no records
  (broker/core/read_budget.py holds the rule, which our ReplicaFetch keeps too).
- A Fetch answers at once when what it can read reaches min_bytes (at least one byte), when the
  response is full, when a partition has an error, or at its deadline; otherwise it waits
  (`Wait`) on every partition of ours it names, and looks again when any of them grows (each
  look a fresh budget: a long poll answered later keeps the cap).
- A Fetch below v10 of a partition whose topic's compression.type is zstd is answered
  UNSUPPORTED_COMPRESSION_TYPE for that partition, Kafka's rule (KafkaApis.handleFetchRequest,
  KIP-110: zstd batches need Fetch v10): the topic's setting decides, not the batches read, so
  nothing is read or decoded for it (zstd batches of a producer, on a topic that keeps the
  producer's codec, go out as stored, as Kafka sends them). The error answers the request at
  once, as our other partition errors do; Kafka reads the partition first, waiting for min_bytes.
- No fetch sessions: session id 0 (full fetches); an incremental one is
  FETCH_SESSION_ID_NOT_FOUND, as Kafka answers a session it does not know.
- read_committed (isolation_level 1) reads below the last stable offset
  (`Isolation.LAST_STABLE`) and is told the aborted transactions its records overlap (producer
  id, first offset), as Kafka's `ReplicaManager.readFromLog` and `UnifiedLog.read` do;
  read_uncommitted is told none (null). Every partition answers its last stable offset (the
  high watermark when no transaction is open or unreplicated).
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Gather, Outcome, Read, Reply, Wait
from broker.core.partition import Isolation, Partition, PendingRead
from broker.core.read_budget import ReadBudget
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import DONE, NotLeaderError, UnsupportedCompressionError, kafka_error
from broker.kafka.fast_encode import fetch_response
from ringlog_proto.batch import COMPRESSION_ZSTD, now_ms
from ringlog_proto.frames import Buffer

FETCH: Final = 1
VERSIONS: Final = (4, 11)  # v12+ are flexible
FETCH_PARTITION_MAX: Final = 64 << 20  # a partition's share of one fetch, whatever it asks
# The records of one response, whatever it asks: Kafka's broker config fetch.max.bytes (KIP-541),
# at its default; clients ask less (librdkafka's and the Java client's fetch.max.bytes: 50 MiB).
FETCH_RESPONSE_MAX: Final = 55 << 20
FETCH_WAIT_MAX_MS: Final = 30_000
# Fetch sessions (v7+): the epochs of a full fetch; any other asks for a session we never create
FETCH_SESSION_INITIAL: Final = 0
FETCH_SESSION_FINAL: Final = -1
READ_COMMITTED: Final = 1  # Fetch isolation_level
ZSTD_MIN_VERSION: Final = 10  # KIP-110: the first Fetch that may carry zstd batches

# (topic, index) -> (error, high watermark, last stable offset, log start, aborted (producer id,
# first offset) pairs, records as read)
Results = dict[tuple[str, int], tuple[ErrorCode, int, int, int, tuple[tuple[int, int], ...], Buffer]]
_FAILED: Final = (-1, -1, -1, (), b"")  # a partition's answer beside an error


def fetch(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    deadline = now_ms() + min(max(0, int(body.max_wait.total_seconds() * 1000)), FETCH_WAIT_MAX_MS)
    if int(getattr(body, "session_epoch", -1)) not in (FETCH_SESSION_INITIAL, FETCH_SESSION_FINAL):
        # An incremental fetch of a session we never created (we answer session id 0): what
        # Kafka answers for an unknown session; the client starts over with a full fetch.
        return _fetch_session_unknown(request)
    return _fetch(ctx, request, body, deadline)


def _fetch(ctx: Context, request: KafkaRequest, body: Any, deadline_ms: int, final: bool = False) -> Outcome:
    """Each partition's batches as a plain extent read (one `Read` part each, stored bytes
    sent as they are), within the response's budget. Answered at once when a partition has an
    error, when what can be read reaches min_bytes (at least one byte: min_bytes 0 never waits)
    or the budget left a batch out, or at the deadline (`final`);
    otherwise it waits on every partition of ours it names, until one grows (then it looks
    again) or the deadline passes (then it answers with what there is)."""
    results: Results = {}
    order: list[tuple[str, list[int]]] = []
    parts: list[Outcome] = []
    ours: dict[Partition, None] = {}  # the partitions of this core it names, once each
    budget = ReadBudget(min(int(body.max_bytes), FETCH_RESPONSE_MAX))
    readable = 0
    failed = False
    read_committed = int(getattr(body, "isolation_level", 0)) == READ_COMMITTED
    isolation = Isolation.LAST_STABLE if read_committed else Isolation.HIGH_WATERMARK
    before_zstd = request.api_version < ZSTD_MIN_VERSION
    for topic in body.topics:
        indexes: list[int] = []
        order.append((topic.topic, indexes))
        refusal = ctx.topic_refusal(FETCH, topic.topic)
        for fp in topic.partitions:
            key = (topic.topic, int(fp.partition))
            indexes.append(key[1])
            try:
                if refusal is not None:
                    raise refusal
                target = ctx.core.partition_named(*key)
                if not isinstance(target, Partition):
                    raise NotLeaderError(f"led by core {target}")
                if before_zstd and target.log.config.compression == COMPRESSION_ZSTD:
                    raise UnsupportedCompressionError(
                        f"{key[0]!r} is stored in zstd: Fetch v{request.api_version} predates it (v10)"
                    )
                limit = budget.limit(min(int(fp.partition_max_bytes), FETCH_PARTITION_MAX))
                epoch = int(getattr(fp, "current_leader_epoch", -1))
                read = target.read(int(fp.fetch_offset), limit, isolation, epoch)
                read = budget.take(read, limit)
            except Exception as exc:
                code, _ = kafka_error(exc)
                results[key] = (code, *_FAILED)
                failed = True
                continue
            now = read.nothing()
            results[key] = (
                ErrorCode.none,
                now.high_watermark,
                now.last_stable_offset,
                now.log_start_offset,
                (),
                b"",
            )
            ours[target] = None
            if read.extent is not None:
                readable += read.extent.length
                parts.append(_read_part(key, read, results))

    def reply() -> Reply:
        return _fetch_reply(request, order, results, read_committed)

    enough = budget.full or readable >= max(1, int(body.min_bytes)) or int(body.min_bytes) <= 0
    if not (final or failed or enough or not ours) and deadline_ms > now_ms():

        def again() -> Outcome:
            return _fetch(ctx, request, body, deadline_ms)

        def at_deadline() -> Outcome:
            return _fetch(ctx, request, body, deadline_ms, final=True)

        return Wait(tuple(ours), None, deadline_ms, at_deadline, again)

    return Gather(parts, reply)


def _fetch_session_unknown(request: KafkaRequest) -> Outcome:
    schema = response_schema(FETCH, request.api_version)
    assert schema is not None
    resp = make(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.fetch_session_id_not_found,
        session_id=0,
        responses=(),
    )
    return Reply(encode_response(request.correlation_id, resp))


def _read_part(key: tuple[str, int], read: PendingRead, results: Results) -> Read:
    assert read.extent is not None

    def finish(data: Buffer) -> Reply:
        found = read.finish(data)
        aborted = tuple((a.producer_id, a.first_offset) for a in found.aborted)
        high, stable, start = found.high_watermark, found.last_stable_offset, found.log_start_offset
        results[key] = (ErrorCode.none, high, stable, start, aborted, found.records)
        return DONE

    def fail(exc: BaseException) -> Reply:
        results[key] = (kafka_error(exc)[0], *_FAILED)
        return DONE

    return Read(read.extent, finish, fail)


def _fetch_reply(
    request: KafkaRequest,
    order: list[tuple[str, list[int]]],
    results: Results,
    read_committed: bool,
) -> Reply:
    """The Fetch response (written by fast_encode.py): read_committed gets each partition's
    aborted transactions, empty when none (read_uncommitted: null)."""
    topics = []
    for name, indexes in order:
        partitions = []
        for i in indexes:
            code, high, stable, start, aborted, records = results[(name, i)]
            partitions.append(
                (i, int(code), high, stable, start, aborted if read_committed else None, records)
            )
        topics.append((name, partitions))
    return Reply(fetch_response(request.api_version, request.correlation_id, 0, 0, topics))
