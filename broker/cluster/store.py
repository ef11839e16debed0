"""The metadata store: the cluster's record (nodes, controller, topics, partitions, producer ids)
behind a small interface, `MetadataStore`, and `EtcdStore`, which keeps it in a real etcd (3.4+).

Why etcd3gw, etcd's HTTP/JSON grpc-gateway client, rather than a gRPC client (python-etcd3,
aetcd): it needs only `requests` (no grpcio and its generated stubs, whose wheels and protobuf
pins are the usual source of breakage), the gateway ships in every etcd 3.4+ at `/v3/` (Debian's
`etcd-server` 3.4.23 included), and the store is called from the supervisor's own threads, where a
plain blocking client with per-call timeouts is what we want (no event loop, no gRPC threads). The
price: no bidirectional streams, so a lease keepalive is one POST per refresh and a watch is one
long POST per watch. etcd3gw gives the per-endpoint client (gateway URL, TLS session); its helpers
drop the response header (the store revision every caller needs) and its watcher reports neither
cancellation nor compaction, so the store sends the gateway's JSON through that client's session
and reads the answers itself.

What each call guarantees (`EtcdStore`):
- Reads (`get`, `get_prefix`) are linearizable (etcd's default: a ReadIndex round with the raft
  leader), and return the store revision they saw.
- Every call is bounded: a connect timeout, a per-attempt read timeout, and an overall deadline;
  the watch's stream has an idle timeout. Nothing blocks forever on a dead or frozen member.
- Several endpoints: a connection error, a timeout or "unavailable" from a member moves the store
  to the next endpoint. Idempotent calls (reads, put, delete, lease grant, keepalive, revoke, ttl)
  are retried there until the overall deadline, then raise `StoreUnavailable`. A put retried after
  an attempt that may have applied writes the same value again: same final state, one more
  revision. A lease grant retried may leave an unused lease, which expires on its own.
- `txn` is never retried blindly: a request that could have reached etcd and got no answer raises
  `StoreUncertain` (it may or may not have applied; the caller reads back, e.g. its own lease on
  the key, and decides). Only a request that never left (connection refused, connect timeout) is
  sent to the next endpoint. A txn rejected by etcd (bad request, unknown lease) raises
  `StoreError` and did not apply.
- Watches deliver events in revision order, each once, on a thread of their own; after a dropped
  connection or a dead member they resume on the next endpoint from the revision after the last one
  delivered, so nothing is lost or repeated. A start revision etcd has compacted away ends the watch
  with `WatchCompacted` (to `on_error`): the owner must re-read (get_prefix) and watch again from
  the revision it read. Watches require a raft leader (gateway metadata `hasleader`): a member cut
  off from its cluster cancels them, and the watch moves to another member.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import etcd3gw
import requests
import urllib3.exceptions

log = logging.getLogger(__name__)

Key = bytes | str
Value = bytes | str
Target = Literal["value", "mod_revision", "create_revision", "version"]
CompareOp = Literal["==", "!=", "<", ">"]

CONNECT_TIMEOUT: Final = 0.5  # s: a live member on the LAN accepts in ms; a dead host never does
# s: one attempt. A healthy member answers in milliseconds (a write is one fsync on a quorum); one
# that does not answer in a second is most likely holding a request its raft leader lost (a dead
# leader not yet noticed, an election under way) and answers only at its own timeout (5 s + two
# election timeouts), so the next member is the better bet.
REQUEST_TIMEOUT: Final = 1.0
CALL_DEADLINE: Final = 5.0  # s: all attempts of one call, over every endpoint
WATCH_IDLE_TIMEOUT: Final = 2.0  # s: a watch stream silent this long is reopened, on the next member
RETRY_PAUSE: Final = (0.05, 0.5)  # s: pause after a round of failed endpoints, doubling, with jitter

_TARGETS: Final = {
    "value": ("VALUE", "value"),
    "mod_revision": ("MOD", "mod_revision"),
    "create_revision": ("CREATE", "create_revision"),
    "version": ("VERSION", "version"),
}
_RESULTS: Final = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}
_GRPC_NOT_FOUND: Final = 5
_GRPC_UNAVAILABLE: Final = 14
_HASLEADER: Final = {"Grpc-Metadata-hasleader": "true"}  # etcd's require-leader metadata


class StoreError(Exception):
    """etcd refused the call (it did not apply), or the store cannot be used as asked."""


class StoreUnavailable(StoreError):
    """No endpoint answered before the call's deadline. For a txn: it was never sent, not applied."""


class StoreUncertain(StoreError):
    """A txn was sent and no answer came: it may or may not have applied. Read back to know."""


