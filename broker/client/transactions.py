"""A transactional producer's state, as a pure machine: which calls are allowed when, which
partitions the transaction holds, and what an error makes of it (Kafka's client
`TransactionManager`, KIP-98 and KIP-360).

Rules this module keeps:
- No I/O, no event loop, no clock: the producer (broker/client/producer.py) asks before it
  acts (`begin`, `check_send`, `begin_commit`, `begin_abort`) and tells what happened
  (`initialized`, `added`, `failed`, `completed`).
- States: UNINITIALIZED until `init_transactions()` has a producer id and epoch from the
  coordinator; READY between transactions; IN_TRANSACTION from `begin_transaction()`;
  COMMITTING / ABORTING while EndTxn is under way; ABORTABLE_ERROR once anything of the
  transaction failed (a batch, an AddPartitionsToTxn): only `abort_transaction()` leads on, and
  then the producer asks the coordinator for a bumped epoch (KIP-360) before the next
  transaction; FATAL_ERROR when the producer is fenced (a newer one with the same
  transactional id started: PRODUCER_FENCED, INVALID_PRODUCER_EPOCH), refused its id
  (TRANSACTIONAL_ID_AUTHORIZATION_FAILED) or out of step with the coordinator
  (INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING): nothing but `close()` is left, as in Kafka's.
- A partition is added to the transaction (AddPartitionsToTxn) before its first batch of the
  transaction is sent; `added` holds those the coordinator took, `pending` those asked for.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

from broker.client.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionalIdAuthorizationError,
    TransactionError,
)

TopicPartitionKey = tuple[str, int]


class ConsumerGroupMetadata(NamedTuple):
    """A consumer's place in its group, for `send_offsets_to_transaction` (Kafka's
    ConsumerGroupMetadata): the coordinator refuses offsets of a member of an old generation."""

    group_id: str
    generation: int = -1  # -1 and no member: offsets stored whatever the group's members
    member_id: str = ""


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable error"
    FATAL_ERROR = "fatal error"


# errors after which the producer can do nothing more (Kafka's fatal errors)
FATAL: Final = (ProducerFencedError, TransactionalIdAuthorizationError, InvalidTxnStateError)


def is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, FATAL) or (isinstance(exc, TransactionError) and exc.fatal)


class TransactionState:
    """The transaction state of one producer (module rules)."""

    __slots__ = (
        "added",
        "error",
        "offsets_added",
        "pending",
        "producer_epoch",
        "producer_id",
        "state",
        "txn_id",
    )

    def __init__(self, txn_id: str) -> None:
        self.txn_id = txn_id
        self.state = TxnState.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.added: set[TopicPartitionKey] = set()
        self.pending: set[TopicPartitionKey] = set()
        self.offsets_added = False  # AddOffsetsToTxn was answered: EndTxn is needed
        self.error: BaseException | None = None  # what made the state an error state

    # ------------------------------------------------------------------------- questions

    @property
    def started(self) -> bool:
        """Whether the coordinator knows of this transaction (a partition or offsets added): only
        then has EndTxn anything to end."""
        return bool(self.added) or self.offsets_added

    def needs_epoch_bump(self) -> bool:
        """After an abortable error the producer's sequences may disagree with the partitions':
        a new epoch from the coordinator (KIP-360) starts them again."""
        return self.error is not None and not is_fatal(self.error)

    # ------------------------------------------------------------------------- checks

    def _raise_error_state(self, action: str) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise TransactionError(
                f"{self.txn_id!r}: cannot {action}: the producer failed fatally: {self.error}", fatal=True
            ) from self.error
        if self.state is TxnState.ABORTABLE_ERROR:
            raise TransactionError(
                f"{self.txn_id!r}: cannot {action}: the transaction must be aborted: {self.error}",
                abortable=True,
            ) from self.error

    def check_init(self) -> None:
        self._raise_error_state("init_transactions")
        if self.state is not TxnState.UNINITIALIZED:
            raise TransactionError(f"{self.txn_id!r}: init_transactions() was called already")

    def begin(self) -> None:
        self._raise_error_state("begin_transaction")
        if self.state is not TxnState.READY:
            raise TransactionError(
                f"{self.txn_id!r}: begin_transaction() in state {self.state.value}"
                + (" (call init_transactions() first)" if self.state is TxnState.UNINITIALIZED else "")
            )
        self.state = TxnState.IN_TRANSACTION

    def check_send(self) -> None:
        """A record may join the transaction only while one is open."""
        self._raise_error_state("send")
        if self.state is not TxnState.IN_TRANSACTION:
            raise TransactionError(
                f"{self.txn_id!r}: send outside a transaction (state {self.state.value}): "
                "call begin_transaction() first"
            )

    def check_offsets(self) -> None:
        self._raise_error_state("send_offsets_to_transaction")
        if self.state is not TxnState.IN_TRANSACTION:
            raise TransactionError(
                f"{self.txn_id!r}: send_offsets_to_transaction() outside a transaction "
                f"(state {self.state.value})"
            )

    def begin_commit(self) -> None:
        self._raise_error_state("commit_transaction")
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.COMMITTING):
            raise TransactionError(f"{self.txn_id!r}: commit_transaction() in state {self.state.value}")
        self.state = TxnState.COMMITTING

    def begin_abort(self) -> None:
        if self.state is TxnState.FATAL_ERROR:
            self._raise_error_state("abort_transaction")
        if self.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING):
            raise TransactionError(f"{self.txn_id!r}: abort_transaction() in state {self.state.value}")
        self.state = TxnState.ABORTING

    # ------------------------------------------------------------------------- events

    def initialized(self, producer_id: int, producer_epoch: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        if self.state is TxnState.UNINITIALIZED:
            self.state = TxnState.READY

    def ask_add(self, tp: TopicPartitionKey) -> bool:
        """Whether `tp` must be asked for now (neither added nor asked already)."""
        if tp in self.added or tp in self.pending:
            return False
        self.pending.add(tp)
        return True

    def added_partitions(self, tps: set[TopicPartitionKey]) -> None:
        self.pending -= tps
        self.added |= tps

    def not_added(self, tps: set[TopicPartitionKey]) -> None:
        """An AddPartitionsToTxn to ask again (a retriable error)."""
        self.pending -= tps

    def failed(self, exc: BaseException) -> None:
        """Something of the transaction failed: fatal errors end the producer, others the
        transaction (the first error is kept; a fatal one replaces an abortable one)."""
        if self.state is TxnState.FATAL_ERROR:
            return
        if is_fatal(exc):
            self.state = TxnState.FATAL_ERROR
            self.error = exc
            return
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING, TxnState.ABORTABLE_ERROR):
            if self.error is None:
                self.error = exc
            self.state = TxnState.ABORTABLE_ERROR
        elif self.state is TxnState.ABORTING and self.error is None:
            self.error = exc  # the epoch bump after the abort still applies

    def completed(self) -> None:
        """EndTxn succeeded (or there was nothing to end, and the epoch is bumped if it had to
        be): the next transaction may begin."""
        self.state = TxnState.READY
        self.added.clear()
        self.pending.clear()
        self.offsets_added = False
        self.error = None
