"""The acks rule's vocabulary: which acks values a produce may carry, and what its reply waits for.

The rule itself is the partition's (`Partition.waits_for`: it knows whether it is replicated and
how many replicas are in sync); the outcomes carry its answer and the backends carry it out. Which
values are valid is decided here alone (`check_acks`), for the partition and for an adapter that
must refuse a bad value before it looks the partition up; each adapter answers the refusal in its
own protocol's code (ours INVALID_REQUEST, Kafka's INVALID_REQUIRED_ACKS). A leaf module, so the
partition and the outcomes both import it.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from ringlog_proto.messages import Acks

VALID_ACKS: Final = frozenset(Acks)


class InvalidAcksError(ValueError):
    """A produce's acks is none of `Acks`: refused before anything is written."""


def check_acks(acks: int) -> None:
    """Raise `InvalidAcksError` unless `acks` is one of `Acks`' values."""
    if acks not in VALID_ACKS:
        raise InvalidAcksError(f"acks must be 0, 1, 2 or -1, not {acks}")


class Waits(Enum):
    """What the reply to an append waits for, once its writes are visible: decided by the
    partition from the produce's acks (`Partition.produce`), carried out by the backend."""

    WRITE = "the write"  # acks=0 and acks=1: answered once written and visible
    FLUSH = "a flush"  # acks=durable, and acks=all of a partition kept in one copy
    HIGH_WATERMARK = "the high watermark"  # acks=all (and durable) of a replicated partition
