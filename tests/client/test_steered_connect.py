"""The client's side of steering that needs no eBPF: the source port rule and the steered
connection's first frame, against a plain listener (no root needed)."""

from __future__ import annotations

import asyncio
import socket

from broker.client.connection import AsyncConnection, bind_source_port_for
from ringlog_proto import messages as m
from ringlog_proto import routing
from ringlog_proto.frames import NEED_DATA, FrameDecoder


def test_source_port_has_the_core_residue() -> None:
    for cores in (2, 3, 7):
        for core in range(cores):
            with socket.socket() as s:
                port = bind_source_port_for(s, socket.AF_INET, core, cores)
                assert port and s.getsockname()[1] == port
                assert routing.port_owner(port, cores, (1 << cores) - 1) == core
    with socket.socket() as s:
        assert bind_source_port_for(s, socket.AF_INET, 0, 1) == 0  # one core: nothing to choose


def test_steered_connection_sends_the_partition_identity_first() -> None:
    """Without eBPF the connection still works: the hello (ApiVersions with the identity in its
    header) is the first frame the listener reads, whether or not it came in the SYN."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    async def body() -> tuple[int, int, int, int]:
        conn = await AsyncConnection.connect_steered("127.0.0.1", port, (77, 5), 1, 2)
        try:
            loop = asyncio.get_running_loop()
            peer, addr = await loop.run_in_executor(None, listener.accept)
            with peer:
                peer.settimeout(5)
                d = FrameDecoder()
                f = d.next_frame()
                while f is NEED_DATA:
                    d.feed(peer.recv(4096))
                    f = d.next_frame()
            return f.api_key, f.topic_id, f.partition, addr[1]
        finally:
            await conn.close()

    try:
        api, topic_id, partition, source_port = asyncio.run(body())
    finally:
        listener.close()
    assert (api, topic_id, partition) == (m.ApiKey.API_VERSIONS, 77, 5)
    assert source_port % 2 == 1  # the port rule's residue for core 1
