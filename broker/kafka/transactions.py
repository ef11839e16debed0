"""Kafka's transaction APIs (KIP-98, transaction version 1): InitProducerId with a transactional
id (api 22), AddPartitionsToTxn (24, v0-3), AddOffsetsToTxn (25, v0-4), EndTxn (26, v0-4), and
KIP-664's DescribeTransactions (65, v0) and ListTransactions (66, v0-1), on the core's
transaction coordinator (broker/core/transactions.py).

Rules this module keeps:
- A request for a transactional id this core does not coordinate is NOT_COORDINATOR (the client
  asks FindCoordinator again, as against a Kafka broker that moved the id); its coordinator
  answers once the change is durable (a `Later`).
- The coordinator's `TxnCode`s are Kafka's error names; PRODUCER_FENCED goes as
  INVALID_PRODUCER_EPOCH to versions that predate it (InitProducerId < 4, the others < 2), as
  Kafka's KafkaApis does.
- AddPartitionsToTxn names topics: an unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION
  for it and OPERATION_NOT_ATTEMPTED for the rest, nothing added (Kafka). The internal topic
  may not join a transaction (INVALID_TOPIC_EXCEPTION, nothing added).
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.outcomes import Append, Gather, Later, Outcome, Reply, Silent
from broker.core.partition import Partition, PendingProduce
from broker.core.producer_state import CoordinatorFencedError
from broker.core.transactions import is_internal
from broker.core.txn_coordinator import Done, InitResult, TxnCode
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import DONE, NotLeaderError, kafka_error

log = logging.getLogger(__name__)

ADD_PARTITIONS_TO_TXN: Final = 24
ADD_OFFSETS_TO_TXN: Final = 25
END_TXN: Final = 26
WRITE_TXN_MARKERS: Final = 27
DESCRIBE_TRANSACTIONS: Final = 65
LIST_TRANSACTIONS: Final = 66
VERSIONS: Final[dict[int, tuple[int, int]]] = {
    ADD_PARTITIONS_TO_TXN: (0, 3),  # v4+: KIP-890's batched form for brokers (not built)
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 4),
    WRITE_TXN_MARKERS: (1, 2),  # v0 is gone from Kafka 4; v1 flexible
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
}
FENCED_FROM: Final = 2  # AddPartitions/AddOffsets/EndTxn versions that know PRODUCER_FENCED
INIT_FENCED_FROM: Final = 4
NO_THROTTLE: Final = datetime.timedelta(0)


def error_of(code: TxnCode) -> ErrorCode:
    if code is TxnCode.LIMIT_EXCEEDED:
        return ErrorCode.policy_violation
    return ErrorCode[code.value]


def _reply(request: KafkaRequest, **fields: Any) -> Reply:
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    return Reply(encode_response(request.correlation_id, make(schema, throttle_time=NO_THROTTLE, **fields)))


def init_transactional(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """InitProducerId with a transactional id: the coordinator's producer id and epoch."""
    core = ctx.core
    txn_id = str(body.transactional_id)
    version = request.api_version

    def answer(result: InitResult) -> Reply:
        if result.code is not TxnCode.NONE:
            core.metrics.error()
        return _reply(
            request,
            error_code=error_of(result.code),
            producer_id=result.producer_id,
            producer_epoch=result.producer_epoch,
        )

    ready = core.transactions.ready(txn_id)
    if ready is not TxnCode.NONE:
        return answer(InitResult(ready))
    pid, epoch = int(getattr(body, "producer_id", -1)), int(getattr(body, "producer_epoch", -1))
    expected = (pid, epoch) if pid >= 0 else None
    timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)

    def start(send: Callable[[Reply | Silent], None]) -> None:
        core.transactions.coordinator.init_producer_id(
            txn_id,
            timeout_ms,
            lambda result: send(answer(result)),
            expected=expected,
            knows_fenced=version >= INIT_FENCED_FROM,
        )

    return Later(start)


