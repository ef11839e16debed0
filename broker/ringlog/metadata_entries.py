"""Our Metadata's topic entries, encoded once and kept: a listing copies kept bytes and writes only
the offsets of the partitions open on this core, instead of building and encoding every partition
on each request.

Rules this module keeps:
- An entry is the topic as `MetadataResponse.write_topic` writes it with every partition's
  offsets -1, -1 (`topic_placement` of the core's `MetadataViews`, broker/core/metadata_views.py),
  kept while the topic (name, partition count, configs) and the core's `placement_stamp` stay
  the same, with where each partition's offsets sit; a request writes the offsets
  `topic_offsets` gives into a copy. Errors and refusals are written per request
  (broker/ringlog/topics.py).
"""

from __future__ import annotations

import struct

from broker.core.core import Core
from broker.core.topics import Topic
from broker.core.views import TopicView
from ringlog_proto import messages as m
from ringlog_proto.frames import Buffer

_OFFSETS = struct.Struct(">qq")


class TopicEntries:
    """Each known topic's kept entry, by topic id (module rules)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        # topic id -> (the topic, placement stamp, entry, where partition i's offsets are)
        self._held: dict[int, tuple[Topic, object, bytes, list[int]]] = {}

    def entry(self, core: Core, view: TopicView) -> Buffer:
        """The entry of `view` (a known topic, without partitions: `metadata_view(partitions=False)`)
        with this core's offsets written in."""
        registered = core.registry.by_id[view.topic_id]
        stamp = core.metadata_views.placement_stamp
        held = self._held.get(view.topic_id)
        if held is None or held[1] is not stamp or held[0] != registered:
            if len(self._held) > 2 * len(core.registry.by_id) + 64:  # topics deleted since
                live = core.registry.by_id
                self._held = {k: v for k, v in self._held.items() if k in live}
            held = self._held[view.topic_id] = (registered, stamp, *_encoded(core, registered, view))
        _, _, entry, offsets_at = held
        shown = core.metadata_views.topic_offsets(registered)
        if not shown:
            return entry
        out = bytearray(entry)
        for index, start, end in shown:
            _OFFSETS.pack_into(out, offsets_at[index], start, end)
        return out


def _encoded(core: Core, topic: Topic, view: TopicView) -> tuple[bytes, list[int]]:
    w = m.Writer()
    w.pack("h", m.ErrorCode.NONE).str(view.name)
    w.pack("Iqqq", view.topic_id, view.retention_ms, view.retention_bytes, view.segment_bytes)
    placement = core.metadata_views.topic_placement(topic)
    w.array(len(placement))
    offsets_at = []
    at = sum(len(b) for b in w.parts)
    for p in placement:
        offsets_at.append(at + m.PARTITION_OFFSETS_AT)
        first = len(w.parts)
        m.MetadataResponse.write_partition(
            w,
            m.PartitionMetadata(
                p.index, p.owner_core, -1, -1, p.leader_node, p.leader_epoch, p.replicas, p.isr
            ),
        )
        at += sum(len(b) for b in w.parts[first:])
    return b"".join(w.parts), offsets_at
