"""bpf/steer_rules.h against ringlog_proto, bit for bit: the port rule against `routing.port_owner`
and the frame's partition identity against what `frames` encodes, by running the compiled BPF
(an XDP program that is never attached; BPF_PROG_TEST_RUN feeds it cases and reads the answers).

The defines are compared with the Python constants without root, so a moved header field fails
here on any machine; the runs need root and bcc and skip without them.
"""

from __future__ import annotations

import random
import re
import struct

import pytest

from bpf import kernel
from ringlog_proto import frames, routing
from ringlog_proto import messages as m

reason = kernel.ebpf_unavailable()
needs_ebpf = pytest.mark.skipif(reason is not None, reason=f"eBPF unavailable: {reason}")
MAX_CORES = 64


def c_defines() -> dict[str, int]:
    text = (kernel.HERE / "steer_rules.h").read_text()
    return {name: int(value, 0) for name, value in re.findall(r"#define (RL_\w+) (\w+)", text)}


def test_frame_defines_are_the_frame_codec_constants() -> None:
    d = c_defines()
    assert d["RL_FRAME_MAGIC"] == frames.MAGIC
    assert d["RL_FRAME_VERSION"] == frames.FRAME_VERSION
    assert d["RL_FRAME_PREFIX"] == frames.HEADER_SIZE
    assert d["RL_FRAME_TOPIC_ID_OFFSET"] == frames.TOPIC_ID_OFFSET
    assert d["RL_FRAME_PARTITION_OFFSET"] == frames.PARTITION_OFFSET
    header = frames.encode_header(0, 0, 0, 0)
    assert header[d["RL_FRAME_MAGIC_OFFSET"]] == frames.MAGIC
    assert header[d["RL_FRAME_VERSION_OFFSET"]] == frames.FRAME_VERSION


def test_max_cores_agree() -> None:
    text = (kernel.HERE / "rendezvous.h").read_text()
    assert int(re.search(r"#define RL_MAX_CORES (\d+)", text).group(1)) == kernel.MAX_CORES == MAX_CORES  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def probe():
    if reason is not None:
        pytest.skip(f"eBPF unavailable: {reason}")
    bcc = kernel.load_bcc()
    b = bcc.BPF(text=kernel.source("rendezvous.h", "steer_rules.h", "steer_probe.c"))
    fn = b.load_func(b"rl_steer_probe", kernel.BPF_PROG_TYPE_XDP)
    try:
        yield fn.fd
    finally:
        b.cleanup()


def run(prog_fd: int, sport: int, cores: int, live: int, header: bytes) -> tuple[int, int]:
    """(the frame key the C reads from `header`, the port rule's owner)."""
    assert len(header) == frames.HEADER_SIZE
    ret, out = kernel.prog_test_run(prog_fd, struct.pack("<IIQ", sport, cores, live) + header)
    assert ret == 2  # XDP_PASS
    key, owner = struct.unpack_from("<Qi", out)
    return key, owner


def python_key(raw: bytes) -> int:
    """The key the payload rule must read from the frame `raw`: the identity the decoder sees,
    when the frame names one (0 for none, and for bytes that are no frame of this version)."""
    d = frames.FrameDecoder()
    d.feed(raw)
    try:
        f = d.next_frame()
    except frames.ProtocolError:
        return 0
    assert isinstance(f, frames.Frame)
    return routing.partition_key(f.topic_id, f.partition) if f.topic_id else 0


@needs_ebpf
def test_port_rule_agrees_over_many_cases(probe) -> None:
    rng = random.Random(7)
    header = frames.encode_header(0, 0, 1, 0)
    cases = 0
    for _ in range(3000):
        cores = rng.choice([1, 2, 3, 4, 7, 8, 16, 63, 64, rng.randrange(1, 65)])
        live = rng.getrandbits(min(cores, MAX_CORES))
        if rng.random() < 0.3:
            live = (1 << cores) - 1  # a full worker set, the common case
        elif rng.random() < 0.1:
            live = rng.getrandbits(64)  # bits beyond the configured cores
        sport = rng.choice([0, 1, 65535, rng.randrange(32768, 61000), rng.randrange(65536)])
        assert run(probe, sport, cores, live, header)[1] == routing.port_owner(sport, cores, live)
        cases += 1
    assert cases == 3000


@needs_ebpf
def test_port_rule_edges(probe) -> None:
    header = frames.encode_header(0, 0, 1, 0)
    for sport, cores, live in [
        (5, 0, 1),
        (5, 1, 0),
        (65535, 64, 1 << 63),
        (63, 64, 1 << 63),
        (1000, 200, -1 & (2**64 - 1)),
    ]:
        assert run(probe, sport, cores, live, header)[1] == routing.port_owner(sport, cores, live)
    for core in range(8):  # the ports the client picks reach the core it picked them for
        for port in list(routing.source_ports(core, 8, 32768, 60999))[:50]:
            assert run(probe, port, 8, 0xFF, header)[1] == core


@needs_ebpf
def test_frame_identity_is_read_where_the_encoder_puts_it(probe) -> None:
    rng = random.Random(11)
    for i in range(1000):
        topic = rng.choice([0, 1, 2, 0xFFFFFFFF, rng.randrange(2**32)])
        part = rng.choice([0, 1, 0xFFFFFFFF, rng.randrange(2**32)])
        if i % 2:
            raw = b"".join(m.encode_request(m.FetchRequest(topic, part, 0), rng.randrange(2**32)))
        else:
            body = rng.randbytes(rng.randrange(40))
            raw = frames.encode_frame(
                rng.randrange(100), rng.randrange(10), rng.randrange(2**32), body, topic, part
            )
        expected = routing.partition_key(topic, part) if topic else 0
        assert python_key(raw) == expected
        assert run(probe, 1, 1, 1, raw[: frames.HEADER_SIZE])[0] == expected


@needs_ebpf
def test_not_a_ringlog_frame_names_no_partition(probe) -> None:
    d = c_defines()
    good = frames.encode_frame(4, 1, 1, b"", 7, 3)
    assert run(probe, 1, 1, 1, good)[0] == python_key(good) == routing.partition_key(7, 3)
    for at, value in (
        (d["RL_FRAME_MAGIC_OFFSET"], frames.MAGIC ^ 1),
        (d["RL_FRAME_VERSION_OFFSET"], frames.FRAME_VERSION + 1),
    ):
        bad = bytearray(good)
        bad[at] = value
        assert python_key(bytes(bad)) == 0
        assert run(probe, 1, 1, 1, bytes(bad))[0] == 0
    assert run(probe, 1, 1, 1, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[: frames.HEADER_SIZE])[0] == 0
