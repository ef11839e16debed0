"""Kafka's zigzag varint, the one encoder both record codecs use (batch_encode.py's, and
records_codec.py's Python twin of the C codec), apart from both so neither imports the other; and
the Python codec's varint helpers (precomputed encodings of small values, `read_varint`)."""

from __future__ import annotations

from ringlog_proto.record import BatchError

_MASK64 = 0xFFFF_FFFF_FFFF_FFFF


def zigzag_varint(value: int) -> bytes:
    """Kafka's varint (and varlong) encoding of a signed integer: zigzag, then base 128."""
    z = ((value << 1) ^ (value >> 63)) & _MASK64
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_MASK32 = 0xFFFF_FFFF
_VARINT_BITS = 35  # 5 bytes of 7 bits: a sixth byte makes a varint too long (as Kafka reads them)
_VARLONG_BITS = 70  # 10 bytes


_ZZ_TABLE_SIZE = 1 << 14  # non-negative values with a precomputed encoding (lengths up to 16 KiB)
_ZZ: list[bytes] = [zigzag_varint(v) for v in range(_ZZ_TABLE_SIZE)]
_NULL = zigzag_varint(-1)  # b"\x01": a null key, value or header value
_UNZZ: tuple[int, ...] = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))  # one-byte varints


def varint_size(value: int) -> int:
    """Bytes of `zigzag_varint(value)`."""
    z = ((value << 1) ^ (value >> 63)) & _MASK64
    return (z.bit_length() + 6) // 7 or 1


def _zz(value: int) -> bytes:
    return _ZZ[value] if 0 <= value < _ZZ_TABLE_SIZE else zigzag_varint(value)


def read_varint(buf: bytes | bytearray | memoryview, p: int, wide: bool = False) -> tuple[int, int]:
    """(value, next position) of the zigzag varint (`wide`: varlong) at `p`, read as Kafka reads it
    (bits past 32 or 64 dropped). BatchError when it is longer than 5 (10) bytes; IndexError past
    the end of `buf`."""
    limit = _VARLONG_BITS if wide else _VARINT_BITS
    shift = 0
    z = 0
    while True:
        b = buf[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            z &= _MASK64 if wide else _MASK32
            return (z >> 1) ^ -(z & 1), p
        shift += 7
        if shift >= limit:
            raise BatchError(f"a {'varlong' if wide else 'varint'} longer than {limit // 7} bytes")
