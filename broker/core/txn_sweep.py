"""Hanging transactions: open in a partition, ended by no coordinator, holding its last stable
offset (and every read_committed reader) back for ever.

A transaction hangs when its data reached a partition but its marker never will: a produce that
named a transactional id its coordinator no longer knows (state lost, or expired), a coordinator
bug, or a late produce that reached the partition after its transaction's marker (the race
KIP-890 closes, not built here). Kafka leaves this to an operator (KIP-664):
`kafka-transactions.sh find-hanging` lists each partition's producers with a transaction open
(DescribeProducers) whose last write is older than the maximum transaction timeout, asks the
coordinators (ListTransactions by producer id, DescribeTransactions) and calls a transaction
hanging when no coordinator holds it open with that partition; its `abort` command then writes
the ABORT marker (WriteTxnMarkers). Here each core does the same by itself.

Rules this module keeps:
- Every `--transaction-hang-check-interval-ms` (60 s) each core takes the open transactions of
  the partitions it leads whose producer last wrote there longer ago than the maximum transaction
  timeout plus two abort intervals (by then a coordinator that holds the transaction has aborted
  it on its own: it scans every abort interval) and asks every transaction coordinator whether
  it holds that producer id Ongoing or prepared with that partition, or has a change of it under
  way: on one node this node's (`holds`: this core's directly, the other cores' with a
  FIND_HELD_TXNS frame over the inter-core links, as markers travel); in a cluster every core of
  every node the view says is live (another node's over the core's remote links to that core's
  direct port, as markers travel there). Each answer also names the state partitions its
  coordinator has loaded.
- Only when every coordinator answered and none holds it is the transaction aborted: an ABORT
  marker through the partition's door (`Partition.write_marker`, the producer's own epoch, its
  last coordinator epoch), as this core's own append, once; a failure is logged and the next
  round tries again. A coordinator that cannot be asked (its core or node down, a link that
  fails or times out, its state partitions loading or not loadable) means nothing is aborted
  that round; in a cluster so does any node of the view that is not live, a state partition
  with no live leader in the view, the state topic not known here, or a state partition that no
  answer names loaded (its transactions would be unknown to all). A false abort of a held
  transaction must never happen; a hanging one left for a later round only waits. The
  partition is looked at again just before: if its producer wrote, or the transaction ended,
  meanwhile, it is left alone.
- One round at a time: a round still asking, or still writing its markers, when the next is due
  makes that one skip. A clustered node before its first view skips too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from broker.core.own_appends import OwnAppend, append_own
from broker.core.producer_state import CoordinatorFencedError, FencedEpochError
from broker.core.replication import NotLeaderError
from broker.core.transactions import TXN_STATE_TOPIC, is_internal
from broker.core.txn_markers import one_target
from ringlog_proto import messages as m
from ringlog_proto.apis.body import REQUEST_ARRAY_MAX
from ringlog_proto.frames import Frame

if TYPE_CHECKING:
    from broker.core.partition import Partition

log = logging.getLogger(__name__)

# (producer id, topic id, partition): "does any coordinator hold this one open here?"
Question = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A transaction open in a partition this core leads, idle past the threshold."""

    topic_id: int
    partition: int
    producer_id: int
    producer_epoch: int
    first_offset: int
    last_write_ms: int
    coordinator_epoch: int
    last_sequence: int  # with the rest, tells whether the producer wrote here since

    @property
    def question(self) -> Question:
        return (self.producer_id, self.topic_id, self.partition)


# a coordinator's answer: one bool per question (held?), and the state partitions it has loaded
Answer = tuple[list[bool], frozenset[int]]


class HoldLinks(Protocol):
    """How the question reaches the coordinator of another core of this node."""

    def ask(self, core: int, questions: Sequence[Question], done: Callable[[Answer | None], None]) -> None:
        """`done(answer)`, or `done(None)` when `core` could not tell."""
        ...


