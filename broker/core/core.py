"""One core's state and doors, whatever protocol asks: the protocol-neutral `Core`.

Rules this module keeps:
- One `Core` per worker process (per CPU), owned by its event-loop thread: the topics as this core
  sees them, the partitions it owns (each with its doors: broker/core/partition.py), the groups it
  coordinates, its producer ids, its metrics, the cluster view, the SASL server and ACLs. The
  adapters (broker/ringlog/ for our protocol, broker/kafka/ for Kafka's) decode a request, call
  the core and its partitions, and encode the answer; the core never learns which protocol asked.
- A core serves only the partitions it owns (`owner(topic_id, partition)`, `routing.shard_for`);
  `partition_named` answers another core's partition with that core's number, for the adapter to
  answer or forward as its protocol does.
- Partitions open on first use: a core opens, at start, the partitions it owns that have files,
  and any other only when a request for it arrives (creating its directory and first segment
  then, in that one request). `create_topic` therefore only writes the registry, whatever the
  partition count: no request ever waits behind thousands of partition creations, and no
  request sees a half-made partition (one is made whole within the request that needs it).
- Topic metadata is shared by all cores through topics.json (broker/core/topics.py). A core learns
  of another core's change on a miss (a partition it should own but has not opened, an unknown
  topic: reload once, then answer), from `metadata_view` and `refresh_topics()` (a stat of the
  file, run by the backend about once a second), and from the notice `delete_topic` sends every
  other core: the deleting core answers its client only after every peer closed the topic's
  partitions (or the notice timed out), so once a deletion is answered no live core accepts
  produce for it. The deleting core removes the files last.
- What an acknowledged produce waits for is decided by its partition, once
  (`Partition.waits_for`, from the produce's acks): the `Append` a produce becomes carries it
  (`Waits`), and so does a retry of stored batches (`stored_reply`); the backend only carries it
  out.
- A full disk refuses writes, never reads (broker/storage/diskspace.py): a produce (through the
  partition, after its retry check: a retry of stored batches is still answered), a topic
  creation and an offset commit ask `space.check_writable()` first and get OUT_OF_SPACE
  (retriable); a write that fails with ENOSPC anyway answers the same and tells `space`. Reads,
  Metadata, offset fetches, deletions and retention never ask.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from broker.core.acks import Waits
from broker.core.blocking import RunBlocking, no_threads
from broker.core.cleaning import LogCleaning
from broker.core.cluster_view import ClusterView, ViewFile
from broker.core.config import BrokerConfig
from broker.core.coordinator import CallLater, GroupCoordinator
from broker.core.groups import GroupOffsetStore
from broker.core.lifecycle import Lifecycle
from broker.core.limits import SEGMENT_FD_CACHE_UNLIMITED, partition_limit
from broker.core.metadata_views import MetadataViews
from broker.core.metrics import CoreMetrics
from broker.core.outcomes import Durable, Later, Notify, Outcome, Reply, Silent
from broker.core.partition import Partition, Stored
from broker.core.producer_ids import FileBlockSource, ProducerIds
from broker.core.remote import RemoteLinks
from broker.core.replication import NotLeaderError
from broker.core.sweeps import Schedule, Sweep
from broker.core.topic_configs import Alteration, ConfigEntry, TopicDefaults, describe_topic
from broker.core.topics import Topic, TopicError, TopicFault, TopicRegistry, invalid_topic_name
from broker.core.transactions import CoreTransactions, is_internal
from broker.core.views import MetadataView
from broker.security.acls import Authorizer
from broker.security.sasl import Authenticator
from broker.storage import layout
from broker.storage.diskspace import DiskSpace
from broker.storage.errors import StorageError
from broker.storage.fdcache import FdCache
from broker.storage.log_config import LogConfig
from ringlog_proto import messages as m
from ringlog_proto.batch import now_ms
from ringlog_proto.frames import Frame
from ringlog_proto.routing import coordinator_for, coordinator_node, shard_for

T = TypeVar("T")
log = logging.getLogger(__name__)

FORCED_REFRESH_GAP_S = 0.001  # see `refresh_topics`
MIRROR_WAIT_S = 3.0  # a store change not in this node's registry by then is answered anyway
MIRROR_POLL_S = 0.005
# (topic id, partition) -> core entries kept at least; cleared when full. Sized up to the partition
# limit (`Core.owner`): a cache smaller than the partitions in use was cleared again and again.
OWNER_CACHE_MAX = 100_000


def _no_timers(delay_s: float, callback: Callable[[], None]) -> object:
    raise RuntimeError("this core has no event loop: group membership needs one")


class Core:
    """One core's state and doors (module rules).

    `metrics` are this core's counters (the backend bumps the per-request ones, the adapters
    count errors); `gauges` are set by the backend (queue depths, read when a snapshot is taken:
    STATS and the published files).
    """

    def __init__(
        self,
        config: BrokerConfig,
        metrics: CoreMetrics | None = None,
        call_later: CallLater | None = None,
        run_blocking: RunBlocking | None = None,
        call_soon: Schedule | None = None,
    ) -> None:
        self.config = config
        # how a pass over every partition hands the loop back between turns (broker/core/sweeps.py);
        # None (no loop: tests, tools): a pass runs whole when it starts
        self.call_soon = call_soon
        self._sweeps: list[Sweep[Partition]] = []
        self._openings: set[Sweep[tuple[int, int]]] = set()  # `open_in_turns`' passes under way
        # slow control-plane calls off the loop: `self.run_blocking(fn, done)` (broker/core/blocking.py)
        self.run_blocking: RunBlocking = run_blocking or no_threads
        self.metrics = metrics if metrics is not None else CoreMetrics(config.core_id, config.backend)
        self.gauges: dict[str, Callable[[], int]] = {}
        # This core's TCP links to other brokers' cores (broker/core/remote.py), set by the backend
        # that serves it: how replication reaches a leader's core. None without a backend (tests).
        self.remote_links: RemoteLinks | None = None
        self._forced_at = -1.0  # when `refresh_topics(force=True)` last reread the registry
        self.space = DiskSpace(config.data_dir, config.limits.min_free_bytes)  # broker/storage/diskspace.py
        os.makedirs(layout.topics_dir(config.data_dir), exist_ok=True)
        self.registry = TopicRegistry(
            config.data_dir, topic_defaults(config), remove_orphans=False, limits=config.limits
        )
        # the topic each open partition's settings were taken from (`_sync_partitions` applies a
        # topic's altered configs to its partitions when the registry shows another)
        self._configured: dict[int, Topic] = {}
        with self.registry.locked():  # orphans are removed only here: at start, under the lock
            self.registry.load()
            self.registry.remove_orphans()
        # Segment files this core keeps open, every partition's (broker/storage/fdcache.py): the
        # limit the supervisor fitted to the open-file limit; 0 where nothing was fitted (an
        # unlimited open-file limit, a core made by a test) is a large one.
        self.fd_cache = FdCache(config.limits.segment_fd_cache or SEGMENT_FD_CACHE_UNLIMITED)
        self.partitions: dict[tuple[int, int], Partition] = {}
        # The log cleaner of this core's compacted partitions (broker/core/cleaning.py).
        self.cleaning = LogCleaning(
            config.cleaner, self.partitions.values, self.run_blocking, sweep=self.partition_sweep("cleaner")
        )
        self._retention = self.partition_sweep("retention")
        # The cluster as the node's supervisor last published it (one node: none, and no cost).
        # A clustered core starts from the view the agent published before the workers started
        # (or an empty one: every partition refused until a view names its replicas here).
        self.cluster = ClusterView.single(config.node_id)
        if config.cluster is not None:
            self.cluster = ViewFile(layout.run_dir(config.data_dir)).poll() or ClusterView(
                config.node_id, -1, clustered=True
            )
        # Broker-assigned producer ids (Kafka's InitProducerId); the first use claims a block.
        # (a cluster's come from its store: ids unique across nodes, as a partition's producer state
        # moves between them; a claim blocks this loop once per block, as the file's flock does)
        ids = config.cluster.producer_ids if config.cluster is not None else None
        self.producer_ids = ProducerIds(ids or FileBlockSource(config.data_dir))
        self._owners: dict[tuple[int, int], int] = {}
        self._owners_max = max(OWNER_CACHE_MAX, partition_limit(config.limits))
        # what both protocols' Metadata show of the topics (broker/core/metadata_views.py)
        self.metadata_views = MetadataViews(self)
        # opening the stored partitions now, closing them all at shutdown (broker/core/lifecycle.py)
        self.lifecycle = Lifecycle(self)
        self.lifecycle.open_stored()
        self.call_later: CallLater = call_later or _no_timers
        # the groups this core coordinates: membership (timers on the backend's loop) and offsets
        self.coordinator = GroupCoordinator(
            (config.cluster.group_offsets if config.cluster is not None else None)
            or GroupOffsetStore(config.data_dir),
            self.call_later,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        )
        # the transactional ids this core coordinates (broker/core/transactions.py); its appends
        # are the backend's (`transactions.own_append`, set when a backend opens the core)
        self.transactions = CoreTransactions(self)
        # One SASL server and one set of ACL decisions per core, whatever protocol a client speaks:
        # users, ACLs, counters and the failure log are one (broker/ringlog/access.py, broker/kafka/).
        self.authenticator = Authenticator(config.data_dir, config.sasl) if config.sasl.enabled else None
        if self.authenticator is not None:
            self.authenticator.on_failure = self.metrics.auth_failure
        self.authorizer = Authorizer(
            config.data_dir, config.authorizing, config.super_users + config.sasl.super_users
        )

    def close(self) -> None:
        """Close every partition (flushing them). Call once, at shutdown. When every one closed
        clean, the core's clean-shutdown marker is written (broker/storage/clean_marker.py,
        broker/core/lifecycle.py)."""
        for sweep in self._sweeps:
            sweep.cancel()
        for opening in self._openings:
            opening.cancel()
        self._openings.clear()
        self.transactions.close()
        self.cleaning.close()
        self.lifecycle.close()

    def partition_sweep(self, name: str) -> Sweep[Partition]:
        """A `Sweep` over this core's partitions for one kind of pass (broker/core/sweeps.py),
        cancelled when the core closes; start it with `sweep_partitions`."""
        sweep: Sweep[Partition] = Sweep(name, self.call_soon)
        self._sweeps.append(sweep)
        return sweep

    def sweep_partitions(
        self,
        sweep: Sweep[Partition],
        visit: Callable[[Partition], None],
        done: Callable[[], None] | None = None,
    ) -> bool:
        """Start `sweep`'s pass over the partitions open now: each visited while this core still
        has it open. False when that sweep's last pass is still running."""
        partitions = self.partitions
        return sweep.start(
            partitions.values(), visit, done, lambda p: partitions.get((p.topic_id, p.index)) is p
        )

    def owner(self, topic_id: int, partition: int) -> int:
        if self.config.cores == 1:
            return 0
        key = (topic_id, partition)
        core = self._owners.get(key)
        if core is None:
            if len(self._owners) >= self._owners_max:
                self._owners.clear()
            core = self._owners[key] = shard_for(topic_id, partition, self.config.cores)
        return core

    def open_partition(self, topic: Topic, index: int, config: LogConfig | None = None) -> Partition:
        """Open (creating it if new) partition `index` of `topic`, which this core owns (`config`:
        its topic's log settings, when the caller has them)."""
        key = (topic.topic_id, index)
        p = self.partitions.get(key)
        if p is None:
            path = self.registry.partition_dir(topic.topic_id, index)
            p = Partition(
                topic.topic_id,
                index,
                path,
                self.registry.log_config(topic) if config is None else config,
                self.fd_cache,
                clean=self.lifecycle.clean_start,
                recovered=self.lifecycle.recovered,
            )
            # the producers its log names that were idle past the expiration already (Kafka's
            # loading of a producer snapshot drops them too)
            p.expire_producers(now_ms(), self.config.producer_id_expiration_ms)
            self.partitions[key] = p
            self._configured.setdefault(topic.topic_id, topic)
            if self.cluster.clustered:
                self.give_role(p)
            self.lifecycle.opened()
        return p

    def group_coordinator(self, group: str) -> tuple[int, int]:
        """(node, core) coordinating `group`: a core of this node alone; in a cluster the node is
        `routing.coordinator_node` over the live nodes that are not draining (`ClusterView.serving`:
        what clients compute too, from Metadata), then the core
        over its cores. Groups' offsets stay on that node (docs/CLUSTER.md says what that means)."""
        c = self.cluster
        live = [n for n in c.serving if n in c.nodes] if c.clustered else []
        if not live:
            return self.config.node_id, coordinator_for(group, self.config.cores)
        node = coordinator_node(group, live)
        return node, coordinator_for(group, c.nodes[node].cores)

    def replicated_here(self, topic_id: int, index: int) -> bool:
        """Whether the cluster view puts a replica of the partition on this node."""
        state = self.cluster.state_of(topic_id, index)
        return state is not None and self.config.node_id in state.replicas

    def give_role(self, p: Partition) -> None:
        """The role the view names for this node's replica of `p` (a clustered core's partitions
        always have one: a partition without a role would serve as if alone). A replica the view
        no longer places here (reassigned away) follows the new leader without fetching: it
        answers nothing a leader would, until `remove_moved_away` closes it and removes its
        files (broker/core/replica_manager.py)."""
        state = self.cluster.state_of(p.topic_id, p.index)
        me = self.config.node_id
        settings = self.config.cluster
        if state is None or settings is None:
            return
        if me not in state.replicas:
            if p.replica is not None:  # it had a role here: it gives it up
                p.become_follower(state.leader_epoch, state.leader)
            return
        if state.leader == me:
            topic = self.registry.by_id.get(p.topic_id)
            min_insync = (
                self.registry.settings_of(topic).min_insync_replicas
                if topic is not None
                else settings.min_insync
            )
            p.become_leader(state.leader_epoch, state.replicas, state.isr, me, min_insync=min_insync)
        else:
            p.become_follower(state.leader_epoch, state.leader)

    # ------------------------------------------------------------------------- topics shared by cores

    def refresh_topics(self, force: bool = False) -> None:
        """Catch up with topic changes made by other cores: reread topics.json when it was replaced
        (or always, with `force`), open the partitions of new topics this core owns and close those
        of topics that are gone. Never removes files (see broker/core/topics.py)."""
        if force:
            # One forced reread per millisecond at most: a request naming thousands of unknown
            # topics or partitions asked for one per entry (~30 us each); between two,
            # the replace check below still sees a registry another core rewrote.
            now = time.monotonic()
            if now - self._forced_at < FORCED_REFRESH_GAP_S:
                force = False
            else:
                self._forced_at = now
        try:
            if force:
                self.registry.load()
            elif not self.registry.refresh():
                return
        except (ValueError, KeyError, TypeError, OSError) as exc:
            # A registry this core cannot read (damaged by hand, a disk error): keep serving the
            # topics it knows; creates and deletes, which must read it, fail with the reason.
            log.error(
                "cannot read the topic registry (%s); keeping the %d topics known",
                exc,
                len(self.registry.by_id),
            )
            return
        self._sync_partitions()

    def _sync_partitions(self) -> None:
        """Close the partitions of topics that are gone (new topics' partitions open on first use)
        and give those of topics whose configs changed their new settings.

        Every gone partition leaves `partitions` before any is closed: closing one wakes its long
        polls, whose fetches are handled again at once and look topics up, which comes back
        here; they must find the topic gone (UNKNOWN_TOPIC_OR_PARTITION), not a partition
        half-way through this loop (a `KeyError` answered UNKNOWN_SERVER_ERROR to the DeleteTopics
        of a topic a consumer was reading).

        So this stays one pass, not turns of the loop (broker/core/sweeps.py): a deletion is
        answered once every core closed its partitions, and the files go then. It walks the
        partitions only when a topic it has partitions of is gone, and once for all the topics
        whose configs changed; a registry change that only adds topics (the common one) costs a
        walk of the topics, not of 100 000 partitions."""
        live = self.registry.by_id
        gone_topics = {tid for tid in self._configured if tid not in live}
        gone = []
        if gone_topics:
            gone = [self.partitions.pop(k) for k in [k for k in self.partitions if k[0] in gone_topics]]
            for tid in gone_topics:  # before the closes below, which may come back here
                del self._configured[tid]
        for p in gone:
            log.info("topic id %d is gone: closing partition %d", p.topic_id, p.index)
            self._discard(p)
        if gone and self.cluster.clustered:
            self._remove_gone_files([(p.topic_id, p.index) for p in gone])
        live = self.registry.by_id  # the closes above may have reloaded it
        changed = {
            tid: t
            for tid, old in self._configured.items()
            if (t := live.get(tid, old)).configs != old.configs
        }
        if changed:
            self._configured.update(changed)
            self._configure(changed)

    def _discard(self, p: Partition) -> None:
        """Close `p`, out of `partitions` already, writing nothing: its files go next."""
        self.cleaning.forget(p)
        try:
            p.close(discard=True)
        except StorageError as exc:
            log.error("closing partition %d/%d: %s", p.topic_id, p.index, exc)

    def remove_moved_away(self, keys: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Close the replicas `keys` (topic id, index) that the view no longer places on this node
        and remove their files, as Kafka's StopReplica with deletion does once a reassignment
        (or a drain, or a cancelled addition) completes: the view drops a replica only then,
        and the data is on the replicas it names. Kept, they held the node's disk, page cache
        and descriptors, unserved, until the topic was deleted and the node restarted. Returns
        those left for later: a replica with appends in flight (the last copy from its old
        leader, its own last produce) cannot close until they complete.

        Like a deleted topic's (`_sync_partitions`), each leaves `partitions` before it closes:
        the long polls its close wakes look it up again and are answered NOT_LEADER, as
        `partition` answers for a replica not placed here (and never opens it again)."""
        later = []
        aside = []
        for key in keys:
            p = self.partitions.get(key)
            if p is None:
                continue
            if p.log.appending:
                later.append(key)
                continue
            del self.partitions[key]
            log.info("partition %d/%d: moved off this node, removing its files", *key)
            self._discard(p)
            try:
                path = self.registry.set_aside_partition_files(*key)
            except OSError as exc:
                log.error("partition %d/%d: cannot set its files aside: %s (kept)", key[0], key[1], exc)
                continue
            if path is not None:
                aside.append(path)
        if aside:
            self._remove_off_loop(lambda: self.registry.remove_set_aside(aside), "moved replicas")
        return later

    def _remove_off_loop(self, remove: Callable[[], None], what: str) -> None:
        """`remove()` (files of closed partitions) on the blocking pool, or at once on a core
        without one; a failure is logged: the next start removes what is left."""

        def done(result: object) -> None:
            if isinstance(result, BaseException):
                log.warning("removing the files of %s: %r (the next start removes them)", what, result)

        if self.run_blocking is no_threads:
            remove()
        else:
            self.run_blocking(remove, done)

    def _remove_gone_files(self, gone: list[tuple[int, int]]) -> None:
        """A cluster node's files of the partitions of deleted topics this core just closed.
        Deleting is the controller's (broker/cluster/admin.py): each node learns it from its
        mirrored registry, and no request of its own waits for the files to go, so each core
        removes its partitions' on the blocking pool (seconds of the kernel's time for a large
        topic, as `delete_topic` says). Left in place, they held the node's disk and page cache
        until a restart's `remove_orphans`: four 4-second runs of R2's shape on topics deleted
        after each left ~0.5 GB a run on every node, and each run's produce took more of the
        kernel's time than the one before (2.6 -> 12.3 s a GB; 96 -> 64 MB/s), 2.3-2.7 s with
        them removed. A removal cut short (the core stopping) is finished by the next start."""
        self._remove_off_loop(lambda: self.registry.remove_partition_files(gone), "deleted partitions")

    def _configure(self, topics: Mapping[int, Topic]) -> None:
        """Apply the configs of `topics` (by id) to this core's open partitions of them (live: no
        reopen), in one walk of the partitions however many topics changed."""
        settings = {}
        for tid, topic in topics.items():
            config = self.registry.log_config(topic)
            min_insync = (
                self.registry.settings_of(topic).min_insync_replicas if self.cluster.clustered else None
            )
            settings[tid] = (config, min_insync)
            log.info("topic %s: configs now %s", topic.name, dict(topic.configs) or "the broker's defaults")
        for (tid, _), p in list(self.partitions.items()):
            setting = settings.get(tid)
            if setting is None:
                continue
            try:
                p.configure(*setting)
            except (StorageError, ValueError) as exc:
                log.error("configuring partition %d/%d: %s", p.topic_id, p.index, exc)

    def partition(self, topic_id: int, index: int) -> Partition:
        """Partition `index` of topic id `topic_id`, which this core owns, opened (made, if new) on
        its first use: what a request of ours names."""
        p = self.partitions.get((topic_id, index))
        if p is not None:
            return p
        topic = self.registry.by_id.get(topic_id)
        if topic is None or not 0 <= index < topic.partitions:
            self.refresh_topics(force=True)  # a miss: another core may have created the topic
        else:
            self.refresh_topics()  # a stat: a topic deleted meanwhile is not made again
        topic = self.registry.by_id.get(topic_id)
        if topic is None or not 0 <= index < topic.partitions:
            raise TopicError(TopicFault.UNKNOWN, f"no partition {index} of topic id {topic_id}")
        if self.owner(topic.topic_id, index) != self.config.core_id:
            raise TopicError(
                TopicFault.UNKNOWN, f"partition {index} of topic id {topic_id} is not on this core"
            )
        if self.cluster.clustered and not self.replicated_here(topic.topic_id, index):
            node = self.config.node_id
            raise NotLeaderError(f"node {node} holds no replica of partition {index}")
        return self.open_partition(topic, index)

    def unopened(self, named: Iterable[tuple[str, int]]) -> list[tuple[int, int]]:
        """The (topic id, index) of the partitions in `named` (topic name, index) that this core
        owns, would serve, and has not opened yet: what `partition_named` would open (and, for a
        new one, make) on the way. Unknown names and indexes are left to it: they open nothing."""
        by_name, partitions, mine = self.registry.by_name, self.partitions, self.config.core_id
        clustered = self.cluster.clustered
        out: dict[tuple[int, int], None] = {}
        for name, index in named:
            t = by_name.get(name)
            if t is None or not 0 <= index < t.partitions:
                continue
            key = (t.topic_id, index)
            if key in partitions or self.owner(*key) != mine:
                continue
            if clustered and not self.replicated_here(*key):
                continue
            out[key] = None
        return list(out)

    def open_in_turns(self, keys: Sequence[tuple[int, int]], done: Callable[[], None]) -> None:
        """Open the partitions `keys` (`unopened`'s) in turns of about a millisecond of the loop
        (broker/core/sweeps.py), then `done()`. A partition's first use makes its directory and
        files (0.1-0.9 ms on ext4): a request naming thousands of new ones, made in one go, held
        every other client of the core 0.5 s and more. One that fails to open here is left to the
        request, which meets the same error and answers it. Never `done` if the core closes."""

        def visit(key: tuple[int, int]) -> None:
            with contextlib.suppress(TopicError, NotLeaderError, StorageError, OSError):
                self.partition(*key)

        def finished() -> None:
            self._openings.discard(opening)
            done()

        opening: Sweep[tuple[int, int]] = Sweep("first use", self.call_soon)
        self._openings.add(opening)
        opening.start(keys, visit, finished)

    def partition_named(self, topic: str, index: int) -> Partition | int:
        """Partition `index` of the topic named `topic` when this core owns it (opened, made if
        new), else the core that owns it: the protocol-neutral lookup of a multi-partition
        request (Kafka's), which answers a partition of another core rather than forward it.
        Raises `TopicError` for an unknown topic or partition."""
        t = self.registry.by_name.get(topic)
        if t is None or not 0 <= index < t.partitions:
            self.refresh_topics(force=True)
            t = self.registry.by_name.get(topic)
        if t is None or not 0 <= index < t.partitions:
            raise TopicError(TopicFault.UNKNOWN, f"no partition {index} of topic {topic!r}")
        core = self.owner(t.topic_id, index)
        if core != self.config.core_id:
            return core
        p = self.partitions.get((t.topic_id, index))
        if p is not None:
            return p
        self.refresh_topics()  # a stat: a topic deleted meanwhile is not made again
        current = self.registry.by_id.get(t.topic_id)
        if current is None:
            raise TopicError(TopicFault.UNKNOWN, f"no partition {index} of topic {topic!r}")
        if self.cluster.clustered and not self.replicated_here(t.topic_id, index):
            # opened here it would have no role, and serve as a single node's partition does
            raise NotLeaderError(f"node {self.config.node_id} holds no replica of partition {index}")
        return self.open_partition(current, index)

    def metadata_view(self, names: Sequence[str] | None = None, *, partitions: bool = True) -> MetadataView:
        """Topics (`names`, or every one when None) as both protocols' Metadata show them
        (broker/core/metadata_views.py `MetadataViews.view`)."""
        return self.metadata_views.view(names, partitions=partitions)

    def topic_name(self, topic_id: int) -> str | None:
        """The name of topic `topic_id` (None if there is none): the resource an ACL names."""
        topic = self.registry.by_id.get(topic_id)
        if topic is None:
            self.refresh_topics(force=True)  # another core may have created it
            topic = self.registry.by_id.get(topic_id)
        return topic.name if topic is not None else None

    def in_cluster(
        self,
        call: Callable[[], Any],
        answer: Callable[[Any], Reply],
        fail: Callable[[BaseException], Reply] | None = None,
        until: Callable[[Any], bool] | None = None,
    ) -> Outcome:
        """Run `call` (a write to the cluster's store) off the loop, then answer with its result;
        an error is answered by `fail`, or passed to `answer` without it. `until`:
        first wait (up to `MIRROR_WAIT_S`) until this core's registry shows the change: the agent
        copies it into topics.json within milliseconds, and the client's next request here must
        see the topic it just created."""

        def start(reply: Callable[[Reply | Silent], None]) -> None:
            def done(result: object) -> None:
                if isinstance(result, BaseException):
                    reply(fail(result) if fail is not None else answer(result))
                    return
                deadline = time.monotonic() + MIRROR_WAIT_S

                def mirrored() -> None:
                    self.refresh_topics(force=True)
                    if until is None or until(result) or time.monotonic() > deadline:
                        reply(answer(result))
                    else:
                        self.call_later(MIRROR_POLL_S, mirrored)

                mirrored()

            self.run_blocking(call, done)

        return Later(start)

    def has_topic(self, topic: Topic) -> bool:
        current = self.registry.by_name.get(topic.name)
        return current is not None and current.topic_id == topic.topic_id

    def create_topic(
        self, name: str, partitions: int, configs: Mapping[str, str | None] | None = None
    ) -> Topic:
        """Create a topic (both protocols' CreateTopic(s)) with these config overrides; raises
        `TopicError` (a bad name or config: broker/core/topic_configs.py) or what refuses it
        (a full disk)."""
        self.space.check_writable()
        with self.registry.locked():  # reload, change, save: other cores change it too
            self.registry.load()
            topic = self.registry.create(name, partitions, configs)
        self._sync_partitions()
        # No partition is made here: each is made on its first use (module rules), so this
        # answer costs one registry write whatever the partition count.
        log.info("created topic %s (id %d, %d partitions)", topic.name, topic.topic_id, topic.partitions)
        return topic

    def alter_topic_configs(self, name: str, alteration: Alteration, validate_only: bool = False) -> Topic:
        """Alter the overrides of topic `name` on one node (`alteration` applied to them as they
        are under the registry's lock: broker/core/topic_configs.py `replacing`, `changing`);
        raises `TopicError`. This core applies them at once, the others on their next registry
        reload (within about a second, `refresh_topics`). `validate_only`: checked, nothing changed."""
        if validate_only:
            self.refresh_topics()
            return self.registry.altered(name, alteration)
        (result,) = self.alter_topics_configs([(name, alteration)])
        if isinstance(result, BaseException):
            raise result
        return result

    def alter_topics_configs(self, alterations: Sequence[tuple[str, Alteration]]) -> list[Topic | Exception]:
        """`alter_topic_configs` of several topics in one write of the registry (a request
        naming thousands costs one fsync, not thousands): each topic's result, the altered
        topic or why it was refused (the others are stored)."""
        results: list[Topic | Exception] = []
        with self.registry.locked():
            self.registry.load()
            for name, alteration in alterations:
                try:
                    results.append(self.registry.altered(name, alteration))
                except TopicError as exc:
                    results.append(exc)
            altered = {t.topic_id: t for t in results if isinstance(t, Topic)}
            if altered:
                self.registry.replace_topic(*altered.values())
        self._sync_partitions()
        return results

    def topic_config_entries(self, name: str, keys: Sequence[str] | None = None) -> list[ConfigEntry]:
        """Every config of topic `name` (or those named by `keys`), as both protocols describe
        them (broker/core/topic_configs.py `describe_topic`); `TopicError` for an unknown topic.
        Read after a stat of the registry: an alter made through another core is seen."""
        self.refresh_topics()
        topic = self.registry.by_name.get(name)
        if topic is None:
            self.refresh_topics(force=True)
            topic = self.registry.get(name)
        return describe_topic(topic.configs, self.registry.topic_defaults, keys)

    def missing_topics(self, names: Iterable[str]) -> list[str]:
        """The names of `names` (each once, in order) that auto topic creation would create: valid
        topic names of no topic here, after a look at the registry (another core or node may have
        made one). Both protocols' Metadata ask it before checking the principal's right to create.
        An internal topic is never among them (Kafka's rule): its coordinators make it, with its
        own partition count and compaction (broker/core/transactions.py)."""
        self.refresh_topics()
        known = self.registry.by_name
        return [
            n
            for n in dict.fromkeys(names)
            if n not in known and not invalid_topic_name(n) and not is_internal(n)
        ]

    def auto_create_topics(self, names: Sequence[str], answer: Callable[[], Reply]) -> Outcome:
        """Create the topics of `names` this broker does not have with the broker's defaults, then
        `answer()`: auto topic creation (Kafka's auto.create.topics.enable, num.partitions and the
        cluster's default replication). The caller has checked the names and the principal's
        right to create. A topic another core or node created meanwhile counts as created; any
        other refusal (a limit, a full disk, too few live nodes) is logged and the topic stays
        unknown in the answer, as a Kafka broker whose auto-creation failed answers it."""
        partitions = self.config.default_partitions
        cluster = self.config.cluster
        if cluster is None:
            for name in names:
                try:
                    self.create_topic(name, partitions)
                except Exception as exc:
                    self._auto_create_failed(name, exc)
            return answer()
        calls, registry = cluster.calls, self.registry

        def create_all() -> list[str]:
            created = []
            for name in names:
                try:
                    calls.create_topic(registry, name, partitions)
                except Exception as exc:
                    if not self._auto_create_failed(name, exc):
                        continue
                created.append(name)
            return created

        def known(created: list[str]) -> bool:
            return all(name in registry.by_name for name in created)

        return self.in_cluster(create_all, lambda _created: answer(), until=known)

    @staticmethod
    def _auto_create_failed(name: str, exc: Exception) -> bool:
        """True when `exc` says the topic exists (someone else created it first)."""
        if isinstance(exc, TopicError) and exc.kind is TopicFault.EXISTS:
            return True
        log.warning("auto-creating topic %r: %s", name, exc)
        return False

    def create_partitions(self, name: str, partitions: int, validate_only: bool = False) -> Topic:
        """Grow topic `name` to `partitions` partitions (Kafka's CreatePartitions; only an increase:
        `TopicRegistry.grown`), one node: the registry only, as `create_topic`. The new partitions
        open on first use on the cores that own them (`routing.shard_for` of the topic id and
        index: the old partitions stay where they are); every core sees the new count at its next
        refresh, at once on a miss (`partition_named`, `metadata_view`). `validate_only`: checked,
        nothing changed. Raises `TopicError` or what refuses a write (a full disk)."""
        if not validate_only:
            self.space.check_writable()
        with self.registry.locked():
            self.registry.load()
            if validate_only:
                return self.registry.grown(self.registry.get(name), partitions)
            topic = self.registry.grow(name, partitions)
        log.info("topic %s (id %d) now has %d partitions", topic.name, topic.topic_id, topic.partitions)
        return topic

    def delete_topic(self, name: str, answer: Callable[[], Reply], notice: Frame | None = None) -> Outcome:
        """Delete a topic (both protocols' DeleteTopic(s)): out of the registry now; every other
        core is told (a DeleteTopic frame of ours, `notice`, made here if not given) and closes
        its partitions of it; then the files go and `answer()` is sent. Raises `TopicError`
        (INVALID for an internal topic: its coordinators' state, broker/core/transactions.py)."""
        if is_internal(name):
            raise TopicError(TopicFault.INVALID, f"topic {name!r} is internal: it cannot be deleted")
        with self.registry.locked():
            self.registry.load()
            topic = self.registry.delete(name)
        self._sync_partitions()  # closes this core's partitions of it, and catches up on the rest

        def removed() -> Reply:
            log.info("deleted topic %s (id %d)", topic.name, topic.topic_id)
            return answer()

        def finish() -> Reply | Later:
            """The files go on the blocking pool, and the answer once they are gone: removing a
            large topic's files frees its page cache and blocks, seconds of the kernel's time
            that on the loop held every other request of this core (1000 partitions holding ~600
            MB: a probe's produce on another topic waited 1.2-1.5 s). A core without a loop
            (handlers built by tests and tools) removes them itself. A removal cut short (the
            core stopping) is finished by the next start (`TopicRegistry.remove_orphans`)."""
            if self.run_blocking is no_threads:
                self.registry.remove_files(topic)
                return removed()

            def start(reply: Callable[[Reply | Silent], None]) -> None:
                def done(result: object) -> None:
                    if isinstance(result, BaseException):
                        log.warning("removing topic %s's files: %r (a restart removes them)", name, result)
                    reply(removed())

                self.run_blocking(lambda: self.registry.remove_files(topic), done)

            return Later(start)

        peers = tuple(c for c in range(self.config.cores) if c != self.config.core_id)
        if not peers:
            return finish()
        if notice is None:
            notice = m.request_frame(m.DeleteTopicRequest(name=name))
        return Notify(notice, peers, finish)

    @staticmethod
    def stored_reply(
        p: Partition, stored: Stored, reply: Reply, fail: Callable[[BaseException], Reply]
    ) -> Outcome:
        """The answer to a retry of stored batches, as its acks say (`stored.waits`, decided by
        the partition): at once, after a flush unless already durable, or once the high
        watermark passes them."""
        waits = stored.waits
        if waits is Waits.HIGH_WATERMARK:
            if stored.end_offset <= p.high_watermark:
                return reply

            def start(answer: Callable[[Reply | Silent], None]) -> None:
                p.after_replicated(stored.end_offset, lambda: answer(reply), lambda exc: answer(fail(exc)))

            return Later(start)
        if waits is Waits.FLUSH and not stored.durable:
            return Durable(p, reply, fail)
        return reply

    def partition_by_id(self, topic_id: int, index: int) -> Partition:
        """Partition `index` of topic id `topic_id` when this core owns it (opened, made if new):
        what ReplicaFetch names, and what the cluster agent gives roles to (`become_leader`,
        `become_follower`). `NotLeaderError` for another core's, `TopicError` for an unknown one."""
        p = self.partitions.get((topic_id, index))
        if p is not None:
            return p
        if self.owner(topic_id, index) != self.config.core_id:
            raise NotLeaderError(
                f"partition {index} of topic id {topic_id} is on core {self.owner(topic_id, index)}"
            )
        return self.partition(topic_id, index)

    def topic_of(self, topic_id: int, partition: int) -> Topic:
        """The topic of a partition this broker has (any core's), else `TopicError` "unknown"."""
        topic = self.registry.by_id.get(topic_id)
        if topic is None or not 0 <= partition < topic.partitions:
            self.refresh_topics(force=True)
            topic = self.registry.by_id.get(topic_id)
        if topic is None or not 0 <= partition < topic.partitions:
            raise TopicError(TopicFault.UNKNOWN, f"no partition {partition} of topic id {topic_id}")
        return topic

    def offsets_run(self, call: Callable[[], T], done: Callable[[T | BaseException], None]) -> None:
        """`done(call())` (or `done(exception)`) for a call on the group offsets' store: at once
        on the loop where the store answers from a file, on a `run_blocking` thread where it may
        wait on the network (`GroupOffsetStore.remote`: a cluster's etcd, which may be away)."""
        if self.coordinator.offsets.remote:
            self.run_blocking(call, done)
            return
        try:
            result: T | BaseException = call()
        except Exception as exc:
            result = exc
        done(result)

    def complete_txn_offsets(
        self, group: str, producer_id: int, commit: bool, done: Callable[[bool | BaseException], None]
    ) -> None:
        """A transaction marker's group target (Kafka's GroupCoordinator completeTransaction):
        the producer's pending offsets in `group` committed or dropped (`offsets_run`: off the
        loop where the store is etcd); `done(whether any were pending)` or `done(failure)`, which
        the marker's sender retries. The caller routes the marker to the group's coordinator."""

        def completed(result: bool | BaseException) -> None:
            if result is True and commit:
                self.coordinator.offsets_exist(group)  # it stays, Empty, as after any commit
            done(result)

        self.offsets_run(
            lambda: self.coordinator.offsets.complete_pending(group, producer_id, commit), completed
        )

    def with_offsets(self, call: Callable[[], T], reply: Callable[[T | BaseException], Reply]) -> Outcome:
        """The outcome that answers `reply(call())` (`offsets_run`): the reply itself when the
        store answered at once, else a `Later`."""
        answered: list[Reply] = []
        if not self.coordinator.offsets.remote:
            self.offsets_run(call, lambda result: answered.append(reply(result)))
            return answered[0]
        return Later(lambda answer: self.offsets_run(call, lambda result: answer(reply(result))))

    def apply_retention(self, done: Callable[[int], None] | None = None) -> bool:
        """The retention pass over this core's partitions: their segments past retention deleted,
        and their producers idle past `--producer-id-expiration-ms` forgotten
        (`Partition.expire_producers`); then `done(segments deleted)`. False (nothing done) while
        the last pass still runs.

        In turns of about a millisecond (broker/core/sweeps.py): each partition's retention and
        expiry is its own, nothing has to hold across partitions, so requests are served between
        turns. A partition opened during the pass waits for the next one (its opening expired its
        producers already); one closed during it is skipped."""
        expiration_ms = self.config.producer_id_expiration_ms
        counts = [0, 0]  # segments deleted, producers forgotten

        def visit(p: Partition) -> None:
            try:
                counts[0] += p.apply_retention()
            except StorageError as exc:
                log.error("retention on partition %d/%d: %s", p.topic_id, p.index, exc)
            counts[1] += p.expire_producers(now_ms(), expiration_ms)

        def finished() -> None:
            if counts[1]:
                log.info(
                    "forgot %d idle producer(s) (--producer-id-expiration-ms %d)", counts[1], expiration_ms
                )
            if done is not None:
                done(counts[0])

        return self.sweep_partitions(self._retention, visit, finished)


def topic_defaults(config: BrokerConfig) -> TopicDefaults:
    """The broker's defaults for topic configs: its log settings and, in a cluster, its
    replication settings (a single node keeps one copy: min.insync.replicas 1)."""
    cluster = config.cluster
    return TopicDefaults(
        log=config.log_defaults,
        min_insync_replicas=cluster.min_insync if cluster is not None else 1,
        unclean_leader_election=cluster.unclean_election if cluster is not None else False,
        static=config.static_configs,
    )
