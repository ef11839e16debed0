"""The client side of the `broker` command: topics, produce, consume, stats.

Rules this module keeps:
- Every command takes `--bootstrap/-b HOST:PORT[,HOST:PORT...]` (default 127.0.0.1:9092; the
  first that answers is used) and the TLS and SASL options (`--tls-ca`, `--sasl-mechanism`, ...;
  the password from a file or $RINGLOG_SASL_PASSWORD, never argv), and uses only the client
  library (`broker.client`), exactly as an application would.
- A failure is one line on stderr and a non-zero exit status, never a traceback: 1 for an error
  the broker or the network reported, 2 for bad arguments or input, 130 for Ctrl-C.
- Binary-safe output: `--format json` prints keys and values as UTF-8 strings when they are valid
  UTF-8, and as {"base64": "..."} when they are not.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from broker.client import DEFAULT_BOOTSTRAP, Admin, ConfigSource, Consumer, Producer, RingLogError, Security
from broker.client.client import parse_bootstraps
from broker.client.errors import ClientError, UndecodableBatchError
from broker.client.security import MECHANISMS
from broker.core.metrics import percentile_us

PROGRESS_EVERY_S = 0.5
PASSWORD_ENV = "RINGLOG_SASL_PASSWORD"
BOOTSTRAP_HELP = f"HOST:PORT[,HOST:PORT...]: the first that answers (default {DEFAULT_BOOTSTRAP})"


class UsageError(Exception):
    """Bad input from the user (exit 2), as opposed to an error from the broker (exit 1)."""


def _connection_args(p: argparse.ArgumentParser) -> None:
    """Where the broker is and how to reach it safely: the options every client command takes."""
    p.add_argument("-b", "--bootstrap", default=DEFAULT_BOOTSTRAP, help=BOOTSTRAP_HELP)
    g = p.add_argument_group("TLS and SASL (docs/SECURITY.md)")
    g.add_argument("--tls", action="store_true", help="connect over TLS (implied by the other --tls-*)")
    g.add_argument("--tls-ca", metavar="PEM", help="the CA that signed the broker's certificate")
    g.add_argument("--tls-cert", metavar="PEM", help="a client certificate (mutual TLS)")
    g.add_argument("--tls-key", metavar="PEM", help="its private key")
    g.add_argument("--sasl-mechanism", choices=MECHANISMS, help="authenticate with this mechanism")
    g.add_argument("--sasl-username", metavar="NAME")
    g.add_argument(
        "--sasl-password-file",
        metavar="FILE",
        help=f"read the password from FILE (first line); else from ${PASSWORD_ENV}. Never on the "
        "command line, where every local user could read it",
    )


def _security(args: argparse.Namespace) -> Security | None:
    tls = bool(args.tls or args.tls_ca or args.tls_cert)
    if args.sasl_mechanism is None:
        if args.sasl_username or args.sasl_password_file:
            raise UsageError("--sasl-username and --sasl-password-file need --sasl-mechanism")
        return (
            Security(tls=True, cafile=args.tls_ca, certfile=args.tls_cert, keyfile=args.tls_key)
            if tls
            else None
        )
    if not args.sasl_username:
        raise UsageError("--sasl-mechanism needs --sasl-username")
    if args.sasl_password_file:
        try:
            with open(args.sasl_password_file) as f:
                password = f.readline().rstrip("\n")
        except OSError as exc:
            raise UsageError(f"--sasl-password-file: {exc}") from exc
    elif PASSWORD_ENV in os.environ:
        password = os.environ[PASSWORD_ENV]
    else:
        raise UsageError(f"--sasl-mechanism needs a password: --sasl-password-file or ${PASSWORD_ENV}")
    return _checked_security(
        tls=tls,
        cafile=args.tls_ca,
        certfile=args.tls_cert,
        keyfile=args.tls_key,
        sasl_mechanism=args.sasl_mechanism,
        username=args.sasl_username,
        password=password,
    )


def _checked_security(**settings: Any) -> Security:
    try:
        return Security(**settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def add_client_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def client_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, **kw)
        _connection_args(p)
        return p

    topics = sub.add_parser("topics", help="create, delete, list and describe topics")
    tsub = topics.add_subparsers(dest="topics_command", required=True)
    tsub_parser = tsub.add_parser
    create = tsub_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--retention-ms", type=int, default=-1, help="-1: broker default, -2: forever")
    create.add_argument("--retention-bytes", type=int, default=-1, help="-1: broker default, -2: unlimited")
    create.add_argument("--segment-bytes", type=int, default=-1, help="-1: broker default")
    create.add_argument(
        "--replication-factor",
        type=int,
        default=-1,
        help="copies of each partition, on as many nodes (-1: broker default; one node: 1)",
    )
    create.add_argument(
        "--replica-assignment",
        metavar="N:N,N:N,...",
        help="each partition's nodes placed by hand, the preferred leader first (1:2,2:3: two "
        "partitions of two replicas; sets --partitions and the replication factor)",
    )
    config_help = "a topic config, Kafka's name (cleanup.policy=compact; repeat it; docs/KAFKA.md)"
    create.add_argument("--config", action="append", default=[], metavar="K=V", help=config_help)
    alter = tsub_parser("alter", help="change a topic's configs (every core applies them within a second)")
    alter.add_argument("name")
    alter.add_argument("--config", action="append", default=[], metavar="K=V", help=config_help)
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K",
        help="back to the broker's default (repeat it)",
    )
    alter.add_argument("--validate-only", action="store_true", help="check the change, make none")
    delete = tsub_parser("delete", help="delete a topic and all its data")
    delete.add_argument("name")
    tsub_parser("list", help="list topic names")
    describe = tsub_parser(
        "describe", help="partitions: leader node and core, epoch, replicas, in-sync set, offsets; settings"
    )
    describe.add_argument("name")
    describe.add_argument(
        "--all-configs", action="store_true", help="every config with its source, not only the topic's own"
    )
    for p in (create, alter, delete, tsub.choices["list"], describe):
        _connection_args(p)
    topics.set_defaults(func=cmd_topics)

    produce = client_parser("produce", help="send lines or JSON lines from stdin or a file")
    produce.add_argument("topic")
    produce.add_argument("--file", help="read from this file instead of stdin")
    produce.add_argument(
        "--format", choices=["text", "json"], default="text", help="text: one record per line"
    )
    produce.add_argument("--key-field", help="json: the field whose value becomes the record key")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument(
        "--acks", type=int, choices=[0, 1, 2], default=1, help="0 none, 1 written, 2 durable"
    )
    produce.add_argument(
        "--compression",
        choices=["none", "gzip", "snappy", "lz4", "zstd"],
        default="none",
        help="the codec of the batches sent (default none)",
    )
    produce.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    produce.add_argument(
        "--transactional-id",
        help="send the whole input as one transaction with this id: read_committed consumers see "
        "all of it once it commits, none of it if anything fails (then it is aborted)",
    )
    produce.set_defaults(func=cmd_produce)

    consume = client_parser("consume", help="print records of a topic")
    consume.add_argument("topic")
    consume.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    consume.add_argument("--partition", type=int, action="append", help="only these partitions (repeatable)")
    consume.add_argument("--offset", type=int, help="start at this offset (needs --partition)")
    consume.add_argument("--group", help="consumer group: resume from and commit its offsets")
    consume.add_argument("--max-records", type=int, help="exit after this many records")
    consume.add_argument("--idle-timeout-ms", type=int, help="exit after this long without a record")
    consume.add_argument("--format", choices=["text", "json"], default="text")
    consume.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_uncommitted",
        help="read_committed: only records of committed transactions (and of no transaction)",
    )
    consume.set_defaults(func=cmd_consume)

    stats = client_parser("stats", help="per-core requests, bytes, forwards, queues and latency")
    stats.add_argument("--format", choices=["text", "json"], default="text")
    stats.add_argument(
        "--data-dir",
        default=None,
        help="only for brokers older than the eBPF counters in STATS: read them from this data dir's "
        "run/bpf.json (shown when that broker is the one at -b; default ./data)",
    )
    stats.set_defaults(func=cmd_stats)


def run_client_command(args: argparse.Namespace) -> int:
    """Run a client command, turning every expected failure into one line and an exit status."""
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 2
    except (RingLogError, ClientError, OSError) as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# ----------------------------------------------------------------------------------------- topics


def cmd_topics(args: argparse.Namespace) -> int:
    with Admin(args.bootstrap, security=_security(args)) as admin:
        if args.topics_command == "create":
            assignment = _assignment(args.replica_assignment)
            partitions = len(assignment) if assignment else args.partitions
            topic_id = admin.create_topic(
                args.name,
                partitions,
                retention_ms=None if args.retention_ms == -1 else args.retention_ms,
                retention_bytes=None if args.retention_bytes == -1 else args.retention_bytes,
                segment_bytes=None if args.segment_bytes == -1 else args.segment_bytes,
                replication=args.replication_factor,
                configs=_config_pairs(args.config),
                assignment=assignment,
            )
            print(f"created topic {args.name} (id {topic_id}, {partitions} partitions)")
        elif args.topics_command == "alter":
            if not args.config and not args.delete_config:
                raise UsageError("topics alter needs --config K=V or --delete-config K")
            admin.alter_configs(
                args.name,
                set=_config_pairs(args.config),
                delete=args.delete_config,
                validate_only=args.validate_only,
            )
            print(f"{'checked' if args.validate_only else 'altered'} topic {args.name}")
        elif args.topics_command == "delete":
            admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
        elif args.topics_command == "list":
            for name in admin.list_topics():
                print(name)
        else:
            d = admin.describe_topic(args.name)
            print(f"topic {d.name}  id {d.topic_id}  partitions {len(d.partitions)}  broker cores {d.cores}")
            print(
                f"  retention_ms {_limit(d.retention_ms)}  retention_bytes {_limit(d.retention_bytes)}"
                f"  segment_bytes {d.segment_bytes}"
            )
            rows = [
                (
                    str(p.partition),
                    str(p.leader_node) if p.leader_node >= 0 else "none",
                    str(p.owner_core) if p.owner_core >= 0 else "-",
                    str(p.leader_epoch),
                    _replicas(p.replicas),
                    _replicas(p.isr),
                    str(p.start_offset),
                    str(p.end_offset),
                    str(p.end_offset - p.start_offset) if p.start_offset >= 0 else "-",
                )
                for p in d.partitions
            ]
            header = ("partition", "leader", "core", "epoch", "replicas", "isr", "start", "end", "records")
            widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
            for row in (header, *rows):
                print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
            configs = admin.describe_configs(args.name)
            shown = [c for c in configs.values() if args.all_configs or c.source == ConfigSource.TOPIC]
            print("  configs" + ("" if shown else ": the broker's defaults"))
            width = max((len(c.name) for c in shown), default=0)
            for c in shown:
                where = "" if c.source == ConfigSource.TOPIC else f"  ({_SOURCE_NAMES[c.source]})"
                print(f"    {c.name.ljust(width)}  {c.value}{where}")
    return 0


_SOURCE_NAMES = {ConfigSource.BROKER_FLAG: "broker flag", ConfigSource.DEFAULT: "default"}


def _assignment(text: str | None) -> list[list[int]] | None:
    """`--replica-assignment 1:2,2:3` (kafka-topics.sh's form) as each partition's node ids."""
    if not text:
        return None
    try:
        return [[int(n) for n in part.split(":")] for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--replica-assignment {text!r}: write it N:N,N:N (nodes per partition)") from None


def _config_pairs(values: list[str]) -> dict[str, str]:
    """`--config K=V` arguments as a dict (a key given twice: the last wins)."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config {item!r}: write it K=V (retention.ms=86400000)")
        out[key.strip()] = value
    return out