def answer_reader(
    where: str, questions: Sequence[Question], done: Callable[[Answer | None], None]
) -> Callable[[Frame | BaseException], None]:
    """The callback reading a FIND_HELD_TXNS answer from `where`: `done(None)` for anything but
    a whole answer."""

    def answered(result: Frame | BaseException) -> None:
        if isinstance(result, BaseException):
            log.info("hanging transactions: %s cannot be asked: %s", where, result)
            done(None)
            return
        try:
            resp = m.decode_response(result)
        except Exception as exc:
            log.error("hanging transactions: an answer of %s that does not read: %s", where, exc)
            done(None)
            return
        if (
            not isinstance(resp, m.FindHeldTxnsResponse)
            or resp.error != m.ErrorCode.NONE
            or len(resp.held) != len(questions)
        ):
            log.info("hanging transactions: %s cannot tell: %s", where, getattr(resp, "message", ""))
            done(None)
            return
        done((list(resp.held), frozenset(resp.loaded)))

    return answered


class PeerHoldLinks:
    """`HoldLinks` over the backend's inter-core links (`send_to_core`): a FIND_HELD_TXNS frame."""

    def __init__(
        self, send_to_core: Callable[[int, Frame, bool, Callable[[Frame | BaseException], None]], None]
    ) -> None:
        self.send_to_core = send_to_core

    def ask(self, core: int, questions: Sequence[Question], done: Callable[[Answer | None], None]) -> None:
        frame = m.request_frame(m.FindHeldTxnsRequest(tuple(questions)))
        self.send_to_core(core, frame, False, answer_reader(f"core {core}", questions, done))


def holds(core: Any, questions: Sequence[Question]) -> list[bool] | None:
    """This core's coordinator's answer to each question, or None when it cannot tell (a state
    partition it has opened is not loaded, on one node, or one is still loading). `core`: the
    Core."""
    txns = core.transactions
    topic = core.registry.by_name.get(TXN_STATE_TOPIC)
    # in a cluster this core may follow state partitions it does not lead: the asking sweep
    # checks instead that every one is loaded by some answering coordinator
    if topic is not None and not core.cluster.clustered:
        for index in range(topic.partitions):
            if (topic.topic_id, index) in core.partitions and not txns.coordinator.owns(index):
                return None  # its ids are unknown until it loads
    holding = txns.coordinator.holding({pid for pid, _, _ in questions})
    if holding is None:
        return None
    held: list[bool] = []
    for pid, tid, index in questions:
        parts = holding.get(pid, frozenset())
        held.append(parts is None or (tid, index) in parts)
    return held


def add_candidates(core: Any, p: Partition, now_ms: int, threshold_ms: int, out: list[Candidate]) -> None:
    """The transactions open in `p`, if this core leads it, whose producer has not written there
    for `threshold_ms`: appended to `out`."""
    if p.replica is not None:
        try:
            p.check_leader()
        except NotLeaderError:
            return
    tid, index = p.topic_id, p.index
    name = core.topic_name(tid)
    if name is None or is_internal(name):
        return
    for pid, epoch, first, last_write_ms, coordinator_epoch in p.producers.open_transactions():
        if last_write_ms + threshold_ms <= now_ms:
            seq = _last_sequence(p, pid)
            out.append(Candidate(tid, index, pid, epoch, first, last_write_ms, coordinator_epoch, seq))