def add_partitions_to_txn(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    core = ctx.core
    txn_id = str(body.v3_and_below_transactional_id)
    topics = [(str(t.name), [int(i) for i in t.partitions]) for t in body.v3_and_below_topics]

    def answer(codes: dict[tuple[str, int], ErrorCode]) -> Reply:
        return _reply(
            request,
            results_by_topic_v3_and_below=tuple(
                make_topic_result(request, name, [(i, codes[(name, i)]) for i in indexes])
                for name, indexes in topics
            ),
        )

    def all_(code: ErrorCode) -> dict[tuple[str, int], ErrorCode]:
        return {(name, i): code for name, indexes in topics for i in indexes}

    ready = core.transactions.ready(txn_id)
    if ready is not TxnCode.NONE:
        core.metrics.error()
        return answer(all_(error_of(ready)))
    bad: dict[tuple[str, int], ErrorCode] = {}
    wanted: set[tuple[int, int]] = set()
    for name, indexes in topics:
        for i in indexes:
            if is_internal(name):
                bad[(name, i)] = ErrorCode.invalid_topic_exception
                continue
            topic = core.registry.by_name.get(name)
            if topic is None or not 0 <= i < topic.partitions:
                core.refresh_topics(force=True)
                topic = core.registry.by_name.get(name)
            if topic is None or not 0 <= i < topic.partitions:
                bad[(name, i)] = ErrorCode.unknown_topic_or_partition
            else:
                wanted.add((topic.topic_id, i))
    if bad:
        core.metrics.error()
        codes = all_(ErrorCode.operation_not_attempted)
        codes.update(bad)
        return answer(codes)
    return _coordinator_later(
        core,
        lambda code: answer(all_(error_of(code))),
        lambda done: core.transactions.coordinator.add_partitions(
            txn_id,
            int(body.v3_and_below_producer_id),
            int(body.v3_and_below_producer_epoch),
            wanted,
            done,
            knows_fenced=request.api_version >= FENCED_FROM,
        ),
    )


def make_topic_result(request: KafkaRequest, name: str, results: list[tuple[int, ErrorCode]]) -> Any:
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    return make(
        module.AddPartitionsToTxnTopicResult,
        name=name,
        results_by_partition=tuple(
            make(module.AddPartitionsToTxnPartitionResult, partition_index=i, partition_error_code=code)
            for i, code in results
        ),
    )


def _coordinator_later(core: Any, answer: Callable[[TxnCode], Reply], call: Callable[[Done], None]) -> Later:
    """`call(done)` on the coordinator, its code answered by `answer` once the change is durable;
    a code other than NONE counts as an error."""

    def start(send: Callable[[Reply | Silent], None]) -> None:
        def done(code: TxnCode) -> None:
            if code is not TxnCode.NONE:
                core.metrics.error()
            send(answer(code))

        call(done)

    return Later(start)


def _coordinator_call(
    ctx: Context, request: KafkaRequest, txn_id: str, call: Callable[[Done], None]
) -> Outcome:
    """A request answered by its error code alone: `txn_id`'s coordinator ready (else its code
    now), then `call(done)` on it (`_coordinator_later`)."""
    core = ctx.core

    def answer(code: TxnCode) -> Reply:
        return _reply(request, error_code=error_of(code))

    ready = core.transactions.ready(txn_id)
    if ready is not TxnCode.NONE:
        core.metrics.error()
        return answer(ready)
    return _coordinator_later(core, answer, call)


def add_offsets_to_txn(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    txn_id = str(body.transactional_id)
    return _coordinator_call(
        ctx,
        request,
        txn_id,
        lambda done: ctx.core.transactions.coordinator.add_offsets(
            txn_id,
            int(body.producer_id),
            int(body.producer_epoch),
            str(body.group_id),
            done,
            knows_fenced=request.api_version >= FENCED_FROM,
        ),
    )


def end_txn(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    txn_id = str(body.transactional_id)
    return _coordinator_call(
        ctx,
        request,
        txn_id,
        lambda done: ctx.core.transactions.coordinator.end_txn(
            txn_id,
            int(body.producer_id),
            int(body.producer_epoch),
            bool(body.committed),
            done,
            knows_fenced=request.api_version >= FENCED_FROM,
        ),
    )


def describe_transactions(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """DescribeTransactions (65, v0; KIP-664): each id as its coordinator holds it; an id of
    another core NOT_COORDINATOR, an unknown one TRANSACTIONAL_ID_NOT_FOUND (Kafka)."""
    core = ctx.core
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    states = []
    for raw in body.transactional_ids:
        txn_id = str(raw)
        ready = core.transactions.ready(txn_id)
        view = core.transactions.coordinator.describe(txn_id) if ready is TxnCode.NONE else ready
        if isinstance(view, TxnCode):
            core.metrics.error()
            states.append(
                make(
                    module.TransactionState,
                    error_code=error_of(view),
                    transactional_id=txn_id,
                    transaction_state="",
                    transaction_timeout=datetime.timedelta(0),
                    transaction_start_time=_ms(-1),
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for topic_id, index in view.partitions:
            name = core.topic_name(topic_id)
            if name is not None:
                by_topic.setdefault(name, []).append(index)
        states.append(
            make(
                module.TransactionState,
                error_code=ErrorCode.none,
                transactional_id=txn_id,
                transaction_state=view.state.value,
                transaction_timeout=datetime.timedelta(milliseconds=view.timeout_ms),
                transaction_start_time=_ms(view.start_ms),
                producer_id=view.producer_id,
                producer_epoch=view.producer_epoch,
                topics=tuple(
                    make(module.TopicData, topic=name, partitions=tuple(sorted(parts)))
                    for name, parts in sorted(by_topic.items())
                ),
            )
        )
    return _reply(request, transaction_states=tuple(states))


def list_transactions(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """ListTransactions (66, v0-1): the ids this core coordinates (an admin client asks every
    broker: each core is one here), filtered by state, producer id and (v1) duration."""
    core = ctx.core
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    listed = core.transactions.coordinator.list_transactions(
        [str(s) for s in body.state_filters],
        [int(p) for p in body.producer_id_filters],
        int(getattr(body, "duration_filter", -1)),
    )
    if isinstance(listed, TxnCode):
        core.metrics.error()
        return _reply(request, error_code=error_of(listed), unknown_state_filters=(), transaction_states=())
    found, unknown = listed
    authorizer, principal = ctx.authorizer, ctx.auth.principal
    if authorizer.enabled:  # only the ids the principal may describe (Kafka)
        found = [t for t in found if authorizer.allowed(principal, "describe", "transactional_id", t.txn_id)]
    return _reply(
        request,
        error_code=ErrorCode.none,
        unknown_state_filters=tuple(unknown),
        transaction_states=tuple(
            make(
                module.TransactionState,
                transactional_id=t.txn_id,
                producer_id=t.producer_id,
                transaction_state=t.state.value,
            )
            for t in found
        ),
    )


def write_txn_markers(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """Kafka's WriteTxnMarkers (27, v1-2): a marker written to each named partition this core
    leads, through `Partition.write_marker` (the door our coordinators' markers use), answered
    once each is durable. Kafka's brokers send it to each other; clients send it to abort a
    hanging transaction (KIP-664's `Admin.abortTransaction`, allowed with alter on the cluster by
    KIP-1037: broker/kafka/authorize.py). A partition of another core is NOT_LEADER_OR_FOLLOWER,
    a fenced marker INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED; group markers
    (Kafka's __consumer_offsets partitions) are not named by this request's clients."""
    core = ctx.core
    schema = response_schema(request.api_key, request.api_version)
    assert schema is not None
    module = sys.modules[schema.__module__]
    results: dict[tuple[int, str, int], ErrorCode] = {}
    parts: list[Outcome] = []
    for n, marker in enumerate(body.markers):
        for topic in marker.topics:
            for raw in topic.partition_indexes:
                key = (n, str(topic.name), int(raw))
                try:
                    target = core.partition_named(key[1], key[2])
                    if not isinstance(target, Partition):
                        raise NotLeaderError(f"partition {key[2]} of {key[1]!r} is led by core {target}")
                    pending = target.write_marker(
                        int(marker.producer_id),
                        int(marker.producer_epoch),
                        int(marker.coordinator_epoch),
                        bool(marker.transaction_result),
                    )
                except CoordinatorFencedError as exc:
                    results[key] = ErrorCode.transaction_coordinator_fenced
                    log.info("WriteTxnMarkers to %s/%d: %s", key[1], key[2], exc)
                    continue
                except Exception as exc:
                    results[key] = kafka_error(exc)[0]
                    continue
                parts.append(_marker_append(target, pending, key, results))

    def finish() -> Reply:
        markers = []
        for n, marker in enumerate(body.markers):
            topics = tuple(
                make(
                    module.WritableTxnMarkerTopicResult,
                    name=str(topic.name),
                    partitions=tuple(
                        make(
                            module.WritableTxnMarkerPartitionResult,
                            partition_index=int(i),
                            error_code=results[(n, str(topic.name), int(i))],
                        )
                        for i in topic.partition_indexes
                    ),
                )
                for topic in marker.topics
            )
            markers.append(
                make(module.WritableTxnMarkerResult, producer_id=marker.producer_id, topics=topics)
            )
        if any(code != ErrorCode.none for code in results.values()):
            core.metrics.error()
        return Reply(encode_response(request.correlation_id, make(schema, markers=tuple(markers))))

    return Gather(parts, finish)


def _marker_append(
    p: Partition,
    pending: PendingProduce,
    key: tuple[int, str, int],
    results: dict[tuple[int, str, int], ErrorCode],
) -> Append:
    def answer() -> Reply:
        results[key] = ErrorCode.none
        return DONE

    def fail(exc: BaseException) -> Reply:
        pending.fail()
        results[key] = kafka_error(exc)[0]
        return DONE

    return Append(p, pending.pending, pending.waits, pending.complete, answer, fail)


def _ms(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
