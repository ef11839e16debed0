"""The client's routing in a cluster: route keys (node, core), leaders' addresses, offline
partitions, the group coordinator's node, several bootstrap addresses.

No cluster runs here (docs/CLUSTER.md; it is being built): the routing is a function of the
Metadata answers the client applies, so the first tests apply hand-built answers and check the
route keys and addresses. The others connect to two real single-node brokers and apply a
Metadata answer that names them as nodes 0 and 1 of a cluster: each request must reach the broker
its partition's leader names (the two logs differ), with no fake sockets anywhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import (
    AsyncAdmin,
    AsyncClient,
    AsyncConsumer,
    AsyncProducer,
    BrokerUnavailable,
    LeaderNotAvailableError,
    NotOwnerError,
    Producer,
)
from broker.client.client import NO_ROUTE, parse_bootstraps
from broker.core.views import kafka_broker_id
from labkit.brokerproc import BrokerProcess
from ringlog_proto.messages import (
    ErrorCode,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
    NodeMetadata,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetSpec,
    PartitionMetadata,
    TopicMetadata,
)
from ringlog_proto.routing import coordinator_for, coordinator_node, node_core_id, shard_for

Pair = tuple[BrokerProcess, BrokerProcess]
NODES = (
    NodeMetadata(0, "10.0.0.1", 9092, 2, (9100, 9101)),
    NodeMetadata(1, "10.0.0.2", 9092, 2, (9200, 9201)),
    NodeMetadata(2, "10.0.0.3", 9093, 4, ()),  # no direct ports: its public port
)


def part(index: int, node: int, core: int, epoch: int = 3) -> PartitionMetadata:
    replicas = ((node, core), ((node + 1) % 3, 0))
    return PartitionMetadata(index, core, -1, -1, node, epoch, replicas, replicas[:1])


def clustered(
    partitions: tuple[PartitionMetadata, ...], nodes: tuple[NodeMetadata, ...] = NODES
) -> MetadataResponse:
    topic = TopicMetadata(ErrorCode.NONE, "t", 7, partitions=partitions)
    return MetadataResponse(
        host="10.0.0.1", port=9092, cores=2, core_ports=(9100, 9101), topics=(topic,), node_id=0,
        clustered=True, nodes=nodes,
    )  # fmt: skip


def routed(resp: MetadataResponse) -> AsyncClient:
    client = AsyncClient("127.0.0.1:1")
    client.apply_metadata(resp)
    return client


# ----------------------------------------------------------------------------------- hand-built


def test_a_partition_goes_to_its_leader_nodes_core() -> None:
    client = routed(clustered((part(0, 1, 1), part(1, 2, 3), part(2, 0, 0))))
    info = client.cached_topic("t")
    assert info is not None and info.owners == (1001, 2003, 0)
    assert info.owners == tuple(kafka_broker_id(n, c) for n, c in ((1, 1), (2, 3), (0, 0)))
    assert client.address(1001) == ("10.0.0.2", 9201)  # node 1's core 1 at its direct port
    assert client.address(2003) == ("10.0.0.3", 9093)  # node 2 has no direct ports
    assert client.address(0) == ("10.0.0.1", 9100)
    with pytest.raises(ConnectionError, match="node 5"):
        client.address(node_core_id(5, 0))


def test_offline_partitions_and_down_nodes_have_no_route() -> None:
    nodes = (NODES[0], NodeMetadata(1, "10.0.0.2", 9092, 2, (9200, 9201), live=False), NODES[2])
    offline = PartitionMetadata(0, -1, -1, -1, -1, 4, ((1, 0),), ())
    on_down_node = part(1, 1, 0)
    on_unknown_node = part(2, 9, 0)
    client = routed(clustered((offline, on_down_node, on_unknown_node, part(3, 2, 1)), nodes))
    assert [client.cached_route("t", p) for p in range(4)] == [NO_ROUTE] * 3 + [2001]

    async def main() -> None:
        with pytest.raises(LeaderNotAvailableError) as caught:
            await client.connection(NO_ROUTE)
        assert isinstance(caught.value, NotOwnerError) and caught.value.retriable

    asyncio.run(main())


def test_group_coordinator_is_a_core_of_a_live_node() -> None:
    client = routed(clustered((part(0, 0, 0),)))
    seen = set()
    for i in range(60):
        group = f"group-{i}"
        node = coordinator_node(group, [0, 1, 2])
        assert client.coordinator(group) == node_core_id(node, coordinator_for(group, NODES[node].cores))
        seen.add(node)
    assert seen == {0, 1, 2}
    down = (NODES[0], NodeMetadata(1, "10.0.0.2", 9092, 2, (9200, 9201), live=False), NODES[2])
    client.apply_metadata(clustered((part(0, 0, 0),), down))
    assert all(client.coordinator(f"group-{i}") // 1000 != 1 for i in range(60))


def test_one_node_routes_by_core_as_before() -> None:
    one = MetadataResponse(
        host="x", port=9092, cores=2, core_ports=(9100, 9101), node_id=4, nodes=(NODES[1],),
        topics=(TopicMetadata(ErrorCode.NONE, "t", 7, partitions=(part(0, 4, 1), part(1, 4, 0))),),
    )  # fmt: skip
    client = routed(one)
    info = client.cached_topic("t")
    assert info is not None and info.owners == (1, 0), "one node: the route key is the core id"
    assert client.address(1) == ("127.0.0.1", 9101), "the bootstrap host at the core's direct port"
    assert client.coordinator("g") == coordinator_for("g", 2)


def test_bootstrap_lists() -> None:
    assert parse_bootstraps("a:1, b:2,[::1]:3,") == [("a", 1), ("b", 2), ("::1", 3)]
    assert parse_bootstraps("a") == [("a", 9092)]
    with pytest.raises(ValueError):
        parse_bootstraps(" , ")


# ----------------------------------------------------------------------------------- two brokers


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    procs = []
    try:
        for name, cores in (("a", 2), ("b", 1)):
            d = tmp_path_factory.mktemp(name)
            procs.append(BrokerProcess(d / "data", d / "broker.log", cores=cores).start())
        yield procs[0], procs[1]
    finally:
        for p in procs:
            if p.running():
                p.stop()


@pytest.fixture(scope="module")
def topic_id(pair: Pair) -> int:
    """Topic "t" (2 partitions) on both brokers, with other contents: 5 and 2 records on A's
    partitions 0 and 1, 3 and 4 on B's."""
    ids = set()
    for proc, counts in zip(pair, ((5, 2), (3, 4)), strict=True):

        async def main(proc: BrokerProcess = proc) -> int:
            async with AsyncAdmin(proc.bootstrap) as admin:
                return await admin.create_topic("t", 2)

        ids.add(asyncio.run(main()))
        with Producer(proc.bootstrap) as p:
            for partition, n in enumerate(counts):
                for _ in range(n):
                    p.send("t", b"x", partition=partition)
    assert len(ids) == 1, "fresh brokers give their first topic the same id"
    return ids.pop()


