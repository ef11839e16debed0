"""The log cleaner's key -> latest offset map, in a fixed amount of memory (Kafka's
`SkimpyOffsetMap`, its "dedupe buffer").

Rules this module keeps:
- One `bytearray` of `slots` entries, each a 16-byte MD5 of the key and the 8-byte offset
  (`ENTRY_BYTES`), sized once from a byte budget (`--log-cleaner-dedupe-buffer-size`): memory is
  bounded whatever the keys, and no Python object is kept per key.
- Open addressing, linear probing from the hash's first 8 bytes. It takes keys only up to
  `LOAD_FACTOR` of its slots (Kafka's log.cleaner.io.buffer.load.factor): `full` says when, and
  the cleaner then cleans what the map covers and leaves the rest dirty for its next round.
- Two keys whose hashes are equal are one key here, as in Kafka: with MD5's 128 bits the chance
  is nil for any log a broker holds.
- Offsets only grow as the cleaner feeds it (a log in order), so `put` overwrites; `latest_offset`
  is the last offset put.
- Owned by one cleaning at a time (on a blocking thread of its core): not thread-safe.
"""

from __future__ import annotations

import hashlib
import struct

HASH_BYTES = 16  # MD5, as Kafka's cleaner hashes keys
ENTRY_BYTES = HASH_BYTES + 8  # the hash, then the offset (i64, big-endian)
LOAD_FACTOR = 0.9  # Kafka's log.cleaner.io.buffer.load.factor default
MIN_SLOTS = 16

_OFFSET = struct.Struct(">q")
_EMPTY = bytes(HASH_BYTES)  # a slot never used (a key hashing to zeros is taken as one: never met)


class OffsetMap:
    """Key hash -> the latest offset seen for it, in `memory_bytes` (module rules)."""

    __slots__ = ("_data", "_limit", "_md5", "entries", "latest_offset", "slots")

    def __init__(self, memory_bytes: int) -> None:
        slots = memory_bytes // ENTRY_BYTES
        if slots < MIN_SLOTS:
            raise ValueError(f"an offset map of {memory_bytes} bytes holds fewer than {MIN_SLOTS} keys")
        self.slots = slots
        self._data = bytearray(slots * ENTRY_BYTES)
        self._limit = int(slots * LOAD_FACTOR)
        self._md5 = hashlib.md5
        self.entries = 0
        self.latest_offset = -1

    @property
    def memory_bytes(self) -> int:
        return len(self._data)

    @property
    def capacity(self) -> int:
        """How many keys it takes before it is `full`."""
        return self._limit

    @property
    def full(self) -> bool:
        return self.entries >= self._limit

    def clear(self) -> None:
        if self.entries:  # a new map is zeros already: its first clear costs nothing
            self._data[:] = bytes(len(self._data))
        self.entries = 0
        self.latest_offset = -1

    def _slot(self, digest: bytes) -> int:
        """The byte position of `digest`'s slot: where it is, or the empty slot where it goes."""
        data = self._data
        slots = self.slots
        i = int.from_bytes(digest[:8], "big") % slots
        while True:
            at = i * ENTRY_BYTES
            found = data[at : at + HASH_BYTES]
            if found in (digest, _EMPTY):
                return at
            i += 1
            if i == slots:
                i = 0

    def put(self, key: bytes, offset: int) -> None:
        """`offset` is now the latest of `key`. The caller stops before the map is `full`; a new
        key past it raises (the table never fills beyond its load factor)."""
        digest = self._md5(key).digest()
        at = self._slot(digest)
        data = self._data
        if data[at : at + HASH_BYTES] == _EMPTY:
            if self.entries >= self._limit:
                raise OverflowError("the offset map is full")
            data[at : at + HASH_BYTES] = digest
            self.entries += 1
        _OFFSET.pack_into(data, at + HASH_BYTES, offset)
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        """The latest offset put for `key`, or -1."""
        digest = self._md5(key).digest()
        at = self._slot(digest)
        data = self._data
        if data[at : at + HASH_BYTES] == _EMPTY:
            return -1
        offset: int = _OFFSET.unpack_from(data, at + HASH_BYTES)[0]
        return offset