class LeaseNotFound(StoreError):
    """The lease expired or was revoked (or never existed)."""


class WatchCompacted(StoreError):
    """The watch's start revision was compacted away: re-read and watch from the revision read."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"watch revision compacted: the oldest revision kept is {compact_revision}")
        self.compact_revision = compact_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    """A put or delete. For a delete, `kv` has the key and `mod_revision` (the delete's revision)."""

    type: Literal["put", "delete"]
    kv: KeyValue

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class Range:
    kvs: list[KeyValue]
    revision: int  # the store's revision when read: watch from revision + 1 to miss nothing


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl: int  # granted, in seconds: etcd raises a TTL below its minimum (1.5 election timeouts)


@dataclass(frozen=True, slots=True)
class Compare:
    key: Key
    target: Target
    op: CompareOp
    operand: Value | int


@dataclass(frozen=True, slots=True)
class Put:
    key: Key
    value: Value
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: Key
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: Key
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store's revision after the txn (the revision of its writes, if any)
    # one per op of the branch taken: Get -> list[KeyValue], Delete -> count deleted, Put -> None
    results: list[list[KeyValue] | int | None] = field(default_factory=list)


def value_is(key: Key, value: Value, op: CompareOp = "==") -> Compare:
    return Compare(key, "value", op, value)


def mod_revision_is(key: Key, revision: int, op: CompareOp = "==") -> Compare:
    return Compare(key, "mod_revision", op, revision)


def create_revision_is(key: Key, revision: int, op: CompareOp = "==") -> Compare:
    return Compare(key, "create_revision", op, revision)


def version_is(key: Key, version: int, op: CompareOp = "==") -> Compare:
    return Compare(key, "version", op, version)


def absent(key: Key) -> Compare:
    """The key does not exist (etcd: create_revision == 0)."""
    return Compare(key, "create_revision", "==", 0)


class Watch(Protocol):
    def cancel(self) -> None:
        """Stop delivering; returns once no callback runs any more (unless called from one)."""
        ...

    @property
    def next_revision(self) -> int:
        """The revision the watch resumes from: one past the last delivered."""
        ...


class MetadataStore(Protocol):
    """The cluster's record. Keys and values are bytes or str (str as UTF-8); values are JSON."""

    def get(self, key: Key) -> KeyValue | None: ...

    def get_prefix(self, prefix: Key) -> Range: ...

    def read(self, key: Key, prefix: bool = False) -> Range:
        """The key (or every key under the prefix) and the revision read at: watch from the
        revision + 1 and no change is missed or seen twice."""
        ...

    def put(self, key: Key, value: Value, lease: int = 0) -> int:
        """The revision of the write."""
        ...

    def delete(self, key: Key, prefix: bool = False) -> int:
        """How many keys were deleted."""
        ...

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        """All compares true: the success ops, else the failure ops, atomically. Raises
        StoreUncertain when it may or may not have applied."""
        ...

    def lease_grant(self, ttl: int) -> Lease: ...

    def lease_keepalive(self, lease_id: int, deadline: float | None = None) -> int:
        """Refresh the lease; its TTL. Raises LeaseNotFound once it expired. `deadline`: seconds
        this call may take at most (the store's default otherwise)."""
        ...

    def lease_revoke(self, lease_id: int) -> None:
        """Delete the lease and every key on it (a lease already gone is not an error)."""
        ...

    def lease_ttl(self, lease_id: int) -> int:
        """Seconds left, or -1 when the lease is gone."""
        ...

    def watch_prefix(
        self,
        prefix: Key,
        start_revision: int | None,
        callback: Callable[[Event], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> Watch:
        """Events under `prefix` from `start_revision` (None: from now), in revision order, on a
        thread of the watch's own. `on_error` gets the exception that ended it: WatchCompacted,
        or what the callback raised."""
        ...

    def watch_key(
        self,
        key: Key,
        start_revision: int | None,
        callback: Callable[[Event], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> Watch: ...

    def close(self) -> None: ...


def _bytes(data: Key) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _b64(data: Key) -> str:
    return base64.b64encode(_bytes(data)).decode()


def _prefix_end(prefix: Key) -> bytes:
    """The first key after every key that starts with `prefix` (etcd's range_end for a prefix)."""
    p = bytearray(_bytes(prefix))
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"  # every key


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        version=int(raw.get("version", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _range_body(key: Key, prefix: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key)}
    if prefix:
        body["range_end"] = _b64(_prefix_end(key))
    return body


def _op_body(op: Op) -> dict[str, Any]:
    if isinstance(op, Put):
        put: dict[str, Any] = {"key": _b64(op.key), "value": _b64(op.value)}
        if op.lease:
            put["lease"] = str(op.lease)
        return {"request_put": put}
    if isinstance(op, Delete):
        return {"request_delete_range": _range_body(op.key, op.prefix)}
    return {"request_range": _range_body(op.key, op.prefix)}


def _compare_body(c: Compare) -> dict[str, Any]:
    target, field_name = _TARGETS[c.target]
    if c.target == "value":
        assert not isinstance(c.operand, int), "a value compares to bytes or str"
        operand: Any = _b64(c.operand)
    else:
        assert isinstance(c.operand, int), "a revision or version compares to an int"
        operand = str(c.operand)
    return {"key": _b64(c.key), "target": target, "result": _RESULTS[c.op], field_name: operand}


def _op_result(raw: dict[str, Any]) -> list[KeyValue] | int | None:
    if "response_range" in raw:
        return [_kv(kv) for kv in raw["response_range"].get("kvs", [])]
    if "response_delete_range" in raw:
        return int(raw["response_delete_range"].get("deleted", 0))
    return None


def _never_sent(exc: requests.RequestException) -> bool:
    """Whether the request surely never reached the server: the connection was not made."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = exc.args[0] if exc.args else None
    if isinstance(reason, urllib3.exceptions.MaxRetryError):
        reason = reason.reason
    return isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError)


class _Failed(Exception):
    """One attempt on one endpoint failed in a way another endpoint may not."""

    def __init__(self, detail: str, sent: bool) -> None:
        super().__init__(detail)
        self.sent = sent


def _endpoint_client(endpoint: str, timeout: float) -> etcd3gw.Etcd3Client:
    url = endpoint if "://" in endpoint else "http://" + endpoint
    protocol, rest = url.split("://", 1)
    host, _, port = rest.rstrip("/").rpartition(":")
    # The gateway's path is /v3/ from etcd 3.4 on: fixed, so no discovery round trip per client.
    return etcd3gw.Etcd3Client(host=host, port=int(port), protocol=protocol, timeout=timeout, api_path="/v3/")


class EtcdStore:
    """`MetadataStore` on an etcd cluster through its grpc-gateway (several endpoints, one cluster)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        connect_timeout: float = CONNECT_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
        call_deadline: float = CALL_DEADLINE,
        watch_idle_timeout: float = WATCH_IDLE_TIMEOUT,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = list(endpoints)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.call_deadline = call_deadline
        self.watch_idle_timeout = watch_idle_timeout
        self._current = 0  # the endpoint calls go to first; moved on by failures (races are benign)
        self._local = threading.local()  # one client (session) per thread and endpoint
        self._watches: set[_EtcdWatch] = set()
        self._sessions: list[requests.Session] = []  # every thread's, closed by close()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ calls
    def _client(self, i: int) -> etcd3gw.Etcd3Client:
        clients = getattr(self._local, "clients", None)
        if clients is None:
            clients = self._local.clients = {}
        if i not in clients:
            clients[i] = _endpoint_client(self.endpoints[i], self.request_timeout)
            with self._lock:
                self._sessions.append(clients[i].session)
        return clients[i]

    def _attempt(self, i: int, path: str, body: dict[str, Any], read_timeout: float) -> dict[str, Any]:
        client = self._client(i)
        timeout = (min(self.connect_timeout, read_timeout), read_timeout)
        try:
            resp = client.session.post(client.get_url(path), json=body, timeout=timeout)
        except requests.RequestException as exc:
            raise _Failed(f"{self.endpoints[i]}: {exc}", sent=not _never_sent(exc)) from exc
        if resp.status_code == 200:
            return resp.json()
        try:
            err = resp.json()
            code, message = int(err.get("code", -1)), str(err.get("message") or err.get("error"))
        except ValueError:
            code, message = -1, resp.text[:200]
        if code == _GRPC_UNAVAILABLE or resp.status_code in (408, 502, 503, 504):
            # no leader, request timed out, leader changed...: another member may do better
            raise _Failed(f"{self.endpoints[i]}: {resp.status_code} {message}", sent=True)
        if code == _GRPC_NOT_FOUND and "lease not found" in message:
            raise LeaseNotFound(message)
        raise StoreError(f"{path}: {resp.status_code} {message}")

    def _call(
        self, path: str, body: dict[str, Any], idempotent: bool = True, deadline: float | None = None
    ) -> dict[str, Any]:
        end = time.monotonic() + (self.call_deadline if deadline is None else deadline)
        pause = RETRY_PAUSE[0]
        failures: list[str] = []
        for n in itertools.count(1):
            i = self._current
            left = end - time.monotonic()
            try:
                return self._attempt(i, path, body, max(0.05, min(self.request_timeout, left)))
            except _Failed as exc:
                failures.append(str(exc))
                if self._current == i:
                    self._current = (i + 1) % len(self.endpoints)
                if exc.sent and not idempotent:
                    raise StoreUncertain(f"{path}: sent, no answer: {exc}") from exc
            left = end - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"{path}: no etcd endpoint answered: {'; '.join(failures[-3:])}")
            if n % len(self.endpoints) == 0:  # every endpoint failed once more: pause before the next round
                time.sleep(min(left, pause * random.uniform(0.5, 1.0)))
                pause = min(pause * 2, RETRY_PAUSE[1])
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------------------------ kv
    def read(self, key: Key, prefix: bool = False) -> Range:
        resp = self._call("kv/range", _range_body(key, prefix))
        return Range([_kv(kv) for kv in resp.get("kvs", [])], int(resp["header"]["revision"]))

    def get(self, key: Key) -> KeyValue | None:
        kvs = self.read(key).kvs
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: Key) -> Range:
        return self.read(prefix, prefix=True)

    def put(self, key: Key, value: Value, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self._call("kv/put", body)["header"]["revision"])

    def delete(self, key: Key, prefix: bool = False) -> int:
        return int(self._call("kv/deleterange", _range_body(key, prefix)).get("deleted", 0))

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        body = {
            "compare": [_compare_body(c) for c in compare],
            "success": [_op_body(op) for op in success],
            "failure": [_op_body(op) for op in failure],
        }
        resp = self._call("kv/txn", body, idempotent=False)
        return TxnResult(
            succeeded=bool(resp.get("succeeded", False)),
            revision=int(resp["header"]["revision"]),
            results=[_op_result(r) for r in resp.get("responses", [])],
        )

    def compact(self, revision: int) -> None:
        """Forget the history before `revision` (etcd's compaction; an operator's or a test's act)."""
        self._call("kv/compaction", {"revision": str(revision), "physical": True})

    def status(self, endpoint: int) -> dict[str, Any]:
        """/maintenance/status of one member (its id in header.member_id, the raft leader's in leader)."""
        return self._attempt(endpoint, "maintenance/status", {}, self.request_timeout)

    # ------------------------------------------------------------------------------------ leases
    def lease_grant(self, ttl: int) -> Lease:
        resp = self._call("lease/grant", {"TTL": str(ttl), "ID": "0"})
        if resp.get("error"):
            raise StoreError(f"lease grant: {resp['error']}")
        return Lease(int(resp["ID"]), int(resp["TTL"]))

    def lease_keepalive(self, lease_id: int, deadline: float | None = None) -> int:
        resp = self._call("lease/keepalive", {"ID": str(lease_id)}, deadline=deadline)
        ttl = int(resp.get("result", resp).get("TTL", 0))
        if ttl <= 0:  # etcd answers an expired lease's keepalive with no TTL
            raise LeaseNotFound(f"lease {lease_id:x} expired")
        return ttl

    def lease_revoke(self, lease_id: int) -> None:
        with contextlib.suppress(LeaseNotFound):
            self._call("kv/lease/revoke", {"ID": str(lease_id)})

    def lease_ttl(self, lease_id: int) -> int:
        # proto3 leaves zeros out: no TTL is 0 s left; a lease gone answers TTL -1
        return int(self._call("kv/lease/timetolive", {"ID": str(lease_id)}).get("TTL", 0))

    # ------------------------------------------------------------------------------------ watches
    def watch_prefix(
        self,
        prefix: Key,
        start_revision: int | None,
        callback: Callable[[Event], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> Watch:
        return self._watch(_bytes(prefix), _prefix_end(prefix), start_revision, callback, on_error)

    def watch_key(
        self,
        key: Key,
        start_revision: int | None,
        callback: Callable[[Event], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> Watch:
        return self._watch(_bytes(key), None, start_revision, callback, on_error)

    def _watch(
        self,
        key: bytes,
        range_end: bytes | None,
        start_revision: int | None,
        callback: Callable[[Event], None],
        on_error: Callable[[Exception], None] | None,
    ) -> Watch:
        if start_revision is None:  # "from now", fixed before returning: a write after this call is seen
            head = self._call("kv/range", {"key": _b64(key), "count_only": True})
            start_revision = int(head["header"]["revision"]) + 1
        w = _EtcdWatch(self, key, range_end, start_revision, callback, on_error)
        with self._lock:
            self._watches.add(w)
        w.start()
        return w

    def _forget(self, w: _EtcdWatch) -> None:
        with self._lock:
            self._watches.discard(w)

    def close(self) -> None:
        """Cancel the watches and close the connections (calls made after this open new ones)."""
        with self._lock:
            watches = list(self._watches)
        for w in watches:
            w.cancel()
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()


class _EtcdWatch:
    """One watch: a thread holding one streaming POST /v3/watch, reopened on failure."""

    def __init__(
        self,
        store: EtcdStore,
        key: bytes,
        range_end: bytes | None,
        start_revision: int,
        callback: Callable[[Event], None],
        on_error: Callable[[Exception], None] | None,
    ) -> None:
        self.store = store
        self.key = key
        self.range_end = range_end
        self._next = start_revision
        self.callback = callback
        self.on_error = on_error
        self.error: Exception | None = None
        self._stopped = threading.Event()
        self._resp: requests.Response | None = None
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch {key!r}", daemon=True)

    @property
    def next_revision(self) -> int:
        return self._next

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._stopped.set()
        resp = self._resp
        if resp is not None:
            # Wake the thread out of its blocking read: shut the socket down under the stream.
            with contextlib.suppress(Exception):
                resp.raw._connection.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                resp.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.store.watch_idle_timeout + self.store.connect_timeout + 1)
        self.store._forget(self)

    def _run(self) -> None:
        pause = RETRY_PAUSE[0]
        while not self._stopped.is_set():
            i = self.store._current
            try:
                self._stream(i)
                pause = RETRY_PAUSE[0]  # the stream worked for a while: start over quickly
            except _Failed as exc:
                log.debug("etcd watch %r on %s: %s", self.key, self.store.endpoints[i], exc)
            except Exception as exc:  # compaction, or the callback's own failure: the watch ends
                self.error = exc
                self._stopped.set()
                if self.on_error is not None:
                    self.on_error(exc)
                else:
                    log.error("etcd watch %r ended: %s", self.key, exc)
                break
            finally:
                self._resp = None
            if self._stopped.is_set():
                break
            if self.store._current == i:
                self.store._current = (i + 1) % len(self.store.endpoints)
            self._stopped.wait(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, RETRY_PAUSE[1])
        self.store._forget(self)

    def _stream(self, i: int) -> None:
        create: dict[str, Any] = {"key": _b64(self.key), "progress_notify": True}
        if self.range_end is not None:
            create["range_end"] = _b64(self.range_end)
        create["start_revision"] = str(self._next)
        client = _endpoint_client(self.store.endpoints[i], self.store.watch_idle_timeout)
        try:
            try:
                resp = client.session.post(
                    client.get_url("watch"),
                    json={"create_request": create},
                    headers=_HASLEADER,
                    stream=True,
                    timeout=(self.store.connect_timeout, self.store.watch_idle_timeout),
                )
            except requests.RequestException as exc:
                raise _Failed(str(exc), sent=True) from exc
            self._resp = resp
            if self._stopped.is_set():
                return
            if resp.status_code != 200:
                raise _Failed(f"watch: {resp.status_code} {resp.text[:200]}", sent=True)
            try:
                for line in resp.iter_lines():
                    if self._stopped.is_set():
                        return
                    if line.strip():
                        self._handle(json.loads(line))
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                if self._stopped.is_set():
                    return
                raise _Failed(f"watch stream: {exc}", sent=True) from exc
            raise _Failed("watch stream ended", sent=True)
        finally:
            client.session.close()

    def _handle(self, msg: dict[str, Any]) -> None:
        result = msg.get("result")
        if result is None:  # the gateway's error object: the member failed the stream
            raise _Failed(f"watch: {msg.get('error')}", sent=True)
        header_rev = int(result.get("header", {}).get("revision", 0))
        if result.get("canceled"):
            compacted = int(result.get("compact_revision", 0))
            if compacted:
                raise WatchCompacted(compacted)
            raise _Failed(f"watch canceled: {result.get('cancel_reason', '')}", sent=True)
        if result.get("created"):
            return
        events = result.get("events")
        if not events:  # a progress notification: every event up to header_rev was sent
            if header_rev + 1 > self._next:
                self._next = header_rev + 1
            return
        last = 0
        for raw in events:
            kind: Literal["put", "delete"] = "delete" if raw.get("type") == "DELETE" else "put"
            ev = Event(kind, _kv(raw["kv"]))
            if ev.revision < self._next:
                continue  # already delivered before a reconnect
            self.callback(ev)
            last = ev.revision
        if last:
            self._next = last + 1
