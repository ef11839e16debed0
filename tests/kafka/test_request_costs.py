"""No request of the largest size the broker reads may hold a core for long (docs/LIMITS.md,
"Request costs"): for each defect found, the worst-case request is sent to a real broker, and a
second client on the same core must be answered promptly. The bound is generous (a shared 2-CPU
machine); the defects it catches held the core for 30 s and more.

- JoinGroup (v3: one step, no member id asked first) with as many protocols as fit in a request
  (~760k in 8 MiB; Kafka clients send one per assignor, a handful): choosing the group's
  protocol was quadratic in them (100k held the core 59 s). Now a join with more than
  `PROTOCOLS_MAX` is refused (INVALID_REQUEST), the choice is linear, and the largest join is
  refused before that by the bound on entries (below).
- Kafka requests filling 8 MiB with array entries: Metadata naming 1.2M topics held the core 20 s,
  OffsetFetch of 2.1M partitions 65 s, ListOffsets of 0.7M partitions 31 s, Produce of 1M
  partitions without records 30 s (the handlers' cost per entry, a registry refresh per unknown
  name among it). Now a request of more than `codec.ENTRIES_MAX` entries is refused as one that
  does not parse (the connection is closed, as Kafka closes on such a request), counted before
  kio decodes it when it is large.
- Our protocol's Metadata naming 2.8M topics: refused past `REQUEST_ARRAY_MAX` (INVALID_REQUEST)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode

from broker.core.coordinator import PROTOCOLS_MAX
from broker.core.limits import Limits
from broker.kafka.codec import KafkaRequest, make, request_schema
from labkit.brokerproc import BrokerProcess, Wire
from labkit.kafka_requests import frame, read_response
from ringlog_proto import messages as m

PROMPT_S = 5.0  # a second client's Metadata must be answered within this
ONE_CORE = [{"cores": 1, "backend": b} for b in ("uvloop", "io_uring")]


def read_frame(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def metadata_seconds(port: int) -> float:
    """How long a Metadata (v1, every topic) takes to be answered on a new connection."""
    schema = request_schema(3, 1)
    assert schema is not None
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        t0 = time.monotonic()
        sock.sendall(frame(3, 1, 1, make(schema, topics=None)))
        read_frame(sock)
        return time.monotonic() - t0


def _str(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def join_request(protocols: int) -> bytes:
    """A JoinGroup v3 (non-flexible) naming `protocols` protocols, each with empty metadata,
    framed by hand: kio takes minutes to write ~760k entities."""
    head = struct.pack(">hhi", 11, 3, 1) + _str("t")
    body = _str("g") + struct.pack(">ii", 10_000, 10_000) + _str("") + _str("consumer")
    entries = b"".join(_str(f"{i:x}") + b"\0\0\0\0" for i in range(protocols))
    data = head + body + struct.pack(">i", protocols) + entries
    return struct.pack(">i", len(data)) + data


def largest_join() -> bytes:
    """A JoinGroup with as many protocols as fit in the largest request the broker reads."""
    limit = Limits().max_request_bytes
    n = limit // 11
    while len(raw := join_request(n)) > limit:
        n -= 1 + (len(raw) - limit) // 11
    return raw


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True, ids=["uvloop", "io_uring"])
def test_a_join_with_every_protocol_that_fits_holds_no_core(broker: BrokerProcess) -> None:
    took, got = second_client_waits(broker.port, largest_join())
    assert took < PROMPT_S, f"a Metadata waited {took:.1f} s behind the largest JoinGroup"
    assert isinstance(got, ConnectionError), got  # past ENTRIES_MAX: refused as malformed
    # under the entries bound, over the protocols one: refused by the coordinator
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        sock.sendall(join_request(PROTOCOLS_MAX + 1))
        answer = read_response(11, 3, read_frame(sock))[1]
    assert answer.error_code == ErrorCode.invalid_request, answer
    assert metadata_seconds(broker.port) < PROMPT_S  # and the broker keeps serving


def kafka_request(key: int, version: int, body: bytes) -> bytes:
    data = struct.pack(">hhi", key, version, 1) + _str("t") + body
    return struct.pack(">i", len(data)) + data


def largest_array(entry: Callable[[int], bytes], room: int) -> bytes:
    """An array (i32 count, then entries) of as many `entry(i)` as fit in `room` bytes."""
    parts = []
    size = 4
    i = 0
    while size + len(e := entry(i)) <= room:
        parts.append(e)
        size += len(e)
        i += 1
    return struct.pack(">i", i) + b"".join(parts)


def worst_kafka(name: str) -> bytes:
    """The largest request of each kind found to hold a core, filled with array entries."""
    room = Limits().max_request_bytes - 200
    one_topic = struct.pack(">i", 1) + _str("t")
    if name == "metadata":  # v1: topics [name]
        return kafka_request(3, 1, largest_array(lambda i: _str(f"{i:x}"), room))
    if name == "offset_fetch":  # v1: group, topics [name, partitions [i32]]
        return kafka_request(
            9, 1, _str("g") + one_topic + largest_array(lambda i: struct.pack(">i", i), room)
        )
    if name == "list_offsets":  # v1: replica, topics [name, partitions [index, timestamp]]
        parts = largest_array(lambda i: struct.pack(">iq", i, -1), room)
        return kafka_request(2, 1, struct.pack(">i", -1) + one_topic + parts)
    if name == "produce":  # v3: transactional id, acks, timeout, topics [name, partitions [index, null]]
        parts = largest_array(lambda i: struct.pack(">ii", i, -1), room)
        return kafka_request(0, 3, struct.pack(">hhi", -1, 1, 5000) + one_topic + parts)
    raise ValueError(name)


def second_client_waits(port: int, raw: bytes) -> tuple[float, bytes | Exception]:
    """Send `raw` on one connection; meanwhile time a Metadata on another. (the wait, what the
    first connection got: a response frame, or the error reading one)."""
    got: list[bytes | Exception] = []

    def send() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            sock.sendall(raw)
            try:
                got.append(read_frame(sock))
            except OSError as exc:  # ConnectionError: closed, as Kafka closes on a bad request
                got.append(exc)

    t = threading.Thread(target=send)
    t.start()
    time.sleep(0.3)
    took = metadata_seconds(port)
    t.join(120)
    return took, got[0]


@pytest.mark.parametrize("broker", ONE_CORE, indirect=True, ids=["uvloop", "io_uring"])
def test_requests_full_of_entries_hold_no_core(broker: BrokerProcess) -> None:
    w = Wire(broker.port)
    try:
        w.create_topic("t", 4)
        for name in ("metadata", "offset_fetch", "list_offsets", "produce"):
            took, got = second_client_waits(broker.port, worst_kafka(name))
            assert took < PROMPT_S, f"a Metadata waited {took:.1f} s behind the largest {name}"
            assert isinstance(got, ConnectionError), (name, got)  # refused, as a malformed request
        # ours: a Metadata naming as many topics as fit
        room = Limits().max_request_bytes - 200
        names = tuple(f"{i:x}" for i in range(room // 9))
        resp = w.rpc(m.MetadataRequest(names))
        assert resp.error == m.ErrorCode.INVALID_REQUEST, resp
        assert metadata_seconds(broker.port) < PROMPT_S
    finally:
        w.close()


def test_the_entry_prescan_counts_what_kio_decodes() -> None:
    """`too_many_entries` (the count made before kio decodes a large request) agrees with the
    count of the decoded body, for every api and version kio has, at bounds around the count
    (two entries in every array); it never counts more, and may count fewer only where arrays sit
    in tagged fields (which it skips whole; the count after decoding still sees them). Where a
    schema has none (`_prescan_counts_all`), decode_request takes its answer without counting
    again, so there it must be exact."""
    from kio.schema.index import api_key_map, schema_name_map
    from kio.serial import entity_reader

    from broker.kafka.codec import _entries_over, _prescan_counts_all, decode_request, too_many_entries
    from labkit.kafka_requests import build

    checked = exact = trusted = 0
    for key in sorted(api_key_map):
        for version in sorted(schema_name_map[api_key_map[key]]):
            schema = request_schema(key, version)
            if schema is None:
                continue
            raw = frame(key, version, 1, build(schema, filled=True))
            request = KafkaRequest(key, version, 1, raw[4:])
            body, _ = decode_request(request, schema, max_entries=1 << 30)
            _, used = entity_reader(schema.__header_schema__)(request.data, 0)
            if not too_many_entries(request.data, used, schema, -1):  # "cannot tell": kio decides
                continue
            same = True
            for bound in (0, 1, 2, 3, 5, 8, 13, 100):
                expected = _entries_over(body, bound) < 0
                got = too_many_entries(request.data, used, schema, bound)
                assert expected or not got, (key, version, bound)  # never refuses what kio would not
                same = same and got == expected
            if _prescan_counts_all(schema):
                assert same, (key, version)  # its "not over" is taken as the answer
                trusted += 1
            checked += 1
            exact += same  # (arrays inside tagged fields are skipped, not counted: the decoded count is)
    assert checked >= 300 and exact > 0.9 * checked, (checked, exact)
    assert trusted > 0.5 * checked, (checked, trusted)
    produce = request_schema(0, 9)
    assert produce is not None and _prescan_counts_all(produce)
