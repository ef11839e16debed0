"""A throwaway cluster network for tests and benchmarks: a Linux bridge on the host, one network
namespace per broker node and per etcd member, each joined to the bridge by a veth pair, all in
one /24; etcd members and `broker serve` processes started inside them; and the nemesis's faults
(kill, stop, pause, isolate, restart) applied to them.

Test and bench harness, not broker code, like labkit/netlab.py.

Rules this module keeps:
- Everything made here is removed by `close()` (also on `__exit__` and at interpreter exit, so a
  failing test or an interrupted benchmark cleans up): processes are killed by pid (brokers by
  their process group: supervisor and workers), host-side veths and the bridge are deleted,
  namespaces are removed. Names and the subnet carry this process's pid and a counter, and a
  subnet already on a host interface is skipped, so concurrent runs and leftovers never collide.
- IPv6 is off on every interface before it comes up (its neighbour discovery would put packets of
  its own on the links, and tests count packets), as in netlab.
- Fixed addresses and ports, so that a restarted node is found where it was: node i is
  `<subnet>.(10+i)`, etcd member j `<subnet>.(100+j)`, the host (the bridge) `<subnet>.1`; every
  node listens on BROKER_PORT, its cores on CORE_PORTS_BASE+k, membership on MEMBERSHIP_PORT.
  Inside each namespace the veth is named `eth0`.
- Isolation blocks the node's bridge port (`bridge link set ... state disabled`): the bridge then
  drops every frame from and to that port, silently, both ways, as a dead switch port does. The
  node's interface stays up with its address and routes, so its loopback and its own address keep
  working (its supervisor and workers still talk to each other) and an XDP program on it stays
  attached; nothing is reported to its sockets, packets just vanish. This kernel has neither
  iptables nor the tc drop action (no act_gact), and `ip link set down` would fail the node's
  sends at once with "network unreachable" (the connected route goes) and drop carrier on the
  bridge port: a local error, not a partition.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from bpf import state
from labkit.brokerproc import membership_key_file

BROKER_PORT: Final = 9092
CORE_PORTS_BASE: Final = 9100
MEMBERSHIP_PORT: Final = 7946
ETCD_CLIENT_PORT: Final = 2379
ETCD_PEER_PORT: Final = 2380
NS_IF: Final = "eth0"  # the veth's name inside every namespace
NODE_HOST_BASE: Final = 10  # node i is <subnet>.(10+i)
ETCD_HOST_BASE: Final = 100  # etcd member j is <subnet>.(100+j)
PREFIX_LEN: Final = 24
ETCD_BIN: Final = "/usr/bin/etcd"
ETCDCTL_BIN: Final = "/usr/bin/etcdctl"
ETCD_TUNING: Final = ("--heartbeat-interval", "50", "--election-timeout", "500")
BROKER_START_S: Final = 30.0  # several brokers boot at once on a shared 2-CPU machine
ETCD_START_S: Final = 20.0
STOP_S: Final = 20.0
READY_RE: Final = re.compile(r"serving on [\d.]+:(\d+)")
CLONE_NEWNET: Final = 0x40000000
BR_STATE_FORWARDING: Final = 3
BLACKHOLE_MAC: Final = "02:00:00:00:0d:ad"  # locally administered, on no interface: `cut`
BR_STATE_DISABLED: Final = 0

_counter = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def lab_unavailable() -> str | None:
    """Why the lab cannot run here (None: it can): the tests' reason to skip."""
    if os.geteuid() != 0:
        return "the cluster lab needs root (network namespaces, a bridge, veths)"
    for tool in (ETCD_BIN, ETCDCTL_BIN, "ip", "bridge"):
        if shutil.which(tool) is None:
            return f"the cluster lab needs {tool}"
    return None


