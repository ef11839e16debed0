"""One core's settings, as the worker builds them from the supervisor's spec.

Apart from the handlers so that the node (which builds it), the forwarding logic and the backends
(which read it) need not import request handling. `bpf_snapshot` is how the core learns what the
eBPF plane is doing without importing `bpf/`: the worker hands it `bpf.state.read` bound to the data
dir; the default says "no plane", as in unit tests. Likewise `make_adapters` is how the backends get
the protocols they serve without importing them: the worker hands in the function that makes them
over a core (broker/core/adapter.py `MakeAdapters`, typed there: that module imports this one, so
this one names the type loosely); the default, None, serves nothing, as in unit tests of the core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.core.cluster_view import ClusterSettings
from broker.core.limits import Limits
from broker.core.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT
from broker.security.sasl import SaslConfig
from broker.security.tls import TlsConfig
from broker.storage.cleaner import CleanerConfig
from broker.storage.log import LogConfig


def no_bpf_snapshot() -> dict[str, Any] | None:
    return None


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    data_dir: str = "./data"
    host: str = "127.0.0.1"
    port: int = 9092
    node_id: int = 0
    cores: int = 1
    core_id: int = 0
    log_defaults: LogConfig = field(default_factory=LogConfig)
    cleaner: CleanerConfig = field(
        default_factory=CleanerConfig
    )  # the log cleaner's (broker/core/cleaning.py)
    core_ports: tuple[int, ...] = ()  # each core's direct port, for Metadata (empty: unknown)
    peer_addresses: tuple[str, ...] = ()  # each core's inter-core unix socket (abstract: "\0...")
    peer_liveness_fd: int = -1  # the supervisor's liveness table (broker/core/liveness.py); -1: none
    backend: str = "uvloop"
    limits: Limits = field(default_factory=Limits)
    # how long a group that was empty waits for more members before its first generation (Kafka's
    # group.initial.rebalance.delay.ms): broker/core/coordinator.py
    group_initial_rebalance_delay_ms: int = 3000
    # transactions (broker/core/txn_coordinator.py): the longest transaction timeout a producer may
    # ask (Kafka's transaction.max.timeout.ms) and how often timed-out transactions are aborted
    transaction_max_timeout_ms: int = 900_000
    transaction_abort_interval_ms: int = 10_000
    # partitions of __transaction_state when a coordinator makes it (Kafka's
    # transaction.state.log.num.partitions; only the first creation reads it)
    transaction_state_partitions: int = 50
    # how long an idle transactional id is kept (Kafka's transactional.id.expiration.ms)
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # how often each core looks for hanging transactions in the partitions it leads
    # (broker/core/txn_sweep.py)
    transaction_hang_check_interval_ms: int = 60_000
    # the supervisor's eBPF snapshot (bpf/state.py: `steering`, counters), or None without a plane
    bpf_snapshot: Callable[[], dict[str, Any] | None] = no_bpf_snapshot
    # a node of a cluster (docs/CLUSTER.md): its store calls and replication settings; None: alone
    cluster: ClusterSettings | None = None
    # SASL on the client listeners (broker/security/sasl.py); off by default
    sasl: SaslConfig = field(default_factory=SaslConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)  # TLS on the client listeners (broker/security/tls.py)
    super_users: tuple[str, ...] = ()  # principals the ACLs never refuse (broker/security/acls.py)
    advertised_host: str = ""  # the host Metadata names (clients connect, TLS verifies it); "": `host`
    # topic configs whose broker default a `broker serve` flag set (described STATIC_BROKER_CONFIG,
    # broker/core/topic_configs.py), the others built in
    static_configs: frozenset[str] = frozenset()
    # auto topic creation (Kafka's auto.create.topics.enable, on there too): a Metadata request
    # of either protocol that allows it creates the topics it names that do not exist, with
    # `default_partitions` partitions (Kafka's num.partitions) and the topic config defaults
    auto_create_topics: bool = True
    default_partitions: int = 1
    # how long an idempotent producer's state is kept after its last write (Kafka's
    # producer.id.expiration.ms, KIP-854: one day): broker/core/producer_state.py `expire_idle`
    producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT
    # the protocols' adapters over a core, made by the worker: a `MakeAdapters` (see above)
    make_adapters: Callable[[Any], Any] | None = None

    @property
    def public_host(self) -> str:
        return self.advertised_host or self.host

    @property
    def authorizing(self) -> bool:
        """ACLs apply exactly when clients authenticate: SASL, or mutual TLS."""
        return self.sasl.enabled or bool(self.tls.client_ca)
