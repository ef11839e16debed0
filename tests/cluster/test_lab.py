"""The cluster lab itself (labkit/clusterlab.py): its network, its faults and its cleanup, with
plain single brokers (no cluster flags) and real etcd members in namespaces on one bridge.

Root-required (CI is root); skipped, with the reason, otherwise. Each lab is closed at teardown
even when a test fails.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Admin
from broker.node import membership
from labkit.brokerproc import TEST_KEYRING
from labkit.clusterlab import (
    BROKER_PORT,
    ETCD_CLIENT_PORT,
    MEMBERSHIP_PORT,
    ClusterLab,
    lab_unavailable,
    wait_until,
)
from ringlog_proto import membership as wire
from ringlog_proto import messages as m
from ringlog_proto.frames import NEED_DATA, FrameDecoder

REASON = lab_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"{REASON}")
CUT_TIMEOUT_S = 0.5  # a connection across a cut must not complete in this time


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterLab]:
    """3 plain brokers and 1 etcd member, shared by the module's tests (each leaves it healed,
    resumed and running)."""
    lab = ClusterLab(nodes=3, etcd_members=1, base_dir=tmp_path_factory.mktemp("lab"))
    try:
        lab.start_nodes()
        yield lab
    finally:
        lab.close()


def stats_frame(corr: int) -> bytes:
    return b"".join(m.encode_request(m.StatsRequest(), corr))


def read_response(sock: socket.socket) -> m.Response:
    decoder = FrameDecoder()
    while True:
        f = decoder.next_frame()
        if f is not NEED_DATA:
            return m.decode_response(f)
        data = sock.recv(65536)
        assert data, "broker closed the connection"
        decoder.feed(data)


def test_every_node_reaches_every_node_and_etcd_from_inside(lab: ClusterLab) -> None:
    etcd = lab.etcd[0]
    for node in lab.nodes:
        for peer in lab.nodes:
            assert node.host.connects(peer.ip, BROKER_PORT), f"node {node.index} -> node {peer.index}"
            ack = lab.in_node(
                node.index,
                lambda peer=peer: membership.ping(peer.ip, MEMBERSHIP_PORT, TEST_KEYRING, timeout=2),
            )
            assert ack.kind == wire.ACK  # UDP too, on the membership port
        assert node.host.connects(etcd.ip, ETCD_CLIENT_PORT), f"node {node.index} -> etcd"
    with Admin(lab.nodes[0].bootstrap) as admin:  # the host is on the bridge too
        assert admin.create_topic("lab", partitions=1) > 0


def test_isolate_cuts_a_node_off_both_ways_and_heal_restores(lab: ClusterLab) -> None:
    n0, n1, n2 = lab.nodes
    etcd = lab.etcd[0]
    lab.isolate(1)
    try:
        assert not n0.host.connects(n1.ip, BROKER_PORT, CUT_TIMEOUT_S)
        assert not n2.host.connects(n1.ip, BROKER_PORT, CUT_TIMEOUT_S)
        assert not n1.host.connects(etcd.ip, ETCD_CLIENT_PORT, CUT_TIMEOUT_S)
        assert not n1.host.connects(n0.ip, BROKER_PORT, CUT_TIMEOUT_S)
        with pytest.raises(OSError):  # UDP vanishes too (TimeoutError is an OSError)
            lab.in_node(
                0, lambda: membership.ping(n1.ip, MEMBERSHIP_PORT, TEST_KEYRING, timeout=CUT_TIMEOUT_S)
            )
        # inside node 1 nothing changed: its own address and loopback still work
        assert n1.host.connects(n1.ip, BROKER_PORT)
        assert (
            lab.in_node(1, lambda: membership.ping(n1.ip, MEMBERSHIP_PORT, TEST_KEYRING, timeout=2)).kind
            == wire.ACK
        )
        # the others still reach each other and etcd
        assert n0.host.connects(n2.ip, BROKER_PORT) and n2.host.connects(etcd.ip, ETCD_CLIENT_PORT)
    finally:
        lab.heal(1)
    wait_until(lambda: n0.host.connects(n1.ip, BROKER_PORT), 5, "node 0 -> node 1 after heal")
    assert n2.host.connects(n1.ip, BROKER_PORT)
    assert n1.host.connects(etcd.ip, ETCD_CLIENT_PORT)


def test_pause_freezes_the_whole_process_group_and_resume_thaws_it(lab: ClusterLab) -> None:
    proc = lab.nodes[0].proc
    assert proc is not None
    pids = proc.group_pids()
    assert len(pids) >= 1 + lab.cores  # the supervisor and its workers
    with socket.create_connection((lab.nodes[0].ip, BROKER_PORT), timeout=5) as s:
        s.sendall(stats_frame(1))
        assert isinstance(read_response(s), m.StatsResponse)
        lab.pause(0)
        try:
            wait_until(lambda: all(state(p) == "T" for p in pids), 2, "every process stopped")
            s.sendall(stats_frame(2))
            s.settimeout(0.5)
            with pytest.raises(TimeoutError):
                s.recv(1)
        finally:
            lab.resume(0)
        s.settimeout(5)
        assert isinstance(read_response(s), m.StatsResponse)  # the request waited, then was answered
    assert all(state(p) != "T" for p in pids)


def state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_kill_and_restart_keep_address_ports_and_data(lab: ClusterLab) -> None:
    with Admin(lab.nodes[2].bootstrap) as admin:
        admin.create_topic("survives", partitions=2)
    old = lab.nodes[2].proc
    assert old is not None
    pids = old.group_pids()
    assert lab.kill(2) == -9
    wait_until(
        lambda: not any(Path(f"/proc/{p}").exists() and state(p) != "Z" for p in pids), 5, "workers gone"
    )
    assert not lab.nodes[0].host.connects(lab.nodes[2].ip, BROKER_PORT)  # refused at once
    lab.restart(2)
    with Admin(lab.nodes[2].bootstrap) as admin:
        assert "survives" in admin.list_topics()
    assert lab.stop(2) == 0  # graceful
    lab.restart(2)
    assert lab.nodes[0].host.connects(lab.nodes[2].ip, BROKER_PORT)
    what = [e for _, e in lab.events]
    assert what[-4:] == ["kill node 2", "start node 2", "stop node 2", "start node 2"]
    assert lab.last_fault() == lab.events[-1][0]


def test_three_etcd_members_elect_a_new_leader_when_theirs_is_killed(cluster_lab) -> None:
    lab = cluster_lab(nodes=0, etcd_members=3)
    leader = lab.wait_etcd_leader()
    lab.etcdctl("put", "lab/key", "before")
    started = time.monotonic()
    lab.kill_etcd(leader)
    new = lab.wait_etcd_leader(timeout=10)
    elected_s = time.monotonic() - started
    assert new != leader
    lab.etcdctl("put", "lab/key", "after")
    assert lab.etcdctl("get", "lab/key", "--print-value-only").strip() == "after"
    assert elected_s < 5, f"a new etcd leader took {elected_s:.1f} s"
    lab.restart_etcd(leader)  # rejoins as a follower, the data intact
    wait_until(lambda: lab.etcd_leader() == new, 5, "the old leader to follow")
    assert (
        lab.etcdctl(
            "get", "lab/key", "--print-value-only", f"--endpoints={lab.etcd[leader].endpoint}"
        ).strip()
        == "after"
    )


def test_close_leaves_no_namespace_link_or_process(cluster_lab) -> None:
    lab = cluster_lab(nodes=2, etcd_members=1)
    lab.start_nodes()
    lab.isolate(0)
    lab.pause(1)  # the worst case for cleanup: a cut node and a stopped one
    names = lab.names()
    pids = [p for n in lab.nodes if n.proc for p in n.proc.group_pids()]
    pids += [e.proc.pid for e in lab.etcd if e.proc]
    lab.close()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    for name in names["netns"]:
        assert name not in netns
    for name in names["links"]:
        assert f" {name}:" not in links and f" {name}@" not in links
    alive = [p for p in pids if Path(f"/proc/{p}").exists() and state(p) != "Z"]
    assert not alive, f"processes left: {alive}"
    found = subprocess.run(["pgrep", "-f", str(lab.base)], check=False, capture_output=True, text=True).stdout
    assert not found.strip(), found


def test_xdp_on_a_node_counts_membership_and_partition_packets(cluster_lab) -> None:
    from bpf import kernel

    reason = kernel.ebpf_unavailable()
    if reason is not None:
        pytest.skip(f"XDP needs root and bcc: {reason}")
    lab = cluster_lab(nodes=2, etcd_members=0)
    lab.start_node(0, xdp=True)
    lab.start_node(1)
    target = lab.nodes[0].ip
    before = lab.xdp_counters(0, after=time.time())
    assert before is not None
    pings, conns = 4, 3
    for i in range(pings):
        lab.in_node(
            1, lambda i=i: membership.ping(target, MEMBERSHIP_PORT, TEST_KEYRING, sequence=i + 1, timeout=2)
        )
    for _ in range(conns):
        assert lab.nodes[1].host.connects(target, BROKER_PORT)
    after = lab.xdp_counters(0, after=time.time())
    assert after is not None
    assert after["membership"] - before["membership"] == pings
    assert after["partition"] - before["partition"] >= 3 * conns  # SYN, ACK, FIN at least
    assert after["malformed_dropped"] == before["malformed_dropped"]
    assert lab.xdp_counters(1, timeout=0.2) is None  # no XDP asked on node 1


def test_cut_drops_one_pair_only_and_one_way_cuts_are_one_way(lab: ClusterLab) -> None:
    n0, n1, n2 = lab.nodes

    def ping(src: int, dst: int) -> bool:
        try:
            lab.in_node(
                src,
                lambda: membership.ping(
                    lab.nodes[dst].ip, MEMBERSHIP_PORT, TEST_KEYRING, timeout=CUT_TIMEOUT_S
                ),
            )
        except OSError:
            return False
        return True

    # a connection from node 0 to node 2 made before the cut: its packets are dropped too
    conn = lab.in_node(0, lambda: socket.create_connection((n2.ip, BROKER_PORT), timeout=5))
    with conn:
        conn.sendall(stats_frame(1))
        assert isinstance(read_response(conn), m.StatsResponse)
        lab.cut(0, 2)
        try:
            conn.sendall(stats_frame(2))
            conn.settimeout(CUT_TIMEOUT_S)
            with pytest.raises(TimeoutError):
                conn.recv(1)
            assert not n0.host.connects(n2.ip, BROKER_PORT, CUT_TIMEOUT_S)
            assert not n2.host.connects(n0.ip, BROKER_PORT, CUT_TIMEOUT_S)
            assert not ping(0, 2) and not ping(2, 0)
            assert ping(0, 1) and ping(1, 2) and ping(2, 1)  # the rest of the mesh is whole
            assert n0.host.connects(lab.etcd[0].ip, ETCD_CLIENT_PORT)
        finally:
            lab.mend(0, 2)
        conn.settimeout(5)
        assert isinstance(read_response(conn), m.StatsResponse)  # retransmitted once mended
    assert ping(0, 2) and ping(2, 0)

    lab.cut(0, 1, both=False)  # 0 -> 1 dropped, 1 -> 0 delivered
    try:
        assert udp_delivered(lab, src=1, dst=0)
        assert not udp_delivered(lab, src=0, dst=1)
        assert not ping(1, 0)  # its answer is lost
    finally:
        lab.heal_all()
    assert ping(0, 1) and ping(1, 0) and n1.host.cut_to == set()


def udp_delivered(lab: ClusterLab, src: int, dst: int) -> bool:
    """Whether a datagram sent from node src reaches a socket on node dst."""
    ip = lab.nodes[dst].ip

    def bound() -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((ip, 0))
        return s

    with lab.in_node(dst, bound) as rx:
        port = rx.getsockname()[1]

        def send() -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
                tx.sendto(b"x", (ip, port))

        lab.in_node(src, send)
        rx.settimeout(CUT_TIMEOUT_S)
        try:
            return rx.recv(16) == b"x"
        except TimeoutError:
            return False
