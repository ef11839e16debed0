"""InitProducerId (api 22, v0-4): the producer id and epoch of an idempotent Kafka producer.

Rules this module keeps:
- Ids and epochs come from the core (`Core.producer_ids`, broker/core/producer_ids.py): a new
  id at epoch 0, or, when a v3+ request names its current id and epoch (KIP-360, librdkafka and
  Java ask after some errors), the same id at the next epoch. Any core answers: no coordinator
  (FindCoordinator is not needed by an idempotent producer, only by a transactional one).
- Transactions are not supported yet: a transactional id is refused here and in FindCoordinator
  (key type 1, broker/kafka/groups.py) with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the answer a
  Kafka broker gives a principal that may not use that transactional id: no transactional id may
  be used here. Tried against the clients, it is the one code that all of them take as fatal at
  once, at either request: librdkafka 2.16 (`init_transactions()` raises a fatal error carrying
  FindCoordinator's message), aiokafka 0.14 (`start()` raises), kafka-python 3
  (`init_transactions()` raises) and Java's (a fatal error). The others tried fail slowly or not
  at all in librdkafka, which retries any other FindCoordinator error and InitProducerId's
  COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST and UNSUPPORTED_VERSION until its timeout (our
  earlier answers: COORDINATOR_NOT_AVAILABLE, then INVALID_REQUEST, each a 60 s hang);
  CLUSTER_AUTHORIZATION_FAILED is fatal too but names an ACL on the cluster.
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
from broker.kafka.errors import kafka_error

INIT_PRODUCER_ID: Final = 22
VERSIONS: Final = (0, 4)  # v2+ flexible
TRANSACTIONS_REFUSED: Final = ErrorCode.transactional_id_authorization_failed  # module rules


def transactions_refused(transactional_id: str) -> str:
    """Why a transactional id is refused, where the response has room for a message (librdkafka
    and Java show FindCoordinator's to the application)."""
    return (
        f"ringlog does not support transactions yet: transactional.id {transactional_id!r} is refused "
        "(an idempotent producer without transactional.id is supported)"
    )


def init_producer_id(core: Core, request: KafkaRequest, body: Any) -> Outcome:
    """A new producer id at epoch 0, or the bumped epoch of the one named (v3+). Where the ids'
    counter is etcd (`source.remote`), a block is claimed on a `run_blocking` thread, not on the
    core's loop, and a counter that cannot be reached is COORDINATOR_NOT_AVAILABLE (retriable)."""
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
    if body.transactional_id is not None:
        core.metrics.error()
        code = TRANSACTIONS_REFUSED
    else:
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
