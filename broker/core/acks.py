"""What the reply to an acknowledged append waits for: the vocabulary of the acks rule.

The rule itself is the partition's (`Partition.waits_for`: it knows whether it is replicated and
how many replicas are in sync); the outcomes carry its answer and the backends carry it out. A
leaf module, so the partition and the outcomes both import it.
"""

from __future__ import annotations

from enum import Enum


class Waits(Enum):
    """What the reply to an append waits for, once its writes are visible: decided by the
    partition from the produce's acks (`Partition.produce`), carried out by the backend."""

    WRITE = "the write"  # acks=0 and acks=1: answered once written and visible
    FLUSH = "a flush"  # acks=durable, and acks=all of a partition kept in one copy
    HIGH_WATERMARK = "the high watermark"  # acks=all (and durable) of a replicated partition
