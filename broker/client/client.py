"""The client core shared by the producer, the consumer and the admin: connections and metadata.

Rules this module keeps:
- **Routing-aware.** A partition request goes over the connection of the core that owns the
  partition (`PartitionMetadata.owner_core` from Metadata), one connection per core, kept in a map
  keyed by core id. Core k is reached at the bootstrap host and its direct port
  (`MetadataResponse.core_ports`), so a request never needs forwarding between cores; before the
  ports are known, or if a core's port does not answer, the bootstrap address (any core, which
  forwards) is used. Requests about no partition go over any open connection, first the bootstrap
  one (kept under its own key: through the public port it reaches whichever core the kernel
  picked, so it is never treated as a particular core's).
- **Metadata is a cache**, refreshed when the broker says it is stale: UNKNOWN_TOPIC_OR_PARTITION
  (the topic was deleted and perhaps re-created under a new id) or NOT_OWNER (ownership moved).
  Concurrent lookups of one topic share one Metadata request.
- **Steering.** When Metadata says `steering` (the broker's eBPF program picks the listener of each
  new connection to the public port), a core's connection is opened to the public port instead of
  the core's direct port, steered to the core by its first frame (`AsyncConnection.connect_steered`:
  a partition that core owns, sent in the SYN with TCP Fast Open) and by its source port. One
  port serves every core, which is what a firewall or a load balancer in front of it wants.
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
    NotOwnerError,
    RingLogError,
    UnknownTopicError,
    UnsupportedVersionError,
    error_for,
)
from ringlog_proto.messages import (
    CURRENT_VERSIONS,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    ErrorCode,
    MetadataRequest,
    MetadataResponse,
    PartitionRequest,
    Request,
    Response,
    TopicMetadata,
)
from ringlog_proto.routing import coordinator_for

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP: Final = "127.0.0.1:9092"
DEFAULT_PORT: Final = 9092
CLIENT_NAME: Final = "ringlog-python"
BOOTSTRAP_KEY: Final = -1  # the connection to the bootstrap address, in the map of connections


class TopicPartition(NamedTuple):
    """A partition by topic name and index. A plain tuple `("orders", 3)` works wherever one is taken."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the client caches about a topic: enough to address and route its partitions."""

    name: str
    topic_id: int
    owners: tuple[int, ...]  # owner core of each partition, by index
    metadata: TopicMetadata
    fetched_at: float  # time.monotonic() of the Metadata answer

    @property
    def partitions(self) -> int:
        return len(self.owners)


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
    ) -> None:
        self.bootstrap = bootstrap
        self.host, self.port = parse_bootstrap(bootstrap)
        self.client_name = client_name
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.metadata_max_age = metadata_max_age_ms / 1000
        self.retry_backoff = retry_backoff_ms / 1000
        self.cores = 1  # from ApiVersions / Metadata
        self.core_ports: tuple[int, ...] = ()  # direct port of each core, from Metadata
        self.steering = False  # from Metadata: connect to the public port, steered by the kernel
        self.api_versions: ApiVersionsResponse | None = None
        # Connections by core id; a "lane" (a second connection to the same core, see
        # `connection`) by (core id, lane name).
        self._conns: dict[int | tuple[int, str], AsyncConnection] = {}
        self._connecting: dict[int | tuple[int, str], asyncio.Future[AsyncConnection]] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._topic_lookups: dict[str, asyncio.Future[TopicInfo]] = {}
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
        """Where to reach `core`: the bootstrap host at the core's direct port (from Metadata),
        or the bootstrap address when that is unknown (then the broker forwards)."""
        if 0 <= core < len(self.core_ports) and self.core_ports[core]:
            return self.host, self.core_ports[core]
        return self.host, self.port

    async def connection(self, core: int = 0, lane: str = "") -> AsyncConnection:
        """The open connection to `core`, connecting if there is none (concurrent callers share one
        connect). Raises `BrokerUnavailable` if the broker cannot be reached.

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
        pending = self._connecting.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._connect(key, core))
            self._connecting[key] = pending
        return await asyncio.shield(pending)

    def connection_nowait(self, core: int, lane: str = "") -> AsyncConnection | None:
        """The open connection to `core` (and `lane`), or None: then `await connection(...)`."""
        conn = self._conns.get((core, lane) if lane else core)
        return conn if conn is not None and not conn.closed else None

    async def _connect(self, key: int | tuple[int, str], core: int) -> AsyncConnection:
        try:
            if self.steering and core != BOOTSTRAP_KEY and self.cores > 1:
                conn = await AsyncConnection.connect_steered(
                    self.host,
                    self.port,
                    self._identity_owned_by(core),
                    core,
                    self.cores,
                    client_name=self.client_name,
                    connect_timeout=self.connect_timeout,
                    request_timeout=self.request_timeout,
                )
                if self._closed:
                    await conn.close()
                    raise ClientClosedError("the client is closed")
                self._conns[key] = conn
                return conn
            host, port = self._address_for_core(core) if core != BOOTSTRAP_KEY else (self.host, self.port)
            try:
                conn = await AsyncConnection.connect(
                    host, port, connect_timeout=self.connect_timeout, request_timeout=self.request_timeout
                )
            except BrokerUnavailable:
                if (host, port) == (self.host, self.port):
                    raise
                # The core's direct port is stale (the broker restarted on other ports): forget
                # the ports and go through the bootstrap address; the next Metadata brings new ones.
                log.debug("core %d at %s:%d unreachable; using the bootstrap address", core, host, port)
                self.core_ports = ()
                conn = await AsyncConnection.connect(
                    self.host,
                    self.port,
                    connect_timeout=self.connect_timeout,
                    request_timeout=self.request_timeout,
                )
            if self._closed:
                await conn.close()
                raise ClientClosedError("the client is closed")
            self._conns[key] = conn
            return conn
        finally:
            self._connecting.pop(key, None)

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
        connection if there is none)."""
        for key, conn in self._conns.items():
            if isinstance(key, int) and not conn.closed:
                return key
        return BOOTSTRAP_KEY

    async def request(
        self, req: Request, *, core: int | None = None, timeout: float | None = None, check: bool = True
    ) -> Response:
        """Send `req` to `core` (a non-partition request: any core) and return the response."""
        conn = await self.connection(self._control_core() if core is None else core)
        return await conn.request(req, timeout=timeout, check=check)

    # ----------------------------------------------------------------------------------- metadata

    async def refresh_metadata(self, topics: Sequence[str] = ()) -> MetadataResponse:
        """Ask for metadata of `topics` (all topics when empty) and update the cache with it."""
        resp = await self.request(MetadataRequest(tuple(topics)))
        assert isinstance(resp, MetadataResponse)
        self.cores = max(1, resp.cores)
        self.core_ports = resp.core_ports
        self.steering = resp.steering
        now = time.monotonic()
        for t in resp.topics:
            if t.error == ErrorCode.NONE:
                owners = [0] * len(t.partitions)
                for p in t.partitions:
                    if p.index < len(owners):
                        owners[p.index] = p.owner_core
                self._topics[t.name] = TopicInfo(t.name, t.topic_id, tuple(owners), t, now)
            else:
                self._topics.pop(t.name, None)
        if not topics:  # a full listing: topics it lacks are gone
            names = {t.name for t in resp.topics}
            for name in [n for n in self._topics if n not in names]:
                del self._topics[name]
        return resp

    def cached_topic(self, name: str) -> TopicInfo | None:
        """The cached entry for `name` if it is fresh enough, without any I/O."""
        info = self._topics.get(name)
        if info is not None and time.monotonic() - info.fetched_at > self.metadata_max_age:
            return None
        return info

    def invalidate(self, name: str) -> None:
        """Forget `name`: the next lookup asks the broker."""
        self._topics.pop(name, None)

    async def topic(self, name: str, *, refresh: bool = False) -> TopicInfo:
        """Metadata of topic `name`, from the cache unless stale or `refresh`. Raises
        `UnknownTopicError` when the broker does not know it."""
        if not refresh:
            info = self.cached_topic(name)
            if info is not None:
                return info
        pending = self._topic_lookups.get(name)
        if pending is None:
            pending = asyncio.get_running_loop().create_task(self._lookup(name))
            self._topic_lookups[name] = pending
        return await asyncio.shield(pending)

    async def _lookup(self, name: str) -> TopicInfo:
        try:
            resp = await self.refresh_metadata((name,))
            for t in resp.topics:
                if t.name == name and t.error != ErrorCode.NONE:
                    raise error_for(t.error, f"topic {name!r}")
            info = self._topics.get(name)
            if info is None:
                raise UnknownTopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r}")
            return info
        finally:
            self._topic_lookups.pop(name, None)

    # ----------------------------------------------------------------------------------- partitions

    async def route(self, topic: str, partition: int, *, refresh: bool = False) -> tuple[TopicInfo, int]:
        """(topic info, owner core) of a partition; raises `UnknownTopicError` for a bad index."""
        info = await self.topic(topic, refresh=refresh)
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
        """Send the request `build(topic_id)` to the core owning the partition (with `group`: to
        the group's coordinator core, where OffsetCommit and OffsetFetch are served) and return
        the response, refreshing metadata on UNKNOWN_TOPIC_OR_PARTITION / NOT_OWNER and retrying
        retriable errors and lost connections up to `retries` times with a short backoff.

        Only for requests that are safe to repeat (everything but produce, which has its own
        retry logic built on idempotence).
        """
        attempt = 0
        refresh = False
        while True:
            info, core = await self.route(topic, partition, refresh=refresh)
            if group is not None:
                core = coordinator_for(group, self.cores)
            refresh = False
            try:
                return await self.request(build(info.topic_id), core=core, timeout=timeout)
            except (UnknownTopicError, NotOwnerError) as exc:
                # Stale metadata: the topic was re-created (new id) or ownership moved.
                if attempt >= retries:
                    raise
                refresh = True
                if isinstance(exc, UnknownTopicError) and attempt >= 1:
                    raise  # fresh metadata and still unknown: it really is
                log.debug("%s/%d: %s; refreshing metadata", topic, partition, exc)
            except (RingLogError, BrokerUnavailable) as exc:
                if not exc.retriable or attempt >= retries:
                    raise
                log.debug("%s/%d: %s; retrying", topic, partition, exc)
            await asyncio.sleep(backoff_delay(attempt, self.retry_backoff, 1.0))
            attempt += 1
