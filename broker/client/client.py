"""The client core shared by the producer, the consumer and the admin: connections and metadata.

Rules this module keeps:
- **Routing-aware.** A partition request goes over the connection of the core that serves the
  partition, one connection per core, kept in a map keyed by a *route key*. On one node (Metadata
  says not `clustered`) the route key is the core id (`PartitionMetadata.owner_core`), and core k
  is reached at the bootstrap host and its direct port (`MetadataResponse.core_ports`), so a
  request never needs forwarding between cores; before the ports are known, or if a core's port
  does not answer, the bootstrap address (any core, which forwards) is used. Requests about no
  partition go over any open connection, first the bootstrap one (kept under its own key: through
  the public port it reaches whichever core the kernel picked, so it is never treated as a
  particular core's); in a cluster, not one to a node that left a request unanswered past its
  timeout lately (paused or cut off: a Metadata there would wait out a timeout too).
- **A cluster** (Metadata says `clustered`): a partition is served by its leader node's core, and
  its route key is `ringlog_proto.routing.node_core_id(leader_node, owner_core)` = node * 1000 +
  core (the Kafka listener's broker id of that core). That core is reached at the leader node's
  host and `NodeMetadata.core_port(core)`, from Metadata's `nodes`; each connection remembers the
  address it was opened to and is dropped when a newer Metadata moves its key elsewhere. No
  bootstrap fallback and no steering there: a node's public port reaches that node only. A
  partition with no leader (`leader_node` -1) or whose leader's node is not live has route
  `NO_ROUTE`: its requests fail with `LeaderNotAvailableError` (retriable, code NOT_OWNER) and are
  retried after a back-off and a fresh Metadata, as is NOT_OWNER (the node is not the leader) and,
  in a cluster, a lost connection; those three are retried until `request_timeout_ms`, long
  enough for the cluster to elect a new leader. One node retries them `retries` times, as before.
- **Group requests** go to the group's coordinator core, `coordinator(group)`: on one node
  `routing.coordinator_for(group, cores)`; in a cluster core `coordinator_for(group, its cores)` of
  node `routing.coordinator_node(group, live nodes)`.
- **Bootstrap**: `bootstrap` is one address or several, comma-separated; the bootstrap connection
  tries them in order (in a cluster, then the public address of every live node Metadata named)
  and the first that answers becomes the bootstrap host (where one node's direct ports are).
- **Metadata is a cache**, refreshed when the broker says it is stale: UNKNOWN_TOPIC_OR_PARTITION
  (the topic was deleted and perhaps re-created under a new id) or NOT_OWNER (ownership moved).
  Concurrent lookups of one topic share one Metadata request.
- **Steering** (one node only). When Metadata says `steering` (the broker's eBPF program picks the
  listener of each new connection to the public port), a core's connection is opened to the public
  port instead of the core's direct port, steered to the core by its first frame
  (`AsyncConnection.connect_steered`: a partition that core owns, sent in the SYN with TCP Fast
  Open) and by its source port. One port serves every core, which is what a firewall or a load
  balancer in front of it wants.
- Connections that fail are dropped from the map and reopened by the next request to that core.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from broker.client.backoff import backoff_delay
from broker.client.connection import AsyncConnection
from broker.client.errors import (
    BrokerUnavailable,
    ClientClosedError,
    LeaderNotAvailableError,
    NotOwnerError,
    RingLogError,
    UnknownTopicError,
    UnsupportedVersionError,
    error_for,
)
from broker.client.security import Security
from ringlog_proto.messages import (
    CURRENT_VERSIONS,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    ErrorCode,
    MetadataRequest,
    MetadataResponse,
    NodeMetadata,
    PartitionMetadata,
    PartitionRequest,
    Request,
    Response,
    TopicMetadata,
)
from ringlog_proto.routing import coordinator_for, coordinator_node, node_core_id, split_node_core_id

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP: Final = "127.0.0.1:9092"
DEFAULT_PORT: Final = 9092
CLIENT_NAME: Final = "ringlog-python"
BOOTSTRAP_KEY: Final = -1  # the connection to the bootstrap address, in the map of connections
NO_ROUTE: Final = -2  # the route of a partition with no live leader now (a cluster's offline one)

ConnKey = int | tuple[int, str]  # a route key, or (route key, lane name)


class TopicPartition(NamedTuple):
    """A partition by topic name and index. A plain tuple `("orders", 3)` works wherever one is taken."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the client caches about a topic: enough to address and route its partitions."""

    name: str
    topic_id: int
    owners: tuple[int, ...]  # route key of each partition, by index (one node: its owner core)
    metadata: TopicMetadata
    fetched_at: float  # time.monotonic() of the Metadata answer

    @property
    def partitions(self) -> int:
        return len(self.owners)