def sh(args: Sequence[str], check: bool = True) -> str:
    proc = subprocess.run(list(args), check=False, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def in_netns(name: str, fn: Callable[[], T]) -> T:
    """Run `fn()` in a new thread that has entered network namespace `name` (setns affects only
    the calling thread for a network namespace): every socket `fn` creates belongs to that
    namespace for good, whichever thread uses it later. No process is started."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({name}): {os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    t = threading.Thread(target=run, name=f"netns-{name}", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def tcp_connects(ip: str, port: int, timeout: float = 1.0) -> bool:
    try:
        socket.create_connection((ip, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def wait_until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def _free_subnet(start: int) -> str:
    """A 10.214.X /24 that no host interface has an address in (another run's bridge, a leftover)."""
    used = set(re.findall(r"inet 10\.214\.(\d+)\.", sh(["ip", "-4", "-o", "addr", "show"])))
    for k in range(250):
        x = (start + k) % 250 + 1
        if str(x) not in used:
            return f"10.214.{x}"
    raise RuntimeError("no free 10.214.X.0/24 subnet for the cluster lab")


def _ipv6_off(ifname: str) -> None:
    with contextlib.suppress(OSError), open(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "w") as f:
        f.write("1")


class Host:
    """A namespace `name` on the lab's bridge: `eth0` inside with `ip`, its peer `host_if` a port
    of the bridge."""

    def __init__(self, name: str, host_if: str, ip: str) -> None:
        self.name = name
        self.host_if = host_if
        self.ip = ip
        self.isolated = False
        self.cut_to: set[str] = set()  # addresses this namespace's packets to are dropped (`cut`)

    def create(self, bridge: str) -> None:
        name, host_if, ip = self.name, self.host_if, self.ip
        sh(["ip", "netns", "add", name])
        self.run(
            ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        )
        sh(["ip", "link", "add", host_if, "type", "veth", "peer", "name", NS_IF, "netns", name])
        _ipv6_off(host_if)
        sh(["ip", "link", "set", host_if, "master", bridge])
        sh(["ip", "link", "set", host_if, "up"])
        sh(["ip", "-n", name, "addr", "add", f"{ip}/{PREFIX_LEN}", "dev", NS_IF])
        sh(["ip", "-n", name, "link", "set", NS_IF, "up"])
        sh(["ip", "-n", name, "link", "set", "lo", "up"])

    def command(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def run(self, args: Sequence[str]) -> str:
        return sh(self.command(args))

    def call(self, fn: Callable[[], T]) -> T:
        return in_netns(self.name, fn)

    def connects(self, ip: str, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from inside this namespace to ip:port completes."""
        return self.call(lambda: tcp_connects(ip, port, timeout))

    def set_port_state(self, state: int) -> None:
        sh(["bridge", "link", "set", "dev", self.host_if, "state", str(state)])
        shown = sh(["bridge", "link", "show", "dev", self.host_if])
        want = "forwarding" if state == BR_STATE_FORWARDING else "disabled"
        if f"state {want}" not in shown:  # the kernel ignores some states silently (blocking without STP)
            raise RuntimeError(f"bridge port {self.host_if} did not go to {want}: {shown.strip()}")
        self.isolated = state != BR_STATE_FORWARDING

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            sh(["ip", "link", "del", self.host_if])
        with contextlib.suppress(RuntimeError):
            sh(["ip", "netns", "del", self.name])


class Proc:
    """A process started in a namespace as the leader of its own process group (a broker's
    supervisor and workers, or one etcd member), logging to `log_path`."""

    def __init__(self, host: Host, args: Sequence[str], log_path: Path) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                host.command(args), stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pid = self.popen.pid  # `ip netns exec` execs the command: this is its pid and pgid
        self.paused = False

    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        """This start's part of the log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def group_pids(self) -> list[int]:
        """Every live process of the group (the supervisor and its workers)."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    fields = stat[stat.rindex(")") + 2 :].split()
                    if int(fields[2]) == self.pid and fields[0] != "Z":
                        out.append(int(entry))
        return sorted(out)

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def kill(self) -> int:
        self.signal_group(signal.SIGKILL)
        return self.popen.wait(STOP_S)

    def stop(self) -> int:
        if self.paused:
            self.signal_group(signal.SIGCONT)
            self.paused = False
        if self.running():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.kill()
        self.signal_group(signal.SIGKILL)  # any worker the supervisor left behind
        return self.popen.returncode


class Node:
    """Broker node i: its namespace, data dir and log, and the `broker serve` running there."""

    def __init__(self, index: int, host: Host, base: Path) -> None:
        self.index = index
        self.host = host
        self.data_dir = base / f"node{index}" / "data"
        self.log_path = base / f"node{index}.log"
        self.data_dir.mkdir(parents=True)
        self.proc: Proc | None = None
        self.args: tuple[str, ...] = ()
        self.xdp = False

    @property
    def ip(self) -> str:
        return self.host.ip

    @property
    def bootstrap(self) -> str:
        return f"{self.host.ip}:{BROKER_PORT}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.running()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class EtcdMember:
    def __init__(self, index: int, host: Host, base: Path) -> None:
        self.index = index
        self.host = host
        self.name = f"m{index}"
        self.data_dir = base / f"etcd{index}"
        self.proc: Proc | None = None

    @property
    def ip(self) -> str:
        return self.host.ip

    @property
    def endpoint(self) -> str:
        return f"{self.host.ip}:{ETCD_CLIENT_PORT}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.running()


class ClusterLab:
    """`nodes` broker namespaces and `etcd_members` etcd namespaces on one bridge; etcd is started
    (and healthy) when the constructor returns, brokers by `start_node`."""

    def __init__(
        self,
        nodes: int = 3,
        etcd_members: int = 1,
        base_dir: Path | None = None,
        cores: int = 1,
        backend: str = "uvloop",
    ) -> None:
        n = next(_counter)
        pid = os.getpid()
        self.tag = f"{pid % 100000}x{n}"
        self.cores = cores
        self.backend = backend
        self.bridge = f"rlbr{self.tag}"
        self.subnet = _free_subnet(pid * 7 + n)
        self.bridge_ip = f"{self.subnet}.1"
        self._own_base = base_dir is None
        self.base = (
            Path(tempfile.mkdtemp(prefix=f"ringlog-lab-{self.tag}-")) if base_dir is None else base_dir
        )
        # etcd fsyncs every write: on tmpfs that costs nothing (the members are scratch)
        shm = Path("/dev/shm")
        self.etcd_base = Path(
            tempfile.mkdtemp(prefix=f"ringlog-etcd-{self.tag}-", dir=shm if shm.is_dir() else None)
        )
        self.hosts: list[Host] = []
        self.nodes: list[Node] = []
        self.etcd: list[EtcdMember] = []
        self.events: list[tuple[float, str]] = []  # (time.monotonic(), fault): what the nemesis did
        self._closed = False
        atexit.register(self.close)
        try:
            sh(["ip", "link", "add", self.bridge, "type", "bridge"])
            _ipv6_off(self.bridge)
            sh(["ip", "addr", "add", f"{self.bridge_ip}/{PREFIX_LEN}", "dev", self.bridge])
            sh(["ip", "link", "set", self.bridge, "up"])
            for i in range(nodes):
                host = self._add_host(f"ringlog-{pid}-{n}-node{i}", f"rlv{self.tag}n{i}", NODE_HOST_BASE + i)
                self.nodes.append(Node(i, host, self.base))
            for j in range(etcd_members):
                host = self._add_host(f"ringlog-{pid}-{n}-etcd{j}", f"rlv{self.tag}e{j}", ETCD_HOST_BASE + j)
                self.etcd.append(EtcdMember(j, host, self.etcd_base))
            if self.etcd:
                for j in range(len(self.etcd)):
                    self._spawn_etcd(j, "new")
                for m in self.etcd:
                    self._wait_etcd(m)
        except BaseException:
            self.close()
            raise

    def _add_host(self, name: str, host_if: str, last: int) -> Host:
        host = Host(name, host_if, f"{self.subnet}.{last}")
        self.hosts.append(host)  # before it is built: close() removes a half-built one
        host.create(self.bridge)
        return host

    # ------------------------------------------------------------------------- etcd

    @property
    def etcd_endpoints(self) -> str:
        """Every member's `ip:2379`, comma-separated (what `--etcd` takes)."""
        return ",".join(m.endpoint for m in self.etcd)

    def _spawn_etcd(self, j: int, state: str) -> None:
        m = self.etcd[j]
        cluster = ",".join(f"{e.name}=http://{e.ip}:{ETCD_PEER_PORT}" for e in self.etcd)
        args = [ETCD_BIN, "--name", m.name, "--data-dir", str(m.data_dir)]
        args += [
            "--listen-client-urls",
            f"http://{m.ip}:{ETCD_CLIENT_PORT},http://127.0.0.1:{ETCD_CLIENT_PORT}",
        ]
        args += ["--advertise-client-urls", f"http://{m.ip}:{ETCD_CLIENT_PORT}"]
        args += ["--listen-peer-urls", f"http://{m.ip}:{ETCD_PEER_PORT}"]
        args += ["--initial-advertise-peer-urls", f"http://{m.ip}:{ETCD_PEER_PORT}"]
        args += ["--initial-cluster", cluster, "--initial-cluster-token", f"ringlog-{self.tag}"]
        args += ["--initial-cluster-state", state, *ETCD_TUNING, "--logger", "zap", "--log-level", "warn"]
        m.proc = Proc(m.host, args, self.base / f"etcd{j}.log")

    def _wait_etcd(self, m: EtcdMember) -> None:
        def healthy() -> bool:
            assert m.proc is not None
            if not m.proc.running():
                raise RuntimeError(f"etcd member {m.index} exited:\n{m.proc.log()}")
            return self._etcd_get(m, "/health").get("health") == "true"

        wait_until(healthy, ETCD_START_S, f"etcd member {m.index} to be healthy")

    def _etcd_get(self, m: EtcdMember, path: str, body: dict | None = None, timeout: float = 1.0) -> dict:
        url = f"http://{m.endpoint}{path}"
        data = None if body is None else json.dumps(body).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as resp:
                return json.loads(resp.read())
        except (OSError, ValueError):
            return {}

    def etcd_status(self, j: int) -> dict:
        """Member j's /v3/maintenance/status ({} when it does not answer)."""
        return self._etcd_get(self.etcd[j], "/v3/maintenance/status", {})

    def etcd_leader(self) -> int | None:
        """The index of the member the live members agree leads (None: no leader, or no agreement)."""
        ids: dict[str, int] = {}
        leaders: set[str] = set()
        for m in self.etcd:
            if not m.running() or m.host.isolated:
                continue
            st = self.etcd_status(m.index)
            if st:
                ids[st["header"]["member_id"]] = m.index
                leaders.add(st.get("leader", "0"))
        if len(leaders) != 1:
            return None
        return ids.get(leaders.pop())

    def wait_etcd_leader(self, timeout: float = 10.0) -> int:
        found: list[int] = []

        def has() -> bool:
            leader = self.etcd_leader()
            if leader is not None:
                found.append(leader)
            return leader is not None

        wait_until(has, timeout, "an etcd leader", step=0.1)
        return found[-1]

    def kill_etcd(self, j: int) -> None:
        m = self.etcd[j]
        if m.proc is not None and m.proc.running():
            self._event(f"kill etcd {j}")
            m.proc.kill()

    def restart_etcd(self, j: int) -> None:
        """Start member j again on its data dir (it rejoins the cluster it was in)."""
        self.kill_etcd(j)
        self._spawn_etcd(j, "existing")
        self._wait_etcd(self.etcd[j])

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """etcdctl (API v3) from the host against the live members."""
        live = ",".join(m.endpoint for m in self.etcd if m.running())
        env = {**os.environ, "ETCDCTL_API": "3"}
        cmd = [ETCDCTL_BIN, f"--endpoints={live}", "--command-timeout=3s", "--dial-timeout=1s", *args]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    # ------------------------------------------------------------------------- nodes

    def node_args(self, i: int, extra: Sequence[str] = (), xdp: bool = False) -> list[str]:
        """The `broker serve` command line of node i: fixed address and ports, the lab's defaults
        (uvloop, eBPF off unless XDP is asked for), then `extra` (which wins: argparse keeps the
        last value of a repeated option)."""
        node = self.nodes[i]
        args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(node.data_dir)]
        args += ["--allow-plaintext"]
        args += ["--host", node.ip, "--port", str(BROKER_PORT), "--core-ports", str(CORE_PORTS_BASE)]
        args += ["--membership-port", str(MEMBERSHIP_PORT), "--cores", str(self.cores), "--oversubscribe"]
        args += ["--membership-key-file", str(membership_key_file(self.base))]  # the lab's cluster key
        args += ["--backend", self.backend]
        args += ["--ebpf", "auto", "--xdp-iface", NS_IF] if xdp else ["--ebpf", "off"]
        return [*args, *extra]

    def start_node(
        self, i: int, extra_args: Sequence[str] = (), xdp: bool = False, wait: bool = True
    ) -> Node:
        """Run `broker serve` in node i's namespace with `extra_args` (the cluster flags; none: a
        plain single broker). `wait`: return once it accepts connections on its port."""
        node = self.nodes[i]
        if node.running():
            raise RuntimeError(f"node {i} is running")
        node.args, node.xdp = tuple(extra_args), xdp
        node.proc = Proc(node.host, self.node_args(i, extra_args, xdp), node.log_path)
        if wait:
            self.wait_node(i)
        return node

    def start_nodes(
        self, extra_args: Callable[[int], Sequence[str]] | Sequence[str] = (), xdp: bool = False
    ) -> None:
        """Start every node at once (`extra_args`: the same for all, or a function of the node's
        index), then wait for all."""
        for node in self.nodes:
            extra = extra_args(node.index) if callable(extra_args) else extra_args
            self.start_node(node.index, extra, xdp=xdp, wait=False)
        for node in self.nodes:
            self.wait_node(node.index)

    def wait_node(self, i: int, timeout: float = BROKER_START_S) -> None:
        node = self.nodes[i]
        proc = node.proc
        assert proc is not None

        def ready() -> bool:
            if not proc.running():
                raise RuntimeError(f"node {i} exited with {proc.popen.returncode}:\n{proc.log()}")
            return bool(READY_RE.search(proc.log())) and node.host.connects(node.ip, BROKER_PORT)

        wait_until(ready, timeout, f"node {i} to serve")

    def _proc(self, i: int) -> Proc:
        proc = self.nodes[i].proc
        if proc is None:
            raise RuntimeError(f"node {i} was never started")
        return proc

    def kill(self, i: int) -> int:
        """SIGKILL to node i's whole process group (a crash of the machine's broker)."""
        proc = self._proc(i)
        self._event(f"kill node {i}")
        proc.paused = False
        return proc.kill()

    def stop(self, i: int) -> int:
        """SIGTERM to node i's supervisor (a graceful shutdown); its exit status."""
        proc = self._proc(i)
        self._event(f"stop node {i}")
        return proc.stop()

    def pause(self, i: int) -> None:
        """SIGSTOP to node i's process group: supervisor and workers freeze (a long GC pause, a VM
        stall); the kernel still completes TCP handshakes into their listen backlogs."""
        proc = self._proc(i)
        self._event(f"pause node {i}")
        proc.signal_group(signal.SIGSTOP)
        proc.paused = True

    def resume(self, i: int) -> None:
        proc = self._proc(i)
        self._event(f"resume node {i}")
        proc.signal_group(signal.SIGCONT)
        proc.paused = False

    def restart(self, i: int, graceful: bool = False, wait: bool = True) -> Node:
        """Kill (or, `graceful`, stop) node i and start it again with the same arguments on the
        same data dir, address and ports."""
        node = self.nodes[i]
        if node.running():
            self.stop(i) if graceful else self.kill(i)
        self._event(f"start node {i}")
        return self.start_node(i, node.args, xdp=node.xdp, wait=wait)

    def isolate(self, i: int) -> None:
        """Cut node i off from every other node, etcd and the host (see the module's rules)."""
        self._event(f"isolate node {i}")
        self.nodes[i].host.set_port_state(BR_STATE_DISABLED)

    def heal(self, i: int) -> None:
        self._event(f"heal node {i}")
        self.nodes[i].host.set_port_state(BR_STATE_FORWARDING)

    def cut(self, a: int, b: int, both: bool = True) -> None:
        """Drop what node a sends to node b (and, `both`, what b sends to a), silently, leaving
        everything else alone: the partial and one-way partitions membership must survive. Done
        with a permanent neighbour entry in a's namespace giving b's address a MAC nobody has:
        the bridge floods those frames and every interface discards them."""
        self._event(f"cut node {a} -> node {b}" + (" both ways" if both else ""))
        self._cut(self.nodes[a].host, self.nodes[b].host)
        if both:
            self._cut(self.nodes[b].host, self.nodes[a].host)

    def mend(self, a: int, b: int) -> None:
        """Undo `cut(a, b)` (both ways)."""
        self._event(f"mend node {a} - node {b}")
        for src, dst in ((a, b), (b, a)):
            self._mend(self.nodes[src].host, self.nodes[dst].host)

    def partition(self, *groups: Sequence[int]) -> None:
        """Cut every node of each group off from every node of the other groups (nodes in no group
        and etcd keep reaching everyone): e.g. `partition([0], [1, 2])`."""
        for gi, group in enumerate(groups):
            for other in groups[gi + 1 :]:
                for a in group:
                    for b in other:
                        self.cut(a, b)

    def _cut(self, src: Host, dst: Host) -> None:
        neigh = [dst.ip, "lladdr", BLACKHOLE_MAC, "dev", NS_IF, "nud", "permanent"]
        sh(["ip", "-n", src.name, "neigh", "replace", *neigh])
        src.cut_to.add(dst.ip)

    def _mend(self, src: Host, dst: Host) -> None:
        if dst.ip in src.cut_to:
            sh(["ip", "-n", src.name, "neigh", "del", dst.ip, "dev", NS_IF], check=False)
            src.cut_to.discard(dst.ip)

    def isolate_etcd(self, j: int) -> None:
        self._event(f"isolate etcd {j}")
        self.etcd[j].host.set_port_state(BR_STATE_DISABLED)

    def heal_etcd(self, j: int) -> None:
        self._event(f"heal etcd {j}")
        self.etcd[j].host.set_port_state(BR_STATE_FORWARDING)

    def heal_all(self) -> None:
        """Undo every isolation and cut."""
        self._event("heal all")
        by_ip = {h.ip: h for h in self.hosts}
        for host in self.hosts:
            if host.isolated:
                host.set_port_state(BR_STATE_FORWARDING)
            for ip in list(host.cut_to):
                self._mend(host, by_ip[ip])

    def _event(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    def last_fault(self) -> float:
        """When (time.monotonic()) the last nemesis call was made: the `fault_at` of
        `clusterchecker.failover_time`."""
        return self.events[-1][0]

    def in_node(self, i: int, fn: Callable[[], T]) -> T:
        """`fn()` run in node i's namespace (sockets it makes are node i's)."""
        return self.nodes[i].host.call(fn)

    def xdp_counters(self, i: int, after: float | None = None, timeout: float = 5.0) -> dict[str, int] | None:
        """Node i's XDP classifier counters (membership, partition, other, malformed_dropped: packets
        into its namespace's eth0) from its supervisor's bpf.json snapshot, rewritten about once a
        second; `after` (a time.time()): wait for a snapshot taken later than that. None without
        XDP on the node or before its first snapshot."""
        deadline = time.monotonic() + timeout
        while True:
            doc = state.read(str(self.nodes[i].data_dir)) or {}
            fresh = after is None or float(doc.get("time", 0)) > after
            xdp = doc.get("xdp")
            if fresh and xdp and "classes" in xdp:
                return dict(xdp["classes"])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    # ------------------------------------------------------------------------- cleanup

    def names(self) -> dict[str, list[str]]:
        """What this lab made on the host: namespaces and links (for leak checks)."""
        return {
            "netns": [h.name for h in self.hosts],
            "links": [self.bridge, *(h.host_if for h in self.hosts)],
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        for member in (*self.nodes, *self.etcd):
            if member.proc is not None:
                with contextlib.suppress(Exception):
                    member.proc.signal_group(signal.SIGCONT)
                    member.proc.kill()
        for host in self.hosts:
            host.remove()
        with contextlib.suppress(RuntimeError):
            sh(["ip", "link", "del", self.bridge])
        shutil.rmtree(self.etcd_base, ignore_errors=True)
        if self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> ClusterLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