def _replicas(replicas: tuple[tuple[int, int], ...]) -> str:
    """Replicas as `node:core,...` (the node's core that holds the copy); "-" for none."""
    return ",".join(f"{node}:{core}" for node, core in replicas) or "-"


def _limit(value: int) -> str:
    return "unlimited" if value == -2 else str(value)


# ----------------------------------------------------------------------------------------- produce


def _records(stream: IO[str], fmt: str, key_field: str | None) -> Iterator[tuple[bytes | None, bytes]]:
    for lineno, raw_line in enumerate(stream, 1):
        line = raw_line.rstrip("\n")
        if not line:
            continue
        if fmt == "text":
            yield None, line.encode()
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"line {lineno} is not JSON: {exc.msg}") from None
        key = None
        if key_field is not None:
            if not isinstance(doc, dict) or key_field not in doc:
                raise UsageError(f"line {lineno} has no field {key_field!r}")
            raw = doc[key_field]
            key = (raw if isinstance(raw, str) else json.dumps(raw)).encode()
        yield key, line.encode()


def cmd_produce(args: argparse.Namespace) -> int:
    if args.key_field and args.format != "json":
        raise UsageError("--key-field needs --format json")
    progress = sys.stdout.isatty() if args.progress is None else args.progress
    stream: IO[str] = open(args.file, encoding="utf-8") if args.file else sys.stdin  # noqa: SIM115
    sent = 0
    started = time.monotonic()
    try:
        with Producer(
            args.bootstrap,
            acks=args.acks,
            compression=args.compression,
            security=_security(args),
            transactional_id=args.transactional_id,
        ) as producer:
            if args.transactional_id is not None:
                producer.init_transactions()
                producer.begin_transaction()
            try:
                sent = _send_all(producer, args, stream, progress, started)
            except BaseException:
                if args.transactional_id is not None:
                    with contextlib.suppress(ClientError):
                        producer.abort_transaction()
                raise
            if args.transactional_id is not None:
                producer.commit_transaction()
    finally:
        if stream is not sys.stdin:
            stream.close()
    if progress:
        print(f"\r{sent:,} records sent in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


def _send_all(
    producer: Producer, args: argparse.Namespace, stream: IO[str], progress: bool, started: float
) -> int:
    """Every record of `stream` sent and acknowledged (errors raised): how many."""
    sent = 0
    last = started
    futures = []
    for key, value in _records(stream, args.format, args.key_field):
        futures.append(producer.send(args.topic, value, key=key, partition=args.partition))
        sent += 1
        if len(futures) >= 10_000:  # bound memory; surface errors early
            for f in futures:
                f.result()
            futures.clear()
        now = time.monotonic()
        if progress and now - last >= PROGRESS_EVERY_S:
            last = now
            print(f"\r{sent:,} records, {sent / (now - started):,.0f}/s", end="", file=sys.stderr)
    producer.flush()
    for f in futures:
        f.result()
    return sent


# ----------------------------------------------------------------------------------------- consume


def _text(b: bytes | None) -> Any:
    if b is None:
        return None
    try:
        return b.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode()}


