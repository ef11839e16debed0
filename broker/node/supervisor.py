"""The supervisor: makes every socket, starts one pinned worker per core, restarts the ones that die.

Rules this module keeps:
- The supervisor holds every listening socket for the broker's lifetime and hands copies to the
  workers (inherited fds). A worker that dies loses nothing but its accepted connections: new ones
  queue in the backlog of the sockets the supervisor still holds until the restarted worker takes
  them. Per core k: (a) its member of the public SO_REUSEPORT group on HOST:PORT, (b) its direct
  TCP listener (`--core-ports BASE`: BASE+k; 0: the port it had at the last start on this data
  dir, `core-ports.json`, if still free, else ephemeral: Kafka clients hold on to the ports
  Metadata named), (c) its inter-core unix listener in the
  abstract namespace, `\\0ringlog-<supervisor pid>-<port>-core-<k>`.
- Worker k is pinned to one CPU of the supervisor's affinity set (`worker_cpus`: k modulo that
  set when oversubscribed; a node of a cluster starts at its node id's place in the set, its
  id - 1 times its cores, so the nodes of one machine spread over its CPUs). Workers die with the supervisor
  (PR_SET_PDEATHSIG, broker/node/worker.py).
- "serving on HOST:PORT" is logged once, when every worker has reported ready; a worker that
  exits before it is first ready fails the whole start (exit 1, with the reason).
- A worker that dies later is restarted at once. One that dies again before it has been up
  (ready) for `RESTART_FAST_S` is in a crash loop: each such death in a row doubles the delay
  before the next start, from `RESTART_BACKOFF_FIRST_S` up to `RESTART_BACKOFF_MAX_S` (a few
  seconds: a worker killed by an operator or the OOM killer again soon after a restart must not
  stay away for long). A worker that stays up `RESTART_FAST_S` starts the count afresh.
- Liveness (broker/core/liveness.py): the supervisor keeps one byte per core in a memfd every worker
  maps: up from the worker's ready report until it is reaped. Forwarding cores read it so that a
  forward to a dead worker's core is answered NOT_OWNER at once instead of waiting in the backlog
  of the inter-core listener, which the supervisor holds, for the restart.
- SIGTERM/SIGINT are forwarded to the workers (graceful: they answer in-flight requests and
  flush); the supervisor exits 0 when all of them exited 0, 1 otherwise. A node of a cluster
  first drains (Kafka's controlled shutdown, broker/cluster/agent.py): its leaderships move to
  other in-sync replicas while its workers still serve (they answer NOT_LEADER_OR_FOLLOWER /
  NOT_COORDINATOR from then on, so clients move on at once), on a thread while this loop keeps
  answering membership and reaping; then it sends LEFT, leaves the store and signals the
  workers. LEFT goes after the drain: the others' controller revokes the session of a node that
  left, which would turn the handover into a failover.
- One broker per data directory: the supervisor holds the data dir's lock, which every worker
  inherits (broker/node/startup.py, with the other checks made before any worker starts).
- The supervisor does no request work: the optional Prometheus endpoint (`--metrics-port`,
  broker/node/metrics_http.py) runs on threads of its own and reads only the workers' published
  metrics files.
- eBPF (bpf/plane.py, `--ebpf auto|on|off`): the supervisor loads the steering program before any
  worker starts, puts core k's public listener at index k of the sockmap, keeps the live-cores map,
  publishes the counters to `<data_dir>/run/bpf.json` each second, and detaches everything (and
  restores the TFO sysctl if it set it) when it exits, whatever the exit path. Killed with SIGKILL,
  the kernel detaches all of it (XDP hangs on a BPF link only the supervisor holds), and the next
  start restores the sysctl and removes stale XDP programs of older brokers (bpf/plane.py).
- Live cores: a core is live while its worker runs or is being restarted at once: its listener
  still queues connections and no other core can serve its partitions, so sending its connections
  elsewhere would only add a forward to a dead peer. A worker that keeps dying at start (restart
  delayed by the backoff) leaves the live set until it reports ready again, so new connections are
  not parked for seconds in a backlog nobody accepts from; they land on a live core, which answers
  everything but that core's partitions (those get NOT_OWNER, retriable).
- The membership endpoint (broker/node/membership.py) is a UDP socket on the same host, port
  `--membership-port` (default for a node of a cluster: the broker's TCP port number; a single
  node opens none unless that flag names one), answered from the supervisor's loop. Every endpoint
  needs the cluster key (`--membership-key-file`): packets not signed with it are dropped unread.
  It runs a SWIM node (broker/cluster/swim.py): `--node-id` and `--join` make it part of a cluster.
  Its timer is the selector's timeout. Every change of the view is written atomically to
  `<data_dir>/run/members.json` and passed to `on_member_event` (the cluster agent's hook, whose
  states are `State` members of ringlog_proto.membership, never strings); SIGTERM sends a graceful LEFT first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from bpf.kernel import BpfError
from bpf.plane import EbpfPlane
from broker.backends.uring_options import (
    APPEND_WRITES_DEFAULT,
    FETCH_SENDS_DEFAULT,
    FLUSH_SYNCS_DEFAULT,
    busy_poll_for,
)
from broker.cluster.swim import MemberEvent, Swim
from broker.core.limits import Limits
from broker.core.liveness import LivenessTable
from broker.core.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT
from broker.core.topics import TopicRegistry
from broker.node.listeners import Sockets, make_sockets, remember_core_ports, remembered_core_ports
from broker.node.membership import SwimEndpoint, read_keyring
from broker.node.startup import StartError, prepare_data_dir, raise_nofile_limit
from broker.security.credentials import SECURITY_DIR
from broker.security.sasl import INTER_BROKER_PASSWORD_ENV, SaslConfig
from broker.security.tls import TlsConfig
from broker.storage import layout
from broker.storage.cleaner import CleanerConfig
from broker.storage.durable_file import replace_json
from broker.storage.log import LogConfig
from ringlog_proto.membership import Member

if TYPE_CHECKING:
    from broker.cluster.agent import ClusterAgent

log = logging.getLogger("broker.node.supervisor")

START_TIMEOUT_S = 60.0  # every worker must be ready within this, plus the time below per partition
# What opening one stored partition may take at start on a loaded machine (a recovery after
# kill -9 measured ~0.65 ms here at 10 000 partitions, a clean start ~0.1 ms): a node holding
# 100k partitions must not be stopped for being slow at what it was asked to hold.
START_TIMEOUT_PER_PARTITION_S = 0.002
# After SIGTERM, workers still running after STOP_TIMEOUT_S plus the time below per stored
# partition are killed. A clean stop syncs what each partition wrote since its last flush and
# writes its producer snapshot (broker/core/lifecycle.py): measured ~0.3-0.5 ms a partition here
# at 20 000. A stop killed for being slow leaves no clean marker, and the next start recovers
# every partition (~1 ms each at 100 000): the kill costs more than the wait it saves.
STOP_TIMEOUT_S = 30.0
STOP_TIMEOUT_PER_PARTITION_S = 0.001
RESTART_FAST_S = 10.0  # a worker dying sooner than this after it was ready is in a crash loop
RESTART_BACKOFF_FIRST_S = 0.25  # the delay after the second death in a row; it doubles from there
RESTART_BACKOFF_MAX_S = 2.0
TICK_S = 0.2
BPF_PUBLISH_S = 1.0  # bpf.json (counters for `broker stats`) is rewritten this often
MEMBERS_FILE = "members.json"  # under <data_dir>/run/: the membership view, rewritten on every change


def stored_partitions(data_dir: str) -> int:
    """The partition directories under `data_dir` (what a start opens and a stop closes)."""
    stored = 0
    with contextlib.suppress(OSError), os.scandir(layout.topics_dir(data_dir)) as topics:
        for topic in topics:
            with contextlib.suppress(OSError):
                stored += len(os.listdir(topic.path))
    return stored


def start_timeout_s(data_dir: str) -> float:
    """How long the workers may take to be ready: START_TIMEOUT_S and
    START_TIMEOUT_PER_PARTITION_S for each partition directory stored (every one with files is
    opened, and after a crash recovered, before a worker serves)."""
    return START_TIMEOUT_S + START_TIMEOUT_PER_PARTITION_S * stored_partitions(data_dir)


def stop_timeout_s(data_dir: str) -> float:
    """How long the workers may take to stop after SIGTERM (see STOP_TIMEOUT_PER_PARTITION_S)."""
    return STOP_TIMEOUT_S + STOP_TIMEOUT_PER_PARTITION_S * stored_partitions(data_dir)


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    port: int = 9092
    cores: int = 1
    core_ports_base: int = 0
    backend: str = "auto"
    log_level: str = "INFO"
    busy_poll_us: int | None = None  # io_uring backend options (broker/backends/uring_options.py)
    append_writes: str = APPEND_WRITES_DEFAULT
    flush_syncs: str = FLUSH_SYNCS_DEFAULT
    fetch_sends: str = FETCH_SENDS_DEFAULT
    metrics_port: int | None = None
    log_defaults: LogConfig = field(default_factory=LogConfig)
    static_configs: frozenset[str] = frozenset()  # topic configs whose default a flag set
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)
    ebpf: str = "auto"  # bpf/plane.py: auto | on | off
    xdp_iface: str | None = None
    xdp_mode: str = "auto"
    tcp_fastopen_sysctl: bool = False  # set net.ipv4.tcp_fastopen's server bit (restored at exit)
    membership_port: int | None = None  # None: a node of a cluster uses its TCP port's number, a
    # single node has none; -1: no endpoint
    membership_key_file: str | None = None  # membership.read_keyring: every endpoint needs the key
    limits: Limits = field(default_factory=Limits)  # broker/core/limits.py, docs/LIMITS.md
    group_initial_rebalance_delay_ms: int = 3000  # broker/core/coordinator.py
    transaction_max_timeout_ms: int = 900_000  # broker/core/txn_coordinator.py
    transaction_abort_interval_ms: int = 10_000
    transaction_state_partitions: int = 50
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    transaction_hang_check_interval_ms: int = 60_000  # broker/core/txn_sweep.py
    auto_create_topics: bool = True  # broker/core/config.py
    default_partitions: int = 1
    producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT  # broker/core/producer_state.py
    sasl: SaslConfig = field(default_factory=SaslConfig)  # broker/security/sasl.py
    tls: TlsConfig = field(default_factory=TlsConfig)  # broker/security/tls.py
    super_users: tuple[str, ...] = ()  # broker/security/acls.py
    advertised_host: str = ""  # what Metadata tells clients to connect to; "": --host
    node_id: int = 0  # cluster node id (u32); 0: a single node
    join: tuple[tuple[str, int], ...] = ()  # seed membership addresses (host, udp port)
    rack: str = ""
    weight: int = 100
    etcd: tuple[str, ...] = ()  # the metadata store's endpoints; empty: a single node
    cluster_name: str = "ringlog"
    default_replication: int = 3
    min_insync: int = 2
    replica_lag_max_ms: int = 10_000
    unclean_election: bool = False
    reassign_after_s: float = 0.0
    session_ttl_s: int = 2  # broker/cluster/agent.py: SESSION_TTL_S


def worker_cpus(cpus: Sequence[int], cores: int, node_id: int) -> list[int]:
    """The CPU each worker is pinned to, from the supervisor's affinity set `cpus` (sorted).

    Why a node of a cluster starts at its node id's place (node id - 1 times its cores, around
    the set): every node sees the same set, and nodes of one machine (a test cluster, a bench, a
    small deployment) would all pin their first worker to the same CPU while the others idle;
    nodes of equal cores numbered from 1 then take CPUs of their own while there are enough.
    Measured with three one-core nodes on a 2-CPU VM, acks=all one at a time (bench/scale.py
    R4): p50 1.15-1.18 -> 0.94-1.01 ms on uvloop, 1.30-1.33 -> 1.07 ms on io_uring. On a machine
    of its own a node only starts elsewhere in the set, which costs nothing; a single node (id 0)
    starts at the first CPU as before."""
    first = (node_id - 1) * cores % len(cpus) if node_id > 0 else 0
    return [cpus[(first + k) % len(cpus)] for k in range(cores)]


@dataclass(slots=True)
class Worker:
    """What the supervisor knows of core `core`'s worker process."""

    core: int
    cpu: int
    fds: tuple[int, int, int]  # public listener, direct listener, inter-core listener
    proc: subprocess.Popen[bytes] | None = None
    ready_r: int = -1
    ready: bool = False
    started_at: float = 0.0
    ready_at: float | None = None  # when it last reported ready
    fast_failures: int = 0
    restart_at: float | None = None
    pid_buffer: bytes = b""
    stopped_rc: int | None = None  # exit status when it stopped during shutdown


