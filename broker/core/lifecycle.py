"""A core's start and stop over the partitions it has on disk: opening them at start, and the
clean close at shutdown that lets the next start trust their snapshots instead of recovering them.

Apart from `Core` (broker/core/core.py) because it runs twice in a core's life, each time over
every partition, on other threads at the close, and what it keeps (this run's token) is no
request's business.

Rules this module keeps:
- At start, the partitions this core owns that have files open (a clustered core's only where the
  view places a replica here: the files of one it places elsewhere are removed); the others
  open on first use (`Core.partition`). One that needs a new segment file on a full disk is left
  for its first request.
- The stored partitions open with Python's cyclic collector off, and are then frozen out of its
  walk (broker/core/heap.py): they live as long as the core. Those opened later are frozen too,
  a few hundred at a time (`opened`).
- The clean-shutdown marker (broker/storage/clean_marker.py) is taken, gone durably, before
  anything opens: a crash from then on leaves none. Only the partitions opened at start may stand
  on their snapshots (`clean_start`); any opened later are new or were never closed here.
- A close writes the marker only when every partition closed clean and its snapshot was written:
  the snapshots after every partition's syncs (`Partition.close` says why), the marker's fsync
  last. A second close (nothing left open) vouches for nothing.
- The close's disk work (each log's flush, the release of its preallocated tail) runs on
  `CLOSE_THREADS` threads, `CLOSE_CHUNK` partitions at a time; the rest stays on the loop's
  thread, which serves nothing any more.
- Many partitions' syncs are one syncfs per file system (broker/storage/fileio.py says what that
  promises and why after a failed one each log syncs its own files): a close's chunk of
  `SYNCFS_MIN` or more, and a start's recovered partitions, gathered while they open
  (`recovered`) and made durable before the core serves any of them.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from broker.core.cluster_view import ClusterView
from broker.core.config import BrokerConfig
from broker.core.heap import OpenedWhileServing, collector_off, freeze_long_lived
from broker.core.partition import Partition
from broker.core.topics import Topic, TopicRegistry
from broker.storage import clean_marker, layout
from broker.storage.diskspace import is_out_of_space
from broker.storage.errors import StorageError
from broker.storage.fileio import SYNC_IO, SYNCFS_MIN, FileSystems
from broker.storage.log import Log, sync_recovered
from broker.storage.log_config import LogConfig
from broker.storage.log_flush import ClosePlan, run_close, run_closes_together
from broker.storage.producer_snapshot import Snapshot

log = logging.getLogger("broker.core.core")  # the core's lines, as before this module was apart

# The close's disk work: concurrent fdatasyncs share the journal's commits (this disk: ~1 100
# syncs/s on one thread, ~8 500/s on four), and the partitions in flight are pinned (2 descriptors each)
CLOSE_THREADS = 8
CLOSE_CHUNK = 256
# a partition being closed: its snapshot, the plan of its log's close and that plan's run on a
# thread of its own (None when its chunk runs together: `run_closes_together`)
_Closing = tuple[Partition, Snapshot | None, ClosePlan | None, Future[None] | None]


class StartingCore(Protocol):
    """What the start and the stop use of their core: a `Core` (broker/core/core.py, which makes
    them, so this module does not import it)."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def cluster(self) -> ClusterView: ...
    @property
    def registry(self) -> TopicRegistry: ...
    @property
    def partitions(self) -> dict[tuple[int, int], Partition]: ...
    def owner(self, topic_id: int, partition: int) -> int: ...
    def replicated_here(self, topic_id: int, index: int) -> bool: ...
    def open_partition(self, topic: Topic, index: int, config: LogConfig | None = None) -> Partition: ...


