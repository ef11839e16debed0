"""Produce (api 0, v3-8 answered; v0-2 advertised and refused): each partition through its door.

Rules this module keeps:
- A Kafka Produce names many partitions; ours names one. Each partition becomes its own outcome,
  an `Append` from `Partition.produce` (the one door of a produce), and the request one `Gather`
  of them, whose `finish` writes the one response once every part is done (a Produce of one
  partition: its `Append` answers the request itself). The response is written by
  broker/kafka/fast_encode.py (the hot path).
- A partition of another core is answered NOT_LEADER_OR_FOLLOWER, never forwarded: Metadata names
  its owning core the leader at that core's own port, so a stock client refreshes Metadata and
  goes there, and one request is never split between cores.
- acks: 0 answers nothing, 1 after the write, -1 as our acks=all (the high watermark when the
  partition is replicated, else a flush).
- A partition whose first batch is zstd in a Produce below v7 is answered
  UNSUPPORTED_COMPRESSION_TYPE, before its leader is looked at (Kafka's ProduceRequest
  .validateRecords, called per partition by KafkaApis.handleProduceRequest; KIP-110): one
  look at the batch header's attributes, only for those versions.
- v0-2 are listed in ApiVersions (librdkafka before 2.11 stops compressing unless v0 is) and
  answered UNSUPPORTED_VERSION for every partition (their bytes: broker/kafka/codec.py).
- Records without a key to a compacted topic (the partition refuses them: `KeylessRecordError`)
  are answered as Kafka's LogValidator refuses them: INVALID_RECORD, with a record error per
  such record (its index in the batch and Kafka's message) and an error message (v8+, KIP-467).
  Below v8 the code is INVALID_RECORD too, with neither: Kafka's broker does not downgrade it
  (KAFKA-9492 only drops the record errors an old version cannot carry).
- A partition's records are exactly one batch (Kafka's `ProduceRequest.validateRecords` for v3+,
  the only versions answered with data): more is INVALID_RECORD with Kafka's message and
  nothing of that partition is written. The first batch's length field tells, without a walk.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Append, Gather, Outcome, Reply, Silent
from broker.core.partition import Partition, Stored
from broker.core.transactions import is_internal
from broker.kafka.codec import KafkaRequest, produce_v0_refusal, produce_v0_topics
from broker.kafka.context import Context
from broker.kafka.errors import DONE, NotLeaderError, UnsupportedCompressionError, kafka_error
from broker.kafka.fast_encode import RecordErrors, produce_response
from broker.storage.diskspace import is_out_of_space
from broker.storage.errors import KeylessRecordError
from ringlog_proto.batch import COMPRESSION_ZSTD, peek_codec
from ringlog_proto.frames import ProtocolError
from ringlog_proto.messages import Acks

PRODUCE: Final = 0
VERSIONS: Final = (0, 8)  # advertised from 0, but v0-2 are refused (`produce_refused`); v9+ flexible
REFUSED_BELOW: Final = 3  # librdkafka < 2.11 stops compressing unless Produce v0 is listed
RECORD_ERRORS_FROM: Final = 8  # KIP-467: record errors, an error message and INVALID_RECORD
ZSTD_MIN_VERSION: Final = 7  # KIP-110: the first Produce that may carry zstd batches
# Kafka acks -> ours: -1 (all in-sync replicas) is our acks=all: once the high watermark passes
# the batches when the partition is replicated, else (the one copy) after the fsync, as acks=2.
_ACKS: Final[dict[int, Acks]] = {0: Acks.NONE, 1: Acks.WRITTEN, -1: Acks.ALL}


def produce(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """Each partition through `Partition.produce`, the one door of a produce, as its own part
    of one `Gather`; the answers are combined into one response once every part is done.
    A partition of another core answers NOT_LEADER_OR_FOLLOWER (module rules)."""
    version = request.api_version
    acks = _ACKS.get(int(body.acks))
    core = ctx.core
    # (topic, index) -> (error, base offset, log start offset, message, log append time, record
    # errors), filled by the parts
    results: dict[tuple[str, int], tuple[ErrorCode, int, int, str | None, int, RecordErrors]] = {}
    order: list[tuple[str, list[int]]] = []
    # a request naming a transactional id (v3+) may carry transactional batches (Kafka's
    # LogValidator takes them; TV1: the coordinator is not asked, KIP-890 is not built)
    transactional = getattr(body, "transactional_id", None) is not None
    parts: list[Outcome] = []

    def refused(key: tuple[str, int], exc: BaseException) -> Reply:
        code, message = kafka_error(exc)
        results[key] = (code, -1, -1, message, -1, ())
        return DONE

    def stored(key: tuple[str, int], at: Stored) -> Reply:
        results[key] = (ErrorCode.none, at.base_offset, at.log_start_offset, None, at.log_append_time, ())
        return DONE

    for topic in body.topic_data:
        indexes: list[int] = []
        order.append((topic.name, indexes))
        refusal = ctx.topic_refusal(PRODUCE, topic.name)
        for data in topic.partition_data:
            key = (topic.name, int(data.index))
            indexes.append(key[1])
            if refusal is not None:
                results[key] = (ErrorCode.topic_authorization_failed, -1, -1, str(refusal), -1, ())
                continue
            if acks is None:
                results[key] = (ErrorCode.invalid_required_acks, -1, -1, f"acks {body.acks}", -1, ())
                continue
            if is_internal(topic.name):  # only its coordinators write it (broker/core/transactions.py)
                results[key] = (ErrorCode.invalid_topic_exception, -1, -1, "an internal topic", -1, ())
                continue
            if _more_than_one_batch(data.records):
                core.metrics.error()
                why = (
                    f"Produce requests with version {version} are only allowed to contain "
                    "exactly one record batch per partition"
                )
                results[key] = (ErrorCode.invalid_record, -1, -1, why, -1, ())
                continue
            try:
                part = _produce_partition(
                    ctx, key, data.records, acks, refused, stored, version, transactional
                )
            except KeylessRecordError as exc:
                results[key] = _keyless(key, exc, version)
                continue
            except Exception as exc:  # refused before anything was written
                code, message = kafka_error(exc)
                if is_out_of_space(exc):
                    core.space.saw_full(exc)
                results[key] = (code, -1, -1, message, -1, ())
                continue
            if part is not None:
                parts.append(part)

    def finish() -> Reply | Silent:
        if acks == Acks.NONE:
            return Silent()
        topics = [(name, [(i, *results[(name, i)]) for i in indexes]) for name, indexes in order]
        return Reply(produce_response(version, request.correlation_id, topics))

    if len(parts) == 1 and len(results) == 0 and isinstance(parts[0], Append):
        # The common request, one partition: its append answers the request itself, without
        # the gather's bookkeeping (the same calls, in the same order, as its part would make).
        one = parts[0]

        def answer() -> Reply | Silent:
            one.answer()  # the partition's result, which `finish` reads
            return finish()

        def fail(exc: BaseException) -> Reply | Silent:
            one.fail(exc)
            return finish()

        return Append(one.partition, one.pending, one.waits, one.publish, answer, fail)
    return Gather(parts, finish)


def _more_than_one_batch(records: bytes | memoryview | None) -> bool:
    """Whether the first batch's length (bytes 8-11, after the base offset) ends before the
    records do; a length past the end is the validation's to refuse."""
    if records is None or len(records) < 12:
        return False
    return 12 + int.from_bytes(records[8:12], "big", signed=True) < len(records)


