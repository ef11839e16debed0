"""The data directory's layout: every file and directory name the broker keeps there.

Rules this module keeps:
- The one place a name in the data directory is spelled. Everyone who makes, opens, lists or
  removes something there (storage, the core, the node, the CLI) asks this module for its path or
  its name; no other module of broker/ writes one of these names as a literal.
- Names only: nothing here touches the file system.
- bpf/ cannot import broker/, so bpf/state.py (`run/bpf.json`) and bpf/tfo.py
  (`run/restore/`) spell their own copies; tests/storage/test_layout.py asserts they agree.

The layout:

    <data_dir>/
      broker.lock                 flock held by the supervisor: one broker per data dir
      topics.json                 the topic registry (broker/core/topics.py)
      topics.lock                 flock around reload, change, save of topics.json
      producer-ids.json           the next producer id not yet claimed (broker/core/producer_ids.py)
      producer-ids.lock           flock around claiming a block of producer ids
      core-ports.json             the direct port each core last listened on (broker/node/listeners.py)
      reserve.space               space kept back for a full disk (broker/storage/diskspace.py)
      run/                        views of a running broker, not data; emptied at each start
        metrics-core-<k>.json     core k's metrics snapshot (broker/core/metrics.py)
        bpf.json                  the supervisor's eBPF snapshot (bpf/state.py)
        members.json              the membership view of SWIM (broker/node/supervisor.py)
        restore/                  what a killed broker must undo (bpf/tfo.py); a directory, so the
                                  start-up sweep of run/ keeps it
      topics/
        <topic id>/               decimal, no padding
          <partition>/            decimal, no padding: one partition's log
            00000000000000000042.log    a segment's store, named by its base offset (20 digits)
            00000000000000000042.index  its index
            00000000000000000042.txnindex  a closed segment's transaction markers, a cache
                                        (broker/storage/txn_index.py)
            00000000000000000042.log.cleaned   a segment the log cleaner is writing (and .index.cleaned):
                                        removed at open, never read (broker/storage/cleaner.py)
            00000000000000000042.log.swap      a cleaned segment committed to replace the segments
                                        in its range (and .index.swap): the open completes the swap
            cleaner-checkpoint.json     where the log cleaner's last clean ended (its dirty section
                                        starts there) and its next delete horizon
            log-start-offset.json       the log start when records were deleted below an offset
                                        inside a segment (broker/storage/log_start.py)
            group-offsets.json          old per-partition group offsets: moved into groups/ at
                                        start, then removed (broker/core/offsets.py)
      groups/
        <sha256 of group id, 32 hex>.json   one consumer group's committed offsets, the group id
                                            inside (broker/core/offsets.py)
"""

from __future__ import annotations

import hashlib
import os
from typing import Final

BROKER_LOCK: Final = "broker.lock"
TOPICS_FILE: Final = "topics.json"
TOPICS_LOCK: Final = "topics.lock"
PRODUCER_IDS_FILE: Final = "producer-ids.json"
CORE_PORTS_FILE: Final = "core-ports.json"
PRODUCER_IDS_LOCK: Final = "producer-ids.lock"
RESERVE_FILE: Final = "reserve.space"
RUN_DIR: Final = "run"
RESTORE_DIR: Final = "restore"
BPF_SNAPSHOT_FILE: Final = "bpf.json"
METRICS_SNAPSHOT_PREFIX: Final = "metrics-core-"
METRICS_SNAPSHOT_SUFFIX: Final = ".json"
TOPICS_DIR: Final = "topics"
GROUP_OFFSETS_FILE: Final = "group-offsets.json"
LOG_START_FILE: Final = "log-start-offset.json"
GROUPS_DIR: Final = "groups"
GROUP_FILE_SUFFIX: Final = ".json"
GROUP_NAME_HEX: Final = 32  # hex digits of the group id's sha256 in its file name
STORE_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TXN_INDEX_SUFFIX: Final = ".txnindex"
CLEANED_SUFFIX: Final = ".cleaned"  # after a segment file's name: being written by the log cleaner
SWAP_SUFFIX: Final = ".swap"  # after a segment file's name: a clean committed, its swap not done
CLEANER_CHECKPOINT_FILE: Final = "cleaner-checkpoint.json"
SEGMENT_NAME_DIGITS: Final = 20  # zero-padded, so that `ls` sorts segments in offset order


# ----------------------------------------------------------------------------- the data dir


def broker_lock_path(data_dir: str) -> str:
    return os.path.join(data_dir, BROKER_LOCK)


def topics_file_path(data_dir: str) -> str:
    return os.path.join(data_dir, TOPICS_FILE)


def topics_lock_path(data_dir: str) -> str:
    return os.path.join(data_dir, TOPICS_LOCK)


def producer_ids_path(data_dir: str) -> str:
    return os.path.join(data_dir, PRODUCER_IDS_FILE)