def restart_delay(w: Worker, was_ready: bool, now: float) -> float:
    """How long to wait before starting `w` again after it died at `now` (module rules): at once
    after a death in a stable run, a doubling delay up to `RESTART_BACKOFF_MAX_S` in a crash loop."""
    if was_ready and w.ready_at is not None and now - w.ready_at >= RESTART_FAST_S:
        w.fast_failures = 0
    w.fast_failures += 1  # deaths in a row without a stable run, this one included
    if w.fast_failures <= 1:
        return 0.0
    return float(min(RESTART_BACKOFF_FIRST_S * 2 ** (w.fast_failures - 2), RESTART_BACKOFF_MAX_S))


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class Supervisor:
    """Runs the workers of one broker. Single-threaded apart from the optional metrics server."""

    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config
        self.cpus = sorted(os.sched_getaffinity(0))
        self.workers: list[Worker] = []
        self.sockets: Sockets | None = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._announced = False
        self._worker_backend = "?"
        self._lock_fd = -1
        self.ebpf = EbpfPlane(config.data_dir, config.ebpf)
        self.membership: SwimEndpoint | None = None
        self.on_member_event: Callable[[MemberEvent], None] | None = None  # the cluster agent's hook
        self.agent: ClusterAgent | None = None  # a node of a cluster (--etcd): broker/cluster/agent.py
        self._live: frozenset[int] = frozenset()
        self._bpf_published_at = 0.0
        self.liveness: LivenessTable | None = None

    # ------------------------------------------------------------------------- entry point

    def run(self) -> int:
        """Start, supervise and stop the workers; the process exit status."""
        try:
            # before any worker: they inherit the limit, and serve with the limits it allows
            limits = raise_nofile_limit(self.config.limits)
        except ValueError as exc:
            print(f"broker: {exc}", file=sys.stderr)
            return 1
        self.config = replace(self.config, limits=limits)
        try:
            c = self.config
            self._lock_fd = prepare_data_dir(c.data_dir, c.log_defaults, c.limits)
            try:
                # compiled before the listeners exist
                self.ebpf.prepare(self.config.cores, xdp_or_tfo=bool(c.xdp_iface) or c.tcp_fastopen_sysctl)
            except BpfError as exc:
                raise StartError(str(exc)) from exc
            remembered = remembered_core_ports(self.config.data_dir, self.config.host)
            self.sockets = make_sockets(
                self.config.host,
                self.config.port,
                self.config.cores,
                self.config.core_ports_base,
                remembered,
            )
            if self.sockets.direct_ports != remembered:
                remember_core_ports(self.config.data_dir, self.config.host, self.sockets.direct_ports)
        except StartError as exc:
            print(f"broker: {exc}", file=sys.stderr)
            self.ebpf.close()
            return 1
        except OSError as exc:
            print(f"broker: cannot serve on {self.config.host}:{self.config.port}: {exc}", file=sys.stderr)
            self.ebpf.close()
            return 1
        s = self.sockets
        self.liveness = LivenessTable(self.config.cores)
        cpus = worker_cpus(self.cpus, self.config.cores, self.config.node_id)
        for k in range(self.config.cores):
            fds = (s.public[k].fileno(), s.direct[k].fileno(), s.peer[k].fileno())
            self.workers.append(Worker(k, cpus[k], fds))
        metrics_server = None
        try:
            try:
                self._start_membership()
                self._start_agent()
                self._load_ebpf()  # right after the listeners: steered from their first connection
                if self.config.metrics_port is not None:
                    # here: it reads the workers' snapshots with the core's metrics code, which a
                    # broker without --metrics-port need not import at every start
                    from broker.node.metrics_http import serve_metrics  # noqa: PLC0415

                    metrics_server = serve_metrics(
                        self.config.host, self.config.metrics_port, self.config.data_dir, self.config.cores
                    )
            except StartError as exc:
                print(f"broker: {exc}", file=sys.stderr)
                return 1
            except OSError as exc:
                print(
                    f"broker: cannot serve metrics on port {self.config.metrics_port}: {exc}", file=sys.stderr
                )
                return 1
            self._install_signals()
            for w in self.workers:
                self._spawn(w)
            return self._loop()
        finally:
            if metrics_server is not None:
                metrics_server.shutdown()
            if self.agent is not None:
                self.agent.stop()
            self.ebpf.close()  # before the listeners close: the kernel's hash takes over, then they go
            if self.membership is not None:
                self.membership.sock.close()
            for sock in (*s.public, *s.direct, *s.peer):
                sock.close()
            if self.liveness is not None:
                self.liveness.close()

    def _start_membership(self) -> None:
        assert self.sockets is not None
        port = self.config.membership_port
        clustered = self.config.node_id != 0 or bool(self.config.join)
        if port is not None and port < 0:
            if clustered:
                raise StartError("--node-id/--join need the membership endpoint (--membership-port)")
            return
        if port is None and not clustered:
            return  # a single node opens no UDP port it was not asked for
        if self.config.membership_key_file is None:
            raise StartError(
                "the membership endpoint needs the cluster key (--membership-key-file; docs/CLUSTER.md)"
            )
        try:
            keyring = read_keyring(self.config.membership_key_file)
            mode = os.stat(self.config.membership_key_file).st_mode
        except (OSError, ValueError) as exc:
            raise StartError(f"--membership-key-file: {exc}") from exc
        if mode & 0o077:
            log.warning(
                "%s is readable by other users (mode %o): whoever reads the cluster key can forge "
                "membership packets; chmod 600 it",
                self.config.membership_key_file,
                mode & 0o777,
            )
        port = self.sockets.port if port is None else port
        family = socket.getaddrinfo(self.config.host, port, type=socket.SOCK_DGRAM)[0][0]
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.bind((self.config.host, port))
        except OSError as exc:
            sock.close()
            raise StartError(f"cannot serve membership on udp {self.config.host}:{port}: {exc}") from exc
        c = self.config
        me = Member(
            c.node_id,
            c.host,
            self.sockets.port,
            sock.getsockname()[1],
            tuple(self.sockets.direct_ports),
            c.cores,
            c.weight,
            c.rack,
        )
        # A restart's incarnation is its start time: higher than any the old process refuted up to.
        now = time.monotonic()
        swim = Swim(me, keyring, rng=random.Random(), now=now, incarnation=int(time.time()) & 0xFFFFFFFF)
        self.membership = SwimEndpoint(sock, swim)
        self._selector.register(sock, selectors.EVENT_READ, self.membership)
        log.info("membership endpoint on udp %s:%d (node %d)", c.host, me.membership_port, c.node_id)
        self._write_members()
        if c.join:
            swim.join(list(c.join), now)
            self.membership.flush()

    def _membership_changed(self) -> None:
        """Publish the view after the SWIM node changed it, then tell the hook (if any)."""
        assert self.membership is not None
        events = self.membership.swim.take_events()
        if not events:
            return
        for ev in events:
            m = ev.view.member
            log.info(
                "member %d (%s:%d) %s, incarnation %d",
                m.node_id,
                m.host,
                m.port,
                ev.kind.value,
                ev.view.incarnation,
            )
        self._write_members()
        if self.on_member_event is not None:
            for ev in events:
                try:
                    self.on_member_event(ev)
                except Exception:  # the hook's bug must not stop the workers' supervision
                    log.exception("on_member_event failed for %s", ev)

    def _write_members(self) -> None:
        assert self.membership is not None
        swim = self.membership.swim
        doc = {"node_id": swim.me.node_id, "members": [v.to_json() for v in swim.members()]}
        try:
            replace_json(os.path.join(layout.run_dir(self.config.data_dir), MEMBERS_FILE), doc)
        except OSError as exc:
            log.warning("cannot write %s: %s", MEMBERS_FILE, exc)

    def _load_ebpf(self) -> None:
        """Load the eBPF plane (bpf/plane.py decides per --ebpf); every core starts live."""
        assert self.sockets is not None
        s = self.sockets
        self.ebpf.port = s.port
        try:
            self.ebpf.load(
                s.public,
                xdp_iface=self.config.xdp_iface,
                xdp_mode=self.config.xdp_mode,
                membership_port=self.membership.sock.getsockname()[1] if self.membership else 0,
                partition_ports=(s.port, *s.direct_ports),
                set_tfo_sysctl=self.config.tcp_fastopen_sysctl,
            )
        except BpfError as exc:
            raise StartError(str(exc)) from exc
        self._set_live(frozenset(range(self.config.cores)))

    def _set_live(self, live: frozenset[int]) -> None:
        if live != self._live:
            if self._live:
                log.info("live cores for steering: %s", sorted(live))
            self._live = live
            self.ebpf.set_live(live)

    def _update_live(self) -> None:
        """The live set by the module rules: all but the workers waiting out a restart backoff."""
        self._set_live(frozenset(w.core for w in self.workers if w.fast_failures <= 1 or w.ready))

    def _publish_bpf(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._bpf_published_at >= BPF_PUBLISH_S:
            self._bpf_published_at = now
            if self.membership is not None:
                self.ebpf.membership = self.membership.counters()
            self.ebpf.publish()

    # ------------------------------------------------------------------------- workers

    def _spawn(self, w: Worker) -> None:
        assert self.sockets is not None
        ready_r, ready_w = os.pipe()
        spec = {
            "core": w.core,
            "cores": self.config.cores,
            "supervisor_pid": os.getpid(),
            "data_dir": self.config.data_dir,
            "host": self.config.host,
            "port": self.sockets.port,
            "core_ports": self.sockets.direct_ports,
            "peer_addresses": self.sockets.peer_addresses,
            "liveness_fd": self.liveness.fd if self.liveness is not None else -1,
            "backend": self.config.backend,
            "uring": {
                "busy_poll_us": busy_poll_for(self.config.busy_poll_us, self.config.cores, len(self.cpus)),
                "append_writes": self.config.append_writes,
                "flush_syncs": self.config.flush_syncs,
                "fetch_sends": self.config.fetch_sends,
            },
            "log_level": self.config.log_level,
            "log_defaults": asdict(self.config.log_defaults),
            "static_configs": sorted(self.config.static_configs),
            "cleaner": asdict(self.config.cleaner),
            "limits": self.config.limits.to_spec(),
            "group_initial_rebalance_delay_ms": self.config.group_initial_rebalance_delay_ms,
            "transaction_max_timeout_ms": self.config.transaction_max_timeout_ms,
            "transaction_abort_interval_ms": self.config.transaction_abort_interval_ms,
            "transaction_state_partitions": self.config.transaction_state_partitions,
            "transactional_id_expiration_ms": self.config.transactional_id_expiration_ms,
            "transaction_hang_check_interval_ms": self.config.transaction_hang_check_interval_ms,
            "auto_create_topics": self.config.auto_create_topics,
            "default_partitions": self.config.default_partitions,
            "producer_id_expiration_ms": self.config.producer_id_expiration_ms,
            "sasl": {
                "mechanisms": list(self.config.sasl.mechanisms),
                "plain_without_tls": self.config.sasl.plain_without_tls,
                # the password goes in the worker's environment, never on its command line
                "inter_broker_user": login.user if (login := self.config.sasl.inter_broker) else None,
            },
            "tls": asdict(self.config.tls),
            "super_users": list(self.config.super_users),
            "advertised_host": self.config.advertised_host,
            "node_id": self.config.node_id,
            "cluster": self._cluster_spec(),
            "fds": list(w.fds),
            "ready_fd": ready_w,
        }
        try:
            env = None
            if self.config.sasl.inter_broker is not None:
                env = {**os.environ, INTER_BROKER_PASSWORD_ENV: self.config.sasl.inter_broker.password}
            w.proc = subprocess.Popen(
                [sys.executable, "-m", "broker.node.worker_process", "--spec", json.dumps(spec)],
                env=env,
                # the lock: see the module rules; the liveness table: broker/core/liveness.py
                pass_fds=(*w.fds, ready_w, self._lock_fd, *self._liveness_fds()),
            )
        finally:
            os.close(ready_w)
        try:
            os.sched_setaffinity(w.proc.pid, {w.cpu})
        except OSError as exc:  # it exited already; the loop will see it
            log.warning("cannot pin core %d (pid %d) to cpu %d: %s", w.core, w.proc.pid, w.cpu, exc)
        w.ready_r = ready_r
        w.ready = False
        w.started_at = time.monotonic()
        w.restart_at = None
        self._selector.register(ready_r, selectors.EVENT_READ, w)

    def _cluster_spec(self) -> dict[str, object] | None:
        c = self.config
        if not c.etcd:
            return None
        return {
            "endpoints": list(c.etcd),
            "name": c.cluster_name,
            "default_replication": c.default_replication,
            "min_insync": c.min_insync,
            "unclean_election": c.unclean_election,
            "replica_lag_max_ms": c.replica_lag_max_ms,
        }

    def _start_agent(self) -> None:
        """Join the cluster's store (module rules): registered, the cluster read and published
        for the workers before they start; SWIM's deaths passed to the agent as a signal."""
        c = self.config
        if not c.etcd:
            return
        from broker.cluster.agent import AgentConfig, ClusterAgent  # noqa: PLC0415 (a single node never loads etcd's client)
        from broker.cluster.records import NodeRecord  # noqa: PLC0415
        from broker.cluster.store import StoreError  # noqa: PLC0415

        assert self.sockets is not None
        membership_port = self.membership.sock.getsockname()[1] if self.membership is not None else 0
        node = NodeRecord(
            c.node_id,
            c.host,
            self.sockets.port,
            tuple(self.sockets.direct_ports),
            membership_port,
            c.weight,
            c.rack,
        )
        registry = TopicRegistry(c.data_dir, c.log_defaults, remove_orphans=False, limits=c.limits)
        agent = ClusterAgent(
            AgentConfig(
                node,
                c.etcd,
                c.cluster_name,
                unclean_election=c.unclean_election,
                reassign_after_s=c.reassign_after_s,
                default_replication=c.default_replication,
                session_ttl_s=c.session_ttl_s,
            ),
            layout.run_dir(c.data_dir),
            registry,
            security_dir=os.path.join(c.data_dir, SECURITY_DIR),
        )
        try:
            agent.start()
        except StoreError as exc:
            agent.stop()
            raise StartError(
                f"cannot join cluster {c.cluster_name!r} through etcd {','.join(c.etcd)}: {exc}"
            ) from exc
        self.agent = agent

        # ringlog_proto.membership.State on both sides: no string of another case can make every event miss.
        self.on_member_event = lambda ev: agent.member_changed(ev.view.member.node_id, ev.kind)

    def _liveness_fds(self) -> tuple[int, ...]:
        return (self.liveness.fd,) if self.liveness is not None else ()

    def _set_up(self, w: Worker, up: bool) -> None:
        if self.liveness is not None:
            self.liveness.set(w.core, up)

    def _on_ready_pipe(self, w: Worker) -> None:
        try:
            data = os.read(w.ready_r, 256)
        except OSError:
            data = b""
        if data:
            w.pid_buffer += data
            if b"\n" in w.pid_buffer and not w.ready:
                w.ready = True
                w.ready_at = time.monotonic()
                self._set_up(w, True)
                backend = w.pid_buffer.split()[2].decode() if len(w.pid_buffer.split()) > 2 else "?"
                if self._announced:
                    log.info("worker core %d restarted: pid %d ready", w.core, w.proc.pid if w.proc else -1)
                self._worker_backend = backend
            return
        self._selector.unregister(w.ready_r)
        os.close(w.ready_r)
        w.ready_r = -1
        w.pid_buffer = b""

    def _reap(self) -> StartError | None:
        """Handle every worker that exited: restart it, or fail the start if it never was ready."""
        now = time.monotonic()
        for w in self.workers:
            if w.proc is None or w.proc.poll() is None:
                continue
            rc = w.proc.returncode
            pid = w.proc.pid
            w.proc = None
            if w.ready_r >= 0:
                self._selector.unregister(w.ready_r)
                os.close(w.ready_r)
                w.ready_r = -1
            was_ready, w.ready = w.ready, False
            self._set_up(w, False)
            if self._stopping:
                w.stopped_rc = rc
                log.info("worker core %d (pid %d) stopped: %s", w.core, pid, describe_exit(rc))
                continue
            if not self._announced:
                return StartError(
                    f"worker for core {w.core} (pid {pid}) exited before it was ready ({describe_exit(rc)}); "
                    "its log lines above say why"
                )
            delay = restart_delay(w, was_ready, now)
            log.warning(
                "worker core %d (pid %d) died: %s; restarting%s",
                w.core,
                pid,
                describe_exit(rc),
                f" in {delay:.2f} s (it keeps dying at start)" if delay else "",
            )
            w.restart_at = now + delay
        return None

    def _announce(self) -> None:
        assert self.sockets is not None
        self._announced = True
        for w in self.workers:
            assert w.proc is not None
            log.info(
                "core %d: pid %d, cpu %d, direct port %d",
                w.core,
                w.proc.pid,
                w.cpu,
                self.sockets.direct_ports[w.core],
            )
        log.info(
            "serving on %s:%d (%d cores, backend %s, data dir %s)",
            self.config.host,
            self.sockets.port,
            self.config.cores,
            self._worker_backend,
            os.path.abspath(self.config.data_dir),
        )

    # ------------------------------------------------------------------------- the loop

    def _install_signals(self) -> None:
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        signal.set_wakeup_fd(self._wake_w)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)

        def stop(signum: int, _frame: object) -> None:
            self._stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector

    def _loop(self) -> int:
        start_timeout = start_timeout_s(self.config.data_dir)
        start_deadline = time.monotonic() + start_timeout
        signalled = False
        drain: threading.Thread | None = None
        stop_deadline = 0.0
        stop_timeout = STOP_TIMEOUT_S
        while True:
            timeout = TICK_S
            if self.membership is not None:
                timeout = min(timeout, self.membership.timeout(time.monotonic()))
            for key, _ in self._selector.select(timeout):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 512)
                elif isinstance(key.data, SwimEndpoint):
                    key.data.on_readable(time.monotonic())
                else:
                    self._on_ready_pipe(key.data)
            if self.membership is not None:
                self.membership.poll(time.monotonic())
                self._membership_changed()
            failure = self._reap()
            if not self._stopping:
                self._update_live()
            self._publish_bpf()
            now = time.monotonic()
            if failure is None and not self._announced and now > start_deadline:
                failure = StartError(f"the workers were not all ready within {start_timeout:.0f} s")
            if failure is not None:
                print(f"broker: {failure}", file=sys.stderr)
                self._stop_workers(signal.SIGTERM)
                self._wait_all(STOP_TIMEOUT_S)
                return 1
            if self._stopping:
                if not signalled and self.agent is not None and drain is None:
                    drain = threading.Thread(target=self._drain, args=(self.agent,), daemon=True)
                    drain.start()
                if not signalled and drain is not None and drain.is_alive():
                    continue  # leaderships moving: membership is answered, workers serve
                if not signalled:
                    if self.membership is not None:
                        self.membership.swim.leave(now)  # LEFT, not DEAD: the others need not wait
                        self.membership.flush()
                    if self.agent is not None:
                        self.agent.stop()  # leave the store first: leaderships move at once
                        self.agent = None
                    log.info("stopping: SIGTERM to every worker")
                    self._stop_workers(signal.SIGTERM)
                    signalled = True
                    stop_timeout = stop_timeout_s(self.config.data_dir)
                    stop_deadline = now + stop_timeout
                if all(w.proc is None for w in self.workers):
                    failed = [w.core for w in self.workers if w.stopped_rc not in (0, None)]
                    if failed:
                        log.error("worker(s) of core(s) %s did not stop cleanly", failed)
                        return 1
                    log.info("stopped cleanly")
                    return 0
                if now > stop_deadline:
                    log.error("workers still running %.0f s after SIGTERM: killing them", stop_timeout)
                    self._stop_workers(signal.SIGKILL)
                continue
            if not self._announced and all(w.ready for w in self.workers):
                self._announce()
            for w in self.workers:
                if w.proc is None and w.restart_at is not None and now >= w.restart_at:
                    self._spawn(w)

    def _drain(self, agent: ClusterAgent) -> None:
        """The drain's thread: hand this node's leaderships over, then wake the loop."""
        try:
            agent.drain()
        except Exception:  # a bug here must not keep the node from stopping
            log.exception("draining failed; stopping anyway")
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    def _stop_workers(self, sig: int) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(sig)
            w.restart_at = None

    def _wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()


def run_supervisor(config: SupervisorConfig) -> int:
    return Supervisor(config).run()
