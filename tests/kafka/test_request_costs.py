"""No request of the largest size the broker reads may hold a core for long (docs/LIMITS.md,
"Request costs"): for each defect found, the worst-case request is sent to a real broker, and a
second client on the same core must be answered promptly. The bound is generous (a shared 2-CPU
machine); the defects it catches held the core for 30 s and more.

- JoinGroup (v3: one step, no member id asked first) with as many protocols as fit in a request
  (~760k in 8 MiB; Kafka clients send one per assignor, a handful): choosing the group's
  protocol was quadratic in them (100k held the core 59 s). Now a join with more than
  `PROTOCOLS_MAX` is refused (INVALID_REQUEST) and the choice is linear."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest
from brokerproc import BrokerProcess
from kafka_requests import frame, read_response
from kio.schema.errors import ErrorCode

from broker.core.limits import Limits
from broker.kafka.codec import make, request_schema

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
    raw = largest_join()
    answer: list[Any] = []

    def join() -> None:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=120) as sock:
            sock.sendall(raw)
            answer.append(read_response(11, 3, read_frame(sock))[1])

    t = threading.Thread(target=join)
    t.start()
    time.sleep(0.5)  # read, decoded, and past the group's initial rebalance delay (100 ms here)
    took = metadata_seconds(broker.port)
    t.join(120)
    assert took < PROMPT_S, f"a Metadata waited {took:.1f} s behind a JoinGroup of {len(raw)} bytes"
    assert answer and answer[0].error_code == ErrorCode.invalid_request, answer
    assert metadata_seconds(broker.port) < PROMPT_S  # and the broker keeps serving
