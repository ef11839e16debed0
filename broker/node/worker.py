"""One worker process: one core of the broker, started by the supervisor (broker/node/supervisor.py).

Rules this module keeps:
- A worker makes no sockets of its own: it serves the listeners it inherits (its share of the
  public SO_REUSEPORT group, its direct port, its inter-core unix socket), so that a restarted
  worker finds them, with the connections that queued meanwhile, exactly where they were.
- It dies with its supervisor: PR_SET_PDEATHSIG(SIGKILL) is set first thing, and a worker whose
  supervisor is already gone exits at once. A SIGKILLed supervisor therefore leaves no worker
  holding ports or files for the next broker on the same data dir.
- It reports readiness once, by writing to the pipe the supervisor gave it, only after every
  listener is served; a worker that exits before that failed to start.
- The backend is chosen here (`choose_backend`, broker/node/backend_choice.py) and both backends
  keep one contract:
  `run(config: BrokerConfig, listeners: Sequence[socket.socket], ready: Callable[..., None])`
  serves until SIGTERM/SIGINT and returns after a clean shutdown, calling `ready()` once every
  listener is served (an argument, such as a port, is accepted and ignored).
- The protocols are made here too: `serving_adapters` builds each core's adapters (ours, which
  is also the inter-core protocol, and Kafka's) over its `Core`, and the backend gets that function
  in its config (`BrokerConfig.make_adapters`); the backends import neither protocol.
- glibc's malloc thresholds are set (`tune_malloc`) before the backend serves, whichever it is.

Invoked as `python -m broker.node.worker_process --spec JSON` (the supervisor writes the JSON; see
`main`; broker/node/worker_process.py says why that module).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from bpf import state as bpf_state
from broker.backends.uring_options import UringOptions
from broker.core.adapter import Adapters
from broker.core.cluster_view import ClusterSettings
from broker.core.config import BrokerConfig
from broker.core.core import Core
from broker.core.limits import Limits
from broker.core.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT
from broker.kafka.adapter import KafkaAdapter
from broker.node.backend_choice import BackendUnavailable, choose_backend
from broker.node.logfmt import LogfmtFormatter
from broker.ringlog.adapter import RinglogAdapter
from broker.security.acls import AclStore
from broker.security.sasl import INTER_BROKER_PASSWORD_ENV, InterBrokerLogin, SaslConfig
from broker.security.tls import TlsConfig
from broker.storage.cleaner import CleanerConfig
from broker.storage.errors import StorageError
from broker.storage.log import LogConfig

log = logging.getLogger("broker.node.worker")

PR_SET_PDEATHSIG = 1
EXIT_START_FAILED = 3  # the worker could not start (data dir, backend, ...): restarting will not help soon


def backend_runner(
    backend: str, uring_options: UringOptions | None = None
) -> Callable[[BrokerConfig, Sequence[socket.socket], Callable[[], None]], None]:
    """The `run` function of a backend, imported only when chosen (io_uring's with its options)."""
    if backend == "io_uring":
        from broker.backends import uring as uring_server  # noqa: PLC0415 - lazy: may not exist, needs native/

        return functools.partial(uring_server.run, options=uring_options)
    from broker.backends import aio as server  # noqa: PLC0415

    return server.run


def die_with_parent(supervisor_pid: int) -> None:
    """Ask the kernel for SIGKILL when the supervisor dies; exit now if it already has."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except OSError as exc:
        log.warning("prctl unavailable (%s): this worker will outlive a killed supervisor", exc)
    if os.getppid() != supervisor_pid:  # the supervisor died before prctl took effect
        os._exit(EXIT_START_FAILED)


# glibc malloc: request bodies of up to a frame (8 MiB) come and go with every produce. By default
# glibc serves blocks over 128 KiB with mmap and trims the heap top past 128 KiB, so each large
# request costs page faults and brk calls (measured: a fresh broker ingests 1 KiB records at about
# a third of the rate it reaches once glibc has raised its thresholds by itself). Fixing them from
# the start keeps those pages in the heap for reuse.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MALLOC_MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024  # above the largest frame: frames stay on the heap
MALLOC_TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024  # free memory kept before returning it to the OS
MALLOC_TOP_PAD_BYTES = 16 * 1024 * 1024


def tune_malloc() -> bool:
    """Set glibc's malloc thresholds (see above). False where there is no glibc (musl, macOS)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = all(
            libc.mallopt(param, value) == 1
            for param, value in (
                (M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
                (M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
                (M_TOP_PAD, MALLOC_TOP_PAD_BYTES),
            )
        )
    except (OSError, AttributeError):
        return False
    return ok


def serving_adapters(core: Core) -> Adapters:
    """The protocols `core` serves on its ports: ours, which is also the one between cores, and
    Kafka's. A connection's first bytes are tried against ours first (broker/core/adapter.py)."""
    ours = RinglogAdapter(core)
    return Adapters(internal=ours, clients=(ours, KafkaAdapter(core, core.config)))


def config_from_spec(spec: dict[str, Any]) -> BrokerConfig:
    """The BrokerConfig of one worker from the supervisor's JSON spec (parsed JSON: Any)."""
    d = dict(spec["log_defaults"])
    return BrokerConfig(
        data_dir=str(spec["data_dir"]),
        host=str(spec["host"]),
        port=int(spec["port"]),
        cores=int(spec["cores"]),
        core_id=int(spec["core"]),
        log_defaults=LogConfig(**d),
        static_configs=frozenset(spec.get("static_configs", ())),
        cleaner=CleanerConfig(**spec.get("cleaner", {})),
        core_ports=tuple(spec["core_ports"]),
        peer_addresses=tuple(spec["peer_addresses"]),
        peer_liveness_fd=int(spec.get("liveness_fd", -1)),
        backend=str(spec.get("backend", "uvloop")),
        limits=Limits.from_spec(spec.get("limits")),
        group_initial_rebalance_delay_ms=int(spec.get("group_initial_rebalance_delay_ms", 3000)),
        transaction_max_timeout_ms=int(spec.get("transaction_max_timeout_ms", 900_000)),
        transaction_abort_interval_ms=int(spec.get("transaction_abort_interval_ms", 10_000)),
        transaction_state_partitions=int(spec.get("transaction_state_partitions", 50)),
        transactional_id_expiration_ms=int(spec.get("transactional_id_expiration_ms", 7 * 24 * 3600 * 1000)),
        transaction_hang_check_interval_ms=int(spec.get("transaction_hang_check_interval_ms", 60_000)),
        auto_create_topics=bool(spec.get("auto_create_topics", True)),
        default_partitions=int(spec.get("default_partitions", 1)),
        producer_id_expiration_ms=int(
            spec.get("producer_id_expiration_ms", PRODUCER_ID_EXPIRATION_MS_DEFAULT)
        ),
        sasl=sasl_config(spec.get("sasl")),
        tls=TlsConfig(**spec.get("tls", {})),
        super_users=tuple(spec.get("super_users", ())),
        advertised_host=str(spec.get("advertised_host", "")),
        bpf_snapshot=functools.partial(bpf_state.read, str(spec["data_dir"])),  # cached by mtime, no bcc
        node_id=int(spec.get("node_id", 0)),
        cluster=cluster_settings(spec.get("cluster"), str(spec["data_dir"])),
        make_adapters=serving_adapters,
    )


def sasl_config(spec: dict[str, Any] | None) -> SaslConfig:
    """The SASL settings; the inter-broker password comes from the environment (and leaves it:
    nothing this process starts inherits it)."""
    if not spec:
        return SaslConfig()
    password = os.environ.pop(INTER_BROKER_PASSWORD_ENV, "")
    user = spec.get("inter_broker_user")
    return SaslConfig(
        tuple(spec.get("mechanisms", ())),
        bool(spec.get("plain_without_tls", False)),
        InterBrokerLogin(str(user), password) if user else None,
    )


def cluster_settings(spec: dict[str, Any] | None, data_dir: str) -> ClusterSettings | None:
    """A clustered worker's settings, on an `EtcdStore` of its own (made here; its connections are
    per thread): `ClusterAdmin` for the calls the core runs on its `run_blocking` threads, and the
    producer id blocks and group offsets, which are called on the loop as their single-node
    files are (one blocking store call per block claimed or per offset commit)."""
    if not spec:
        return None
    # here, not at the top: a single node's workers never load the etcd client (requests, etcd3gw)
    from broker.cluster.admin import ClusterAdmin  # noqa: PLC0415
    from broker.cluster.group_offsets import StoreGroupOffsets  # noqa: PLC0415
    from broker.cluster.producer_ids import EtcdBlockSource  # noqa: PLC0415
    from broker.cluster.records import Keys  # noqa: PLC0415
    from broker.cluster.security_docs import EtcdDocuments  # noqa: PLC0415
    from broker.cluster.store import EtcdStore  # noqa: PLC0415

    store = EtcdStore(tuple(spec["endpoints"]))
    keys = Keys(str(spec["name"]))
    return ClusterSettings(
        calls=ClusterAdmin(store, keys, int(spec["default_replication"])),
        producer_ids=EtcdBlockSource(store, keys.producer_ids),
        group_offsets=StoreGroupOffsets(store, keys, data_dir),
        acls=AclStore(data_dir, EtcdDocuments(store, keys)),
        name=str(spec["name"]),
        min_insync=int(spec["min_insync"]),
        unclean_election=bool(spec.get("unclean_election", False)),
        replica_lag_max_ms=int(spec["replica_lag_max_ms"]),
        replica_fetch_wait_ms=int(spec.get("replica_fetch_wait_ms", 500)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="broker.node.worker", description="one core of a broker (internal)")
    parser.add_argument("--spec", required=True, help="JSON written by the supervisor")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter({"core": spec["core"]}))
    logging.basicConfig(level=spec.get("log_level", "INFO"), handlers=[handler])
    die_with_parent(int(spec["supervisor_pid"]))
    ready_fd = int(spec["ready_fd"])
    listeners = [socket.socket(fileno=fd) for fd in spec["fds"]]
    try:
        backend = choose_backend(str(spec["backend"]))
        config = config_from_spec({**spec, "backend": backend})
        uring_options = UringOptions(**spec.get("uring", {})) if backend == "io_uring" else None
        run = backend_runner(backend, uring_options)
    except (BackendUnavailable, ImportError, ValueError) as exc:
        log.error("cannot start: %s", exc)
        return EXIT_START_FAILED

    def ready(*_port: object) -> None:  # a backend may pass its first port: not needed here
        os.write(ready_fd, f"ready {os.getpid()} {backend}\n".encode())
        os.close(ready_fd)

    if not tune_malloc():
        log.info("glibc malloc tuning unavailable; large requests will cost more page faults")
    try:
        run(config, listeners, ready)
    except (StorageError, OSError, ValueError) as exc:
        log.error("cannot serve: %s", exc)
        return EXIT_START_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