class Lifecycle:
    """One core's start and stop (module rules), owned by its `Core` (`Core.lifecycle`)."""

    def __init__(self, core: StartingCore) -> None:
        self._core = core
        # The last run's token while the stored partitions open, when its marker says it closed
        # every partition it had open cleanly: their snapshots may stand for the scan, syncs and
        # walk at open. None otherwise, and once they are open.
        self.clean_start: int | None = None
        # this run's, in its snapshots and its marker; None once a close vouches for nothing
        self._token: int | None = None
        # While the stored partitions open: the logs recovered after a crash, whose syncs are
        # made together once all are open (`Log.open`'s `recovered`); None otherwise.
        self.recovered: list[Log] | None = None
        # What the start's and the close's syncfs calls go through (one descriptor per file
        # system, and whether one ever failed: then each log syncs its own files)
        self._filesystems = FileSystems()
        self._while_serving = OpenedWhileServing()

    def opened(self) -> None:
        """The core opened a partition (`Core.open_partition`). One opened after the start counts
        towards the next freeze (broker/core/heap.py); the start's own are frozen at its end."""
        if self.recovered is None:
            self._while_serving.opened()

    def open_stored(self) -> None:
        """At start, once: take the marker, then open every stored partition this core owns."""
        core = self._core
        config = core.config
        self.clean_start = clean_marker.take(config.data_dir, config.core_id, config.cores)
        self._token = clean_marker.new_token()
        started = time.monotonic()
        self.recovered = []
        try:
            with collector_off():  # then out of its walk (broker/core/heap.py)
                for topic in core.registry.by_id.values():
                    self._open_topic(topic)
            if core.partitions:
                freeze_long_lived()
            recovered, self.recovered = self.recovered, None
            sync_recovered(recovered, self._filesystems)  # before anything is served from them
        finally:
            self.recovered = None
        if core.partitions:
            log.info(
                "opened %d stored partitions in %.3f s (%s)",
                len(core.partitions),
                time.monotonic() - started,
                "after a clean shutdown" if self.clean_start is not None else "full recovery",
            )
        self.clean_start = None  # partitions opened later are new or were never closed here

    def _open_topic(self, topic: Topic) -> None:
        """Open the partitions of `topic` this core owns that have files. Retention and recovery
        thus reach every partition holding data."""
        core = self._core
        try:
            names = os.listdir(layout.topic_dir(core.config.data_dir, topic.topic_id))
        except FileNotFoundError:
            return
        config = core.registry.log_config(topic)  # once a topic, not once a partition (~30 us)
        mine = core.config.core_id
        where = layout.topic_dir(core.config.data_dir, topic.topic_id)
        for name in names:  # removals a stop or a crash cut short (`Core.remove_moved_away`)
            index = layout.set_aside_index(name)
            if index is not None and core.owner(topic.topic_id, index) == mine:
                core.registry.remove_set_aside([os.path.join(where, name)])
        for i in sorted(n for n in map(layout.parse_number_name, names) if n is not None):
            if i < topic.partitions and core.owner(topic.topic_id, i) == mine:
                if core.cluster.clustered and not core.replicated_here(topic.topic_id, i):
                    self._moved_away(topic, i)
                    continue
                try:
                    core.open_partition(topic, i, config)
                except (StorageError, OSError) as exc:
                    # It needs a new segment file (none survived) on a full disk: serve the
                    # rest; it opens on its first request once there is room (`Core.partition`).
                    if not is_out_of_space(exc):
                        raise
                    log.error("opening partition %d of topic %s: %s (retried on use)", i, topic.name, exc)

    def _moved_away(self, topic: Topic, index: int) -> None:
        """Files of a replica the view does not place here: those of one moved off the node while
        it was down (or before this start's removal) go, as they would have while it ran. The
        view is the one the node's agent published from the store before the workers started;
        a partition it has no state for yet is left alone (not served, not removed)."""
        core = self._core
        if not core.cluster.placed_elsewhere(topic.topic_id, index):
            return
        log.info("partition %d of topic %s: moved off this node, removing its files", index, topic.name)
        path = core.registry.set_aside_partition_files(topic.topic_id, index)
        if path is not None:
            core.registry.remove_set_aside([path])

    def close(self) -> None:
        """Close every partition (flushing them) and, when every one closed clean, write the
        core's clean-shutdown marker. The core has stopped its own work on them first."""
        try:
            self._close()
        finally:
            self._filesystems.close(SYNC_IO)  # its descriptors are the process's own

    def _close(self) -> None:
        core = self._core
        token, self._token = self._token, None  # a second close (nothing left open) vouches for nothing
        threads = min(CLOSE_THREADS, len(core.partitions)) or 1
        with ThreadPoolExecutor(threads, thread_name_prefix="close") as pool:
            unclean, closed = self._close_partitions(token, pool)
            core.partitions.clear()
            if token is None:
                return
            # after every sync above (Partition.close says why), the marker's fsync last
            unclean += sum(not ok for ok in pool.map(lambda c: c[0].write_snapshot(c[1]), closed))
        if unclean:
            log.warning(
                "no clean-shutdown marker: %d partition(s) did not close clean (no snapshot written, "
                "or an error): the next start recovers every partition",
                unclean,
            )
            return
        config = core.config
        try:
            clean_marker.write(config.data_dir, config.core_id, config.cores, token)
        except OSError as exc:
            log.warning("no clean-shutdown marker written (%s): the next start recovers", exc)

    def _close_partitions(
        self, token: int | None, pool: ThreadPoolExecutor
    ) -> tuple[int, list[tuple[Partition, Snapshot]]]:
        """Close every partition: how many did not close clean, and the snapshots of those that
        did. Each partition's disk work (its flush, the release of its preallocated tail) runs on
        `pool`, `CLOSE_CHUNK` partitions at a time (pinned: their descriptors stay open, bounded);
        a chunk of `SYNCFS_MIN` or more with one syncfs per file system for all of them
        (log_flush.py's `run_closes_together`), else each partition's own syncs on a thread of
        its own. The rest stays on this thread. The loop serves nothing any more."""
        unclean = 0
        closed: list[tuple[Partition, Snapshot]] = []
        begun: list[_Closing] = []
        together: Future[list[OSError | None]] | None = None

        def complete(chunk: list[_Closing], together: Future[list[OSError | None]] | None) -> int:
            bad = 0
            errors = together.result() if together is not None else None  # raises a bug's exception
            at = 0
            for p, snap, plan, run in chunk:
                if plan is not None:
                    if errors is not None:
                        failed: BaseException | None = errors[at]
                        at += 1
                    else:
                        assert run is not None
                        failed = run.exception()
                    if failed is not None and not isinstance(failed, OSError):
                        raise failed
                    try:
                        p.log.complete_close(plan, failed)
                    except (StorageError, OSError) as exc:
                        bad += 1
                        log.error("closing partition %d/%d: %s", p.topic_id, p.index, exc)
                        continue
                if snap is not None:
                    closed.append((p, snap))
                else:
                    bad += 1
            return bad

        parts = list(self._core.partitions.values())
        for at in range(0, len(parts), CLOSE_CHUNK):
            # this chunk is planned while the previous one's syncs run
            chunk, begun = begun, []
            chunk_together, together = together, None
            for p in parts[at : at + CLOSE_CHUNK]:
                try:
                    snap, plan = p.prepare_close(token)
                except (StorageError, OSError) as exc:
                    unclean += 1
                    log.error("closing partition %d/%d: %s", p.topic_id, p.index, exc)
                    continue
                begun.append((p, snap, plan, None))
            closes = [(p.log.io, plan, p.directory) for p, _, plan, _ in begun if plan is not None]
            if len(closes) >= SYNCFS_MIN and self._filesystems.failed is None:
                together = pool.submit(run_closes_together, closes, self._filesystems)
            else:
                begun = [
                    (p, snap, plan, None if plan is None else pool.submit(run_close, p.log.io, plan))
                    for p, snap, plan, _ in begun
                ]
            unclean += complete(chunk, chunk_together)
        unclean += complete(begun, together)
        return unclean, closed