def producer_ids_lock_path(data_dir: str) -> str:
    return os.path.join(data_dir, PRODUCER_IDS_LOCK)


def core_ports_path(data_dir: str) -> str:
    return os.path.join(data_dir, CORE_PORTS_FILE)


def reserve_path(data_dir: str) -> str:
    return os.path.join(data_dir, RESERVE_FILE)


def run_dir(data_dir: str) -> str:
    return os.path.join(data_dir, RUN_DIR)


def restore_dir(data_dir: str) -> str:
    return os.path.join(data_dir, RUN_DIR, RESTORE_DIR)


def bpf_snapshot_path(data_dir: str) -> str:
    return os.path.join(data_dir, RUN_DIR, BPF_SNAPSHOT_FILE)


def metrics_snapshot_path(data_dir: str, core: int) -> str:
    return os.path.join(data_dir, RUN_DIR, f"{METRICS_SNAPSHOT_PREFIX}{core}{METRICS_SNAPSHOT_SUFFIX}")


# ----------------------------------------------------------------------------- topics and partitions


def topics_dir(data_dir: str) -> str:
    return os.path.join(data_dir, TOPICS_DIR)


def topic_dir(data_dir: str, topic_id: int) -> str:
    return os.path.join(data_dir, TOPICS_DIR, str(topic_id))


def partition_dir(data_dir: str, topic_id: int, partition: int) -> str:
    return os.path.join(data_dir, TOPICS_DIR, str(topic_id), str(partition))


# A partition directory renamed `<index>` + SET_ASIDE + a number is being removed (its replica was
# moved off the node): never a partition's name, and removed at the next start when a removal was
# cut short (`set_aside_index`).
SET_ASIDE = ".removing-"


def set_aside_index(name: str) -> int | None:
    """The partition index a set-aside directory under a topic's was named by, else None."""
    index, sep, _ = name.partition(SET_ASIDE)
    return parse_number_name(index) if sep else None


def parse_number_name(name: str) -> int | None:
    """The topic id or partition index a directory under topics/ is named by, or None for a name
    that is not one (anything else found there)."""
    return int(name) if name.isascii() and name.isdigit() else None


def log_start_path(partition_directory: str) -> str:
    """A log's recorded start offset (broker/storage/log_start.py)."""
    return os.path.join(partition_directory, LOG_START_FILE)


def group_offsets_path(partition_directory: str) -> str:
    """The old per-partition group offsets file (only read, to be migrated, then removed)."""
    return os.path.join(partition_directory, GROUP_OFFSETS_FILE)


# ----------------------------------------------------------------------------- consumer groups


def groups_dir(data_dir: str) -> str:
    return os.path.join(data_dir, GROUPS_DIR)


def group_file_path(data_dir: str, group: str) -> str:
    """One group's offsets file: named by a hash (any group id is a safe, bounded file name),
    the id itself kept inside the file."""
    digest = hashlib.sha256(group.encode()).hexdigest()[:GROUP_NAME_HEX]
    return os.path.join(data_dir, GROUPS_DIR, digest + GROUP_FILE_SUFFIX)


# ----------------------------------------------------------------------------- segments


def segment_name(base_offset: int) -> str:
    """A segment's file name without its suffix."""
    return f"{base_offset:0{SEGMENT_NAME_DIGITS}d}"


def store_file_name(base_offset: int) -> str:
    return segment_name(base_offset) + STORE_SUFFIX


def index_file_name(base_offset: int) -> str:
    return segment_name(base_offset) + INDEX_SUFFIX


def txn_index_file_name(base_offset: int) -> str:
    return segment_name(base_offset) + TXN_INDEX_SUFFIX


def cleaner_checkpoint_path(partition_directory: str) -> str:
    return os.path.join(partition_directory, CLEANER_CHECKPOINT_FILE)


def cleaning_name(segment_file_name: str, suffix: str) -> str:
    """A segment file's name while the log cleaner writes it (`CLEANED_SUFFIX`) or once it is
    committed to replace the segments in its range (`SWAP_SUFFIX`)."""
    assert suffix in (CLEANED_SUFFIX, SWAP_SUFFIX)
    return segment_file_name + suffix


def parse_cleaning_name(filename: str) -> tuple[int, str, str] | None:
    """(base offset, segment suffix, cleaning suffix) of a cleaned or swap file's name, or None."""
    for suffix in (CLEANED_SUFFIX, SWAP_SUFFIX):
        if filename.endswith(suffix):
            parsed = parse_segment_name(filename[: -len(suffix)])
            return None if parsed is None else (parsed[0], parsed[1], suffix)
    return None


def parse_segment_name(filename: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, or None for anything else in the directory."""
    stem, dot, suffix = filename.partition(".")
    if not dot or len(stem) != SEGMENT_NAME_DIGITS or not stem.isdigit():
        return None
    if "." + suffix not in (STORE_SUFFIX, INDEX_SUFFIX):
        return None
    return int(stem), "." + suffix
