"""`broker serve`: a broker's options and the supervisor they start (broker/node/supervisor.py), one
worker process per core.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys

from broker.backends.uring_options import (
    APPEND_WRITES,
    APPEND_WRITES_DEFAULT,
    BUSY_POLL_US_DEFAULT,
    FETCH_SENDS,
    FETCH_SENDS_DEFAULT,
    FLUSH_SYNCS,
    FLUSH_SYNCS_DEFAULT,
)
from broker.core.limits import add_limit_arguments, limits_from_args
from broker.core.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT
from broker.node.logfmt import LOG_LEVELS
from broker.security.credentials import CredentialError, check_user_name
from broker.security.exposure import exposure_warnings, is_loopback_only, is_wildcard
from broker.security.sasl import (
    INTER_BROKER_PASSWORD_ENV,
    MECHANISMS,
    InterBrokerLogin,
    SaslConfig,
    parse_mechanisms,
)
from broker.security.tls import TlsConfig, peer_context, server_context
from broker.storage.cleaner import CleanerConfig
from broker.storage.log import LogConfig


def _inter_broker(args: argparse.Namespace) -> InterBrokerLogin | None:
    """`--inter-broker-user` and its password (from a file or the environment: never argv, where
    `ps` would show it); raises ValueError saying what is missing or wrong."""
    if args.inter_broker_user is None:
        if args.inter_broker_password_file:
            raise ValueError("--inter-broker-password-file needs --inter-broker-user")
        return None
    if not args.etcd or not args.sasl_mechanisms:
        raise ValueError("--inter-broker-user is for a cluster (--etcd) with SASL (--sasl-mechanisms)")
    try:
        user = check_user_name(args.inter_broker_user)
    except CredentialError as exc:
        raise ValueError(f"--inter-broker-user: {exc}") from exc
    if args.inter_broker_password_file:
        try:
            with open(args.inter_broker_password_file) as f:
                password = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise ValueError(f"--inter-broker-password-file: {exc}") from exc
    else:
        password = os.environ.get(INTER_BROKER_PASSWORD_ENV, "")
    if not password:
        raise ValueError(
            "--inter-broker-user needs its password: "
            f"--inter-broker-password-file or ${INTER_BROKER_PASSWORD_ENV}"
        )
    return InterBrokerLogin(user, password)


def private_data_dir(data_dir: str, log: logging.Logger) -> None:
    """Make what this process and its workers create private (0700 directories, 0600 files:
    segments, indexes, run files, the security files), whatever mode each is opened with: the
    data dir holds every record and the salted credentials. A data dir that exists already
    (made by an earlier version, 0755) keeps its mode, with a warning: it is the operator's."""
    os.umask(0o077)
    try:
        mode = os.stat(data_dir).st_mode & 0o777
    except FileNotFoundError:
        return
    if mode & 0o077:
        log.warning(
            "data dir %s has mode %04o: other users of this machine may read the records and the "
            "salted credentials in it (chmod 700 it; docs/SECURITY.md)",
            data_dir,
            mode,
        )


class FlagDefault(int):
    """An int flag's default, told apart from the same value given on the command line (argparse
    converts only what is given): a topic config whose default a flag set is described as the
    broker's static config (STATIC_BROKER_CONFIG), one left alone as built in."""


# flag's attribute -> the topic config whose broker default it is
TOPIC_DEFAULT_FLAGS = {
    "segment_bytes": "segment.bytes",
    "segment_ms": "segment.ms",
    "max_batch_bytes": "max.message.bytes",
    "retention_ms": "retention.ms",
    "retention_bytes": "retention.bytes",
    "log_cleaner_delete_retention_ms": "delete.retention.ms",
    "log_cleaner_min_compaction_lag_ms": "min.compaction.lag.ms",
    "log_cleaner_max_compaction_lag_ms": "max.compaction.lag.ms",
}
# string and float flags whose default is None: given, they are static broker configs
TOPIC_DEFAULT_VALUE_FLAGS = {
    "log_cleanup_policy": "cleanup.policy",
    "log_cleaner_min_cleanable_ratio": "min.cleanable.dirty.ratio",
}


