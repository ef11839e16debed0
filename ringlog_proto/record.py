"""What a client sees of a batch: records, their headers, and the error a batch that cannot be
decoded raises.

Apart from batch.py so that both codecs of the records section can name them: batch.py (the
format, its checks and the pure-Python codec) and records_codec.py (the section in C, with its
Python twin), which batch.py calls when the C codec is built. batch.py re-exports all three.
"""

from __future__ import annotations

from collections.abc import Sequence

Header = tuple[str, bytes | None]


class BatchError(ValueError):
    """A batch that cannot be decoded; the message says which field and why."""


class Record:
    """One record as a client sees it. Plain slots class: cheaper to build than a dataclass."""

    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] = (),
        timestamp: int | None = None,
        offset: int = -1,
    ) -> None:
        self.value = value
        self.key = key
        self.headers = headers
        self.timestamp = timestamp
        self.offset = offset

    def __repr__(self) -> str:
        return (
            f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
            f"value={self.value!r}, headers={self.headers!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.offset, self.timestamp, self.key, self.value, tuple(self.headers)) == (
            other.offset,
            other.timestamp,
            other.key,
            other.value,
            tuple(other.headers),
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value
