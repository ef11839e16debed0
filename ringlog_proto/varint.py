"""Kafka's zigzag varint, the one encoder both record codecs use (batch.py's, and
records_codec.py's Python twin of the C codec), apart from both so neither imports the other."""

from __future__ import annotations

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
