"""eBPF steering and the XDP classifier end to end: `broker serve --cores 2` in a network namespace,
clients on the host side of a veth pair, XDP on the namespace's end of it.

Root-required (CI is root). Skipped, with the reason, only without root or bcc. The namespace,
links and programs are removed by the fixtures (tests/bpf/conftest.py) even when a test fails.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from bpf import kernel, tfo
from broker.client import Admin
from broker.client.client import AsyncClient
from broker.node import membership
from labkit.brokerproc import TEST_KEYRING
from labkit.netlab import fastopen_connect, wait_fresh
from ringlog_proto import membership as wire
from ringlog_proto import messages as m
from ringlog_proto.frames import NEED_DATA, FrameDecoder
from ringlog_proto.routing import shard_for

REASON = kernel.ebpf_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"eBPF tests need root and bcc: {REASON}")

PARTITIONS = 8
CONNS_PER_PARTITION = 3
STATS_FRESH_S = 1.3  # other cores' metrics files are rewritten once a second


def frame(req: m.Request, corr: int) -> bytes:
    return b"".join(m.encode_request(req, corr))


def read_responses(sock: socket.socket, count: int) -> list[m.Response]:
    decoder = FrameDecoder()
    out: list[m.Response] = []
    while len(out) < count:
        f = decoder.next_frame()
        if f is NEED_DATA:
            data = sock.recv(65536)
            assert data, "broker closed the connection"
            decoder.feed(data)
            continue
        out.append(m.decode_response(f))
    return out


def partition_connection(
    host: str, port: int, topic_id: int, p: int, fastopen: bool
) -> tuple[int, m.Response]:
    """A connection to the public port whose first frame is about partition p, then a STATS request
    on it: (the core that accepted the connection, the partition request's answer)."""
    first = frame(m.ListOffsetsRequest(topic_id, p), 1)
    if fastopen:
        s = fastopen_connect(host, port, first)
    else:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(first)
    with s:
        s.sendall(frame(m.StatsRequest(), 2))
        answer, stats = read_responses(s, 2)
    assert isinstance(stats, m.StatsResponse)
    return stats.core, answer


def forwards(bootstrap: str) -> int:
    time.sleep(STATS_FRESH_S)
    with Admin(bootstrap) as admin:
        doc = admin.stats()
    assert len(doc["snapshots"]) == 2
    return sum(int(s.get("forwarded", 0)) for s in doc["snapshots"])


def xdp_classes(broker, after: float) -> dict[str, int]:
    return wait_fresh(broker.bpf, after)["xdp"]["classes"]


def delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a}


def test_steered_partitions_land_on_their_owner_and_xdp_counts_the_traffic(lab, ns_broker) -> None:
    host_tfo = tfo.read()
    ns_tfo = lab.sysctl("net.ipv4.tcp_fastopen")
    b = ns_broker("--ebpf", "on", "--tcp-fastopen-sysctl", "--xdp-iface", lab.ns_if)
    assert int(lab.sysctl("net.ipv4.tcp_fastopen")) & tfo.TFO_SERVER_ENABLE
    assert lab.xdp_prog_id() != 0
    with Admin(b.bootstrap) as admin:
        topic_id = admin.create_topic("orders", partitions=PARTITIONS)

    # Clients that do not route themselves: the first frame in the SYN decides the core.
    for p in range(PARTITIONS):
        for _ in range(CONNS_PER_PARTITION):
            core, answer = partition_connection(b.host, b.port, topic_id, p, fastopen=True)
            assert answer.error == m.ErrorCode.NONE, answer
            assert core == shard_for(topic_id, p, 2), f"partition {p} accepted by core {core}"
    assert forwards(b.bootstrap) == 0
    doc = wait_fresh(b.bpf, time.time())
    assert doc["steering"] and doc["payload_steering"] and doc["live_cores"] == [0, 1]
    assert doc["steer"]["by_payload"] >= PARTITIONS * CONNS_PER_PARTITION
    assert doc["steer"]["errors"] == 0

    # The broker's own client: Metadata says steering, so each core's connection goes to the public
    # port, steered there by its first frame; nothing is forwarded.
    async def client_run() -> None:
        async with AsyncClient(b.bootstrap) as c:
            meta = await c.refresh_metadata()
            assert meta.steering
            for p in range(PARTITIONS):
                resp = await c.partition_request("orders", p, lambda tid, p=p: m.ListOffsetsRequest(tid, p))
                assert resp.error == m.ErrorCode.NONE
            for core in (0, 1):
                conn = await c.connection(core)
                assert conn.address == b.bootstrap  # the public port, not the direct one
                stats = await conn.request(m.StatsRequest())
                assert isinstance(stats, m.StatsResponse) and stats.core == core

    asyncio.run(client_run())
    assert forwards(b.bootstrap) == 0

    # XDP: membership pings, malformed membership packets, other UDP, then partition TCP.
    before = xdp_classes(b, time.time())
    pings = 5
    for i in range(pings):
        ack = membership.ping(b.host, b.membership_port, TEST_KEYRING, sequence=100 + i, timeout=2)
        assert (ack.kind, ack.sequence, ack.cores, ack.port) == (wire.ACK, 100 + i, 2, b.port)
    good = wire.encode(wire.Packet(wire.PING, 1), TEST_KEYRING)
    malformed = [b"short", b"XXXX" + good[4:], good[:4] + b"\x01" + good[5:], good[:39]]
    others = 6
    mport = b.membership_port
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        for data in malformed:
            u.sendto(data, (b.host, mport))
        for _ in range(others):
            u.sendto(good, (b.host, mport + 1))  # not the membership port
    after = xdp_classes(b, time.time())
    d = delta(before, after)
    assert d["membership"] == pings
    assert d["malformed_dropped"] == len(malformed)
    assert d["other"] == others
    assert d["partition"] == 0
    assert wait_fresh(b.bpf, time.time())["membership"]["malformed"] == 0  # dropped before the socket

    before = after
    conns = 4
    for p in range(conns):
        partition_connection(b.host, b.port, topic_id, p, fastopen=True)
    after = xdp_classes(b, time.time())
    d = delta(before, after)
    assert d["partition"] >= 3 * conns  # at least SYN, the handshake's ACK and a FIN per connection
    assert d["membership"] == d["malformed_dropped"] == 0

    assert b.stop() == 0
    assert lab.xdp_prog_id() == 0, "XDP left attached"
    assert lab.sysctl("net.ipv4.tcp_fastopen") == ns_tfo, "TFO sysctl not restored"
    assert tfo.read() == host_tfo
    final = b.bpf()
    assert final is not None and final["steering"] is False