def _keyless(
    key: tuple[str, int], exc: KeylessRecordError, version: int
) -> tuple[ErrorCode, int, int, str | None, int, RecordErrors]:
    """A partition's answer to records without a key on a compacted topic (module rules)."""
    if version < RECORD_ERRORS_FROM:
        return ErrorCode.invalid_record, -1, -1, None, -1, ()
    why = f"Compacted topic cannot accept message without key in topic partition {key[0]}-{key[1]}."
    return ErrorCode.invalid_record, -1, -1, str(exc), -1, tuple((i, why) for i in exc.indexes)


def _produce_partition(
    ctx: Context,
    key: tuple[str, int],
    records: bytes | memoryview | None,
    acks: Acks,
    refused: Any,
    stored: Any,
    version: int,
    transactional: bool = False,
) -> Outcome | None:
    """One partition's part of a Produce: None when it is answered already (`refused` or
    `stored` called), else the outcome that stores it. Raises what refuses it at once."""
    target = ctx.core.partition_named(*key)
    if version < ZSTD_MIN_VERSION and records and peek_codec(records) == COMPRESSION_ZSTD:
        raise UnsupportedCompressionError(f"Produce v{version} predates zstd (v7)")
    if not isinstance(target, Partition):
        refused(key, NotLeaderError(f"partition {key[1]} of {key[0]!r} is led by core {target}"))
        return None
    if not records:
        raise ValueError("a produce without records")
    # kio's bytes, or a view of the request (broker/kafka/fast_decode.py): stored as they are
    produced = target.produce(records, ctx.core.space, acks, transactional)
    if isinstance(produced, Stored):  # a retry of batches already stored
        reply = stored(key, produced)
        waiting = ctx.core.stored_reply(target, produced, reply, lambda exc: refused(key, exc))
        return None if waiting is reply else waiting

    def answer() -> Reply:
        return stored(key, produced.stored())

    def fail(exc: BaseException) -> Reply:
        produced.fail()
        if is_out_of_space(exc):
            ctx.core.space.saw_full(exc)
        return refused(key, exc)

    return Append(target, produced.pending, produced.waits, produced.complete, answer, fail)


def produce_refused(ctx: Context, request: KafkaRequest) -> Outcome:
    """Produce v0-2 (advertised, never answered with data): UNSUPPORTED_VERSION for every
    partition (module rules); acks=0 gets no answer at all."""
    ctx.core.metrics.error()
    try:
        topics = produce_v0_topics(request.data)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed kafka produce v{request.api_version}: {exc}") from exc
    if topics is None:  # acks=0: no answer at all
        return Silent()
    return Reply([produce_v0_refusal(request, topics, int(ErrorCode.unsupported_version))])
