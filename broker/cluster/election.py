"""One leader at a time (the controller) on an etcd lease, with a fencing token for its writes.

The election is one key (`/ringlog/<cluster>/controller`, docs/CLUSTER.md). To campaign, a node
grants itself a lease and writes the key in a txn that succeeds only if the key does not exist
(`create_revision == 0`), the value its node id, the key bound to its lease. The key's create
revision is the *fencing token*: it grows with every new leader, and each write the leader makes
compares it (`fence()`: `create_revision(key) == token`) in the same txn, so a write from a leader
that lost the key fails, however late it arrives. Others wait on a watch of the key (and a poll, in
case the watch is stuck) and campaign again the moment it is deleted: when the leader resigns (it
revokes its lease) or its lease expires.

Rules this module keeps:
- A leader stops acting as leader *before* another can win. Every keepalive records the local
  (monotonic) time `sent` at which it left; once etcd's answer says the lease has TTL seconds, the
  lease cannot expire on etcd before `sent + TTL` (etcd's leader restarts the TTL when it
  processes the keepalive, which is after `sent`; a change of etcd leader only extends leases), and
  no one can create the key before it expired. The leader counts itself leader only until
  `sent + STEP_DOWN_AT * TTL` (3/4 of the TTL): `leading()` reads the clock, so it turns false at
  that instant even if no thread ran, and `on_lost` is called as soon as the keepalive thread sees
  it. The quarter TTL left covers clock rate differences and the leader's last act in flight; what
  a paused process might still send after it is refused by the fence.
- Keepalives go every `KEEPALIVE_EVERY * TTL` (a quarter: three may fail before the step-down),
  each bounded by the time left until the step-down, over every endpoint of the store.
- Leadership is also lost, at once, when the key is deleted under the leader (an operator, a
  revoked lease) or etcd says the lease is gone. A lost lease is revoked best-effort, so that the
  key goes as soon as etcd hears from us rather than at its expiry.
- `DEFAULT_TTL` is 2 s: failover after a leader dies is at most TTL (its lease expires) + 0.5 s
  (etcd looks for expired leases every 500 ms) + a watch event and a txn (milliseconds), under 3 s.
  etcd will not grant less than 1.5 election timeouts rounded up to whole seconds (2 s with its
  default 1 s election timeout, 1 s with the tests' 500 ms): the election uses the TTL etcd granted.
- A campaign txn that may or may not have applied (`StoreUncertain`) is resolved by reading the
  key: the lease on it is ours (leases are unique) or it is not. Never by writing again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from broker.cluster.store import (
    Compare,
    Event,
    Get,
    KeyValue,
    Lease,
    LeaseNotFound,
    MetadataStore,
    Put,
    StoreError,
    StoreUncertain,
    Watch,
    absent,
    create_revision_is,
)

log = logging.getLogger(__name__)

DEFAULT_TTL: Final = 2  # s
KEEPALIVE_EVERY: Final = 0.25  # of the TTL
STEP_DOWN_AT: Final = 0.75  # of the TTL after the last keepalive answered was sent
KEEPALIVE_RETRY: Final = 0.1  # s between attempts once a keepalive failed


class NotLeader(Exception):
    """This node does not lead (any more)."""


@dataclass(frozen=True, slots=True)
class Leader:
    node_id: str
    token: int  # the election key's create revision: the fencing token of this leader's term
    lease: int


def _leader(kv: KeyValue | None) -> Leader | None:
    return None if kv is None else Leader(kv.value.decode(), kv.create_revision, kv.lease)


class Election:
    """This node's part in the election on `key`: campaign, lead, resign, observe."""

    def __init__(
        self,
        store: MetadataStore,
        key: str,
        node_id: str,
        ttl: int = DEFAULT_TTL,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.node_id = node_id
        self.ttl = ttl
        self.on_lost = on_lost
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._valid_until = 0.0  # monotonic: the lease is surely alive on etcd until then
        self._token: int | None = None
        self._stop_keepalive: threading.Event | None = None
        self._changed = threading.Event()  # the key changed, or our lease went: campaign again now
        self._watch: Watch | None = None
        self._closed = False

    # ----------------------------------------------------------------------------- leadership
    def leading(self) -> bool:
        """Whether this node may act as leader now (false from the local deadline on, by the clock)."""
        return self._token is not None and time.monotonic() < self._valid_until

    @property
    def token(self) -> int:
        """The fencing token of this node's term (raises NotLeader when it does not lead)."""
        token = self._token
        if token is None or not self.leading():
            raise NotLeader(f"{self.node_id} does not lead {self.key}")
        return token

    def fence(self) -> Compare:
        """The compare that every write of this leader puts in its txn."""
        return create_revision_is(self.key, self.token)

    def leader(self) -> Leader | None:
        """Who leads according to etcd now (a linearizable read)."""
        return _leader(self.store.get(self.key))

    # ----------------------------------------------------------------------------- campaign
    def campaign(self, timeout: float | None = None, stop: threading.Event | None = None) -> int | None:
        """Block until this node leads: its fencing token; None once `stop` is set. TimeoutError
        after `timeout` seconds (the lease stays, kept alive, for the next call; resign() or
        close() drop it)."""
        end = None if timeout is None else time.monotonic() + timeout
        self._ensure_watch()
        while True:
            if self._closed:
                raise NotLeader("election closed")
            if stop is not None and stop.is_set():
                return None
            if self.leading():
                return self.token
            self._changed.clear()
            lease: Lease | None = None
            won = None
            try:
                lease = self._ensure_lease()
                won = self._try(lease)
            except LeaseNotFound:
                if lease is not None:
                    self._lose(lease, "lease gone before the campaign txn")
            except StoreError as exc:  # etcd unreachable for now: try again after the wait below
                log.warning("%s: campaign on %s: %s", self.node_id, self.key, exc)
            if won is not None and lease is not None:
                with self._lock:
                    if self._lease is lease and time.monotonic() < self._valid_until:
                        self._token = won
                        log.info("%s leads %s (token %d)", self.node_id, self.key, won)
                        return won
                # our lease lapsed meanwhile: the key goes with it; campaign again on a new lease
            wait = self.ttl * KEEPALIVE_EVERY
            if end is not None:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self.node_id} did not win {self.key} in {timeout} s")
                wait = min(wait, left)
            if stop is None:
                self._changed.wait(wait)
            else:  # woken by the key's watch, or within 0.1 s of `stop`
                wake = time.monotonic() + wait
                while not self._changed.wait(min(0.1, wake - time.monotonic())) and not stop.is_set():
                    if time.monotonic() >= wake:
                        break

    def _try(self, lease: Lease) -> int | None:
        """One campaign txn: our token if the key is (now) ours, else None."""
        try:
            r = self.store.txn([absent(self.key)], [Put(self.key, self.node_id, lease.id)], [Get(self.key)])
        except StoreUncertain:
            kv = self.store.get(self.key)  # ours or not: our lease is on it only if our txn applied
            return kv.create_revision if kv is not None and kv.lease == lease.id else None
        if r.succeeded:
            return r.revision
        holders = r.results[0]
        assert isinstance(holders, list)
        if holders and holders[0].lease == lease.id:  # an earlier uncertain txn of ours applied
            return holders[0].create_revision
        return None

    def _ensure_watch(self) -> None:
        if self._watch is None:
            self._watch = self.store.watch_key(self.key, None, self._on_event)

    def _on_event(self, ev: Event) -> None:
        if ev.type == "delete":
            token = self._token
            if token is not None and ev.revision > token:
                lease = self._lease
                if lease is not None:
                    self._lose(lease, "the key was deleted")
            self._changed.set()

    # ----------------------------------------------------------------------------- the lease
    def _ensure_lease(self) -> Lease:
        with self._lock:
            if self._lease is not None:
                return self._lease
        sent = time.monotonic()
        lease = self.store.lease_grant(self.ttl)
        if lease.ttl != self.ttl:
            log.warning("%s: etcd granted a TTL of %d s, not %d s", self.node_id, lease.ttl, self.ttl)
        stop = threading.Event()
        with self._lock:
            self._lease = lease
            self._valid_until = sent + lease.ttl * STEP_DOWN_AT
            self._stop_keepalive = stop
        threading.Thread(
            target=self._keepalive, args=(lease, stop), name=f"election keepalive {self.key}", daemon=True
        ).start()
        return lease

    def _keepalive(self, lease: Lease, stop: threading.Event) -> None:
        next_at = time.monotonic() + lease.ttl * KEEPALIVE_EVERY
        while True:
            until = self._valid_until
            now = time.monotonic()
            if stop.wait(max(0.0, min(next_at, until) - now)):
                return
            if time.monotonic() >= self._valid_until:
                self._lose(lease, f"no keepalive answered for {lease.ttl * STEP_DOWN_AT:.2f} s")
                return
            sent = time.monotonic()
            try:
                ttl = self.store.lease_keepalive(lease.id, deadline=max(0.05, self._valid_until - sent))
            except LeaseNotFound:
                self._lose(lease, "etcd says the lease expired")
                return
            except StoreError as exc:
                log.debug("%s: keepalive failed: %s", self.node_id, exc)
                next_at = time.monotonic() + KEEPALIVE_RETRY
                continue
            with self._lock:
                if self._lease is not lease or stop.is_set():
                    return
                self._valid_until = max(self._valid_until, sent + ttl * STEP_DOWN_AT)
            next_at = sent + ttl * KEEPALIVE_EVERY

    def _lose(self, lease: Lease, why: str) -> None:
        """The lease is no longer ours to count on: stop leading, drop it (revoked best-effort)."""
        with self._lock:
            if self._lease is not lease:
                return
            was_leader = self._token is not None
            self._token = None
            self._lease = None
            self._valid_until = 0.0
            if self._stop_keepalive is not None:
                self._stop_keepalive.set()
        self._changed.set()
        if was_leader:
            log.warning("%s no longer leads %s: %s", self.node_id, self.key, why)
            if self.on_lost is not None:
                self.on_lost()
        threading.Thread(target=self._revoke, args=(lease.id,), daemon=True).start()

    def _revoke(self, lease_id: int) -> None:
        with contextlib.suppress(StoreError):
            self.store.lease_revoke(lease_id)

    # ----------------------------------------------------------------------------- leaving
    def resign(self) -> None:
        """Stop leading (first), then revoke the lease, which deletes the key: the others, watching
        it, campaign at once. Also drops the lease of a campaign that has not won."""
        with self._lock:
            lease = self._lease
            self._token = None
            self._lease = None
            self._valid_until = 0.0
            if self._stop_keepalive is not None:
                self._stop_keepalive.set()
        if lease is not None:
            try:
                self.store.lease_revoke(lease.id)
            except StoreError as exc:  # the key then goes when the lease expires, within its TTL
                log.warning("%s: revoking lease on resign failed: %s", self.node_id, exc)

    def close(self) -> None:
        self._closed = True
        self.resign()
        self._changed.set()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    # ----------------------------------------------------------------------------- observing
    def observe(self, callback: Callable[[Leader | None], None]) -> Watch:
        """`callback` with who leads now, then again at every change, in order, on the watch's
        thread (cancel() the watch returned to stop)."""
        snap = self.store.read(self.key)
        last = _leader(snap.kvs[0] if snap.kvs else None)
        callback(last)

        def on_event(ev: Event) -> None:
            nonlocal last
            now = None if ev.type == "delete" else _leader(ev.kv)
            if now != last:
                last = now
                callback(now)

        return self.store.watch_key(self.key, snap.revision + 1, on_event)