def test_without_ebpf_the_same_traffic_is_forwarded_in_user_space(lab, ns_broker) -> None:
    ns_tfo = lab.sysctl("net.ipv4.tcp_fastopen")
    b = ns_broker("--ebpf", "off")
    assert "eBPF off (--ebpf off)" in b.log()
    assert lab.xdp_prog_id() == 0
    with Admin(b.bootstrap) as admin:
        topic_id = admin.create_topic("orders", partitions=PARTITIONS)
    misplaced = 0
    for p in range(PARTITIONS):
        for _ in range(CONNS_PER_PARTITION):
            core, answer = partition_connection(b.host, b.port, topic_id, p, fastopen=False)
            assert answer.error == m.ErrorCode.NONE, answer
            misplaced += core != shard_for(topic_id, p, 2)
    assert misplaced > 0  # the kernel's hash knows nothing of partitions
    assert forwards(b.bootstrap) == misplaced  # each misplaced request was forwarded once

    async def client_run() -> None:
        async with AsyncClient(b.bootstrap) as c:
            meta = await c.refresh_metadata()
            assert not meta.steering
            for p in range(PARTITIONS):
                await c.partition_request("orders", p, lambda tid, p=p: m.ListOffsetsRequest(tid, p))
            conn = await c.connection(1)
            assert conn.address != b.bootstrap  # the direct port: routing-aware without steering

    asyncio.run(client_run())
    assert forwards(b.bootstrap) == misplaced  # the routing-aware client added none
    assert membership.ping(b.host, b.membership_port, TEST_KEYRING, timeout=2).kind == wire.ACK
    assert b.stop() == 0
    assert lab.sysctl("net.ipv4.tcp_fastopen") == ns_tfo


def test_a_restarting_worker_stays_live_and_its_connections_wait_for_it(lab, ns_broker) -> None:
    """A killed worker is restarted at once and stays in the live set: a connection for its
    partition queues in its listener's backlog and is served by it, not forwarded to a dead peer."""
    import os
    import re
    import signal

    b = ns_broker("--ebpf", "on", "--tcp-fastopen-sysctl")
    with Admin(b.bootstrap) as admin:
        topic_id = admin.create_topic("orders", partitions=PARTITIONS)
    pids = {int(c): int(p) for c, p in re.findall(r"core (\d+): pid (\d+)", b.log())}
    victim = 1
    p = next(i for i in range(PARTITIONS) if shard_for(topic_id, i, 2) == victim)
    os.kill(pids[victim], signal.SIGKILL)
    core, answer = partition_connection(b.host, b.port, topic_id, p, fastopen=True)
    assert (core, answer.error) == (victim, m.ErrorCode.NONE)
    assert f"worker core {victim} (pid {pids[victim]}) died" in b.log()
    doc = wait_fresh(b.bpf, time.time())
    assert doc["live_cores"] == [0, 1]
    assert "live cores for steering" not in b.log()  # never left the set
    assert forwards(b.bootstrap) == 0
