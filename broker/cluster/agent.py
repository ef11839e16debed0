"""A node's part in the cluster, run by its supervisor: its session in the store, the copy of the
cluster its workers act on, and the controller's work while this node holds that role.

Rules this module keeps:
- Three threads of the supervisor, each blocking only on the store (etcd, with bounded calls):
  the session (the node's presence key on a lease, kept alive at a third of its TTL; a lapsed
  lease means the cluster declared this node dead: it registers again at once, as a node coming
  back), the mirror (a full read, then a prefix watch from the revision read, again from a full
  read whenever the watch ends), and the controller (an election; while elected, reconcile).
- Workers never talk to etcd for what they act on: the mirror publishes the view
  (`<data_dir>/run/cluster.json`, broker/core/cluster_view.py), copies the topics into the node's
  topic registry (`topics.json`, which workers already follow) and the users and ACLs into its
  security/ files (broker/cluster/security_docs.py), which workers read as on a single node.
  Publishing is coalesced: a burst of events (a topic of many partitions) is one file write,
  within `PUBLISH_COALESCE_S`.
- The controller changes partitions only through `controller.reconcile` (leaders from the
  in-sync set, epochs, offline partitions) and writes each change fenced on the mod revision it
  read; a lost race is left to the next pass, which reads the newer state. It also writes the
  first states of a topic whose creator died half way (`ClusterAdmin.write_partitions`).
- Membership (SWIM) is a signal: a node SWIM confirms dead has its lease revoked by the
  controller, so its partitions fail over without waiting for its TTL. When the dead node is the
  controller, every survivor revokes its election lease (its term), so that a new controller is
  elected and acts at once. A false suspicion costs a re-registration (or a controller's term),
  never data: leaders still come only from in-sync replicas, and a deposed controller's writes
  fail on the election's fence. States arrive as `swim.State` (`member_changed`), never strings.
- A node that cannot reach etcd keeps leading what the store last named it leader of, as a Kafka
  broker does while its controller quorum is away, as long as it still reaches most of its peers
  (SWIM): etcd is then most likely away for everyone, nobody can elect anyone, and an etcd outage
  costs no produce on partitions whose in-sync set does not change. If etcd is away for this node
  only, the others replace it, and acks=all stays safe even so: its high watermark moves only
  when every in-sync replica has fetched, an in-sync set changes only through the store, and a
  new leader comes only from the in-sync set and stops fetching from the old one
  (docs/CLUSTER.md, "While etcd is away"). But a node cut off from etcd *and* from most of its
  peers is most likely the one the others are replacing: after 3/4 of its TTL without a renewed
  session it leads nothing (before etcd can expire its lease), and stays so until etcd answers
  again, so that requests reaching it once the network heals (TCP retransmissions of what
  clients sent meanwhile) find no zombie leader.
- A node the store says lost its session (`LeaseNotFound`: etcd is there and expired it) leads
  nothing until it has registered again and its mirror has caught up with that (the leaderships
  it mirrored may have moved meanwhile).
- Stopping gracefully is Kafka's controlled shutdown, in two steps, while the workers still
  serve. `drain`: the node's presence says it is draining; the controller moves each leadership
  it holds to another in-sync replica (broker/cluster/controller.py), every view stops offering
  it to clients and coordinating groups on it, and `drain` returns once this node's published
  view shows every leadership it could hand over handed over (bounded by `DRAIN_TIMEOUT_S`).
  `stop`: the lease is revoked (presence and controller role go at once) and, after a drain,
  the node waits (bounded by `LEAVE_WAIT_S`) until the controller dropped it from the in-sync
  sets, so that no leader's acks=all waits for a follower that is about to vanish. Only then
  does the supervisor stop the workers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, assert_never

from broker.cluster.admin import ClusterAdmin
from broker.cluster.controller import drain_target, handed_over, reconcile, start_reassignment
from broker.cluster.election import Election, NotLeader
from broker.cluster.mirror import Mirror, Versioned
from broker.cluster.placement import Candidate
from broker.cluster.records import Keys, NodeRecord, PresenceRecord
from broker.cluster.security_docs import write_copies
from broker.cluster.store import (
    EtcdStore,
    Event,
    LeaseNotFound,
    MetadataStore,
    StoreError,
)
from broker.core.cluster_view import ClusterView, publish
from broker.core.topics import Topic, TopicRegistry
from ringlog_proto.membership import State

log = logging.getLogger(__name__)

SESSION_TTL_S: Final = 2  # etcd keeps at least 1.5 election timeouts (1.5 s at its defaults)
PUBLISH_COALESCE_S: Final = 0.01
RECONCILE_EVERY_S: Final = 1.0  # besides every change: a controller that missed nothing redoes nothing
RETRY_S: Final = 0.2
DRAIN_TIMEOUT_S: Final = 5.0  # a graceful stop waits this long at most for its leaderships to move
LEAVE_WAIT_S: Final = 2.0  # and this long at most, after leaving, to be out of every in-sync set
FENCE_AFTER: Final = 0.75  # of the TTL without a renewed session, cut off from most peers: lead nothing
UNCLEAN: Final = "unclean.leader.election.enable"  # the topic config the controller reads


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: NodeRecord
    endpoints: tuple[str, ...]
    cluster: str = "ringlog"
    session_ttl_s: int = SESSION_TTL_S
    unclean_election: bool = False
    default_replication: int = 3
    reassign_after_s: float = 0.0  # a node absent this long has its replicas moved (0: never)


class ClusterAgent:
    def __init__(
        self,
        config: AgentConfig,
        run_dir: str,
        registry: TopicRegistry,
        store: MetadataStore | None = None,
        security_dir: str | None = None,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.security_dir = security_dir  # where the users and ACLs are copied (None: nowhere)
        self.registry = registry
        self.keys = Keys(config.cluster)
        self.store = store if store is not None else EtcdStore(config.endpoints)
        self.admin = ClusterAdmin(self.store, self.keys, config.default_replication)
        self.mirror = Mirror(self.keys, config.node.node_id)
        self._lock = threading.Lock()  # the mirror, between the watch thread and the others
        self._changed = threading.Condition(self._lock)
        self._dirty = False
        self._stop = threading.Event()  # the session and the controller end (the mirror goes on)
        self._closing = threading.Event()  # every thread ends
        self._loaded = threading.Event()
        self._published = threading.Condition(self._lock)  # a view was published (`_view`)
        self._view: ClusterView | None = None  # the last view published
        self._draining = False
        self._since = time.time()
        self._lease = 0
        self._fenced = False  # as last published
        self._cut_off = False  # no renewed session for a while, and most peers unreachable
        self._unreachable: set[int] = set()  # peers SWIM confirmed dead and not seen alive since
        # None: the session holds; 0: etcd said it lapsed; a revision: registered again there
        self._lapsed_until: int | None = None
        self._generation = 0
        self._dead_signals: set[int] = set()
        self._absent_since: dict[int, float] = {}  # node -> when the controller saw it absent
        self._threads: dict[str, threading.Thread] = {}
        self.election = Election(
            self.store,
            self.keys.controller,
            json.dumps({"node_id": config.node.node_id}),
            ttl=config.session_ttl_s,
        )
        self.on_view: Callable[[ClusterView], None] | None = None  # the supervisor's hook (tests)

    # --------------------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 10.0) -> None:
        """Register, load the cluster and publish it once before returning (workers start next
        and must find the topics), then keep all of it up to date on threads."""
        self._register()
        for target, name in (
            (self._session, "session"),
            (self._watch, "mirror"),
            (self._publisher, "publish"),
        ):
            self._spawn(target, name)
        if not self._loaded.wait(timeout_s):
            raise StoreError(f"could not read the cluster from {', '.join(self.config.endpoints)}")
        self._spawn(self._control, "controller")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"cluster-{name}", daemon=True)
        t.start()
        self._threads[name] = t

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> list[tuple[int, int]]:
        """Controlled shutdown, first step (module rules): mark this node draining and wait until
        its workers' view shows its leaderships handed over. Returns the partitions it still
        leads that another replica could have taken (empty: all moved) once done or timed out."""
        me = self.config.node.node_id
        started = time.monotonic()
        with self._changed:
            self._draining = True
            lease = self._lease
        if lease:  # none: the session is being re-registered, which writes the draining presence
            try:
                self.store.put(self.keys.live_node(me), self._presence(), lease=lease)
            except StoreError as exc:
                log.warning("cannot mark this node draining: %s (its leaderships move when it leaves)", exc)
                return []
        deadline = started + timeout_s
        with self._published:
            while True:
                remaining = self._not_handed_over()
                left = deadline - time.monotonic()
                if remaining == [] or left <= 0 or self._closing.is_set():
                    break
                self._published.wait(min(left, 0.5))
        took = time.monotonic() - started
        if remaining is None:
            log.warning("draining: no view showed this node draining within %.1f s; stopping anyway", took)
            return []
        if remaining:
            log.warning(
                "draining: %d leadership(s) not handed over in %.1f s (%s); stopping anyway",
                len(remaining),
                took,
                ", ".join(f"{t}/{p}" for t, p in remaining[:10]),
            )
            return remaining
        log.info("draining: leaderships handed over in %.3f s", took)
        return []

    def _not_handed_over(self) -> list[tuple[int, int]] | None:  # holding the lock
        """The partitions the last published view has this node lead that another live,
        non-draining in-sync replica could take; None until a view shows this node draining."""
        me = self.config.node.node_id
        view = self._view
        if view is None or me not in view.draining:
            return None
        return [
            ident for ident, s in view.partitions.items() if not handed_over(s, me, view.live, view.draining)
        ]

    def _presence(self) -> str:
        return PresenceRecord(self._since, draining=self._draining).encode()

    def stop(self) -> None:
        """Leave: revoke the lease (this node's presence and its controller role go at once);
        after a drain, wait until the controller took this node out of the in-sync sets."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for name in ("session", "controller"):  # neither may register or campaign again
            t = self._threads.get(name)
            if t is not None:
                t.join(timeout=3.0)
        try:
            self.election.resign()
        except StoreError as exc:
            log.warning("resigning the controller role: %s", exc)
        left = False
        if self._lease:
            try:
                self.store.lease_revoke(self._lease)
                left = True
            except StoreError as exc:
                log.warning("leaving the cluster: %s (the lease lapses on its own)", exc)
        if left and self._draining:
            self._wait_out_of_isr(LEAVE_WAIT_S)
        self._closing.set()
        with self._changed:
            self._changed.notify_all()
        for t in self._threads.values():
            t.join(timeout=3.0)
        self.store.close()

    def member_changed(self, node_id: int, state: State) -> None:
        """The supervisor's hook for SWIM's events: DEAD and LEFT are a signal (see the rules),
        ALIVE withdraws one not yet acted on, SUSPECT is nothing yet."""
        match state:
            case State.DEAD | State.LEFT:
                self.member_dead(node_id)
            case State.ALIVE:
                self.member_alive(node_id)
            case State.SUSPECT:
                pass
            case _:
                assert_never(state)

    def _wait_out_of_isr(self, timeout_s: float) -> None:
        """Wait until the published view no longer counts this node live or in any in-sync set
        it can leave (the last member of one stays: broker/cluster/controller.py)."""
        me = self.config.node.node_id
        deadline = time.monotonic() + timeout_s

        def out(view: ClusterView | None) -> bool:
            return (
                view is not None
                and me not in view.live
                and all(me not in s.isr or s.isr == (me,) for s in view.partitions.values())
            )

        with self._published:
            while not out(self._view):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("left the cluster; not yet out of every in-sync set after %.1f s", timeout_s)
                    return
                self._published.wait(min(left, 0.5))

    def member_dead(self, node_id: int) -> None:
        """SWIM confirmed `node_id` dead (a signal; the controller acts on it, see the rules). If
        it is the controller, no controller is left to act: depose it (in a thread of its own:
        this is called from the supervisor's loop, which must not wait on etcd)."""
        with self._changed:
            self._dead_signals.add(node_id)
            self._unreachable.add(node_id)
            self._changed.notify_all()
            is_controller = self.mirror.controller == node_id
        if is_controller and node_id != self.config.node.node_id and not self._stop.is_set():
            threading.Thread(
                target=self._depose, args=(node_id,), name=f"depose controller {node_id}", daemon=True
            ).start()

    def _depose(self, node_id: int) -> None:
        """Revoke the election lease of the controller SWIM confirmed dead, if it still holds the
        key: the key goes, the survivors campaign at once, and the new controller revokes the dead
        node's session as it would any other's (it got the same signal). A false suspicion costs
        the live controller its term, never a write: every write of a term is fenced on the key's
        create revision (broker/cluster/election.py), which a deleted key no longer matches."""
        try:
            leader = self.election.leader()
            if leader is None or int(json.loads(leader.node_id)["node_id"]) != node_id:
                return
            log.warning("membership confirms the controller (node %d) dead: revoking its term", node_id)
            self.store.lease_revoke(leader.lease)
        except (StoreError, ValueError, KeyError, TypeError) as exc:
            log.warning("deposing the dead controller %d: %s (its term lapses on its own)", node_id, exc)

    def member_alive(self, node_id: int) -> None:
        with self._changed:
            self._dead_signals.discard(node_id)
            self._unreachable.discard(node_id)

    # --------------------------------------------------------------------------- session

    def _register(self) -> int:
        """A new session; the revision of its `live` key."""
        k = self.keys
        node = self.config.node
        lease = self.store.lease_grant(self.config.session_ttl_s)
        self.store.put(k.node(node.node_id), node.encode())
        self._since = time.time()
        revision = self.store.put(k.live_node(node.node_id), self._presence(), lease=lease.id)
        self._lease = lease.id
        log.info("registered node %d in cluster %s (lease %x)", node.node_id, self.config.cluster, lease.id)
        return revision

    def _session(self) -> None:
        ttl = self.config.session_ttl_s
        interval = ttl / 3
        pause = interval
        renewed = time.monotonic()  # when the last keepalive that succeeded was sent
        while not self._stop.wait(pause):
            pause = interval
            sent = time.monotonic()
            try:
                if not self._lease:
                    revision = self._register()
                    with self._changed:  # fenced until the mirror has caught up with it
                        self._lapsed_until = revision
                        self._cut_off = False
                        self._mark_dirty()
                else:
                    self.store.lease_keepalive(self._lease, deadline=interval)
                    with self._changed:
                        if self._cut_off:
                            self._cut_off = False
                            self._mark_dirty()
                renewed = sent
            except LeaseNotFound:
                # etcd answered, and the cluster took this node for dead: its leaderships may be
                # others' now. Lead nothing until registered again (module rules).
                log.warning("this node's lease lapsed: the cluster took it for dead; registering again")
                self._lease = 0
                with self._changed:
                    self._lapsed_until = 0
                    self._mark_dirty()
                pause = 0.0
            except StoreError as exc:
                # etcd is away (for this node or for all): keep leading (module rules), and ask
                # again soon: once etcd answers, a lapsed session must be known at once
                log.warning("keeping this node's session: %s", exc)
                pause = RETRY_S
                if time.monotonic() - renewed > FENCE_AFTER * ttl:
                    with self._changed:
                        if not self._cut_off and self._alone():
                            self._cut_off = True
                            self._mark_dirty()

    def _alone(self) -> bool:  # holding the lock
        """This node and the peers SWIM still reaches are not a majority of the cluster's nodes
        (a cluster of one node is never alone: nobody else could take over)."""
        me = self.config.node.node_id
        peers = set(self.mirror.nodes) - {me}
        if not peers:
            return False
        reachable = len(peers - self._unreachable) + 1
        return 2 * reachable <= len(peers) + 1

    def _fenced_now(self) -> bool:  # holding the lock
        """Fenced while cut off (`_session`), and from the store's `LeaseNotFound` until
        registered again and the mirror has caught up with that registration (until then it may
        still hold the leaderships the controller moved while this node was taken for dead)."""
        lapsed = self._lapsed_until
        if lapsed is not None and lapsed and self.mirror.revision >= lapsed:
            lapsed = self._lapsed_until = None
        fenced = lapsed is not None or self._cut_off
        if fenced != self._fenced:
            what = "lost its session: leading nothing" if fenced else "has its session again"
            log.warning("this node %s", what)
            self._fenced = fenced
        return fenced

    # --------------------------------------------------------------------------- mirror

    def _watch(self) -> None:
        while not self._closing.is_set():
            ended = threading.Event()

            def watch_ended(exc: Exception, ended: threading.Event = ended) -> None:
                log.warning("watch ended: %s", exc)
                ended.set()

            try:
                rng = self.store.get_prefix(self.keys.prefix)
                with self._changed:
                    self.mirror.load(
                        [(kv.key.decode(), kv.value, kv.mod_revision, kv.lease) for kv in rng.kvs],
                        rng.revision,
                    )
                    self._mark_dirty()
                watch = self.store.watch_prefix(
                    self.keys.prefix,
                    rng.revision + 1,
                    self._event,
                    watch_ended,
                )
            except StoreError as exc:
                log.warning("reading the cluster: %s", exc)
                self._closing.wait(RETRY_S)
                continue
            while not self._closing.is_set() and not ended.wait(0.2):
                pass
            watch.cancel()

    def _event(self, event: Event) -> None:
        kv = event.kv
        with self._changed:
            value = kv.value if event.type == "put" else None
            if self.mirror.apply(kv.key.decode(), value, kv.mod_revision, kv.lease):
                self._mark_dirty()

    def _mark_dirty(self) -> None:  # holding the lock
        self._dirty = True
        self._changed.notify_all()

    def _publisher(self) -> None:
        published_topics: list[Topic] | None = None
        published_security: dict[str, bytes] | None = None
        while not self._closing.is_set():
            with self._changed:
                while not self._dirty and not self._closing.is_set():
                    self._changed.wait(1.0)
                if self._closing.is_set():
                    return
            time.sleep(PUBLISH_COALESCE_S)
            with self._changed:
                self._dirty = False
                view = self.mirror.view(fenced=self._fenced_now())
                # every view published is newer than the last (a fencing changes no revision)
                self._generation = max(self._generation + 1, view.generation)
                view = dataclasses.replace(view, generation=self._generation)
                topics = self.mirror.topic_list()
                security = dict(self.mirror.security)
            try:
                if topics != published_topics:
                    with self.registry.locked():
                        self.registry.mirror(topics)
                    published_topics = topics
                if self.security_dir is not None and security != published_security:
                    write_copies(self.security_dir, f"etcd {self.keys.security}", security)
                    published_security = security
                publish(self.run_dir, view)
            except OSError as exc:
                log.error("publishing the cluster view: %s", exc)
                with self._changed:
                    self._dirty = True
                self._closing.wait(RETRY_S)
                continue
            with self._published:
                self._view = view
                self._published.notify_all()
            self._loaded.set()
            if self.on_view is not None:
                self.on_view(view)

    # --------------------------------------------------------------------------- controller

    def _drain_absent(
        self, partitions: dict[tuple[int, int], Versioned], live: set[int], candidates: list[Candidate]
    ) -> dict[tuple[int, int], Versioned]:
        """Nodes absent longer than `reassign_after_s` get their replicas moved (a target each,
        which `reconcile` then carries out); the states as they are after those writes."""
        now = time.monotonic()
        with self._changed:
            known = set(self.mirror.nodes)
        for node in known - live:
            self._absent_since.setdefault(node, now)
        for node in list(self._absent_since):
            if node in live or node not in known:
                del self._absent_since[node]
        out = dict(partitions)
        for node, since in self._absent_since.items():
            if now - since < self.config.reassign_after_s:
                continue
            for (tid, p), versioned in partitions.items():
                state = versioned.state
                target = drain_target(tid, p, state, node, candidates)
                if target is None or state.target:
                    continue
                new = start_reassignment(state, target)
                written_at = self.admin.write_state(
                    tid, p, versioned.mod_revision, new, fence=self.election.fence()
                )
                if written_at is not None:
                    log.warning(
                        "node %d absent %.0f s: partition %d/%d moves to %s",
                        node,
                        now - since,
                        tid,
                        p,
                        list(target),
                    )
                    out[(tid, p)] = Versioned(new, written_at)
        return out

    def _control(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.election.campaign(stop=self._stop):
                    continue
                log.info("node %d is the controller", self.config.node.node_id)
                while not self._stop.is_set() and self.election.leading():
                    self._reconcile_all()
                    with self._changed:
                        self._changed.wait(RECONCILE_EVERY_S)
            except NotLeader:
                log.warning("node %d is no longer the controller", self.config.node.node_id)
            except StoreError as exc:
                log.warning("controller: %s", exc)
                self._stop.wait(RETRY_S)

    def _reconcile_all(self) -> None:
        with self._changed:
            live = set(self.mirror.live) & set(self.mirror.nodes)
            draining = self.mirror.draining & live
            leases = dict(self.mirror.live)
            dead = set(self._dead_signals)
            partitions = dict(self.mirror.partitions)
            topics = list(self.mirror.topics.values())
            candidates = [
                Candidate(n.node_id, n.weight, n.rack) for i, n in self.mirror.nodes.items() if i in live
            ]
        for node in dead & set(leases):
            if node != self.config.node.node_id:
                log.warning("membership confirms node %d dead: revoking its session", node)
                self.store.lease_revoke(leases[node])
                live.discard(node)
        with self._changed:
            self._dead_signals -= dead
        if self.config.reassign_after_s > 0:
            partitions = self._drain_absent(partitions, live, candidates)
        for record in topics:
            t = record.topic
            missing = [p for p in range(t.partitions) if (t.topic_id, p) not in partitions]
            if missing and (
                len(candidates) >= record.replication or all(p in record.manual for p in missing)
            ):
                self.admin.write_partitions(t, record.replication, candidates, record.manual)
        # a topic's unclean.leader.election.enable overrides the cluster's --unclean-leader-election
        default = "true" if self.config.unclean_election else "false"
        unclean = {r.topic.topic_id: r.topic.configs.get(UNCLEAN, default) == "true" for r in topics}
        for (tid, p), versioned in partitions.items():
            allowed = unclean.get(tid, self.config.unclean_election)
            new = reconcile(versioned.state, live, unclean=allowed, draining=draining)
            if new is None:
                continue
            if (
                self.admin.write_state(tid, p, versioned.mod_revision, new, fence=self.election.fence())
                is not None
            ):
                old = versioned.state
                log.info(
                    "partition %d/%d: leader %d -> %d (epoch %d), in sync %s",
                    tid,
                    p,
                    old.leader,
                    new.leader,
                    new.leader_epoch,
                    list(new.isr),
                )
