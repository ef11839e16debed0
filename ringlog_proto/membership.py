"""The membership packet (UDP, membership version 2): its bytes, signed and checked, sans-I/O.

Rules this module keeps:
- It is the one owner of the packet's format (docs/PROTOCOL.md §8.2). SWIM (broker/cluster/swim.py)
  fills packets, the node's endpoint (broker/node/membership.py) and tools send and receive them,
  and the XDP classifier (bpf/xdp.c) checks their header; none of them writes a byte offset or a
  size of its own. bpf/xdp.py compiles the C with the constants below as -D flags, so the C
  states none of them (tests/bpf/test_xdp_rules.py runs the compiled check on packets encoded here).
- Every packet starts with the 24-byte RLMB header (magic, version, kind, flags, sequence,
  node_id, cores, port, incarnation: the `*_OFFSET` constants, checked against the struct below
  at import), then a compact payload of updates, then a 16-byte tag: HMAC-SHA256 of everything
  before it under the cluster key, cut to 128 bits. The whole datagram is at most
  `PACKET_BYTES_MAX` bytes (one Ethernet frame's UDP payload).
- Nothing is believed before its tag is: `decode` checks the tag against every key of the
  `Keyring` (two during a rotation, memberlist's rule: the first signs, any verifies) before it
  parses a byte of the payload. It raises nothing but `MalformedPacket` (of which
  `Unauthenticated` is a kind), whatever the bytes.
- No sockets, no files: the key file is read by the node (broker/node/membership.py
  `read_keyring`), which hands its text to `Keyring.from_text`.
"""

from __future__ import annotations

import enum
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

MAGIC: Final = b"RLMB"
VERSION: Final = 2  # 2: every packet ends with the cluster key's tag (version 1 had none)
TAG_SIZE: Final = 16  # HMAC-SHA256 cut to 128 bits (RFC 2104 §5: at least half the hash, 80 bits)
PACKET_BYTES_MAX: Final = 1472  # one Ethernet frame's UDP payload: larger datagrams are not ours
KEY_BYTES_MIN: Final = 16
INCARNATION_MAX: Final = 0xFFFFFFFF  # a u32 on the wire

# The header, field by field: where each starts (big-endian integers).
MAGIC_OFFSET: Final = 0  # 4 bytes
VERSION_OFFSET: Final = 4  # u8
KIND_OFFSET: Final = 5  # u8
FLAGS_OFFSET: Final = 6  # u16
SEQUENCE_OFFSET: Final = 8  # u32
NODE_ID_OFFSET: Final = 12  # u32
CORES_OFFSET: Final = 16  # u16
PORT_OFFSET: Final = 18  # u16
INCARNATION_OFFSET: Final = 20  # u32
HEADER_SIZE: Final = 24
PACKET_MIN: Final = HEADER_SIZE + TAG_SIZE  # a header and a tag, no payload: the plain PING and ACK

PING: Final = 1
ACK: Final = 2
PING_REQ: Final = 3  # "probe this target for me": payload starts with the target
SYNC: Final = 4  # a view (or part of one) pushed whole: push-pull anti-entropy, join replies, nudges
KINDS: Final = frozenset({PING, ACK, PING_REQ, SYNC})

FLAG_JOIN: Final = 0x0001  # on a PING: "send me your view" (answered by ACK and SYNC packets)
FLAG_REPLY: Final = 0x0002  # on a SYNC: "send me yours back"
FLAG_INDIRECT: Final = 0x0004  # on an ACK: relayed for a PING_REQ

# One struct code per header field, in the order of the offsets above.
_HEADER_FIELDS: Final = (
    (MAGIC_OFFSET, "4s"),
    (VERSION_OFFSET, "B"),
    (KIND_OFFSET, "B"),
    (FLAGS_OFFSET, "H"),
    (SEQUENCE_OFFSET, "I"),
    (NODE_ID_OFFSET, "I"),
    (CORES_OFFSET, "H"),
    (PORT_OFFSET, "H"),
    (INCARNATION_OFFSET, "I"),
)
_HEADER = struct.Struct(">" + "".join(code for _, code in _HEADER_FIELDS))
_UPDATE_HEAD = struct.Struct(">BII")  # state, node_id, incarnation
_META = struct.Struct(">HHHH")  # client port, membership port, cores, weight
_TARGET = struct.Struct(">IH")  # PING_REQ: target node id, membership port (then the host, str8)

# The layout's relations, checked at import (plain `if`s: they hold under -O too).
for _i, (_offset, _) in enumerate(_HEADER_FIELDS):
    if struct.calcsize(">" + "".join(code for _, code in _HEADER_FIELDS[:_i])) != _offset:
        raise AssertionError(f"ringlog_proto/membership.py: header field {_i} is not at offset {_offset}")
