"""An in-process fake broker for client unit tests: speaks the real frames, scripts the failures.

It answers ApiVersions and Metadata, and keeps a tiny in-memory log per partition for Produce and
Fetch, with the real broker's duplicate rule (same producer id, epoch and sequence range: answer
with the original offset, append nothing; a gap: OUT_OF_ORDER_SEQUENCE). A test scripts what
happens to each produce request with `on_produce`, which returns an `Action`.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from ringlog_proto import messages as m
from ringlog_proto.batch import iter_batches, set_base_offset
from ringlog_proto.frames import NEED_DATA, Frame, FrameDecoder


class Action(enum.Enum):
    OK = "ok"  # append (or dedupe) and answer
    DROP = "drop"  # close the connection without answering, before appending
    APPEND_THEN_DROP = "append_then_drop"  # append, then close without answering
    HANG = "hang"  # never answer (the request stays unanswered)
    HOLD = "hold"  # append, answer when the test calls `release`


@dataclass
class PartitionLog:
    batches: list[bytes] = field(default_factory=list)
    end: int = 0
    # producer id -> (epoch, [(first seq, last seq, base offset), ...])
    producers: dict[int, tuple[int, list[tuple[int, int, int]]]] = field(default_factory=dict)


@dataclass
class Received:
    topic_id: int
    partition: int
    records: bytes
    producer_id: int
    epoch: int
    base_sequence: int
    record_count: int


class FakeBroker:
    def __init__(self, topics: dict[str, int] | None = None, cores: int = 1) -> None:
        self.topics = {name: (i + 1, n) for i, (name, n) in enumerate((topics or {"t": 1}).items())}
        self.cores = cores
        self.logs: dict[tuple[int, int], PartitionLog] = {}
        self.received: list[Received] = []
        self.on_produce: Callable[[Received, int], Action | m.ErrorCode] = lambda r, i: Action.OK
        self.connections = 0
        self.requests: list[m.Request] = []
        self.held: list[tuple[asyncio.StreamWriter, Frame, m.Response]] = []  # answers of HOLD
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        await self._server.wait_closed()

    def log(self, topic: str, partition: int) -> PartitionLog:
        tid, _ = self.topics[topic]
        return self.logs.setdefault((tid, partition), PartitionLog())

    def release(self) -> int:
        """Send the answers HOLD kept, in the order they were held; how many."""
        held, self.held = self.held, []
        for writer, frame, resp in held:
            if not writer.is_closing():
                self._reply(writer, frame, resp)
        return len(held)

    def drop_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        decoder = FrameDecoder()
        try:
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    return
                decoder.feed(data)
                while True:
                    frame = decoder.next_frame()
                    if frame is NEED_DATA:
                        break
                    assert isinstance(frame, Frame)
                    if not self._handle(frame, writer):
                        writer.transport.abort()
                        return
        except (ConnectionError, OSError):
            return
        finally:
            self._writers.discard(writer)

    def _reply(self, writer: asyncio.StreamWriter, frame: Frame, resp: m.Response) -> None:
        writer.writelines(m.encode_response(resp, frame.correlation_id))

    def _handle(self, frame: Frame, writer: asyncio.StreamWriter) -> bool:
        req = m.decode_request(frame)
        self.requests.append(req)
        if isinstance(req, m.ApiVersionsRequest):
            apis = tuple(m.ApiVersion(k, m.CURRENT_VERSIONS[k], m.CURRENT_VERSIONS[k]) for k in m.ApiKey)
            self._reply(
                writer, frame, m.ApiVersionsResponse(broker_version="fake", cores=self.cores, apis=apis)
            )
        elif isinstance(req, m.MetadataRequest):
            names = req.topics or tuple(self.topics)
            out = []
            for name in names:
                if name not in self.topics:
                    out.append(m.TopicMetadata(m.ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name, 0))
                    continue
                tid, n = self.topics[name]
                parts = tuple(
                    m.PartitionMetadata(i, 0, 0, self.logs.get((tid, i), PartitionLog()).end)
                    for i in range(n)
                )
                out.append(m.TopicMetadata(m.ErrorCode.NONE, name, tid, partitions=parts))
            self._reply(
                writer,
                frame,
                m.MetadataResponse(host="127.0.0.1", port=self.port, cores=self.cores, topics=tuple(out)),
            )
        elif isinstance(req, m.ProduceRequest):
            return self._produce(req, frame, writer)
        elif isinstance(req, m.FetchRequest):
            log = self.logs.get((req.topic_id, req.partition), PartitionLog())
            data = b""
            pos = 0
            for b in log.batches:
                for _, h in iter_batches(b):
                    pos = h.base_offset + h.record_count
                if pos > req.offset:
                    data += b
            self._reply(
                writer, frame, m.FetchResponse(high_watermark=log.end, log_start_offset=0, records=data)
            )
        elif isinstance(req, m.ListOffsetsRequest):
            end = self.logs.get((req.topic_id, req.partition), PartitionLog()).end
            self._reply(
                writer, frame, m.ListOffsetsResponse(offset=end if req.spec == m.OffsetSpec.LATEST else 0)
            )
        else:
            self._reply(
                writer, frame, m.error_response(frame.api_key, m.ErrorCode.UNSUPPORTED_VERSION, "fake")
            )
        return True

    def _produce(self, req: m.ProduceRequest, frame: Frame, writer: asyncio.StreamWriter) -> bool:
        (_, h), *_ = list(iter_batches(req.records))
        rec = Received(
            req.topic_id,
            req.partition,
            req.records,
            h.producer_id,
            h.producer_epoch,
            h.base_sequence,
            h.record_count,
        )
        index = len(self.received)
        self.received.append(rec)
        action = self.on_produce(rec, index)
        if isinstance(action, m.ErrorCode):
            if req.acks:
                self._reply(writer, frame, m.error_response(frame.api_key, action, "scripted"))
            return True
        if action is Action.DROP:
            return False
        if action is Action.HANG:
            return True
        log = self.logs.setdefault((req.topic_id, req.partition), PartitionLog())
        result = self._append(log, rec)
        if action is Action.APPEND_THEN_DROP:
            return False
        if req.acks:
            if isinstance(result, m.ErrorCode):
                resp: m.Response = m.error_response(frame.api_key, result, "sequence")
            else:
                resp = m.ProduceResponse(
                    base_offset=result, end_offset=result + rec.record_count, log_start_offset=0
                )
            if action is Action.HOLD:
                self.held.append((writer, frame, resp))
            else:
                self._reply(writer, frame, resp)
        return True

    def _append(self, log: PartitionLog, rec: Received) -> int | m.ErrorCode:
        if rec.producer_id >= 0:
            state = log.producers.get(rec.producer_id)
            last = rec.base_sequence + rec.record_count - 1
            if state is not None:
                epoch, seen = state
                if rec.epoch < epoch:
                    return m.ErrorCode.OUT_OF_ORDER_SEQUENCE
                if rec.epoch == epoch:
                    for first, lst, base in seen:
                        if first == rec.base_sequence and lst == last:
                            return base  # duplicate
                    want = seen[-1][1] + 1 if seen else 0
                    if rec.base_sequence != want:
                        return m.ErrorCode.OUT_OF_ORDER_SEQUENCE
            if state is None or rec.epoch > state[0]:
                state = (rec.epoch, [])
                log.producers[rec.producer_id] = state
            state[1].append((rec.base_sequence, last, log.end))
            del state[1][:-5]
        base = log.end
        data = bytearray(rec.records)
        set_base_offset(data, base)
        log.batches.append(bytes(data))
        log.end += rec.record_count
        return base
