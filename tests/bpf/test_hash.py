"""bpf/rendezvous.h against ringlog_proto.routing, bit for bit, by running the compiled BPF.

The C is compiled by bcc into an XDP program that is never attached; BPF_PROG_TEST_RUN feeds it
(partition key, live core mask) and reads back the owner, which must equal `routing.owner`.
"""

from __future__ import annotations

import random
import struct

import pytest

from bpf import kernel
from ringlog_proto import routing

reason = kernel.ebpf_unavailable()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"eBPF unavailable: {reason}")


@pytest.fixture(scope="module")
def probe():
    bcc = kernel.load_bcc()
    b = bcc.BPF(text=kernel.source("rendezvous.h", "hash_probe.c"))
    fn = b.load_func(b"rl_hash_probe", kernel.BPF_PROG_TYPE_XDP)
    try:
        yield fn.fd
    finally:
        b.cleanup()


def bpf_owner(prog_fd: int, key: int, live: int) -> int:
    ret, out = kernel.prog_test_run(prog_fd, struct.pack("<QQ", key, live))
    assert ret == 2  # XDP_PASS
    return struct.unpack_from("<i", out)[0]


def test_mix_and_owner_agree_over_many_pairs(probe) -> None:
    rng = random.Random(5)
    cases = 0
    for _ in range(3000):
        topic = rng.choice([1, 2, 3, rng.randrange(1, 2**32)])
        part = rng.choice([0, 1, rng.randrange(0, 256), rng.randrange(0, 2**32)])
        n = rng.choice([1, 2, 3, 4, 8, 16, 63, 64])
        live = rng.getrandbits(n) or 1
        if rng.random() < 0.3:
            live = (1 << n) - 1  # a full worker set, the common case
        cores = [c for c in range(64) if live >> c & 1]
        assert bpf_owner(probe, routing.partition_key(topic, part), live) == routing.owner(topic, part, cores)
        cases += 1
    assert cases == 3000


def test_full_sets_match_shard_for(probe) -> None:
    for n in (1, 2, 3, 4, 7, 64):
        for topic in (1, 2, 9):
            for part in range(32):
                key = routing.partition_key(topic, part)
                assert bpf_owner(probe, key, (1 << n) - 1) == routing.shard_for(topic, part, n)


def test_no_live_core(probe) -> None:
    assert bpf_owner(probe, 123, 0) == -1
