"""The `ringlog` PySpark data source: batch read, batch write, streaming read, streaming write.

Rules this module keeps:
- Everything Spark pickles to executors (readers, writers, input partitions) holds only plain
  values: options, offsets, ids. Connections are made inside `read` / `write` (see `_io.py`).
- Options stay Spark's case-insensitive dict: `startingoffsets` and `startingOffsets` are one
  option, so they are looked up through it, never copied into a plain dict.
- The offset ranges of a read are fixed on the driver (`partitions()`); tasks never ask "what is
  the end now", so a task retry reads exactly the same records.
- Offsets travel as Spark Kafka's JSON: {"topic": {"0": 42, "1": 7}}, partition keys as strings.
- A write task's producer id is a function of the run id and the task's partition id, and its
  epoch is the attempt number: a retry fences the attempt before it, skips what that attempt
  already appended (it counts its own producer id's records in the log since the write began),
  and writes the rest. Exactly-once per task retry with deterministic input; see docs/SPARK.md.
- Arrow batches match SCHEMA exactly (types and field order): Spark checks, and the Arrow path
  is 2.5-3x faster than tuples.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.client import AuthenticationError, Producer, key_partition
from broker.spark import _io
from broker.spark._io import RinglogSparkError

FORMAT = "ringlog"

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), False), StructField("value", BinaryType(), True)]),
    False,
)
SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS_TYPE, True),
    ]
)
WRITE_COLUMNS = ("value", "key", "partition", "headers", "timestamp")
IGNORED_WRITE_COLUMNS = ("topic", "offset")  # so a DataFrame read from ringlog can be written back
ROUND_ROBIN_RUN = 1024  # keyless records: this many in a row to one partition, then the next
EARLIEST, LATEST = -2, -1  # in offset JSON, as in Spark's Kafka source


def arrow_schema() -> pa.Schema:
    header = pa.struct([pa.field("key", pa.string(), False), pa.field("value", pa.binary())])
    return pa.schema(
        [
            pa.field("topic", pa.string(), False),
            pa.field("partition", pa.int32(), False),
            pa.field("offset", pa.int64(), False),
            pa.field("timestamp", pa.timestamp("us", tz="UTC"), False),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("headers", pa.list_(pa.field("element", header, False))),
        ]
    )


# ----------------------------------------------------------------------------------------- options


def _required(options: Any, name: str) -> str:
    value = options.get(name)
    if not value:
        raise RinglogSparkError(f"ringlog: option {name!r} is required")
    return str(value)


def _bool(options: Any, name: str, default: bool) -> bool:
    value = options.get(name)
    if value is None:
        return default
    if str(value).lower() not in ("true", "false"):
        raise RinglogSparkError(f"ringlog: option {name!r} must be true or false, not {value!r}")
    return str(value).lower() == "true"


def _int(options: Any, name: str, default: int | None, minimum: int = 1) -> int | None:
    value = options.get(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        raise RinglogSparkError(f"ringlog: option {name!r} must be an integer, not {value!r}") from None
    if n < minimum:
        raise RinglogSparkError(f"ringlog: option {name!r} must be at least {minimum}, not {n}")
    return n


def resolve_offsets(
    spec: str, name: str, topic: str, starts: Sequence[int], ends: Sequence[int]
) -> list[int]:
    """One offset per partition from "earliest", "latest" or Spark Kafka's JSON
    ({"topic": {"0": 42, "1": -2}}: -2 earliest, -1 latest). Partitions the JSON leaves out take
    the default: earliest for a start, latest for an end. Offsets are clamped to the log."""
    text = spec.strip()
    if text == "earliest":
        return list(starts)
    if text == "latest":
        return list(ends)
    try:
        parsed = json.loads(text)
    except ValueError:
        raise RinglogSparkError(
            f"ringlog: {name} must be 'earliest', 'latest' or JSON like {{{json.dumps(topic)}: "
            f'{{"0": 42}}}}, not {spec!r}'
        ) from None
    if not isinstance(parsed, dict) or set(parsed) - {topic}:
        raise RinglogSparkError(f"ringlog: {name} names topics {sorted(parsed)}; this reads {topic!r}")
    out = list(starts if name.lower().startswith("start") else ends)
    for key, off in parsed.get(topic, {}).items():
        p = int(key)
        if not 0 <= p < len(starts):
            raise RinglogSparkError(f"ringlog: {name}: topic {topic!r} has no partition {p}")
        n = int(off)
        out[p] = starts[p] if n == EARLIEST else ends[p] if n == LATEST else min(n, ends[p])
    return out


def broker_options(options: Any) -> _io.Broker:
    """'bootstrap' and the TLS and SASL options, checked here on the driver (a wrong one fails
    the job before any task starts). The password is an option as in Spark's Kafka source
    (`kafka.sasl.jaas.config`): pass it from a secret store, not a literal in the job."""
    mechanism = options.get("sasl.mechanism")
    broker = _io.Broker(
        bootstrap=_required(options, "bootstrap"),
        tls=_bool(options, "tls", False) or bool(options.get("tls.ca") or options.get("tls.cert")),
        tls_ca=options.get("tls.ca") or None,
        tls_cert=options.get("tls.cert") or None,
        tls_key=options.get("tls.key") or None,
        sasl_mechanism=mechanism or None,
        sasl_username=options.get("sasl.username") or "",
        sasl_password=options.get("sasl.password") or "",
    )
    try:
        broker.security()
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError: a file that does not load
        raise RinglogSparkError(f"ringlog: the tls and sasl options: {exc}") from exc
    if mechanism and not broker.sasl_password:
        raise RinglogSparkError("ringlog: option 'sasl.mechanism' needs 'sasl.username' and 'sasl.password'")
    return broker


@dataclass(frozen=True, slots=True)
class ReadOptions:
    broker: _io.Broker
    topic: str
    fail_on_data_loss: bool
    max_records_per_split: int | None
    fetch_bytes: int

    @classmethod
    def parse(cls, options: Any) -> ReadOptions:
        return cls(
            broker=broker_options(options),
            topic=_required(options, "topic"),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            max_records_per_split=_int(options, "maxRecordsPerSplit", None),
            fetch_bytes=_int(options, "fetchMaxBytes", _io.FETCH_BYTES_DEFAULT) or _io.FETCH_BYTES_DEFAULT,
        )


# ----------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class OffsetRange(InputPartition):
    """One Spark task's share of a read: offsets [start, end) of one ringlog partition."""

    topic: str
    partition: int
    start: int
    end: int