if _HEADER.size != HEADER_SIZE or struct.calcsize(">4s") != len(MAGIC):
    raise AssertionError("ringlog_proto/membership.py: the header struct is not HEADER_SIZE bytes")
if not PACKET_MIN < PACKET_BYTES_MAX:
    raise AssertionError("ringlog_proto/membership.py: PACKET_MIN must be below PACKET_BYTES_MAX")


class State(enum.Enum):
    """A member's state. Its value is the name `<data_dir>/run/members.json` shows."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


ALIVE: Final = State.ALIVE
SUSPECT: Final = State.SUSPECT
DEAD: Final = State.DEAD
LEFT: Final = State.LEFT
_STATE_CODE: Final = {ALIVE: 1, SUSPECT: 2, DEAD: 3, LEFT: 4}
_CODE_STATE: Final = {v: k for k, v in _STATE_CODE.items()}

Addr = tuple[str, int]


class MalformedPacket(ValueError):
    """Not a membership packet of a version we speak."""


class Unauthenticated(MalformedPacket):
    """A membership packet whose tag no key of the keyring made: dropped unread."""


class Keyring:
    """The cluster's membership keys: the first signs every packet sent, any of them verifies one
    received. Rotating is three rolling restarts: add the new key second on every node, then move
    it first (nodes now sign with it and still accept the old one), then drop the old one."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not 1 <= len(keys) <= 2:
            raise ValueError(f"{len(keys)} keys: a keyring holds one, or two during a rotation")
        for k in keys:
            if len(k) < KEY_BYTES_MIN:
                raise ValueError(f"a key of {len(k)} bytes: at least {KEY_BYTES_MIN}")
        self.keys: tuple[bytes, ...] = tuple(keys)

    @classmethod
    def from_text(cls, text: str, source: str) -> Keyring:
        """The keys of a key file's `text`: one a line in hex (`openssl rand -hex 32`), blank lines
        and `#` comments skipped. Raises ValueError naming `source` (the file) and what is wrong."""
        keys = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            try:
                keys.append(bytes.fromhex(line))
            except ValueError:
                raise ValueError(f"{source}:{n}: not a key in hex") from None
        try:
            return cls(keys)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    def sign(self, body: bytes) -> bytes:
        return body + hmac.digest(self.keys[0], body, "sha256")[:TAG_SIZE]

    def verify(self, data: bytes) -> bool:
        body, tag = data[:-TAG_SIZE], data[-TAG_SIZE:]
        return any(hmac.compare_digest(hmac.digest(k, body, "sha256")[:TAG_SIZE], tag) for k in self.keys)


@dataclass(frozen=True, slots=True)
class Member:
    """What a node says of itself, gossiped with every ALIVE: enough to reach each of its cores."""

    node_id: int
    host: str
    port: int  # the broker's client TCP port
    membership_port: int
    direct_ports: tuple[int, ...] = ()  # core k's direct TCP port at index k
    cores: int = 1
    weight: int = 100
    rack: str = ""

    @property
    def addr(self) -> Addr:
        return (self.host, self.membership_port)


@dataclass(frozen=True, slots=True)
class Update:
    """One statement about a node. `member` is set for ALIVE only (the metadata travels with it)."""

    state: State
    node_id: int
    incarnation: int
    member: Member | None = None


@dataclass(frozen=True, slots=True)
class Packet:
    kind: int
    sequence: int
    node_id: int = 0
    cores: int = 0
    port: int = 0
    incarnation: int = 0
    flags: int = 0
    target: Member | None = None  # PING_REQ: node_id, host and membership_port are used
    updates: tuple[Update, ...] = ()


# ----------------------------------------------------------------------------- encode


def _str8(s: str) -> bytes:
    b = s.encode()
    if len(b) > 255:
        raise ValueError(f"{s[:20]!r}...: longer than 255 bytes")
    return bytes((len(b),)) + b


def encode_update(u: Update) -> bytes:
    out = _UPDATE_HEAD.pack(_STATE_CODE[u.state], u.node_id, u.incarnation)
    if u.state == ALIVE:
        m = u.member
        assert m is not None
        out += _str8(m.host) + _META.pack(m.port, m.membership_port, m.cores, m.weight) + _str8(m.rack)
        out += bytes((len(m.direct_ports),)) + struct.pack(f">{len(m.direct_ports)}H", *m.direct_ports)
    return out


