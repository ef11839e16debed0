"""What the client hands to applications: the result of a send, and a consumed record.

Both are NamedTuples, not dataclasses: one is built per record on the hot path of the producer
(`RecordMetadata`) and of the consumer (`ConsumerRecord`), and a tuple is the cheapest object
Python builds. They also unpack, compare and print sensibly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

Header = tuple[str, bytes | None]


class RecordMetadata(NamedTuple):
    """Where a produced record landed. `offset` is -1 with acks=0 (the broker does not say)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch: the record's own, or the time its batch was opened


class ConsumerRecord(NamedTuple):
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch, as the producer set it
    key: bytes | None
    value: bytes | None
    headers: Sequence[Header]