class HangSweep:
    """One core's rounds (module rules). Owned by the core's loop."""

    # core: the Core (broker/core/core.py)
    def __init__(
        self,
        core: Any,
        own_append: OwnAppend,
        links: HoldLinks | None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.core = core
        self.own_append = own_append
        self.links = links
        self.clock_ms = clock_ms
        config = core.config
        self.threshold_ms = config.transaction_max_timeout_ms + 2 * config.transaction_abort_interval_ms
        self._running = False
        self.aborted = 0  # markers written, for tests and logs
        # the look for candidates, in turns of the core's loop (broker/core/sweeps.py)
        self._sweep = core.partition_sweep("hanging transactions")

    def run(self, done: Callable[[], None] | None = None) -> None:
        """One round; `done()` when it is over (at once when it skips).

        The candidates are gathered in turns of the core's loop: a candidate found early in the
        pass may have moved on by its end, which needs no atomic look across partitions since
        each is looked at again just before its abort (module rules)."""
        finish = done or (lambda: None)
        clustered = self.core.config.cluster is not None
        if self._running or (clustered and not self.core.cluster.clustered):
            finish()
            return
        self._running = True
        now = self.clock_ms()
        found: list[Candidate] = []

        def gathered() -> None:
            self._running = False
            self._round(found, finish)

        self.core.sweep_partitions(
            self._sweep, lambda p: add_candidates(self.core, p, now, self.threshold_ms, found), gathered
        )

    def _round(self, found: list[Candidate], finish: Callable[[], None]) -> None:
        """The rest of a round, once its candidates are gathered: ask, then abort."""
        clustered = self.core.config.cluster is not None
        # the longest idle first; what one frame cannot ask waits for the next round
        found = sorted(found, key=lambda c: c.last_write_ms)
        found = found[:REQUEST_ARRAY_MAX]  # one open transaction per producer and partition
        if not found:
            finish()
            return
        state_partitions: int | None = None
        if clustered:
            state_partitions, why = self._cluster_ready()
            if state_partitions is None:
                log.info(
                    "hanging transactions: %d open past %d ms, not aborted this round (%s)",
                    len(found),
                    self.threshold_ms,
                    why,
                )
                finish()
                return
        self._running = True

        def over() -> None:
            self._running = False  # its markers written (or failed): the next round may look
            finish()

        questions = [c.question for c in found]
        targets = self._coordinators()
        answers: dict[tuple[int, int], Answer | None] = {}

        def answered(target: tuple[int, int], answer: Answer | None) -> None:
            answers[target] = answer
            if len(answers) < len(targets):
                return
            given = [a for a in answers.values() if a is not None]
            why = ""
            if len(given) < len(answers):
                why = "a coordinator could not be asked"
            elif state_partitions is not None:
                loaded = frozenset().union(*(a[1] for a in given))
                if not loaded.issuperset(range(state_partitions)):
                    why = f"state partitions {sorted(set(range(state_partitions)) - loaded)} loaded nowhere"
            if why:
                log.info(
                    "hanging transactions: %d open past %d ms, not aborted this round (%s)",
                    len(found),
                    self.threshold_ms,
                    why,
                )
                over()
                return
            held_by_any = {q for i, q in enumerate(questions) if any(a[0][i] for a in given)}
            hanging = [c for c in found if c.question not in held_by_any]
            self._abort_all(hanging, over)

        node = self.core.config.node_id
        me = self.core.config.core_id
        for target in targets:
            there, core = target
            if target == (node, me):
                held = holds(self.core, questions)
                loaded = frozenset(self.core.transactions.coordinator.loaded())
                answered(target, None if held is None else (held, loaded))
            elif there != node:
                self._ask_remote(there, core, questions, partial(answered, target))
            elif self.links is None:
                answered(target, None)
            else:
                self.links.ask(core, questions, partial(answered, target))

    def _coordinators(self) -> list[tuple[int, int]]:
        """(node, core) of every coordinator to ask: this node's cores; in a cluster those of
        every live node too (`_cluster_ready` checked each has an address)."""
        config = self.core.config
        out = [(config.node_id, c) for c in range(config.cores)]
        view = self.core.cluster
        if config.cluster is not None:
            for node in sorted(view.live - {config.node_id}):
                out += [(node, c) for c in range(view.nodes[node].cores)]
        return out

    def _cluster_ready(self) -> tuple[int | None, str]:
        """(the number of state partitions, "") when a cluster's round may ask, else (None, why
        not): every node of the view live with an address, and each state partition led by a
        live node in the view."""
        view = self.core.cluster
        down = sorted(set(view.nodes) - view.live)
        if down:
            return None, f"nodes {down} not live"
        missing = sorted(n for n in view.live if n not in view.nodes or not view.nodes[n].cores)
        if missing:
            return None, f"nodes {missing} have no address in the view"
        topic = self.core.registry.by_name.get(TXN_STATE_TOPIC)
        if topic is None:
            return None, f"{TXN_STATE_TOPIC} not known here"
        for index in range(topic.partitions):
            state = view.state_of(topic.topic_id, index)
            if state is None or state.leader not in view.live:
                return None, f"{TXN_STATE_TOPIC} partition {index} has no live leader"
        return topic.partitions, ""

    def _ask_remote(
        self, node: int, core: int, questions: Sequence[Question], done: Callable[[Answer | None], None]
    ) -> None:
        """Ask a core of another node over the core's remote links, to its direct port."""
        address = self.core.cluster.nodes.get(node)
        remote = self.core.remote_links
        if address is None or remote is None:
            done(None)
            return
        where = (address.host, address.core_port(core))
        deadline = time.monotonic() + self.core.config.limits.forward_timeout_ms / 1000
        frame = m.request_frame(m.FindHeldTxnsRequest(tuple(questions)))
        try:
            remote.request(where, frame, deadline, answer_reader(f"node {node} core {core}", questions, done))
        except ValueError as exc:  # an address that is not an IP literal: the view is wrong
            log.error("hanging transactions: node %d: %s", node, exc)
            done(None)

    def _abort_all(self, hanging: list[Candidate], done: Callable[[], None]) -> None:
        if not hanging:
            done()
            return
        one_done = one_target(len(hanging), done)
        for c in hanging:
            self._abort(c, one_done)

    def _abort(self, c: Candidate, done: Callable[[], None]) -> None:
        p: Partition | None = self.core.partitions.get((c.topic_id, c.partition))
        now = None if p is None else _open_transaction(p, c.producer_id)
        if now != (c.producer_epoch, c.first_offset, c.last_write_ms, c.coordinator_epoch, c.last_sequence):
            done()  # it moved on meanwhile (a write, a marker, a new epoch, the partition gone)
            return
        assert p is not None
        try:
            pending = p.write_marker(c.producer_id, c.producer_epoch, max(c.coordinator_epoch, 0), False)
        except (NotLeaderError, FencedEpochError, CoordinatorFencedError) as exc:
            log.info(
                "hanging transaction of producer %d in %d/%d: %s", c.producer_id, c.topic_id, c.partition, exc
            )
            done()
            return
        except Exception as exc:
            log.warning(
                "hanging transaction of producer %d in %d/%d not aborted: %s (the next round tries again)",
                c.producer_id,
                c.topic_id,
                c.partition,
                exc,
            )
            done()
            return

        def written(error: BaseException | None) -> None:
            if error is not None:
                log.warning(
                    "hanging transaction of producer %d in %d/%d not aborted: %s (tried again next round)",
                    c.producer_id,
                    c.topic_id,
                    c.partition,
                    error,
                )
            else:
                self.aborted += 1
                log.warning(
                    "hanging transaction aborted: producer %d epoch %d in topic id %d partition %d, open "
                    "from offset %d, idle since %d ms ago, held by no coordinator",
                    c.producer_id,
                    c.producer_epoch,
                    c.topic_id,
                    c.partition,
                    c.first_offset,
                    self.clock_ms() - c.last_write_ms,
                )
            done()

        append_own(self.own_append, p, pending, written)


def _last_sequence(p: Partition, producer_id: int) -> int:
    known = p.producers.producer(producer_id)
    return -1 if known is None else known[1]


def _open_transaction(p: Partition, producer_id: int) -> tuple[int, int, int, int, int] | None:
    for pid, epoch, first, last_write_ms, coordinator_epoch in p.producers.open_transactions():
        if pid == producer_id:
            return (epoch, first, last_write_ms, coordinator_epoch, _last_sequence(p, pid))
    return None