def parse_bootstraps(bootstrap: str) -> list[tuple[str, int]]:
    """`"host:port,host:port"` (each as `parse_bootstrap` takes it) as a list of (host, port)."""
    addresses = [parse_bootstrap(part) for part in bootstrap.split(",") if part.strip()]
    if not addresses:
        raise ValueError(f"bootstrap {bootstrap!r}: no address")
    return addresses


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    """`"host:port"`, `"host"` (port 9092) or `"[v6addr]:port"` as (host, port)."""
    text = bootstrap.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not host:
        raise ValueError(f"bootstrap {bootstrap!r}: no host")
    try:
        return host, int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"bootstrap {bootstrap!r}: port {port!r} is not a number") from None


class AsyncClient:
    """Connections (one per owning core) and the metadata cache. Use from one event loop."""

    def __init__(
        self,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        *,
        client_name: str = CLIENT_NAME,
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        metadata_max_age_ms: int = 300_000,
        retry_backoff_ms: int = 100,
        security: Security | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security  # TLS and SASL of every connection (broker/client/security.py)
        self.bootstraps = parse_bootstraps(bootstrap)
        self.host, self.port = self.bootstraps[0]  # the bootstrap address that answered last
        self.client_name = client_name
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.metadata_max_age = metadata_max_age_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.cores = 1  # from ApiVersions / Metadata
        self.core_ports: tuple[int, ...] = ()  # direct port of each core, from Metadata
        self.steering = False  # from Metadata: connect to the public port, steered by the kernel
        self.clustered = False  # from Metadata: route keys name (node, core); see the module doc
        self.node_id = 0  # from Metadata: the node that answered it
        self.nodes: dict[int, NodeMetadata] = {}  # from Metadata: every node the cluster knows
        self.api_versions: ApiVersionsResponse | None = None
        # Connections by route key; a "lane" (a second connection to the same core, see
        # `connection`) by (route key, lane name); with the address each was opened to.
        self._conns: dict[ConnKey, AsyncConnection] = {}
        self._conn_addrs: dict[ConnKey, tuple[str, int]] = {}
        self._connecting: dict[ConnKey, asyncio.Future[AsyncConnection]] = {}
        self._closers: set[asyncio.Task[None]] = set()
        self._topics: dict[str, TopicInfo] = {}
        # lookups under way, by (name, whether they may create the topic)
        self._topic_lookups: dict[tuple[str, bool], asyncio.Future[TopicInfo]] = {}
        # In a cluster: nodes that left a request unanswered past its timeout lately (paused, cut
        # off), until when; requests about no partition (Metadata) go elsewhere meanwhile.
        self._unanswering: dict[int, float] = {}
        self._closed = False

    # ----------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect and check that the broker speaks this client's API versions (ApiVersions)."""
        if self.api_versions is not None:
            return
        resp = await self.request(ApiVersionsRequest(self.client_name))
        assert isinstance(resp, ApiVersionsResponse)
        supported = {a.api_key: (a.min_version, a.max_version) for a in resp.apis}
        missing = [
            f"{key.name} v{CURRENT_VERSIONS[key]}"
            for key in ApiKey
            if not supported.get(key, (1, 0))[0] <= CURRENT_VERSIONS[key] <= supported.get(key, (1, 0))[1]
        ]
        if missing:
            raise UnsupportedVersionError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"broker {resp.broker_version} at {self.bootstrap} lacks " + ", ".join(missing),
            )
        self.api_versions = resp
        self.cores = max(1, resp.cores)

    async def close(self) -> None:
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        self._conn_addrs.clear()
        for fut in self._connecting.values():
            fut.cancel()
        for conn in conns:
            await conn.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AsyncClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----------------------------------------------------------------------------------- connections

    def _address_for_core(self, core: int) -> tuple[str, int]:
        """Where to reach `core` of one node: the bootstrap host at the core's direct port (from
        Metadata), or the bootstrap address when that is unknown (then the broker forwards)."""
        if 0 <= core < len(self.core_ports) and self.core_ports[core]:
            return self.host, self.core_ports[core]
        return self.host, self.port

    def address(self, route: int) -> tuple[str, int]:
        """Where the connection of route key `route` goes (module docstring). In a cluster,
        raises `BrokerUnavailable` for a node Metadata did not name."""
        if route == BOOTSTRAP_KEY:
            return self.host, self.port
        if not self.clustered:
            return self._address_for_core(route)
        node_id, core = split_node_core_id(route)
        node = self.nodes.get(node_id)
        if node is None:
            raise BrokerUnavailable(f"node {node_id} is not in the cluster's Metadata")
        return node.host or self.host, node.core_port(core)

    def route_key(self, node_id: int, core: int) -> int:
        """The route key of `core` of node `node_id` (one node: the core id)."""
        return node_core_id(node_id, core) if self.clustered else core

    async def connection(self, core: int = 0, lane: str = "") -> AsyncConnection:
        """The open connection to route key `core` (one node: a core id), connecting if there is
        none (concurrent callers share one connect). Raises `BrokerUnavailable` if the broker
        cannot be reached.

        `lane` names an extra connection to the same core, for traffic that must not queue behind
        the rest: the broker answers each connection's requests in order, so a long-polling fetch
        holds back every response behind it (the consumer fetches on lanes of its own).
        """
        key = (core, lane) if lane else core
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        if self._closed:
            raise ClientClosedError("the client is closed")
        if core == NO_ROUTE:
            raise LeaderNotAvailableError(ErrorCode.NOT_OWNER, "no live leader now")
        pending = self._connecting.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._connect(key, core))
            self._connecting[key] = pending
        return await asyncio.shield(pending)

    def connection_nowait(self, core: int, lane: str = "") -> AsyncConnection | None:
        """The open connection to `core` (and `lane`), or None: then `await connection(...)`."""
        conn = self._conns.get((core, lane) if lane else core)
        return conn if conn is not None and not conn.closed else None

    async def _connect(self, key: ConnKey, core: int) -> AsyncConnection:
        try:
            if core == BOOTSTRAP_KEY:
                conn, address = await self._connect_bootstrap()
            elif self.clustered:
                address = self.address(core)
                conn = await self._open(*address)
            elif (
                self.steering and self.cores > 1 and (self.security is None or self.security.context is None)
            ):
                # (with TLS the first frame cannot ride in the SYN: each core's direct port instead)
                address = (self.host, self.port)
                conn = await AsyncConnection.connect_steered(
                    self.host,
                    self.port,
                    self._identity_owned_by(core),
                    core,
                    self.cores,
                    client_name=self.client_name,
                    connect_timeout=self.connect_timeout,
                    request_timeout=self.request_timeout,
                    security=self.security,
                )
            else:
                conn, address = await self._connect_core(core)
            if self._closed:
                await conn.close()
                raise ClientClosedError("the client is closed")
            self._conns[key] = conn
            self._conn_addrs[key] = address
            return conn
        finally:
            self._connecting.pop(key, None)

    async def _open(self, host: str, port: int) -> AsyncConnection:
        """A connection to `host`:`port` with this client's timeouts, TLS and SASL."""
        conn = await AsyncConnection.connect(
            host,
            port,
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
            security=self.security,
        )
        conn.on_unanswered = lambda: self._unanswered((host, port))
        return conn

    def _node_at(self, address: tuple[str, int]) -> int | None:
        """The cluster node reached at `address` (its public port or a core's), if Metadata named it."""
        host, port = address
        for n in self.nodes.values():
            if (n.host or self.host) == host and (port == n.port or port in n.core_ports):
                return n.node_id
        return None

    def _unanswered(self, address: tuple[str, int]) -> None:
        """A request to `address` went unanswered past its timeout. In a cluster its node may be
        paused or cut off while the others elect new leaders: for a request timeout, requests
        about no partition (the Metadata that finds those leaders) go to another node, not to an
        idle connection to this one, where they would wait out a timeout of their own (the
        isolation nemesis's failover took 3 s more whenever the node cut off was the client's
        bootstrap one)."""
        node = self._node_at(address) if self.clustered else None
        if node is None:
            return
        self._unanswering[node] = time.monotonic() + max(self.request_timeout, 1.0)
        boot = self._conn_addrs.get(BOOTSTRAP_KEY)
        if boot is not None and self._node_at(boot) == node:
            conn = self._conns.pop(BOOTSTRAP_KEY, None)
            self._conn_addrs.pop(BOOTSTRAP_KEY, None)
            if conn is not None:
                task = asyncio.get_running_loop().create_task(conn.close())
                self._closers.add(task)
                task.add_done_callback(self._closers.discard)

    def _answering(self, address: tuple[str, int] | None) -> bool:
        """Whether the node at `address` has not left a request unanswered lately (`_unanswered`)."""
        if not self._unanswering or address is None:
            return True
        node = self._node_at(address)
        if node is None or node not in self._unanswering:
            return True
        if self._unanswering[node] <= time.monotonic():
            del self._unanswering[node]
            return True
        return False

    async def _connect_core(self, core: int) -> tuple[AsyncConnection, tuple[str, int]]:
        """One node: core `core` at its direct port, else through the bootstrap address."""
        host, port = self._address_for_core(core)
        try:
            conn = await self._open(host, port)
            return conn, (host, port)
        except BrokerUnavailable:
            if (host, port) == (self.host, self.port):
                raise
        # The core's direct port is stale (the broker restarted on other ports): forget the
        # ports and go through the bootstrap address; the next Metadata brings new ones.
        log.debug("core %d at %s:%d unreachable; using the bootstrap address", core, host, port)
        self.core_ports = ()
        conn = await self._open(self.host, self.port)
        return conn, (self.host, self.port)

    async def _connect_bootstrap(self) -> tuple[AsyncConnection, tuple[str, int]]:
        """The first of the bootstrap addresses that answers (in a cluster, then every live
        node's public address), which becomes `host`, `port`."""
        candidates = [(self.host, self.port), *self.bootstraps]
        if self.clustered:
            candidates += [(n.host or self.host, n.port) for n in self.nodes.values() if n.live]
        candidates = list(dict.fromkeys(candidates))
        candidates.sort(key=lambda a: not self._answering(a))  # (stable) unanswering nodes last
        failure: BrokerUnavailable | None = None
        for address in candidates:
            try:
                conn = await self._open(*address)
            except BrokerUnavailable as exc:
                failure = exc
                log.debug("bootstrap %s:%d: %s", *address, exc)
                continue
            if address != (self.host, self.port):
                # Another broker: one node's direct ports are that broker's, unknown yet.
                self.host, self.port = address
                if not self.clustered:
                    self.core_ports = ()
            return conn, address
        assert failure is not None
        if len(candidates) == 1:
            raise failure
        raise BrokerUnavailable(
            f"no bootstrap address answers ({', '.join(f'{h}:{p}' for h, p in candidates)}): {failure}"
        ) from failure

    def _identity_owned_by(self, core: int) -> tuple[int, int] | None:
        """A (topic id, partition) of a cached topic that `core` owns: the steering program reads it
        from the first frame of a steered connection. None when no cached partition is `core`'s."""
        for info in self._topics.values():
            for index, owner in enumerate(info.owners):
                if owner == core:
                    return info.topic_id, index
        return None

    def _control_core(self) -> int:
        """The connection for requests about no partition: any open one will do (the bootstrap
        connection if there is none), except one to a node that left a request unanswered
        lately (`_unanswered`)."""
        for key, conn in self._conns.items():
            if isinstance(key, int) and not conn.closed and self._answering(self._conn_addrs.get(key)):
                return key
        return BOOTSTRAP_KEY

    async def request(
        self, req: Request, *, core: int | None = None, timeout: float | None = None, check: bool = True
    ) -> Response:
        """Send `req` to route key `core` (a non-partition request: any core) and return the response."""
        conn = await self.connection(self._control_core() if core is None else core)
        return await conn.request(req, timeout=timeout, check=check)

    def _drop_moved(self) -> None:
        """A cluster's Metadata may move a route key to another address (a node came back on
        other ports, or is no longer known): close the connections opened to the old one."""
        for key in list(self._conns):
            route = key if isinstance(key, int) else key[0]
            if route == BOOTSTRAP_KEY:
                continue
            try:
                address: tuple[str, int] | None = self.address(route)
            except BrokerUnavailable:
                address = None
            if address != self._conn_addrs.get(key):
                conn = self._conns.pop(key)
                self._conn_addrs.pop(key, None)
                log.debug("route %d moved to %s; closing its connection", route, address)
                task = asyncio.get_running_loop().create_task(conn.close())
                self._closers.add(task)
                task.add_done_callback(self._closers.discard)

    # ----------------------------------------------------------------------------------- metadata

    async def refresh_metadata(
        self, topics: Sequence[str] = (), *, auto_create: bool = False
    ) -> MetadataResponse:
        """Ask for metadata of `topics` (all topics when empty) and update the cache with it.
        `auto_create`: a named topic that does not exist is created where the broker auto-creates
        topics (a producer's lookup, as Kafka's producers ask; consumers and admins do not)."""
        resp = await self.request(MetadataRequest(tuple(topics), auto_create))
        assert isinstance(resp, MetadataResponse)
        self.apply_metadata(resp, full=not topics)
        return resp

    def apply_metadata(self, resp: MetadataResponse, *, full: bool = False) -> None:
        """Take the broker's view from a Metadata answer (`full`: it listed every topic, so the
        cached ones it lacks are gone). No I/O: routing is a function of the answers applied."""
        self.cores = max(1, resp.cores)
        self.core_ports = resp.core_ports
        self.steering = resp.steering
        was_clustered = self.clustered
        self.clustered = resp.clustered
        self.node_id = resp.node_id
        self.nodes = {n.node_id: n for n in resp.nodes}
        now = time.monotonic()
        unplaced = NO_ROUTE if self.clustered else 0
        for t in resp.topics:
            if t.error == ErrorCode.NONE:
                owners = [unplaced] * len(t.partitions)
                for p in t.partitions:
                    if p.index < len(owners):
                        owners[p.index] = self._route_of(p)
                self._topics[t.name] = TopicInfo(t.name, t.topic_id, tuple(owners), t, now)
            else:
                self._topics.pop(t.name, None)
        if full:
            names = {t.name for t in resp.topics}
            for name in [n for n in self._topics if n not in names]:
                del self._topics[name]
        if self.clustered or was_clustered:
            self._drop_moved()

    def _route_of(self, p: PartitionMetadata) -> int:
        """The route key of a partition: one node, its owner core; a cluster, its leader node's
        core, or NO_ROUTE when it has no leader or the leader's node is not live."""
        if not self.clustered:
            return p.owner_core if p.owner_core >= 0 else NO_ROUTE
        node = self.nodes.get(p.leader_node) if p.leader_node >= 0 else None
        if node is None or not node.live or p.owner_core < 0:
            return NO_ROUTE
        return node_core_id(p.leader_node, p.owner_core)

    def coordinator(self, group: str) -> int:
        """The route key of `group`'s coordinator core (module docstring). In a cluster, raises
        `BrokerUnavailable` (retriable) while Metadata names no live node."""
        if not self.clustered:
            return coordinator_for(group, self.cores)
        live = [n.node_id for n in self.nodes.values() if n.live]
        if not live:
            raise BrokerUnavailable(f"group {group!r}: Metadata names no live node to coordinate it")
        node_id = coordinator_node(group, live)
        return node_core_id(node_id, coordinator_for(group, max(1, self.nodes[node_id].cores)))

    def invalidate_route(self, route: int) -> None:
        """Forget every cached topic with a partition routed to `route` (its node may be down):
        the next lookup asks who leads them now."""
        for name in [n for n, info in self._topics.items() if route in info.owners]:
            del self._topics[name]

    def cached_topic(self, name: str) -> TopicInfo | None:
        """The cached entry for `name` if it is fresh enough, without any I/O."""
        info = self._topics.get(name)
        if info is not None and time.monotonic() - info.fetched_at > self.metadata_max_age:
            return None
        return info

    def cached_route(self, name: str, partition: int) -> int | None:
        """The route key of a partition from the cache (NO_ROUTE: no live leader), or None when the
        topic is not cached or has no such partition. No I/O."""
        info = self._topics.get(name)
        if info is None or not 0 <= partition < info.partitions:
            return None
        return info.owners[partition]

    def invalidate(self, name: str) -> None:
        """Forget `name`: the next lookup asks the broker."""
        self._topics.pop(name, None)

    async def topic(self, name: str, *, refresh: bool = False, auto_create: bool = False) -> TopicInfo:
        """Metadata of topic `name`, from the cache unless stale or `refresh`. Raises
        `UnknownTopicError` when the broker does not know it (`auto_create`: nor creates it,
        see `refresh_metadata`)."""
        if not refresh:
            info = self.cached_topic(name)
            if info is not None:
                return info
        key = (name, auto_create)
        pending = self._topic_lookups.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._lookup(name, auto_create))
            self._topic_lookups[key] = pending
        return await asyncio.shield(pending)

    async def _lookup(self, name: str, auto_create: bool) -> TopicInfo:
        try:
            resp = await self.refresh_metadata((name,), auto_create=auto_create)
            for t in resp.topics:
                if t.name == name and t.error != ErrorCode.NONE:
                    raise error_for(t.error, f"topic {name!r}")
            info = self._topics.get(name)
            if info is None:
                raise UnknownTopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r}")
            return info
        finally:
            self._topic_lookups.pop((name, auto_create), None)

    # ----------------------------------------------------------------------------------- partitions

    async def route(self, topic: str, partition: int, *, refresh: bool = False) -> tuple[TopicInfo, int]:
        """(topic info, route key) of a partition (NO_ROUTE: no live leader now); raises
        `UnknownTopicError` for a bad index."""
        info = await self.topic(topic, refresh=refresh)
        if partition >= info.partitions and not refresh:
            # partitions are added to a topic (CreatePartitions), never taken away: a count
            # cached before the topic grew is asked again before the index is refused
            info = await self.topic(topic, refresh=True)
        if not 0 <= partition < info.partitions:
            raise UnknownTopicError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has {info.partitions} partitions; there is no partition {partition}",
            )
        return info, info.owners[partition]

    async def partition_request(
        self,
        topic: str,
        partition: int,
        build: Callable[[int], PartitionRequest],
        *,
        timeout: float | None = None,
        retries: int = 3,
        group: str | None = None,
    ) -> Response:
        """Send the request `build(topic_id)` to the core serving the partition (with `group`: to
        the group's coordinator core, where OffsetCommit and OffsetFetch are served) and return
        the response, refreshing metadata on UNKNOWN_TOPIC_OR_PARTITION / NOT_OWNER and retrying
        retriable errors and lost connections up to `retries` times with a short backoff; in a
        cluster, NOT_OWNER, a partition with no live leader and lost connections are retried
        (with fresh Metadata) until `request_timeout_ms` has passed, to ride out an election.

        Only for requests that are safe to repeat (everything but produce, which has its own
        retry logic built on idempotence).
        """
        attempt = 0
        refresh = False
        deadline = time.monotonic() + self.request_timeout
        while True:
            try:
                info, core = await self.route(topic, partition, refresh=refresh)
                if group is not None:
                    core = self.coordinator(group)
            except BrokerUnavailable as exc:
                # No Metadata now: in a cluster the node asked may be the one that went down.
                if not self.clustered or time.monotonic() >= deadline:
                    raise
                log.debug("%s/%d: %s; asking again", topic, partition, exc)
                refresh = True
                await asyncio.sleep(backoff_delay(attempt, self.retry_backoff, 1.0))
                attempt += 1
                continue
            refresh = False
            try:
                if core == NO_ROUTE:
                    raise LeaderNotAvailableError(
                        ErrorCode.NOT_OWNER, f"{topic}/{partition} has no live leader now"
                    )
                return await self.request(build(info.topic_id), core=core, timeout=timeout)
            except (UnknownTopicError, NotOwnerError) as exc:
                # Stale metadata: the topic was re-created (new id) or ownership moved.
                if attempt >= retries and not self._wait_for_leader(exc, deadline):
                    raise
                refresh = True
                if isinstance(exc, UnknownTopicError) and attempt >= 1:
                    raise  # fresh metadata and still unknown: it really is
                log.debug("%s/%d: %s; refreshing metadata", topic, partition, exc)
            except (RingLogError, BrokerUnavailable) as exc:
                if not exc.retriable or (attempt >= retries and not self._wait_for_leader(exc, deadline)):
                    raise
                if self.clustered and isinstance(exc, BrokerUnavailable):
                    refresh = True  # its node may be down: ask who leads now
                log.debug("%s/%d: %s; retrying", topic, partition, exc)
            await asyncio.sleep(backoff_delay(attempt, self.retry_backoff, 1.0))
            attempt += 1

    def _wait_for_leader(self, exc: BaseException, deadline: float) -> bool:
        """In a cluster, NOT_OWNER and lost connections mean leadership is moving: worth retrying
        past `retries` until `deadline`."""
        return (
            self.clustered
            and isinstance(exc, NotOwnerError | BrokerUnavailable)
            and time.monotonic() < deadline
        )
