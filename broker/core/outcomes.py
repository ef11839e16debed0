"""What the I/O loop is told to do: the outcomes the protocol adapters return
(`RinglogAdapter.handle`, `KafkaAdapter.handle`).

Rules this module keeps:
- It sits at the bottom of the core: the backends, forwarding and the handlers all import it, and it
  imports none of them (the partition, pending append, extent and frame types are named only for
  type checkers), so a loop never has to import the request handlers to know what to carry out.
- An outcome is data plus continuations, never I/O: `Reply` (send these buffers), `Silent` (send
  nothing: acks=0), `Append` (run the log writes, then publish and answer, or `fail`), `Read`
  (read this extent, then `finish`), `Durable` (send after the partition's next flush), `Wait` (long poll:
  re-handle the frame when one of its partitions grows or the deadline passes), `Forward`
  (another core's partition: send the frame there and relay its answer), `Notify` (tell other
  cores, then answer), `Gather` (several of these for one request, one answer), `Later` (the answer depends
  on other requests yet to come: a JoinGroup waits for its group), `Opening` (first open the
  partitions named, in turns, then carry out what the request says).
- `Outcome` is the closed union: a backend's dispatch matches every member and treats anything
  else as a bug (`broker/backends/backend_core.py`), so adding an outcome means adding its case there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.core.acks import Waits

if TYPE_CHECKING:
    from broker.core.partition import Partition
    from broker.storage.log import PendingAppend
    from broker.storage.segment import Extent
    from ringlog_proto.frames import Buffer, Frame


@dataclass(slots=True)
class Reply:
    buffers: Sequence[Buffer]  # read, never changed: the handlers' lists of bytes pass as they are
    # after this reply nothing more is read, and the connection closes a moment later (a failed
    # authentication: broker/security/session.py)
    then_close: bool = False


@dataclass(slots=True)
class Silent:
    pass


@dataclass(slots=True)
class Append:
    """Run `pending.ops`; then `complete()` (and, for acks=durable, flush first) or `fail(exc)`.

    `complete()` is two steps, in this order unless a backend has reason for the other:
    `publish()` makes the written batches visible (the log, the producers' sequences, the long
    polls that wait for them) and `answer()` is the reply. The reply's fields (the offsets the
    prepare assigned, the log start offset) are known before the batches are published, so a
    backend that wrote them on its loop may send `answer()` first and publish after, in the same
    pass (`BackendCore._append`): nothing else runs on the loop in between, so no request sees the
    difference, and the publishing no longer delays the reply."""

    partition: Partition
    pending: PendingAppend
    waits: Waits  # what the reply waits for after the write (the partition decided it)
    publish: Callable[[], object]
    answer: Callable[[], Reply | Silent]
    fail: Callable[[BaseException], Reply | Silent]

    def complete(self) -> Reply | Silent:
        self.publish()
        return self.answer()


@dataclass(slots=True)
class FollowerAppend:
    """A follower's copy of its leader's batches (broker/core/replica_fetcher.py): run
    `pending.ops` in order with the partition's other appends, then `complete()` (which
    publishes) or `fail(exc)`. No client waits for it: it is not an `Outcome` a request returns
    but the broker's own work, carried out by `run_replica_append`, whose `done()` says it ended."""

    partition: Partition
    pending: PendingAppend
    publish: Callable[[], object]
    waits: Waits = Waits.WRITE  # nothing after the write: the leader's high watermark decides

    def complete(self) -> Silent:
        self.publish()
        return Silent()

    @staticmethod
    def answer() -> Silent:
        return Silent()  # nobody to answer

    @staticmethod
    def fail(exc: BaseException) -> Silent:
        return Silent()  # the fetcher learns of it from the log (nothing was made visible)


@dataclass(slots=True)
class Read:
    """Read `extent` (pread of its position and length); then `finish(data)`."""

    extent: Extent
    finish: Callable[[Buffer], Reply]
    fail: Callable[[BaseException], Reply] | None = None  # default: the handlers' error reply


@dataclass(slots=True)
class Durable:
    """Send `reply` once `partition` has been flushed (a retried acks=durable produce whose
    batches are stored but not yet known durable); `fail(exc)` if that flush fails."""

    partition: Partition
    reply: Reply
    fail: Callable[[BaseException], Reply]


@dataclass(slots=True)
class Wait:
    """Nothing to fetch yet (or less than the fetch asks): re-handle `frame` (or call `again`)
    when any of `partitions` grows, or carry out `on_timeout()` at the deadline.

    Several partitions: a Kafka Fetch names many, and a record in any of them must wake it. The
    backend parks it on each and, once woken or timed out, takes it off all of them.

    `log_end`: a follower's fetch, which reads to the log end: a high watermark move adds nothing
    it could read, so only a growing log end (or a change of role) wakes it (`Partition`'s
    `replica_waiters`); a consumer's fetch reads below the HW and is woken by either."""

    partitions: tuple[Partition, ...]
    frame: Frame | None
    deadline_ms: int
    on_timeout: Callable[[], Outcome]
    again: Callable[[], Outcome] | None = None  # runs instead of `frame` re-handled (Kafka, our fetches)
    log_end: bool = False


@dataclass(slots=True)
class Forward:
    """The partition of `frame` belongs to `core`: send the frame there over the inter-core channel
    and relay the answer (broker/core/forwarding.py does it; the backend only moves the bytes).

    `long_poll`: a fetch that may wait at the owner (send it where it holds nothing back);
    `expects_reply`: False for a produce with acks=0 (the owner sends nothing; answer Silent now).
    """

    core: int
    frame: Frame
    long_poll: bool
    expects_reply: bool


@dataclass(slots=True)
class Notify:
    """Send `frame` to each of `cores` over the inter-core channel, wait for every answer (or the
    notice timeout), then send `finish()`, or what it decides later (a `Later`: DeleteTopic's
    files are removed off the loop first). Used by DeleteTopic (see the module rules)."""

    frame: Frame
    cores: tuple[int, ...]
    finish: Callable[[], Reply | Later]


@dataclass(slots=True)
class Gather:
    """One request made of several partitions' work (a Kafka Produce or Fetch, or a DeleteTopics
    of several topics): carry out each of `parts` (Reply, Silent, Append, Read, Durable, Wait,
    Later, Notify), then send `finish()` in the request's one reply slot. The parts' own replies
    are ignored: their callbacks record what `finish` needs."""

    parts: list[Outcome]
    finish: Callable[[], Reply | Silent]


@dataclass(slots=True)
class Opening:
    """The request names partitions of this core used for the first time (`keys`: topic id,
    index), too many to make in one go: the core opens them in turns of about a millisecond
    (`Core.open_in_turns`), serving other connections between, then the backend carries out
    `then()` as the request's outcome. The connection takes no request after this one until then:
    its requests are carried out in the order they came, as Kafka's are."""

    keys: Sequence[tuple[int, int]]
    then: Callable[[], Outcome]


@dataclass(slots=True)
class Later:
    """The answer is decided by requests still to come (a JoinGroup waits for the rest of its
    group): the backend calls `start(answer)` once, and whoever decides calls `answer(reply)`
    once, on this core's loop (later calls are ignored). An answer for a connection closed
    meanwhile is dropped."""

    start: Callable[[Callable[[Reply | Silent], None]], None]


Outcome = Reply | Silent | Append | Read | Durable | Wait | Forward | Notify | Gather | Later | Opening