def cmd_consume(args: argparse.Namespace) -> int:
    """Print records until --max-records or --idle-timeout-ms. Damage stops it with exit 1 after
    every record before it was printed: an undecodable batch (named, with the command that skips
    it) or a partition the broker cannot read (STORAGE_ERROR, after the consumer's retries)."""
    try:
        return _consume(args)
    except UndecodableBatchError as exc:
        skip = ""
        if exc.next_offset is not None:
            skip = (
                f"; to skip it: broker consume {exc.topic} --partition {exc.partition} "
                f"--offset {exc.next_offset}"
            )
        print(
            f"broker: {exc.topic}/{exc.partition}: cannot decode the batch at offset {exc.offset}: "
            f"{exc.reason}{skip}",
            file=sys.stderr,
        )
        return 1


def _consume(args: argparse.Namespace) -> int:
    if args.offset is not None and not args.partition:
        raise UsageError("--offset needs --partition")
    reset = "earliest" if args.from_beginning else "latest"
    count = 0
    with Consumer(
        args.bootstrap,
        group=args.group,
        auto_offset_reset=reset,
        security=_security(args),
        isolation_level=args.isolation_level,
    ) as consumer:
        if args.partition:
            consumer.assign([(args.topic, p) for p in args.partition])
        else:
            consumer.subscribe(args.topic)
        if args.offset is not None:
            for p in args.partition:
                consumer.seek((args.topic, p), args.offset)
        idle_since = time.monotonic()
        while args.max_records is None or count < args.max_records:
            limit = None if args.max_records is None else args.max_records - count
            records = consumer.poll(timeout_ms=200, max_records=limit)
            if not records:
                if (
                    args.idle_timeout_ms is not None
                    and (time.monotonic() - idle_since) * 1000 >= args.idle_timeout_ms
                ):
                    break
                continue
            idle_since = time.monotonic()
            for r in records:
                if args.format == "text":
                    sys.stdout.write((r.value or b"").decode(errors="backslashreplace") + "\n")
                else:
                    doc = {
                        "topic": r.topic,
                        "partition": r.partition,
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key": _text(r.key),
                        "value": _text(r.value),
                        "headers": [[k, _text(v)] for k, v in r.headers],
                    }
                    sys.stdout.write(json.dumps(doc) + "\n")
            sys.stdout.flush()
            count += len(records)
            if args.group is not None:
                consumer.commit()
    return 0


