"""Which record batch format a data dir was written in: refuse, before anything opens, a data dir
of ringlog's format 1 (magic 1, before Kafka's RecordBatch v2 became the one format).

Rules this module keeps:
- Reads only: one 61-byte pread of the first segment of each partition, never a write, so a data
  dir this version cannot read is left exactly as it was (an older ringlog still opens it).
- Not a repair and not a guess: a segment is format 1 only when its first batch has format 1's
  magic and consistent lengths and counts (`ringlog_proto.batch.legacy_format`); anything else
  is left to the segment's own recovery, as before.
- The segment's recovery checks the same (`Segment.recover` raises LegacyFormatError before it
  cuts anything), for tools and tests that open a log without the supervisor.
"""

from __future__ import annotations

import os

from broker.storage import layout
from broker.storage.errors import LegacyFormatError
from ringlog_proto.batch import HEADER_SIZE, legacy_format


def is_legacy_store(path: str) -> bool:
    """Whether the store file at `path` starts with a batch of format 1."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
    except OSError:
        return False
    return legacy_format(head) is not None


def find_legacy_store(data_dir: str) -> str | None:
    """The first segment store under `data_dir` written by format 1, or None."""
    topics = layout.topics_dir(data_dir)
    try:
        topic_names = sorted(os.listdir(topics))
    except OSError:
        return None
    for topic in topic_names:
        if layout.parse_number_name(topic) is None:
            continue
        try:
            partitions = sorted(os.listdir(os.path.join(topics, topic)))
        except OSError:
            continue
        for partition in partitions:
            directory = os.path.join(topics, topic, partition)
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            bases = sorted(
                parsed[0]
                for parsed in map(layout.parse_segment_name, names)
                if parsed is not None and parsed[1] == layout.STORE_SUFFIX
            )
            if bases:
                path = os.path.join(directory, layout.store_file_name(bases[0]))
                if is_legacy_store(path):
                    return path
    return None


def check_data_format(data_dir: str) -> None:
    """Raise LegacyFormatError when `data_dir` holds a segment of format 1."""
    path = find_legacy_store(data_dir)
    if path is not None:
        raise LegacyFormatError(path)