def static_topic_configs(args: argparse.Namespace, clustered: bool) -> frozenset[str]:
    """The topic configs whose broker default a flag given on the command line set."""
    given = {
        config
        for attr, config in TOPIC_DEFAULT_FLAGS.items()
        if not isinstance(getattr(args, attr), FlagDefault)
    }
    given |= {config for attr, config in TOPIC_DEFAULT_VALUE_FLAGS.items() if getattr(args, attr) is not None}
    if clustered and not isinstance(args.min_insync_replicas, FlagDefault):
        given.add("min.insync.replicas")
    if clustered and args.unclean_leader_election:
        given.add("unclean.leader.election.enable")
    return frozenset(given)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the supervisor, which runs one worker process per core (broker/node/supervisor.py)."""
    from broker.core.topics import segment_floor_violation  # noqa: PLC0415
    from broker.node.backend_choice import BackendUnavailable, choose_backend  # noqa: PLC0415
    from broker.node.supervisor import SupervisorConfig, run_supervisor  # noqa: PLC0415 - keep client commands light

    available = len(os.sched_getaffinity(0))
    cores = available if args.cores is None else args.cores
    if cores < 1:
        print(f"broker: --cores must be at least 1, not {cores}", file=sys.stderr)
        return 2
    if cores > available and not args.oversubscribe:
        print(
            f"broker: --cores {cores} is more than the {available} CPU(s) this process may run on; "
            "use --oversubscribe to run several workers per CPU",
            file=sys.stderr,
        )
        return 2
    try:
        sasl = SaslConfig(
            parse_mechanisms(args.sasl_mechanisms), args.sasl_plain_without_tls, _inter_broker(args)
        )
    except ValueError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 2
    tls = TlsConfig(args.tls_cert or "", args.tls_key or "", args.tls_client_ca or "", args.tls_peer_ca or "")
    if bool(tls.cert) != bool(tls.key) or ((tls.client_ca or tls.peer_ca) and not tls.cert):
        print(
            "broker: --tls-cert and --tls-key go together; --tls-client-ca and --tls-peer-ca need both",
            file=sys.stderr,
        )
        return 2
    if tls.enabled:
        try:
            server_context(tls)  # fail here, with the file named, rather than in every worker
            if args.etcd:
                peer_context(tls)
        except (OSError, ssl.SSLError) as exc:
            print(f"broker: TLS: cannot load the certificate, key or CA: {exc}", file=sys.stderr)
            return 2
    super_users = tuple(u.strip() for u in args.super_users.split(";") if u.strip())
    for u in super_users:
        if not u.startswith("User:") or u == "User:":
            print(f"broker: --super-users: {u!r} is not a principal (User:<name>)", file=sys.stderr)
            return 2
    if args.etcd and sasl.enabled and sasl.peer_mechanism(tls.enabled) is None:
        print(
            "broker: the nodes of a cluster log in to each other with the first of SCRAM-SHA-512, "
            "SCRAM-SHA-256 or PLAIN (PLAIN over TLS or with --sasl-plain-without-tls) that "
            "--sasl-mechanisms offers: it offers none of them here",
            file=sys.stderr,
        )
        return 2
    if args.etcd and sasl.enabled and sasl.inter_broker is None:
        print(
            "broker: with SASL in a cluster (--etcd) each node logs in to the others: give "
            "--inter-broker-user and its password "
            f"(--inter-broker-password-file or ${INTER_BROKER_PASSWORD_ENV}), "
            "a user made with `broker users add --etcd` (docs/SECURITY.md)",
            file=sys.stderr,
        )
        return 2
    if not args.allow_plaintext and not sasl.enabled and not tls.enabled and not is_loopback_only(args.host):
        print(
            f"broker: --host {args.host} can be reached from other machines, and this broker has no "
            "TLS or SASL: anyone who reaches it could read, write and delete every topic. "
            "Enable TLS (--tls-cert, --tls-key) and SASL (--sasl-mechanisms SCRAM-SHA-512, users from "
            "`broker users add`), or pass "
            "--allow-plaintext to serve it in plaintext anyway (docs/SECURITY.md)",
            file=sys.stderr,
        )
        return 2
    if is_wildcard(args.host) and not args.advertised_host:
        print(
            f"broker: --host {args.host or repr(args.host)} listens on every interface, which no client "
            "can connect to: give --advertised-host, the name or address clients reach this broker "
            "by (Metadata tells them it)",
            file=sys.stderr,
        )
        return 2
    log = logging.getLogger("broker.serve")
    for warning in exposure_warnings(
        args.host, tls.enabled, sasl.enabled, "PLAIN" in sasl.mechanisms and sasl.plain_without_tls
    ):
        log.warning("%s (docs/SECURITY.md)", warning)
    private_data_dir(args.data_dir, log)
    if args.ebpf == "off" and (args.xdp_iface or args.tcp_fastopen_sysctl):
        print("broker: --xdp-iface and --tcp-fastopen-sysctl need --ebpf auto or on", file=sys.stderr)
        return 2
    if args.backend == "io_uring":
        try:
            choose_backend("io_uring")
        except BackendUnavailable as exc:
            print(f"broker: --backend io_uring: {exc}", file=sys.stderr)
            return 2
    defaults = LogConfig(
        segment_bytes=int(args.segment_bytes),
        max_batch_bytes=int(min(args.max_batch_bytes, args.segment_bytes)),
        retention_ms=None if args.retention_ms < 0 else int(args.retention_ms),
        retention_bytes=None if args.retention_bytes < 0 else int(args.retention_bytes),
        segment_ms=None if args.segment_ms < 0 else int(args.segment_ms),
        cleanup_policy=args.log_cleanup_policy or LogConfig().cleanup_policy,
        delete_retention_ms=int(args.log_cleaner_delete_retention_ms),
        min_compaction_lag_ms=int(args.log_cleaner_min_compaction_lag_ms),
        max_compaction_lag_ms=(
            None
            if args.log_cleaner_max_compaction_lag_ms < 0
            else int(args.log_cleaner_max_compaction_lag_ms)
        ),
        min_cleanable_dirty_ratio=(
            LogConfig().min_cleanable_dirty_ratio
            if args.log_cleaner_min_cleanable_ratio is None
            else args.log_cleaner_min_cleanable_ratio
        ),
    )
    if args.default_partitions < 1:
        print("broker: --default-partitions must be >= 1", file=sys.stderr)
        return 2
    if args.producer_id_expiration_ms < 1:
        print("broker: --producer-id-expiration-ms must be >= 1", file=sys.stderr)
        return 2
    cleaner = CleanerConfig(
        enabled=args.log_cleaner_enable == "on",
        dedupe_buffer_bytes=args.log_cleaner_dedupe_buffer_size,
        io_max_bytes_per_s=(
            None
            if args.log_cleaner_io_max_bytes_per_second <= 0
            else args.log_cleaner_io_max_bytes_per_second
        ),
        backoff_ms=args.log_cleaner_backoff_ms,
    )
    if (reason := cleaner.invalid()) is not None:
        print(f"broker: log cleaner: {reason}", file=sys.stderr)
        return 2
    if args.group_initial_rebalance_delay_ms < 0:
        print("broker: --group-initial-rebalance-delay-ms must be >= 0", file=sys.stderr)
        return 2
    transaction_values = (
        args.transaction_max_timeout_ms,
        args.transaction_abort_interval_ms,
        args.transactional_id_expiration_ms,
        args.transaction_state_partitions,
        args.transaction_hang_check_interval_ms,
    )
    if min(transaction_values) < 1:
        print(
            "broker: --transaction-max-timeout-ms, --transaction-abort-interval-ms, "
            "--transactional-id-expiration-ms, --transaction-state-partitions and "
            "--transaction-hang-check-interval-ms must be >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        limits = limits_from_args(args)
    except ValueError as exc:
        print(f"broker: {exc}", file=sys.stderr)
        return 2
    reason = defaults.invalid() or segment_floor_violation(
        defaults.segment_bytes, defaults.segment_ms, limits
    )
    if reason is not None:
        print(f"broker: {reason}", file=sys.stderr)
        return 2
    try:
        join = parse_join(args.join)
    except ValueError as exc:
        print(f"broker: --join: {exc}", file=sys.stderr)
        return 2
    if not 0 <= args.node_id <= 0xFFFFFFFF or not 0 < args.weight <= 0xFFFF or len(args.rack.encode()) > 255:
        print("broker: --node-id is a u32, --weight 1..65535, --rack at most 255 bytes", file=sys.stderr)
        return 2
    if join and args.node_id == 0:
        print("broker: --join needs --node-id (a nonzero id, distinct in the cluster)", file=sys.stderr)
        return 2
    etcd = tuple(e.strip() for e in args.etcd.split(",") if e.strip())
    if etcd and not 0 < args.node_id <= MAX_CLUSTER_NODE_ID:
        print(
            f"broker: --etcd needs --node-id 1..{MAX_CLUSTER_NODE_ID}, distinct in the cluster",
            file=sys.stderr,
        )
        return 2
    if args.session_timeout_s < 1:
        print("broker: --session-timeout-s is at least 1", file=sys.stderr)
        return 2
    if etcd and (args.default_replication_factor < 1 or args.min_insync_replicas < 1):
        print(
            "broker: --default-replication-factor and --min-insync-replicas are at least 1", file=sys.stderr
        )
        return 2
    config = SupervisorConfig(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        cores=cores,
        core_ports_base=args.core_ports,
        backend=args.backend,
        log_level=args.log_level,
        metrics_port=args.metrics_port,
        log_defaults=defaults,
        static_configs=static_topic_configs(args, bool(etcd)),
        cleaner=cleaner,
        busy_poll_us=args.busy_poll_us,
        append_writes=args.append_writes,
        flush_syncs=args.flush_syncs,
        fetch_sends=args.fetch_sends,
        ebpf=args.ebpf,
        xdp_iface=args.xdp_iface,
        xdp_mode=args.xdp_mode,
        tcp_fastopen_sysctl=args.tcp_fastopen_sysctl,
        membership_port=args.membership_port,
        membership_key_file=args.membership_key_file,
        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
        transaction_max_timeout_ms=args.transaction_max_timeout_ms,
        transaction_abort_interval_ms=args.transaction_abort_interval_ms,
        transaction_state_partitions=args.transaction_state_partitions,
        transactional_id_expiration_ms=args.transactional_id_expiration_ms,
        transaction_hang_check_interval_ms=args.transaction_hang_check_interval_ms,
        auto_create_topics=args.auto_create_topics,
        default_partitions=args.default_partitions,
        producer_id_expiration_ms=args.producer_id_expiration_ms,
        sasl=sasl,
        tls=tls,
        super_users=super_users,
        advertised_host=args.advertised_host,
        limits=limits,
        node_id=args.node_id,
        join=join,
        rack=args.rack,
        weight=args.weight,
        etcd=etcd,
        cluster_name=args.cluster_name,
        default_replication=args.default_replication_factor,
        min_insync=int(args.min_insync_replicas),
        replica_lag_max_ms=args.replica_lag_time_max_ms,
        unclean_election=args.unclean_leader_election,
        reassign_after_s=args.reassign_after_s,
        session_ttl_s=args.session_timeout_s,
    )
    return run_supervisor(config)


MAX_CLUSTER_NODE_ID = 2_000_000  # Kafka broker ids are node * 1000 + core, an int32


def parse_join(text: str) -> tuple[tuple[str, int], ...]:
    """`host:port[,host:port...]` (an IPv6 host in brackets) as (host, port) pairs."""
    seeds = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    return tuple(seeds)


def add_serve_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = sub.add_parser("serve", help="run a broker")
    serve.add_argument("--log-level", default=argparse.SUPPRESS, type=str.upper, choices=LOG_LEVELS)
    serve.add_argument("--data-dir", default="./data", help="where topics live (default ./data)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument(
        "--tls-cert", metavar="PEM", help="serve TLS on the client listeners: certificate chain"
    )
    serve.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    serve.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="require client certificates signed by these CAs (mutual TLS; the subject is the principal)",
    )
    serve.add_argument(
        "--sasl-mechanisms",
        default="",
        metavar="M[,M...]",
        help=f"require SASL on the client listeners with these mechanisms (of {', '.join(MECHANISMS)}; "
        "default none: no authentication)",
    )
    serve.add_argument(
        "--super-users",
        default="",
        metavar="User:A;User:B",
        help="principals the ACLs never refuse (ACLs apply when SASL or --tls-client-ca is on)",
    )
    serve.add_argument(
        "--tls-peer-ca",
        metavar="PEM",
        help="in a cluster: the CAs that signed the other nodes' certificates (default --tls-client-ca, "
        "else the system's); a node's certificate must name its address",
    )
    serve.add_argument(
        "--inter-broker-user",
        metavar="NAME",
        help="in a cluster with SASL: the user this node logs in to the others as (a super user); "
        f"its password from --inter-broker-password-file or ${INTER_BROKER_PASSWORD_ENV}",
    )
    serve.add_argument(
        "--inter-broker-password-file",
        metavar="FILE",
        help="the first line is --inter-broker-user's password",
    )
    serve.add_argument(
        "--sasl-plain-without-tls",
        action="store_true",
        help="offer PLAIN (which sends the password itself) on connections without TLS",
    )
    serve.add_argument(
        "--advertised-host",
        default="",
        metavar="NAME",
        help="the host Metadata tells clients to connect to (default --host; set it when --host is "
        "0.0.0.0, and to a name the TLS certificate carries)",
    )
    serve.add_argument(
        "--allow-plaintext",
        action="store_true",
        help="serve a --host other machines can reach without TLS or SASL (refused otherwise)",
    )
    serve.add_argument("--port", type=int, default=9092, help="TCP port (default 9092)")
    serve.add_argument(
        "--cores", type=int, default=None, help="worker processes, one pinned per CPU (default: all CPUs)"
    )
    serve.add_argument("--oversubscribe", action="store_true", help="allow --cores above the CPUs available")
    serve.add_argument(
        "--core-ports", type=int, default=0, metavar="BASE", help="core k listens directly on BASE+k (0: any)"
    )
    serve.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "io_uring", "uvloop"],
        help="auto: io_uring when it works here, else uvloop",
    )
    serve.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics over HTTP on this port"
    )
    serve.add_argument(
        "--busy-poll-us",
        type=int,
        default=None,
        metavar="US",
        help=f"io_uring: poll this long after activity before sleeping (default {BUSY_POLL_US_DEFAULT}, "
        "0 when --cores exceeds the CPUs)",
    )
    serve.add_argument(
        "--append-writes",
        default=APPEND_WRITES_DEFAULT,
        choices=list(APPEND_WRITES),
        help="io_uring: appends as ring writes, as a pwritev on the loop, or inline when small "
        f"(default {APPEND_WRITES_DEFAULT})",
    )
    serve.add_argument(
        "--flush-syncs",
        default=FLUSH_SYNCS_DEFAULT,
        choices=list(FLUSH_SYNCS),
        help="io_uring: a durable flush's fdatasync on the ring, on the loop, or on the loop when "
        f"nothing else waits and the disk is fast (default {FLUSH_SYNCS_DEFAULT})",
    )
    serve.add_argument(
        "--fetch-sends",
        default=FETCH_SENDS_DEFAULT,
        choices=list(FETCH_SENDS),
        help="io_uring: a fetch's records from the page cache copied to the socket, or spliced by "
        f"reference (default {FETCH_SENDS_DEFAULT}: faster on loopback)",
    )
    serve.add_argument(
        "--ebpf",
        default="auto",
        choices=["auto", "on", "off"],
        help="steer connections to the owning core in the kernel: auto loads the programs when root and "
        "bcc allow (else logs why and forwards in user space), on fails without them (default auto)",
    )
    serve.add_argument(
        "--xdp-iface",
        default=None,
        metavar="IFACE",
        help="attach the XDP classifier (membership/partition/other counters) to this interface",
    )
    serve.add_argument(
        "--xdp-mode",
        default="auto",
        choices=["auto", "native", "generic"],
        help="XDP attach mode (default auto)",
    )
    serve.add_argument(
        "--tcp-fastopen-sysctl",
        action="store_true",
        help="set net.ipv4.tcp_fastopen's server bit (0x2) in this netns so SYNs carry the first frame "
        "for steering; the old value is restored at exit (default: leave the sysctl alone)",
    )
    serve.add_argument(
        "--membership-port",
        type=int,
        default=None,
        metavar="UDP_PORT",
        help="UDP membership (SWIM) endpoint (default: none on a single node; with --node-id or "
        "--join, the TCP port's number; -1: none)",
    )
    serve.add_argument(
        "--membership-key-file",
        default=None,
        metavar="PATH",
        help="the cluster key: one key (or two, during a rotation) in hex, a line each; the first "
        "signs every membership packet, either verifies (needed by any membership endpoint)",
    )
    serve.add_argument(
        "--node-id",
        type=int,
        default=0,
        metavar="N",
        help="this node's id in a cluster (default 0: a single node)",
    )
    serve.add_argument(
        "--join",
        default="",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="membership (UDP) addresses of nodes to join through (default: none, a cluster of one)",
    )
    serve.add_argument("--rack", default="", help="this node's rack, gossiped for rack-aware placement")
    serve.add_argument("--weight", type=int, default=100, help="this node's placement weight (default 100)")
    cluster = serve.add_argument_group("cluster (docs/CLUSTER.md; none of these: a single node, no etcd)")
    cluster.add_argument(
        "--etcd",
        default="",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="etcd client endpoints: the cluster's metadata store (needs --node-id)",
    )
    cluster.add_argument("--cluster-name", default="ringlog", help="key prefix of this cluster in etcd")
    cluster.add_argument(
        "--default-replication-factor",
        type=int,
        default=3,
        metavar="N",
        help="replicas of a new topic's partitions when the request says -1 (default 3)",
    )
    cluster.add_argument(
        "--min-insync-replicas",
        type=int,
        default=FlagDefault(2),
        metavar="N",
        help="acks=all is refused (NOT_ENOUGH_REPLICAS) with fewer in-sync replicas (default 2)",
    )
    cluster.add_argument(
        "--replica-lag-time-max-ms",
        type=int,
        default=10_000,
        metavar="MS",
        help="a follower not caught up for this long leaves the in-sync set (default 10000)",
    )
    cluster.add_argument(
        "--reassign-after-s",
        type=float,
        default=0,
        metavar="S",
        help="the controller moves the replicas of a node absent this long (default 0: never; "
        "`broker reassign --drain` does it by hand)",
    )
    cluster.add_argument(
        "--session-timeout-s",
        type=int,
        default=2,
        metavar="S",
        help="TTL of this node's etcd lease: the cluster takes it for dead this long after its "
        "last renewal, if SWIM has not confirmed it dead sooner (default 2)",
    )
    cluster.add_argument(
        "--unclean-leader-election",
        action="store_true",
        help="with no in-sync replica alive, elect any live replica (may lose acknowledged records)",
    )
    serve.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        default=3000,
        metavar="MS",
        help="how long a consumer group that was empty waits for more members before its first "
        "generation (Kafka's group.initial.rebalance.delay.ms; default 3000)",
    )
    serve.add_argument(
        "--transaction-max-timeout-ms",
        type=int,
        default=900_000,
        metavar="MS",
        help="the longest transaction timeout a transactional producer may ask; longer is "
        "INVALID_TRANSACTION_TIMEOUT (Kafka's transaction.max.timeout.ms; default 900000)",
    )
    serve.add_argument(
        "--transaction-abort-interval-ms",
        type=int,
        default=10_000,
        metavar="MS",
        help="how often transactions open past their timeout are aborted, fencing their producer "
        "(Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms; default 10000)",
    )
    serve.add_argument(
        "--transaction-state-partitions",
        type=int,
        default=50,
        metavar="N",
        help="partitions of __transaction_state, read when the first transactional id makes it "
        "(Kafka's transaction.state.log.num.partitions; default 50)",
    )
    serve.add_argument(
        "--transactional-id-expiration-ms",
        type=int,
        default=7 * 24 * 3600 * 1000,
        metavar="MS",
        help="how long a transactional id with no transaction is kept; after it, the id is "
        "forgotten and its next InitProducerId gets a new producer id (Kafka's "
        "transactional.id.expiration.ms; default 604800000, 7 days)",
    )
    serve.add_argument(
        "--transaction-hang-check-interval-ms",
        type=int,
        default=60_000,
        metavar="MS",
        help="how often each core aborts the hanging transactions of the partitions it leads: "
        "idle longer than --transaction-max-timeout-ms plus two abort intervals and held open by "
        "no coordinator (Kafka's kafka-transactions.sh find-hanging, automated; default 60000)",
    )
    serve.add_argument(
        "--auto-create-topics",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create a topic a Metadata request names and allows creating (a producer's, of Kafka's "
        "protocol or ours), as Kafka's auto.create.topics.enable does (default on, as in Kafka; "
        "off: such a topic is UNKNOWN_TOPIC_OR_PARTITION)",
    )
    serve.add_argument(
        "--default-partitions",
        type=int,
        default=1,
        metavar="N",
        help="partitions of an auto-created topic (Kafka's num.partitions; default 1)",
    )
    serve.add_argument(
        "--producer-id-expiration-ms",
        type=int,
        default=PRODUCER_ID_EXPIRATION_MS_DEFAULT,
        metavar="MS",
        help="how long an idempotent producer's state is kept after its last write to a partition "
        "(Kafka's producer.id.expiration.ms; default 86400000, one day): checked on each core's "
        "retention pass",
    )
    defaults = LogConfig()
    topic_defaults = serve.add_argument_group(
        "topic defaults (a topic's own config overrides each: `broker topics create/alter --config`)"
    )
    topic_defaults.add_argument(
        "--segment-bytes", type=int, default=FlagDefault(defaults.segment_bytes), help="segment.bytes"
    )
    topic_defaults.add_argument(
        "--segment-ms",
        type=int,
        default=FlagDefault(-1),
        help="segment.ms: roll a segment at this age (-1: never)",
    )
    topic_defaults.add_argument(
        "--max-batch-bytes", type=int, default=FlagDefault(defaults.max_batch_bytes), help="max.message.bytes"
    )
    topic_defaults.add_argument(
        "--retention-ms",
        type=int,
        default=FlagDefault(-1 if defaults.retention_ms is None else defaults.retention_ms),
        help="retention.ms (-1: keep forever)",
    )
    topic_defaults.add_argument(
        "--retention-bytes", type=int, default=FlagDefault(-1), help="retention.bytes (-1: no size limit)"
    )
    topic_defaults.add_argument(
        "--log-cleanup-policy",
        choices=("delete", "compact", "compact,delete", "delete,compact"),
        default=None,
        help="cleanup.policy (Kafka's log.cleanup.policy): delete whole segments by retention, "
        "compact (keep each key's last record: docs/STORAGE.md), or both; default delete",
    )
    topic_defaults.add_argument(
        "--log-cleaner-delete-retention-ms",
        type=int,
        default=FlagDefault(defaults.delete_retention_ms),
        metavar="MS",
        help="delete.retention.ms: how long a tombstone outlives the clean that first met it",
    )
    topic_defaults.add_argument(
        "--log-cleaner-min-compaction-lag-ms",
        type=int,
        default=FlagDefault(defaults.min_compaction_lag_ms),
        metavar="MS",
        help="min.compaction.lag.ms: a record younger than this is never compacted away",
    )
    topic_defaults.add_argument(
        "--log-cleaner-max-compaction-lag-ms",
        type=int,
        default=FlagDefault(-1),
        metavar="MS",
        help="max.compaction.lag.ms: a dirty record older than this is compacted whatever the dirty "
        "ratio (-1: no bound)",
    )
    topic_defaults.add_argument(
        "--log-cleaner-min-cleanable-ratio",
        type=float,
        default=None,
        metavar="RATIO",
        help="min.cleanable.dirty.ratio: clean a log once this part of it is dirty (default 0.5)",
    )
    cleaning = CleanerConfig()
    serve.add_argument(
        "--log-cleaner-enable", choices=("on", "off"), default="on", help="run the log cleaner (default on)"
    )
    serve.add_argument(
        "--log-cleaner-dedupe-buffer-size",
        type=int,
        default=cleaning.dedupe_buffer_bytes,
        metavar="BYTES",
        help="memory of a clean's key -> offset map (24 bytes a key); a clean whose dirty keys do "
        "not fit cleans what does (default 32 MiB)",
    )
    serve.add_argument(
        "--log-cleaner-io-max-bytes-per-second",
        type=float,
        default=0,
        metavar="BYTES",
        help="cap on each core's cleaner reads and writes (log.cleaner.io.max.bytes.per.second); 0: no cap",
    )
    serve.add_argument(
        "--log-cleaner-backoff-ms",
        type=int,
        default=cleaning.backoff_ms,
        metavar="MS",
        help="how often a core looks for a log to clean when none was dirty (default 15000)",
    )
    add_limit_arguments(serve)
    serve.set_defaults(func=cmd_serve)