def encode_header(
    kind: int, seq: int, node_id: int, cores: int, port: int, inc: int, flags: int = 0
) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, kind, flags, seq, node_id, cores, port, inc)


def encode_target(t: Member) -> bytes:
    """A PING_REQ's target, which starts its payload."""
    return _TARGET.pack(t.node_id, t.membership_port) + _str8(t.host)


def encode(p: Packet, keyring: Keyring) -> bytes:
    """The whole packet, signed (every update must fit: `Swim` fills its packets itself)."""
    out = encode_header(p.kind, p.sequence, p.node_id, p.cores, p.port, p.incarnation, p.flags)
    if p.target is not None:
        out += encode_target(p.target)
    if p.updates:
        out += bytes((len(p.updates),)) + b"".join(encode_update(u) for u in p.updates)
    if len(out) + TAG_SIZE > PACKET_BYTES_MAX:
        raise ValueError(f"{len(out) + TAG_SIZE} bytes: more than {PACKET_BYTES_MAX}")
    return keyring.sign(out)


# ----------------------------------------------------------------------------- decode


def _str8_at(data: bytes, pos: int) -> tuple[str, int]:
    n = data[pos]
    end = pos + 1 + n
    if end > len(data):
        raise MalformedPacket(f"string of {n} bytes truncated at byte {pos}")
    try:
        return data[pos + 1 : end].decode(), end
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"bad string: {exc}") from exc


_ALIVE_CACHE: dict[bytes, Update] = {}  # the same ALIVE record arrives many times: decode it once
_ALIVE_CACHE_MAX = 4096


def _decode_update(data: bytes, pos: int) -> tuple[Update, int]:
    code, node_id, inc = _UPDATE_HEAD.unpack_from(data, pos)
    start = pos
    pos += _UPDATE_HEAD.size
    state = _CODE_STATE.get(code)
    if state is None:
        raise MalformedPacket(f"unknown member state {code}")
    if state != ALIVE:
        return Update(state, node_id, inc), pos
    p_rack = pos + 1 + data[pos] + _META.size
    p_direct = p_rack + 1 + data[p_rack]
    end = p_direct + 1 + 2 * data[p_direct]
    if end > len(data):
        raise MalformedPacket(f"member record truncated at byte {start}")
    key = data[start:end]
    u = _ALIVE_CACHE.get(key)
    if u is not None:
        return u, end
    host, pos = _str8_at(data, pos)
    port, mport, cores, weight = _META.unpack_from(data, pos)
    rack, pos = _str8_at(data, pos + _META.size)
    direct = struct.unpack_from(f">{data[pos]}H", data, pos + 1)
    u = Update(state, node_id, inc, Member(node_id, host, port, mport, direct, cores, weight, rack))
    if len(_ALIVE_CACHE) >= _ALIVE_CACHE_MAX:
        _ALIVE_CACHE.clear()
    _ALIVE_CACHE[key] = u
    return u, end


def decode(data: bytes, keyring: Keyring) -> Packet:
    """The packet `data` holds, once its tag is one of `keyring`'s; raises MalformedPacket (or
    Unauthenticated) and nothing else, whatever `data` is."""
    if len(data) < PACKET_MIN:
        raise MalformedPacket(f"{len(data)} bytes, shorter than the {HEADER_SIZE}-byte header and the tag")
    if len(data) > PACKET_BYTES_MAX:
        raise MalformedPacket(f"{len(data)} bytes, longer than {PACKET_BYTES_MAX}")
    magic, version, kind, flags, seq, node, cores, port, inc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedPacket(f"magic {magic!r}, not {MAGIC!r}")
    if version != VERSION:
        raise MalformedPacket(f"version {version}, not {VERSION}")
    if kind not in KINDS:
        raise MalformedPacket(f"unknown kind {kind}")
    if not keyring.verify(data):
        raise Unauthenticated("no key of the keyring made this packet's tag")
    data = data[:-TAG_SIZE]
    pos = HEADER_SIZE
    target = None
    updates: list[Update] = []
    try:
        if kind == PING_REQ:
            tid, tport = _TARGET.unpack_from(data, pos)
            thost, pos = _str8_at(data, pos + _TARGET.size)
            target = Member(tid, thost, 0, tport)
        if pos < len(data):
            count = data[pos]
            pos += 1
            for _ in range(count):
                u, pos = _decode_update(data, pos)
                updates.append(u)
    except (struct.error, IndexError) as exc:
        raise MalformedPacket(f"truncated payload: {exc}") from exc
    if pos != len(data):
        raise MalformedPacket(f"{len(data) - pos} bytes after the last update")
    return Packet(kind, seq, node, cores, port, inc, flags, target, tuple(updates))