def as_cluster(
    a: BrokerProcess, b: BrokerProcess, tid: int, partitions: tuple[PartitionMetadata, ...]
) -> MetadataResponse:
    nodes = (
        NodeMetadata(0, "127.0.0.1", a.port, a.cores, tuple(a.core_ports[c] for c in range(a.cores))),
        NodeMetadata(1, "127.0.0.1", b.port, b.cores, tuple(b.core_ports[c] for c in range(b.cores))),
    )
    topic = TopicMetadata(ErrorCode.NONE, "t", tid, partitions=partitions)
    return MetadataResponse(
        host="127.0.0.1", port=a.port, cores=a.cores, topics=(topic,), clustered=True, nodes=nodes
    )


async def latest(client: AsyncClient, partition: int) -> int:
    resp = await client.partition_request(
        "t", partition, lambda tid: ListOffsetsRequest(tid, partition, OffsetSpec.LATEST)
    )
    assert isinstance(resp, ListOffsetsResponse)
    return resp.offset


def test_requests_reach_the_leaders_node(pair: Pair, topic_id: int) -> None:
    a, b = pair
    p1_core = shard_for(topic_id, 1, a.cores)

    async def main() -> None:
        async with AsyncClient(a.bootstrap) as client:
            client.apply_metadata(as_cluster(a, b, topic_id, (part(0, 1, 0), part(1, 0, p1_core))))
            assert await latest(client, 0) == 3, "partition 0 is led by node 1: broker B"
            assert await latest(client, 1) == 2, "partition 1 by node 0: broker A"
            assert client._conn_addrs[1000] == ("127.0.0.1", b.core_ports[0])
            assert client._conn_addrs[p1_core] == ("127.0.0.1", a.core_ports[p1_core])

            # The group's offsets go to its coordinator's node: a group node 1 coordinates.
            group = next(g for g in (f"g{i}" for i in range(100)) if coordinator_node(g, [0, 1]) == 1)
            await client.partition_request(
                "t", 0, lambda tid: OffsetCommitRequest(tid, 0, group, 3), group=group
            )  # 3: partition 0's end on B (a commit past it would be refused)
        for proc, want in ((b, 3), (a, -1)):
            async with AsyncClient(proc.bootstrap) as one:
                resp = await one.partition_request(
                    "t", 0, lambda tid: OffsetFetchRequest(tid, 0, group), group=group
                )
                assert isinstance(resp, OffsetFetchResponse) and resp.offset == want

    asyncio.run(main())


def test_an_offline_partition_is_retried_after_fresh_metadata(pair: Pair, topic_id: int) -> None:
    """Partition 0 has no leader in the applied answer: the request backs off, asks Metadata
    again (broker A, one node, answers: A serves it) and is served there; the connection to
    B, whose route key means something else now, is closed."""
    a, b = pair
    offline = PartitionMetadata(0, -1, -1, -1, -1, 5, ((1, 0),), ())

    async def main() -> None:
        async with AsyncClient(a.bootstrap, retry_backoff_ms=20) as client:
            client.apply_metadata(as_cluster(a, b, topic_id, (part(0, 1, 0), part(1, 1, 0))))
            assert await latest(client, 1) == 4  # opens node 1's core 0 (route key 1000): B
            b_conn = client.connection_nowait(1000)
            assert b_conn is not None
            client.apply_metadata(as_cluster(a, b, topic_id, (offline, part(1, 1, 0))))
            assert await latest(client, 0) == 5, "after fresh Metadata, A (one node) serves it"
            assert not client.clustered and client.connection_nowait(1000) is None
            await asyncio.sleep(0.05)
            assert b_conn.closed

    asyncio.run(main())


