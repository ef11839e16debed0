"""Request handlers: decode, validate, decide; never wait, never touch a socket.

Rules this module keeps:
- `Handlers.handle(frame)` returns an `Outcome` saying what to do, not doing the I/O itself:
  `Reply` (send these buffers), `Silent` (send nothing: acks=0), `Append` (run the log writes, then
  call `complete` or `fail`), `Read` (read this extent, then call `finish`), `Wait` (nothing to
  fetch yet: re-handle the frame when the partition grows or the deadline passes). The uvloop
  backend runs these with blocking file calls; the io_uring backend will run the very same
  outcomes as SQEs. The handlers are therefore testable with no server at all.
- One place maps exceptions to wire error codes (`error_of`). A request that fails gets an error
  response; only a frame that cannot be delimited closes its connection (the server's business).
- Responses leave in request order per connection; the backend guarantees it, not this module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from broker import __version__
from broker.partition import Partition, SequenceError
from broker.storage.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    InvalidBatchError,
    LogClosedError,
    OffsetOutOfRangeError,
    StorageError,
)
from broker.storage.log import LogConfig, PendingAppend
from broker.storage.segment import Extent
from broker.topics import Topic, TopicError, TopicRegistry
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Frame
from ringlog_proto.routing import shard_for

log = logging.getLogger(__name__)

BROKER_VERSION = __version__
FETCH_MAX_BYTES_MAX = 4 * 1024 * 1024  # one fetch answer; below the 8 MiB frame limit with room
FETCH_WAIT_MS_MAX = 60_000  # a long poll longer than a minute is a client bug, not a wish


@dataclass(slots=True)
class Reply:
    buffers: list[bytes]


@dataclass(slots=True)
class Silent:
    pass


@dataclass(slots=True)
class Append:
    """Run `pending.ops`; then `complete()` (and, for acks=durable, flush first) or `fail(exc)`."""

    partition: Partition
    pending: PendingAppend
    acks: int
    complete: Callable[[], Reply | Silent]
    fail: Callable[[BaseException], Reply | Silent]


@dataclass(slots=True)
class Read:
    """Read `extent` (pread of its position and length); then `finish(data)`."""

    extent: Extent
    finish: Callable[[bytes], Reply]


@dataclass(slots=True)
class Durable:
    """Send `reply` once `partition` has been flushed (a retried acks=durable produce whose
    batches are stored but not yet known durable); `fail(exc)` if that flush fails."""

    partition: Partition
    reply: Reply
    fail: Callable[[BaseException], Reply]


@dataclass(slots=True)
class Wait:
    """Nothing to fetch yet: re-handle `frame` when `partition` grows, or answer empty at the deadline."""

    partition: Partition
    frame: Frame
    deadline_ms: int
    on_timeout: Callable[[], Reply]


Outcome = Reply | Silent | Append | Read | Durable | Wait


def error_of(exc: BaseException) -> tuple[m.ErrorCode, str]:
    """The one mapping from exceptions to wire error codes."""
    E = m.ErrorCode
    match exc:
        case m.MalformedBody():
            return E.INVALID_REQUEST, f"malformed request: {exc}"
        case BatchTooLargeError():
            return E.MESSAGE_TOO_LARGE, str(exc)
        case InvalidBatchError():
            return E.CORRUPT_MESSAGE, str(exc)
        case OffsetOutOfRangeError():
            return E.OFFSET_OUT_OF_RANGE, str(exc)
        case SequenceError():
            return E.OUT_OF_ORDER_SEQUENCE, str(exc)
        case CorruptBatchError() | LogClosedError() | StorageError() | OSError():
            return E.STORAGE_ERROR, str(exc)
        case TopicError(kind="exists"):
            return E.TOPIC_ALREADY_EXISTS, str(exc)
        case TopicError(kind="unknown"):
            return E.UNKNOWN_TOPIC_OR_PARTITION, str(exc)
        case TopicError(kind="invalid"):
            return E.INVALID_TOPIC, str(exc)
        case TopicError():
            return E.INVALID_CONFIG, str(exc)
        case GroupError():
            return E.INVALID_GROUP, str(exc)
        case ValueError():
            return E.INVALID_REQUEST, str(exc)
    return E.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    port: int = 9092
    node_id: int = 0
    cores: int = 1
    core_id: int = 0
    log_defaults: LogConfig = field(default_factory=LogConfig)


class Handlers:
    """The request-handling state of one core: its topics view and the partitions it owns."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.registry = TopicRegistry(config.data_dir, config.log_defaults)
        self.partitions: dict[tuple[int, int], Partition] = {}
        for topic in self.registry.by_id.values():
            self._open_topic(topic)
        self._dispatch: dict[int, Callable[[m.Request, Frame], Outcome]] = {
            m.ApiKey.API_VERSIONS: self._api_versions,
            m.ApiKey.METADATA: self._metadata,
            m.ApiKey.CREATE_TOPIC: self._create_topic,
            m.ApiKey.DELETE_TOPIC: self._delete_topic,
            m.ApiKey.PRODUCE: self._produce,
            m.ApiKey.FETCH: self._fetch,
            m.ApiKey.LIST_OFFSETS: self._list_offsets,
            m.ApiKey.OFFSET_COMMIT: self._offset_commit,
            m.ApiKey.OFFSET_FETCH: self._offset_fetch,
        }

    def close(self) -> None:
        for p in self.partitions.values():
            try:
                p.close()
            except StorageError as exc:
                log.error("closing partition %d/%d: %s", p.topic_id, p.index, exc)
        self.partitions.clear()

    def owner(self, topic_id: int, partition: int) -> int:
        return shard_for(topic_id, partition, self.config.cores)

    def _open_topic(self, topic: Topic) -> None:
        for i in range(topic.partitions):
            if self.owner(topic.topic_id, i) == self.config.core_id:
                path = self.registry.partition_dir(topic.topic_id, i)
                self.partitions[(topic.topic_id, i)] = Partition(topic.topic_id, i, path, topic.log_config())

    # ------------------------------------------------------------------------- entry point

    def handle(self, frame: Frame) -> Outcome:
        reason = m.unsupported(frame)
        if reason is not None:
            return self._error(frame, m.ErrorCode.UNSUPPORTED_VERSION, reason)
        try:
            req = m.decode_request(frame)
            return self._dispatch[frame.api_key](req, frame)
        except Exception as exc:  # every failure becomes an error response
            code, message = error_of(exc)
            if code == m.ErrorCode.UNKNOWN_SERVER_ERROR:
                log.exception("unexpected error handling api %d", frame.api_key)
            return self._error(frame, code, message)

    def _reply(self, frame: Frame, resp: m.Response) -> Reply:
        return Reply(m.encode_response(resp, frame.correlation_id, None, frame.topic_id, frame.partition))

    def error_reply(self, frame: Frame, exc: BaseException) -> Reply:
        """The error response for `exc` raised while carrying out an outcome for `frame`."""
        code, message = error_of(exc)
        return self._error(frame, code, message)

    def _error(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply:
        resp = m.error_response(frame.api_key, code, message)
        return Reply(
            m.encode_response(resp, frame.correlation_id, frame.api_key, frame.topic_id, frame.partition)
        )

    def _partition(self, frame: Frame) -> Partition:
        p = self.partitions.get((frame.topic_id, frame.partition))
        if p is not None:
            return p
        topic = self.registry.by_id.get(frame.topic_id)
        if topic is None or not 0 <= frame.partition < topic.partitions:
            raise TopicError("unknown", f"no partition {frame.partition} of topic id {frame.topic_id}")
        raise TopicError(
            "unknown", f"partition {frame.partition} of topic id {frame.topic_id} is not on this core"
        )

    # ------------------------------------------------------------------------- admin

    def _api_versions(self, req: m.Request, frame: Frame) -> Outcome:
        apis = tuple(m.ApiVersion(k, lo, hi) for k, (lo, hi) in sorted(m.SUPPORTED_VERSIONS.items()))
        resp = m.ApiVersionsResponse(
            broker_version=BROKER_VERSION, node_id=self.config.node_id, cores=self.config.cores, apis=apis
        )
        return self._reply(frame, resp)

    def _metadata(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.MetadataRequest)
        names = req.topics or tuple(sorted(self.registry.by_name))
        topics = []
        for name in names:
            topic = self.registry.by_name.get(name)
            if topic is None:
                topics.append(m.TopicMetadata(m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name, 0))
                continue
            parts = []
            for i in range(topic.partitions):
                p = self.partitions.get((topic.topic_id, i))
                start, end = (p.log.start_offset, p.log.end_offset) if p is not None else (-1, -1)
                parts.append(m.PartitionMetadata(i, self.owner(topic.topic_id, i), start, end))
            topics.append(
                m.TopicMetadata(
                    m.ErrorCode.NONE,
                    topic.name,
                    topic.topic_id,
                    _wire_limit(topic.retention_ms),
                    _wire_limit(topic.retention_bytes),
                    topic.segment_bytes,
                    tuple(parts),
                )
            )
        resp = m.MetadataResponse(
            host=self.config.host,
            port=self.config.port,
            cores=self.config.cores,
            steering=False,
            topics=tuple(topics),
        )
        return self._reply(frame, resp)

    def _create_topic(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.CreateTopicRequest)
        topic = self.registry.create(
            req.name, req.partitions, req.retention_ms, req.retention_bytes, req.segment_bytes
        )
        try:
            self._open_topic(topic)
        except Exception:
            self._drop_topic(topic)
            raise
        log.info("created topic %s (id %d, %d partitions)", topic.name, topic.topic_id, topic.partitions)
        return self._reply(frame, m.CreateTopicResponse(topic_id=topic.topic_id))

    def _delete_topic(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.DeleteTopicRequest)
        topic = self.registry.delete(req.name)
        self._drop_topic(topic)
        log.info("deleted topic %s (id %d)", topic.name, topic.topic_id)
        return self._reply(frame, m.DeleteTopicResponse())

    def _drop_topic(self, topic: Topic) -> None:
        self.registry.by_id.pop(topic.topic_id, None)
        self.registry.by_name.pop(topic.name, None)
        for i in range(topic.partitions):
            p = self.partitions.pop((topic.topic_id, i), None)
            if p is not None:
                p.close()
        self.registry.remove_files(topic)

    # ------------------------------------------------------------------------- produce

    def _produce(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.ProduceRequest)
        if req.acks not in (m.Acks.NONE, m.Acks.WRITTEN, m.Acks.DURABLE):
            raise ValueError(f"acks must be 0, 1 or 2, not {req.acks}")
        p = self._partition(frame)
        log_ = p.log
        headers = log_.validate(req.records)
        duplicate_of = p.check_sequences(headers)
        if duplicate_of is not None:
            # A retry of batches already stored: answer with their offsets, but only what the
            # log can stand behind. A log refusing work (a failed fsync) confirms nothing, and a
            # durable retry waits for a flush covering the original.
            log_.check_usable()
            end = duplicate_of + sum(h.record_count for h in headers)
            if req.acks == m.Acks.NONE:
                return Silent()
            reply = self._reply(
                frame,
                m.ProduceResponse(
                    base_offset=duplicate_of, end_offset=end, log_start_offset=log_.start_offset
                ),
            )
            if req.acks == m.Acks.DURABLE and log_.durable_offset < end:
                return Durable(p, reply, lambda exc: self.error_reply(frame, exc))
            return reply
        pending = log_.prepare_append(req.records, headers)

        def complete() -> Reply | Silent:
            log_.complete_append(pending)
            p.appended(pending.headers)
            if req.acks == m.Acks.NONE:
                return Silent()
            resp = m.ProduceResponse(
                base_offset=pending.base_offset,
                end_offset=pending.next_offset,
                log_start_offset=log_.start_offset,
            )
            return self._reply(frame, resp)

        def fail(exc: BaseException) -> Reply | Silent:
            if req.acks == m.Acks.NONE:
                return Silent()
            return self.error_reply(frame, exc)

        return Append(p, pending, req.acks, complete, fail)

    # ------------------------------------------------------------------------- fetch

    def _fetch(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.FetchRequest)
        if req.max_bytes <= 0 or req.max_wait_ms < 0:
            raise ValueError(
                f"max_bytes must be > 0 and max_wait_ms >= 0 ({req.max_bytes}, {req.max_wait_ms})"
            )
        p = self._partition(frame)
        log_ = p.log
        extent = log_.prepare_read(req.offset, min(req.max_bytes, FETCH_MAX_BYTES_MAX))

        def answer(records: bytes) -> Reply:
            resp = m.FetchResponse(
                high_watermark=log_.end_offset, log_start_offset=log_.start_offset, records=records
            )
            return self._reply(frame, resp)

        if extent is not None:

            def finish(data: bytes) -> Reply:
                result = log_.complete_read(extent, data)
                if result.error is not None:
                    log.error("%s", result.error)
                return answer(result.data)

            return Read(extent, finish)
        if req.max_wait_ms == 0:
            return answer(b"")
        deadline = now_ms() + min(req.max_wait_ms, FETCH_WAIT_MS_MAX)
        return Wait(p, frame, deadline, lambda: answer(b""))

    def _list_offsets(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.ListOffsetsRequest)
        log_ = self._partition(frame).log
        if req.spec == m.OffsetSpec.LATEST:
            offset = log_.end_offset
        elif req.spec == m.OffsetSpec.EARLIEST:
            offset = log_.start_offset
        elif req.spec >= 0:
            found = log_.offset_for_timestamp(req.spec)
            offset = -1 if found is None else found
        else:
            raise ValueError(f"offset spec {req.spec}: use -1 (latest), -2 (earliest) or a timestamp")
        return self._reply(frame, m.ListOffsetsResponse(offset=offset))

    # ------------------------------------------------------------------------- groups

    def _offset_commit(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.OffsetCommitRequest)
        _check_group(req.group)
        p = self._partition(frame)
        if req.offset < 0:
            raise ValueError(f"cannot commit negative offset {req.offset}")
        p.commit_offset(req.group, req.offset, req.metadata)
        return self._reply(frame, m.OffsetCommitResponse())

    def _offset_fetch(self, req: m.Request, frame: Frame) -> Outcome:
        assert isinstance(req, m.OffsetFetchRequest)
        _check_group(req.group)
        offset, metadata = self._partition(frame).group_offsets.get(req.group, (-1, ""))
        return self._reply(frame, m.OffsetFetchResponse(offset=offset, metadata=metadata))

    # ------------------------------------------------------------------------- housekeeping

    def apply_retention(self) -> int:
        deleted = 0
        for p in self.partitions.values():
            try:
                deleted += p.log.apply_retention()
            except StorageError as exc:
                log.error("retention on partition %d/%d: %s", p.topic_id, p.index, exc)
        return deleted


def _wire_limit(value: int | None) -> int:
    return -2 if value is None else value


class GroupError(ValueError):
    """A consumer-group id the broker will not store."""


def _check_group(group: str) -> None:
    if not group or len(group) > 255:
        raise GroupError(f"a group id must be 1-255 characters, not {len(group)}")
