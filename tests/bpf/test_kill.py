"""Nothing of ours stays in the kernel after `kill -9`, what older brokers left is removed at
start, and `broker stats -b` shows the eBPF counters with no data dir.

Root-required (CI is root). Skipped, with the reason, only without root or bcc. Everything runs in
a network namespace behind a veth pair (tests/bpf/conftest.py), never on the host's `lo`; the
namespace, links and processes are removed even when a test fails. The checks use `ip link` and,
when installed (make setup installs it), `bpftool`, beside the kernel's own answers (bpf/kernel.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bpf import kernel, tfo, xdp
from broker.node import membership
from labkit.brokerproc import TEST_KEYRING
from labkit.netlab import Netns, NsBroker, wait_fresh
from ringlog_proto import membership as wire

REASON = kernel.ebpf_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"eBPF tests need root and bcc: {REASON}")

GONE_S = 10.0  # programs behind a socket are freed after an RCU grace period: poll, don't sleep
BPFTOOL = shutil.which("bpftool")


def worker_pids(log: str) -> list[int]:
    return [int(p) for p in re.findall(r"core \d+: pid (\d+)", log)]


def wait_dead(pid: int, timeout: float = GONE_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except (FileNotFoundError, ProcessLookupError):
            return
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.02)


def bpftool_knows(kind: str, obj_id: int) -> bool:
    """Whether `bpftool KIND show id N` finds the object (True when bpftool is absent: the kernel
    check alone decides then)."""
    if BPFTOOL is None:
        return False
    cmd = [BPFTOOL, kind, "show", "id", str(obj_id)]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


def leftovers(ids: dict[str, set[int]]) -> dict[str, list[int]]:
    """Which of the BPF objects in `ids` (bpf_fd_ids' kinds) still exist, by kernel and bpftool."""
    out = {}
    for kind in ("prog", "map", "link"):
        alive = set(kernel.object_ids(kind))
        out[kind] = sorted(i for i in ids[f"{kind}_id"] if i in alive or bpftool_knows(kind, i))
    return {k: v for k, v in out.items() if v}


def xdp_on(lab: Netns) -> str:
    """What `ip link` (and `bpftool net`) say is attached to the namespace's interface ('' if nothing)."""
    text = lab.run(["ip", "-d", "link", "show", "dev", lab.ns_if])
    found = re.findall(r"prog/xdp\S* id \d+[^\n]*", text)
    if BPFTOOL is not None:
        nets = json.loads(lab.run([BPFTOOL, "-j", "net", "show", "dev", lab.ns_if]))
        found += [json.dumps(x) for net in nets for x in net.get("xdp", [])]
    return "; ".join(found)


def test_kill_9_leaves_nothing_attached_and_the_next_start_restores_the_sysctl(lab, tmp_path: Path) -> None:
    lab.run(["sysctl", "-qw", "net.ipv4.tcp_fastopen=1"])
    data = tmp_path / "data"
    b = NsBroker(
        lab,
        data,
        tmp_path / "broker.log",
        ("--ebpf", "on", "--tcp-fastopen-sysctl", "--xdp-iface", lab.ns_if),
    ).start()
    assert b.proc is not None
    supervisor = b.proc.pid  # `ip netns exec` execs the command: this is the supervisor
    workers = worker_pids(b.log())
    assert len(workers) == 2
    assert lab.xdp_prog_id() != 0 and xdp_on(lab)
    assert lab.sysctl("net.ipv4.tcp_fastopen") == "3"
    ours = kernel.bpf_fd_ids(supervisor)
    assert ours["link_id"], "XDP is not attached through a BPF link"
    xdp_id = lab.xdp_prog_id()
    assert xdp_id in ours["prog_id"] and kernel.prog_name(xdp_id) == xdp.PROG_NAME
    assert len(ours["prog_id"]) >= 2 and ours["map_id"]  # the reuseport program too, and their maps
    for w in workers:  # the workers hold no program, map or link: only their listeners
        assert kernel.bpf_fd_ids(w) == {"prog_id": set(), "map_id": set(), "link_id": set()}, w

    for pid in (supervisor, *workers):
        os.kill(pid, signal.SIGKILL)
    b.proc.wait(GONE_S)
    for w in workers:
        wait_dead(w)

    deadline = time.monotonic() + GONE_S
    while (left := leftovers(ours)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"left in the kernel after kill -9: {left}"
    assert lab.xdp_prog_id() == 0 and xdp_on(lab) == "", xdp_on(lab)
    assert not [i for i in kernel.prog_ids() if i == xdp_id]
    # A SIGKILL skips the restore; the value and the record of the original are still there.
    assert lab.sysctl("net.ipv4.tcp_fastopen") == "3"
    assert os.path.exists(tfo.record_path(str(data)))

    again = NsBroker(lab, data, tmp_path / "broker2.log", ("--ebpf", "off")).start()
    try:
        assert lab.sysctl("net.ipv4.tcp_fastopen") == "1"
        assert "set /proc/sys/net/ipv4/tcp_fastopen to 3 (was 1): restored to 1" in again.log()
        assert not os.path.exists(tfo.record_path(str(data)))
    finally:
        assert again.stop() == 0


STALE_LOADER = """
import os, sys
from pyroute2 import IPRoute
from bpf.xdp import XdpClassifier, XDP_FLAGS_DRV_MODE
x = XdpClassifier(sys.argv[1], 1, [2])
with IPRoute() as ipr:  # how brokers before BPF links attached, and what they left when killed
    ipr.link("set", index=ipr.link_lookup(ifname=sys.argv[1])[0],
             xdp={"attrs": [("IFLA_XDP_FD", x.prog_fd), ("IFLA_XDP_FLAGS", XDP_FLAGS_DRV_MODE)]})
os._exit(0)  # no cleanup: a kill -9
"""


def test_a_stale_netlink_attached_program_of_ours_is_detached_at_start(lab, ns_broker) -> None:
    lab.run([sys.executable, "-c", STALE_LOADER, lab.ns_if])
    stale = lab.xdp_prog_id()
    assert stale != 0 and kernel.prog_name(stale) == xdp.PROG_NAME
    assert kernel.prog_holders(stale) == []  # its loader is gone: only the interface keeps it

    b = ns_broker("--ebpf", "on", "--xdp-iface", lab.ns_if, cores=1)
    assert (
        f"detached stale ringlog XDP program {xdp.PROG_NAME} (id {stale}, native mode) on {lab.ns_if}, "
        "left by a broker that did not exit cleanly" in b.log()
    )
    assert lab.xdp_prog_id() not in (0, stale)  # ours, through a link
    assert stale not in kernel.prog_ids()
    assert b.stop() == 0
    assert lab.xdp_prog_id() == 0


@pytest.mark.parametrize("backend", ["uvloop", "io_uring"])
def test_stats_over_the_wire_show_steering_and_xdp_without_the_data_dir(
    lab, ns_broker, tmp_path: Path, backend: str
) -> None:
    b = ns_broker("--ebpf", "on", "--xdp-iface", lab.ns_if, "--backend", backend)
    pings = 3
    for i in range(pings):
        assert (
            membership.ping(b.host, b.membership_port, TEST_KEYRING, sequence=i, timeout=2).kind == wire.ACK
        )
    wait_fresh(b.bpf, time.time())
    elsewhere = tmp_path / "elsewhere"  # a machine without the data dir: no ./data, no --data-dir
    elsewhere.mkdir()
    cmd = [sys.executable, "-m", "broker.cli", "stats", "-b", b.bootstrap]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}  # the worktree's broker, from another cwd
    text = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout
    assert re.search(r"ebpf steering: on, .*live cores \[0, 1\]; new connections: by_payload \d+", text), text
    m = re.search(rf"xdp on {lab.ns_if} \(native\): packets membership (\d+), partition (\d+)", text)
    assert m and int(m[1]) >= pings and int(m[2]) > 0, text
    raw = subprocess.run(
        [*cmd, "--format", "json"], cwd=elsewhere, env=env, capture_output=True, text=True, check=True
    ).stdout
    doc = json.loads(raw)
    assert doc["bpf"]["steering"] is True and doc["bpf"]["port"] == b.port
    assert doc["bpf"]["xdp"]["classes"]["membership"] >= pings
    assert len(doc["snapshots"]) == 2


RESTORE = """
import sys
from bpf import tfo
print(tfo.restore_recorded(sys.argv[1]))
"""


def test_the_next_start_leaves_a_sysctl_changed_since_or_of_another_namespace(lab, tmp_path: Path) -> None:
    """The record's two guards, on the real sysctl of the lab's namespace (bpf/tfo.py rules)."""
    data = str(tmp_path / "data")
    lab.run(["sysctl", "-qw", "net.ipv4.tcp_fastopen=5"])  # someone changed it after the broker set 3
    lab.run([sys.executable, "-c", f"from bpf import tfo; tfo.record({data!r}, 1, 3)"])
    out = lab.run([sys.executable, "-c", RESTORE, data])
    assert "it is 5 now, changed since: left as it is" in out, out
    assert lab.sysctl("net.ipv4.tcp_fastopen") == "5"
    assert not os.path.exists(tfo.record_path(data))

    tfo.record(data, 1, 5)  # written in the host's namespace: only the file, no sysctl touched
    out = lab.run([sys.executable, "-c", RESTORE, data])
    assert "in another network namespace: not restored here" in out, out
    assert lab.sysctl("net.ipv4.tcp_fastopen") == "5"