def test_the_first_bootstrap_address_that_answers(pair: Pair, topic_id: int) -> None:
    a, _b = pair

    async def main() -> None:
        async with AsyncClient(f"127.0.0.1:1,{a.bootstrap}", connect_timeout_ms=2000) as client:
            assert (client.host, client.port) == ("127.0.0.1", a.port)
            assert await latest(client, 0) == 5

    asyncio.run(main())


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (a broker's supervisor and its workers)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def test_metadata_avoids_a_node_that_left_a_request_unanswered(pair: Pair, topic_id: int) -> None:
    """Node 0 (broker A, the bootstrap one) stops answering (SIGSTOP: the kernel still accepts
    and buffers, as for a node paused or cut off) and a request to it times out. A Metadata asked
    next must go to node 1 over its open connection, not over the idle bootstrap connection to
    node 0, where it would wait out a timeout too (the isolation nemesis's failover took one
    request timeout more whenever the node cut off was the client's bootstrap one)."""
    a, b = pair
    p1_core = shard_for(topic_id, 1, a.cores)
    assert a.proc is not None

    async def main() -> None:
        async with AsyncClient(a.bootstrap, request_timeout_ms=500) as client:
            client.apply_metadata(as_cluster(a, b, topic_id, (part(0, 1, 0), part(1, 0, p1_core))))
            assert await latest(client, 0) == 3  # node 1's connection is open
            stopped = process_tree(a.proc.pid)  # type: ignore[union-attr]
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            try:
                with pytest.raises(BrokerUnavailable, match="no response"):
                    await client.request(ListOffsetsRequest(topic_id, 1, OffsetSpec.LATEST), core=p1_core)
                started = time.monotonic()
                resp = await client.request(MetadataRequest(("t",)))
                assert isinstance(resp, MetadataResponse) and resp.port == b.port, "node 1 answered"
                assert time.monotonic() - started < 0.4
            finally:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
            assert await latest(client, 0) == 3

    asyncio.run(main())


def test_topics_create_and_describe_commands(pair: Pair, topic_id: int) -> None:
    a, _b = pair

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "broker.cli", "topics", *args, "-b", a.bootstrap],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    assert cli("create", "r1", "--partitions", "2", "--replication-factor", "1").returncode == 0
    refused = cli("create", "r2", "--replication-factor", "2")
    assert refused.returncode == 1 and "needs a cluster" in refused.stderr
    lines = cli("describe", "t").stdout.splitlines()
    assert lines[2].split() == [
        "partition",
        "leader",
        "core",
        "epoch",
        "replicas",
        "isr",
        "start",
        "end",
        "records",
    ]
    rows = [line.split() for line in lines[3:5]]
    assert lines[5].split() == ["configs:", "the", "broker's", "defaults"]  # "t" overrides none
    p0_core = shard_for(topic_id, 0, a.cores)
    assert rows[0] == ["0", "0", str(p0_core), "0", f"0:{p0_core}", f"0:{p0_core}", "0", "5", "5"]
    assert [r[7] for r in rows] == ["5", "2"]


def test_producer_and_consumer_wait_for_a_leader(pair: Pair, topic_id: int) -> None:
    """Topic "u" (on A only) is offline in the applied answer: the producer's batch and the
    consumer's first ListOffsets wait, ask Metadata again, and go where it says (A, one node).
    (`topic_id` first: "t" must be the first topic of both brokers, to have one id on both.)"""
    a, b = pair

    async def main() -> None:
        async with AsyncAdmin(a.bootstrap) as admin:
            tid = await admin.create_topic("u", 1)
        offline = TopicMetadata(
            ErrorCode.NONE, "u", tid, partitions=(PartitionMetadata(0, -1, -1, -1, -1, 2, ((1, 0),), ()),)
        )
        for role in ("producer", "consumer"):
            client = AsyncClient(a.bootstrap, retry_backoff_ms=20)
            await client.start()
            client.apply_metadata(dataclasses.replace(as_cluster(a, b, tid, ()), topics=(offline,)))
            assert client.cached_route("u", 0) == NO_ROUTE
            if role == "producer":
                async with AsyncProducer(a.bootstrap, client=client, retry_backoff_ms=20) as p:
                    md = await asyncio.wait_for(await p.send("u", b"hello", partition=0), 10)
                    assert (md.partition, md.offset) == (0, 0)
            else:
                async with AsyncConsumer(a.bootstrap, client=client, auto_offset_reset="earliest") as c:
                    await c.assign([("u", 0)])
                    records = await c.poll(5000)
                    assert [r.value for r in records] == [b"hello"]
            assert not client.clustered, "the fresh Metadata came from A, one node"
            await client.close()

    asyncio.run(main())