def split_ranges(
    topic: str, bounds: dict[int, tuple[int, int]], max_records: int | None
) -> list[OffsetRange]:
    """Ranges of at most `max_records` offsets (None: one per partition) covering
    partition -> [start, end); empty ranges are dropped."""
    out: list[OffsetRange] = []
    for p, (s, e) in sorted(bounds.items()):
        step = max_records or max(e - s, 1)
        out.extend(OffsetRange(topic, p, lo, min(lo + step, e)) for lo in range(s, e, step))
    return out


def _to_arrow(topic: str, partition: int, chunk: _io.Chunk, schema: pa.Schema) -> pa.RecordBatch:
    n = len(chunk.offsets)
    headers = [[{"key": k, "value": v} for k, v in h] for h in chunk.headers]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array(chunk.offsets, pa.int64()),
            pa.array(chunk.timestamps, pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            pa.array(chunk.keys, pa.binary()),
            pa.array(chunk.values, pa.binary()),
            pa.array(headers, schema.field("headers").type),
        ],
        schema=schema,
    )


def read_range(opts: ReadOptions, r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow record batches of one offset range, one per fetch (up to fetchMaxBytes)."""
    schema = arrow_schema()
    for chunk in _io.fetch_range(
        opts.broker,
        r.topic,
        r.partition,
        r.start,
        r.end,
        fail_on_data_loss=opts.fail_on_data_loss,
        fetch_bytes=opts.fetch_bytes,
    ):
        yield _to_arrow(r.topic, r.partition, chunk, schema)


class RinglogReader(DataSourceReader):
    """Batch read: the offset ranges are fixed here, on the driver, when Spark plans the job."""

    def __init__(self, opts: ReadOptions, starting: str, ending: str) -> None:
        self.opts = opts
        self.starting = starting
        self.ending = ending

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        starts, ends = _io.partition_offsets(o.broker, o.topic)
        lo = resolve_offsets(self.starting, "startingOffsets", o.topic, starts, ends)
        hi = resolve_offsets(self.ending, "endingOffsets", o.topic, starts, ends)
        for p, (s, e) in enumerate(zip(lo, hi, strict=True)):
            if s < starts[p] and o.fail_on_data_loss:
                raise _io._data_loss(o.topic, p, s, e, starts[p])
        bounds = {p: (s, max(s, e)) for p, (s, e) in enumerate(zip(lo, hi, strict=True))}
        ranges = split_ranges(o.topic, bounds, o.max_records_per_split)
        # Spark needs at least one partition to run the read (it may be empty).
        return ranges or [OffsetRange(o.topic, 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        if partition.end > partition.start:
            yield from read_range(self.opts, partition)


# ----------------------------------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class WriteOptions:
    broker: _io.Broker
    topic: str
    acks: int
    linger_ms: int
    fail_first_attempt_after: int | None  # test hook: see docs/SPARK.md

    @classmethod
    def parse(cls, options: Any) -> WriteOptions:
        acks = (options.get("acks") or "1").lower()
        if acks not in ("0", "1", "2", "none", "written", "durable"):
            raise RinglogSparkError(
                f"ringlog: option 'acks' must be 1 (written) or 2 (durable), not {acks!r}"
            )
        level = {"none": 0, "written": 1, "durable": 2}.get(acks)
        level = int(acks) if level is None else level
        if level == 0:
            raise RinglogSparkError(
                "ringlog: acks=0 is not supported for writes: without answers a retried task cannot "
                "know what its failed attempt appended; use acks 1 or 2"
            )
        return cls(
            broker=broker_options(options),
            topic=_required(options, "topic"),
            acks=level,
            linger_ms=_int(options, "lingerMs", 5, minimum=0) or 0,
            fail_first_attempt_after=_int(options, "_failFirstAttemptAfter", None, minimum=0),
        )


def check_write_schema(schema: StructType) -> None:
    names = [f.name.lower() for f in schema.fields]
    if "value" not in names:
        raise RinglogSparkError(
            f"ringlog: writing needs a 'value' column (binary or string); the DataFrame has {names}"
        )
    unknown = sorted(set(names) - set(WRITE_COLUMNS) - set(IGNORED_WRITE_COLUMNS))
    if unknown:
        raise RinglogSparkError(
            f"ringlog: cannot write columns {unknown}; a ringlog record has value, key, partition, headers "
            "and timestamp (select or drop the others first)"
        )
    for f in schema.fields:
        name = f.name.lower()
        if name in ("value", "key") and not isinstance(f.dataType, BinaryType | StringType):
            raise RinglogSparkError(f"ringlog: column {f.name!r} must be binary or string, not {f.dataType}")
        if name == "partition" and not isinstance(f.dataType, IntegerType | LongType):
            raise RinglogSparkError(f"ringlog: column 'partition' must be int, not {f.dataType}")
        if name == "timestamp" and not isinstance(f.dataType, TimestampType):
            raise RinglogSparkError(f"ringlog: column 'timestamp' must be a timestamp, not {f.dataType}")


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task appended, and what it found its failed attempt had appended already."""

    partition_id: int
    attempt: int
    written: int
    skipped: int


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    for i, field in enumerate(batch.schema):
        if field.name.lower() == name:
            col = batch.column(i)
            if name in ("value", "key") and pa.types.is_string(col.type):
                col = col.cast(pa.binary())
            elif name == "timestamp":
                col = col.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
            return col.to_pylist()
    return None


def write_task(
    opts: WriteOptions,
    batches: Iterator[pa.RecordBatch],
    producer_id: int,
    attempt: int,
    task_index: int,
    starts: dict[int, int],
) -> WriteReport:
    """Produce every row of `batches`; on a retry (attempt > 0) skip what earlier attempts appended.

    Partitions are chosen deterministically (the partition column, else the key's hash, else runs
    of ROUND_ROBIN_RUN keyless records starting at the task's index), so that "the first n records
    this task routed to partition p" is the same set on every attempt.
    """
    n_parts = len(starts)
    done = _io.records_by_producer(opts.broker, opts.topic, starts, producer_id) if attempt else {}
    routed = [0] * n_parts
    errors: list[BaseException] = []

    def on_done(_md: object, exc: BaseException | None) -> None:
        if exc is not None and len(errors) < 10:
            errors.append(exc)

    written = skipped = keyless = 0
    topic = opts.topic
    try:
        producer = Producer(
            opts.broker.bootstrap,
            security=opts.broker.security(),
            acks=opts.acks,
            linger_ms=opts.linger_ms,
            producer_id=producer_id,
            producer_epoch=min(attempt, (1 << 15) - 1),
            client_name="ringlog-spark-writer",
        )
    except (OSError, ConnectionError, AuthenticationError) as exc:
        raise RinglogSparkError(f"ringlog: cannot reach the broker at {opts.broker} ({exc})") from exc
    try:
        for batch in batches:
            rows = batch.num_rows
            values = _column(batch, "value")
            keys = _column(batch, "key") or [None] * rows
            parts = _column(batch, "partition") or [None] * rows
            stamps = _column(batch, "timestamp") or [None] * rows
            raw_headers = _column(batch, "headers") or [None] * rows
            assert values is not None
            for i in range(rows):
                key = keys[i]
                p = parts[i]
                if p is None:
                    if key is not None:
                        p = key_partition(key, n_parts)
                    else:
                        p = (task_index + keyless // ROUND_ROBIN_RUN) % n_parts
                        keyless += 1
                elif not 0 <= p < n_parts:
                    raise RinglogSparkError(
                        f"ringlog: row with partition {p}: topic {topic!r} has {n_parts} partitions"
                    )
                seen = routed[p]
                routed[p] = seen + 1
                if seen < done.get(p, 0):
                    skipped += 1
                    continue
                h = raw_headers[i]
                headers = [(x["key"], x["value"]) for x in h] if h else ()
                producer.send(topic, values[i], key, headers, p, stamps[i], on_done)
                written += 1
                if (
                    opts.fail_first_attempt_after is not None
                    and attempt == 0
                    and written >= opts.fail_first_attempt_after
                ):
                    producer.flush()
                    raise RuntimeError(f"ringlog test hook: failing attempt 0 after {written} records")
            if errors:
                break
        producer.flush()
    finally:
        producer.close()
    if errors:
        raise RinglogSparkError(f"ringlog: writing to {topic!r} failed: {errors[0]}") from errors[0]
    return WriteReport(task_index, attempt, written, skipped)


class RinglogWriter(DataSourceArrowWriter):
    """Batch write. Made on the driver (run id, log ends now), pickled to every task."""

    def __init__(self, opts: WriteOptions, run_id: str, starts: dict[int, int]) -> None:
        self.opts = opts
        self.run_id = run_id
        self.starts = starts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        assert ctx is not None
        index = ctx.partitionId()
        pid = _io.producer_id_for(self.run_id, index)
        return write_task(self.opts, iterator, pid, ctx.attemptNumber(), index, self.starts)


class RinglogStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: one producer identity per (query run, micro-batch, task)."""

    def __init__(self, opts: WriteOptions, run_id: str, starts: dict[int, int]) -> None:
        self.opts = opts
        self.run_id = run_id
        self.starts = starts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        assert ctx is not None
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") or f"t{time.time_ns()}"
        index = ctx.partitionId()
        pid = _io.producer_id_for(self.run_id, batch_id, index)
        return write_task(self.opts, iterator, pid, ctx.attemptNumber(), index, self.starts)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


# ----------------------------------------------------------------------------------------- streaming


def _offset_json(topic: str, offsets: Sequence[int] | dict[int, int]) -> dict[str, dict[str, int]]:
    items = offsets.items() if isinstance(offsets, dict) else enumerate(offsets)
    return {topic: {str(p): int(o) for p, o in items}}


def _from_json(topic: str, offset: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset.get(topic, {}).items()}


def limit_rows(start: dict[int, int], end: dict[int, int], max_rows: int) -> dict[int, int]:
    """Cut [start, end) down to about `max_rows` records in all, shared by partition in proportion
    to what each has waiting (as Spark's Kafka source does with maxOffsetsPerTrigger)."""
    waiting = {p: max(0, e - start.get(p, e)) for p, e in end.items()}
    total = sum(waiting.values())
    if total <= max_rows:
        return dict(end)
    out = {}
    given = 0
    for p, w in sorted(waiting.items()):
        share = w * max_rows // total
        out[p] = start.get(p, end[p]) + share
        given += share
    for p, w in sorted(waiting.items()):  # the rounding remainder, one record at a time
        if given >= max_rows:
            break
        if out[p] < start.get(p, end[p]) + w:
            out[p] += 1
            given += 1
    return out


class RinglogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source. The offset of a batch is {"topic": {"partition": next offset}}."""

    def __init__(
        self, opts: ReadOptions, starting: str, max_per_trigger: int | None, group: str | None
    ) -> None:
        self.opts = opts
        self.starting = starting
        self.max_per_trigger = max_per_trigger
        self.group = group
        self.target: dict[int, int] | None = None  # Trigger.AvailableNow: read no further

    def initialOffset(self) -> dict[str, Any]:
        starts, ends = _io.partition_offsets(self.opts.broker, self.opts.topic)
        return _offset_json(
            self.opts.topic, resolve_offsets(self.starting, "startingOffsets", self.opts.topic, starts, ends)
        )

    def prepareForTriggerAvailableNow(self) -> None:
        _starts, ends = _io.partition_offsets(self.opts.broker, self.opts.topic)
        self.target = dict(enumerate(ends))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        topic = self.opts.topic
        starts, ends = _io.partition_offsets(self.opts.broker, topic)
        begin = _from_json(topic, start)
        if self.group and begin:
            # Spark plans a batch only once the previous one is done, so `start` is processed: commit
            # it now. `commit()` alone would leave the last batch of a run (AvailableNow) uncommitted
            # until the next run, and the group's lag would show records already read.
            _io.commit_group_offsets(self.opts.broker, topic, self.group, begin)
        end: dict[int, int] = {}
        for p, e in enumerate(ends):
            if self.target is not None and p not in self.target:
                continue  # created after the AvailableNow run began: a later run reads it
            b = begin.setdefault(p, starts[p])  # a partition new since the last batch: from its start
            end[p] = max(b, e if self.target is None else min(e, self.target[p]))
        if isinstance(limit, ReadMaxRows):
            end = limit_rows(begin, end, limit.max_rows)
        return _offset_json(topic, end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        topic = self.opts.topic
        begin, stop = _from_json(topic, start), _from_json(topic, end)
        if any(p not in begin for p in stop):
            starts, _ends = _io.partition_offsets(self.opts.broker, topic)
            for p in stop:
                begin.setdefault(p, starts[p])
        bounds = {p: (begin[p], max(begin[p], e)) for p, e in stop.items()}
        return split_ranges(topic, bounds, self.opts.max_records_per_split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        if partition.end > partition.start:
            yield from read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        if self.group:
            _io.commit_group_offsets(
                self.opts.broker, self.opts.topic, self.group, _from_json(self.opts.topic, end)
            )


# ----------------------------------------------------------------------------------------- the source


class RinglogDataSource(DataSource):
    """`spark.read.format("ringlog")` and friends; register with `broker.spark.register(spark)`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return RinglogReader(
            ReadOptions.parse(self.options),
            self.options.get("startingOffsets") or "earliest",
            self.options.get("endingOffsets") or "latest",
        )

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RinglogStreamReader(
            ReadOptions.parse(self.options),
            self.options.get("startingOffsets") or "latest",
            _int(self.options, "maxRecordsPerTrigger", None),
            self.options.get("groupId"),
        )

    def _writer_parts(self, schema: StructType, overwrite: bool) -> tuple[WriteOptions, str, dict[int, int]]:
        if overwrite:
            raise RinglogSparkError(
                "ringlog: save mode 'overwrite' is not supported: a topic is an append-only log; use "
                "mode('append') (delete and re-create the topic to start over)"
            )
        check_write_schema(schema)
        opts = WriteOptions.parse(self.options)
        _starts, ends = _io.partition_offsets(opts.broker, opts.topic)
        return opts, uuid.uuid4().hex, dict(enumerate(ends))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return RinglogWriter(*self._writer_parts(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return RinglogStreamWriter(*self._writer_parts(schema, overwrite))