# ----------------------------------------------------------------------------------------- stats

STATS_COLUMNS = (
    ("core", 4),
    ("pid", 7),
    ("requests", 10),
    ("bytes_in", 12),
    ("bytes_out", 12),
    ("fwd_out", 8),
    ("fwd_in", 8),
    ("errors", 7),
    ("inflight", 8),
    ("fwd_pending", 11),
    ("long_polls", 10),
    ("commit_wait", 11),
    ("p50_us", 7),
    ("p99_us", 7),
    ("age_s", 6),
)


def _bpf_snapshot(doc: dict[str, Any], data_dir: str | None, port: int) -> dict[str, Any] | None:
    """The eBPF snapshot of the broker at `port`: from its STATS answer (key "bpf", null when its
    supervisor published none), or for a broker too old to send one, from the run/bpf.json its
    supervisor published in `data_dir` on this machine."""
    if "bpf" in doc:
        bpf = doc["bpf"]
        return bpf if isinstance(bpf, dict) else None
    from bpf import state  # noqa: PLC0415 - only for this command

    local = state.read(data_dir or "./data")
    if local is None or (local.get("port") not in (None, port)):
        return None
    return local


def cmd_stats(args: argparse.Namespace) -> int:
    with Admin(args.bootstrap, security=_security(args)) as admin:
        doc = admin.stats()
    bpf = _bpf_snapshot(doc, args.data_dir, parse_bootstraps(args.bootstrap)[0][1])
    if args.format == "json":
        print(json.dumps({**doc, "bpf": bpf}, indent=1))
        return 0
    print(f"broker stats: {doc.get('cores')} cores, answered by core {doc.get('answered_by')}")
    print("  ".join(name.rjust(width) for name, width in STATS_COLUMNS))
    now = time.time()
    for s in doc.get("snapshots", []):
        gauges = s.get("gauges", {})
        hist = s.get("latency_us_log2", [])
        row = (
            s.get("core"),
            s.get("pid"),
            s.get("requests_total", 0),
            s.get("bytes_in", 0),
            s.get("bytes_out", 0),
            s.get("forwarded", 0),
            s.get("forwarded_in", 0),
            s.get("errors", 0),
            gauges.get("inflight_requests", 0),
            gauges.get("pending_forwards", 0),
            gauges.get("parked_long_polls", 0),
            gauges.get("commit_waiters", 0),
            percentile_us(hist, 0.5),
            percentile_us(hist, 0.99),
            f"{max(0.0, now - float(s.get('time', now))):.1f}",
        )
        print("  ".join(str(v).rjust(width) for v, (_, width) in zip(row, STATS_COLUMNS, strict=True)))
    if bpf is not None:
        steer = bpf.get("steer") or {}
        if bpf.get("steering"):
            rules = "by payload (TFO)" if bpf.get("payload_steering") else "by source port (no server TFO)"
            print(
                f"ebpf steering: on, {rules}; live cores {bpf.get('live_cores')}; new connections: "
                + ", ".join(f"{k} {v}" for k, v in steer.items())
            )
        else:
            print(f"ebpf steering: off ({bpf.get('reason') or 'not loaded'})")
        xdp = bpf.get("xdp")
        if xdp:
            classes = ", ".join(f"{k} {v}" for k, v in (xdp.get("classes") or {}).items())
            print(f"xdp on {xdp.get('iface')} ({xdp.get('mode')}): packets {classes}")
        ms = bpf.get("membership")
        if ms:
            print("membership: " + ", ".join(f"{k} {v}" for k, v in ms.items()))
    return 0
