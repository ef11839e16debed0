"""Topic administration: create, delete, list, describe, and their configs; and what the broker
supports.

`describe_topic` is Metadata for one topic, returned fresh (never from the cache): per-partition
start and end offsets, leaders and in-sync sets are facts of the moment, not routing data. A core
knows the offsets of its own partitions only (Metadata says -1 for the others), so those are asked
of their owners (in a cluster: leaders) with ListOffsets; a partition with no live leader is
described with offsets -1 rather than waited for.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.client.client import DEFAULT_BOOTSTRAP, NO_ROUTE, AsyncClient
from broker.client.errors import ClientClosedError, error_for
from broker.client.loop_thread import LoopThread
from broker.client.security import Security
from ringlog_proto.messages import (
    AlterConfigsRequest,
    ApiVersionsRequest,
    ApiVersionsResponse,
    ConfigChange,
    ConfigDescription,
    ConfigOp,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    ErrorCode,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataResponse,
    OffsetSpec,
    PartitionMetadata,
    StatsRequest,
    StatsResponse,
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    owner_core: int  # the core serving it on its leader node; -1: no leader
    start_offset: int  # first offset still stored (-1: unknown, no live leader)
    end_offset: int  # next offset to be assigned (the high watermark)
    leader_node: int = 0  # -1: offline (no in-sync replica is live); one node: its node id
    leader_epoch: int = 0
    replicas: tuple[tuple[int, int], ...] = ()  # (node id, core), the preferred leader first
    isr: tuple[tuple[int, int], ...] = ()  # the in-sync replicas, as (node id, core)


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: int
    retention_ms: int  # -2: forever
    retention_bytes: int  # -2: unlimited
    segment_bytes: int
    partitions: tuple[PartitionDescription, ...]
    cores: int  # the answering broker's worker cores (one node: owner_core is one of 0..cores-1)
    clustered: bool = False  # the answering broker is part of a cluster


def _limit(value: int | None) -> int:
    """None (the broker's default) is -1 on the wire."""
    return -1 if value is None else value


class AsyncAdmin:
    """Topic administration over an `AsyncClient` (its own unless one is given)."""

    def __init__(
        self,
        bootstrap: str = DEFAULT_BOOTSTRAP,
        *,
        request_timeout_ms: int = 30_000,
        client: AsyncClient | None = None,
        client_name: str = "ringlog-python-admin",
        security: Security | None = None,
    ) -> None:
        self._own_client = client is None
        self._client = client or AsyncClient(
            bootstrap, client_name=client_name, request_timeout_ms=request_timeout_ms, security=security
        )

    async def start(self) -> None:
        await self._client.start()

    async def close(self) -> None:
        if self._own_client:
            await self._client.close()

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
        replication: int = -1,
        configs: Mapping[str, str] | None = None,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> int:
        """Create a topic; returns its id. None means the broker's default; -2 for retention
        means keep forever / unlimited; `replication` is the copies of each partition (-1: the
        broker's default; more than 1 needs a cluster of that many live nodes); `configs` are
        topic configs by Kafka's names (`{"cleanup.policy": "compact"}`: docs/KAFKA.md, "Topic
        configs"), which win over the limits above; `assignment` places each partition's
        replicas by hand, node ids with the preferred leader first (one list per partition: as
        many as `partitions`; a single node: `[[0]]` alone). Raises `TopicExistsError`,
        `InvalidTopicError`, `InvalidConfigError`, `InvalidRequestError` (an assignment naming
        an unknown node, one twice, or one with no live node)."""
        resp = await self._client.request(
            CreateTopicRequest(
                name,
                partitions,
                _limit(retention_ms),
                _limit(retention_bytes),
                _limit(segment_bytes),
                replication,
                tuple((str(k), str(v)) for k, v in (configs or {}).items()),
                tuple(tuple(int(n) for n in r) for r in assignment or ()),
            )
        )
        assert isinstance(resp, CreateTopicResponse)
        self._client.invalidate(name)
        return resp.topic_id

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its data. Raises `UnknownTopicError` if there is none."""
        await self._client.request(DeleteTopicRequest(name))
        self._client.invalidate(name)

    async def describe_configs(self, name: str, keys: Sequence[str] = ()) -> dict[str, ConfigDescription]:
        """Every config of topic `name` (or those of `keys`) by name: its effective value, where
        it comes from (`ConfigSource`: the topic's override, a broker flag, built in) and what it
        does. Raises `UnknownTopicError`."""
        resp = await self._client.request(DescribeConfigsRequest(name, tuple(keys)))
        assert isinstance(resp, DescribeConfigsResponse)
        return {c.name: c for c in resp.configs}

    async def alter_configs(
        self,
        name: str,
        set: Mapping[str, str] | None = None,
        delete: Sequence[str] = (),
        append: Mapping[str, str] | None = None,
        subtract: Mapping[str, str] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Change topic `name`'s configs: `set` overrides, `delete` overrides (back to the
        broker's default), `append`/`subtract` values of list configs (cleanup.policy); the
        others are kept. Every core applies the change within about a second. Raises
        `InvalidConfigError` (a bad name or value: nothing changed), `UnknownTopicError`."""
        changes = [ConfigChange(k, ConfigOp.SET, str(v)) for k, v in (set or {}).items()]
        changes += [ConfigChange(k, ConfigOp.DELETE) for k in delete]
        changes += [ConfigChange(k, ConfigOp.APPEND, str(v)) for k, v in (append or {}).items()]
        changes += [ConfigChange(k, ConfigOp.SUBTRACT, str(v)) for k, v in (subtract or {}).items()]
        await self._client.request(AlterConfigsRequest(name, True, validate_only, tuple(changes)))

    async def replace_configs(
        self, name: str, configs: Mapping[str, str], validate_only: bool = False
    ) -> None:
        """Make `configs` topic `name`'s overrides: every config they leave out goes back to the
        broker's default (Kafka's AlterConfigs)."""
        changes = tuple(ConfigChange(k, ConfigOp.SET, str(v)) for k, v in configs.items())
        await self._client.request(AlterConfigsRequest(name, False, validate_only, changes))

    async def list_topics(self) -> list[str]:
        """Names of all topics, sorted."""
        resp = await self._client.refresh_metadata(())
        return sorted(t.name for t in resp.topics if t.error == ErrorCode.NONE)

    async def describe_topic(self, name: str) -> TopicDescription:
        """A topic's settings and, per partition, leader node and core, leader epoch, replicas,
        in-sync replicas and start/end offsets (fresh)."""
        resp: MetadataResponse = await self._client.refresh_metadata((name,))
        for t in resp.topics:
            if t.name != name:
                continue
            if t.error != ErrorCode.NONE:
                raise error_for(t.error, f"topic {name!r}")
            parts = tuple(
                await asyncio.gather(
                    *(self._describe_partition(name, p) for p in sorted(t.partitions, key=lambda p: p.index))
                )
            )
            return TopicDescription(
                t.name,
                t.topic_id,
                t.retention_ms,
                t.retention_bytes,
                t.segment_bytes,
                parts,
                resp.cores,
                resp.clustered,
            )
        raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r}")

    async def _describe_partition(self, topic: str, p: PartitionMetadata) -> PartitionDescription:
        start, end = p.start_offset, p.end_offset
        if (start < 0 or end < 0) and self._client.cached_route(topic, p.index) != NO_ROUTE:
            offsets = []
            for spec in (OffsetSpec.EARLIEST, OffsetSpec.LATEST):
                resp = await self._client.partition_request(
                    topic, p.index, functools.partial(ListOffsetsRequest, partition=p.index, spec=spec)
                )
                assert isinstance(resp, ListOffsetsResponse)
                offsets.append(resp.offset)
            start, end = offsets
        return PartitionDescription(
            p.index, p.owner_core, start, end, p.leader_node, p.leader_epoch, p.replicas, p.isr
        )

    async def stats(self) -> dict[str, Any]:
        """Every core's counters (the STATS api; docs/PROTOCOL.md §4.12): a dict with
        `answered_by`, `cores`, `snapshots` (one per core) and `bpf` (the eBPF steering and XDP
        counters, or None; absent from older brokers)."""
        resp = await self._client.request(StatsRequest())
        assert isinstance(resp, StatsResponse)
        doc: dict[str, Any] = json.loads(resp.stats_json)
        return doc

    async def api_versions(self) -> ApiVersionsResponse:
        """The broker's version, node id, core count and supported API version ranges."""
        resp = await self._client.request(ApiVersionsRequest(self._client.client_name))
        assert isinstance(resp, ApiVersionsResponse)
        return resp


class Admin:
    """The blocking admin: an `AsyncAdmin` on an event loop in a daemon thread."""

    def __init__(self, bootstrap: str = DEFAULT_BOOTSTRAP, **config: Any) -> None:
        self._thread = LoopThread("ringlog-admin")
        self._closed = False
        try:
            self._async: AsyncAdmin = self._thread.run(self._make(bootstrap, config))
        except BaseException:
            self._thread.stop()
            raise

    @staticmethod
    async def _make(bootstrap: str, config: dict[str, Any]) -> AsyncAdmin:
        admin = AsyncAdmin(bootstrap, **config)
        try:
            await admin.start()
        except BaseException:
            await admin.close()
            raise
        return admin

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ClientClosedError("the admin client is closed")
        return self._thread.run(coro)

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
        replication: int = -1,
        configs: Mapping[str, str] | None = None,
        assignment: Sequence[Sequence[int]] | None = None,
    ) -> int:
        return self._run(
            self._async.create_topic(
                name,
                partitions,
                retention_ms,
                retention_bytes,
                segment_bytes,
                replication,
                configs,
                assignment,
            )
        )

    def delete_topic(self, name: str) -> None:
        self._run(self._async.delete_topic(name))

    def describe_configs(self, name: str, keys: Sequence[str] = ()) -> dict[str, ConfigDescription]:
        return self._run(self._async.describe_configs(name, keys))

    def alter_configs(
        self,
        name: str,
        set: Mapping[str, str] | None = None,
        delete: Sequence[str] = (),
        append: Mapping[str, str] | None = None,
        subtract: Mapping[str, str] | None = None,
        validate_only: bool = False,
    ) -> None:
        self._run(self._async.alter_configs(name, set, delete, append, subtract, validate_only))

    def replace_configs(self, name: str, configs: Mapping[str, str], validate_only: bool = False) -> None:
        self._run(self._async.replace_configs(name, configs, validate_only))

    def list_topics(self) -> list[str]:
        return self._run(self._async.list_topics())

    def describe_topic(self, name: str) -> TopicDescription:
        return self._run(self._async.describe_topic(name))

    def api_versions(self) -> ApiVersionsResponse:
        return self._run(self._async.api_versions())

    def stats(self) -> dict[str, Any]:
        return self._run(self._async.stats())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._async.close())
        finally:
            self._thread.stop()
