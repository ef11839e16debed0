"""InitProducerId (api 22, v0-4): the producer id and epoch of an idempotent Kafka producer.

Rules this module keeps:
- Ids and epochs come from the core (`Core.producer_ids`, broker/core/producer_ids.py): a new
  id at epoch 0, or, when a v3+ request names its current id and epoch (KIP-360, librdkafka and
  Java ask after some errors), the same id at the next epoch. Any core answers: no coordinator
  (FindCoordinator is not needed by an idempotent producer, only by a transactional one).
- A transactional id's producer id and epoch come from its transaction coordinator
  (broker/kafka/transactions.py `init_transactional`): NOT_COORDINATOR on another core.
- v2+ are flexible versions: kio reads and writes their headers (request header v2, response
  header v1) and tagged fields, and writes a tagged field only when it is not the default (this
  response has none but the empty tag buffer).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from broker.core.core import Core
from broker.core.outcomes import Later, Outcome, Reply, Silent
from broker.kafka.codec import KafkaRequest, encode_response, make, response_schema
from broker.kafka.context import Context
from broker.kafka.errors import kafka_error
from broker.kafka.transactions import init_transactional

INIT_PRODUCER_ID: Final = 22
VERSIONS: Final = (0, 4)  # v2+ flexible


def init_producer_id(ctx: Context, request: KafkaRequest, body: Any) -> Outcome:
    """A new producer id at epoch 0, or the bumped epoch of the one named (v3+). Where the ids'
    counter is etcd (`source.remote`), a block is claimed on a `run_blocking` thread, not on the
    core's loop, and a counter that cannot be reached is COORDINATOR_NOT_AVAILABLE (retriable).
    A transactional id's come from its coordinator (broker/kafka/transactions.py)."""
    core = ctx.core
    if body.transactional_id is not None:
        return init_transactional(ctx, request, body)
    current = int(getattr(body, "producer_id", -1)), int(getattr(body, "producer_epoch", -1))
    ids = core.producer_ids
    if body.transactional_id is None and ids.needs_block(*current) and getattr(ids.source, "remote", False):

        def start(answer: Callable[[Reply | Silent], None]) -> None:
            def claimed(first: int | BaseException) -> None:
                if isinstance(first, BaseException):
                    answer(_answer(core, request, body, first))
                else:
                    ids.add_block(first)
                    answer(_answer(core, request, body))

            core.run_blocking(lambda: ids.source.claim_block(ids.block_size), claimed)

        return Later(start)
    return _answer(core, request, body)


def _answer(core: Core, request: KafkaRequest, body: Any, failed: BaseException | None = None) -> Reply:
    schema = response_schema(INIT_PRODUCER_ID, request.api_version)
    assert schema is not None
    code, producer_id, epoch = ErrorCode.none, -1, -1
    current = int(getattr(body, "producer_id", -1)), int(getattr(body, "producer_epoch", -1))
    try:
        if failed is not None:
            raise failed
        producer_id, epoch = core.producer_ids.init(*current)
    except Exception as exc:  # the counter: a full disk, etcd away (both retriable), unreadable
        core.metrics.error()
        code = kafka_error(exc)[0]
    resp = make(
        schema,
        throttle_time=datetime.timedelta(0),
        error_code=code,
        producer_id=producer_id,
        producer_epoch=epoch,
    )
    return Reply(encode_response(request.correlation_id, resp))
