"""eBPF steering beside user-space forwarding, in one run, with clients that do not route themselves.

Run (root, bcc): `.venv/bin/python bench/steering.py [--seconds S] [--rounds R] [--conns N]`

Setup. A network namespace joined to the host by a veth pair (labkit/netlab.py), so the TFO sysctl
the payload rule needs is set in the namespace only. Inside it, two brokers run at once, each
`--cores 2 --backend uvloop` on its own data dir: "steered" (`--ebpf on --tcp-fastopen-sysctl`) and
"unsteered" (`--ebpf off`: the kernel's reuseport hash picks a core, a request for another core's
partition is forwarded over the inter-core unix socket). The client process is on the host side.

Clients that do not route themselves: each of `--conns` connections is opened to the public port
with its first request sent in the SYN (MSG_FASTOPEN), exactly the same way for both brokers, and
is bound to one partition (connections spread evenly over 8 partitions). Each connection then
runs closed-loop (one request in flight): a one-record (100-byte value) produce with acks=1.
Connections are fresh each round (the steering decision is per connection). Rounds alternate
between the brokers, so drift on the machine hits both alike.

Figures: requests/s, p50/p99/p99.9 latency (µs, client-measured, send to answer; the first
request of each connection, sent in its SYN, is left out: its time includes the handshake), and
forwards per request (the brokers' STATS `forwarded` counters over the rounds / requests answered).
The issue's target: steering removes all forwards and improves p99 latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from bpf import kernel
from broker.client import Admin
from labkit.netlab import NS_MEMBERSHIP_PORT, Netns, NsBroker, fastopen_connect
from ringlog_proto import messages as m
from ringlog_proto.batch import Record, encode_batch
from ringlog_proto.frames import NEED_DATA, FrameDecoder, peek_frame_size, set_correlation_id

PARTITIONS = 8


def produce_frame(topic_id: int, partition: int, corr: int) -> bytes:
    batch = encode_batch([Record(b"v" * 100)])
    return b"".join(
        m.encode_request(m.ProduceRequest(topic_id, partition, m.Acks.WRITTEN, 30_000, batch), corr)
    )


def _frames(data: bytes):
    d = FrameDecoder()
    d.feed(data)
    while (f := d.next_frame()) is not NEED_DATA:
        yield f


async def one_connection(
    host: str, port: int, topic_id: int, p: int, stop_at: float, lat: list[float]
) -> int:
    frame = bytearray(produce_frame(topic_id, p, 0))
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    sock = await loop.run_in_executor(None, fastopen_connect, host, port, bytes(frame))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    done = 0
    corr = 0
    try:
        while True:
            head = await reader.readexactly(4)
            body = await reader.readexactly(peek_frame_size(head) - len(head))
            if done == 0:  # the first answer of each connection is checked; the rest are alike
                resp = m.decode_response(next(iter(_frames(head + body))))
                if resp.error != m.ErrorCode.NONE:
                    raise RuntimeError(f"partition {p}: {resp}")
            if done:  # the first answer's time includes the handshake and executor: not a request's
                lat.append(time.perf_counter() - t0)
            done += 1
            if time.perf_counter() >= stop_at:
                break
            corr += 1
            set_correlation_id(frame, corr)
            t0 = time.perf_counter()
            writer.write(frame)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return done


async def round_(
    host: str, port: int, topic_id: int, conns: int, seconds: float
) -> tuple[int, list[float], float]:
    lat: list[float] = []
    start = time.perf_counter()
    stop_at = start + seconds
    counts = await asyncio.gather(
        *(one_connection(host, port, topic_id, i % PARTITIONS, stop_at, lat) for i in range(conns))
    )
    return sum(counts), lat, time.perf_counter() - start


def forwarded(bootstrap: str) -> int:
    with Admin(bootstrap) as admin:
        doc = admin.stats()
    return sum(int(s.get("forwarded", 0)) for s in doc["snapshots"])


def pct(sorted_lat: list[float], q: float) -> float:
    return sorted_lat[min(len(sorted_lat) - 1, int(q * len(sorted_lat)))] * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="per round and broker")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conns", type=int, default=16)
    args = ap.parse_args()
    why = kernel.ebpf_unavailable()
    if why is not None:
        print(f"bench/steering.py needs eBPF: {why}", file=sys.stderr)
        return 1
    with Netns() as lab, tempfile.TemporaryDirectory(prefix="ringlog-steer-") as tmp:
        brokers = {
            "steered (eBPF)": NsBroker(
                lab, Path(tmp) / "a", Path(tmp) / "a.log", ("--ebpf", "on", "--tcp-fastopen-sysctl")
            ).start(),
            "unsteered (forwarding)": NsBroker(
                lab,
                Path(tmp) / "b",
                Path(tmp) / "b.log",
                ("--ebpf", "off"),
                membership_port=NS_MEMBERSHIP_PORT + 1,  # the first broker holds the default
            ).start(),
        }
        try:
            topics = {}
            for name, b in brokers.items():
                with Admin(b.bootstrap) as admin:
                    topics[name] = admin.create_topic("bench", partitions=PARTITIONS)
            results = {
                name: {"n": 0, "lat": [], "secs": 0.0, "fwd0": forwarded(b.bootstrap)}
                for name, b in brokers.items()
            }
            for r in range(args.rounds):
                for name, b in brokers.items():
                    n, lat, secs = asyncio.run(round_(b.host, b.port, topics[name], args.conns, args.seconds))
                    res = results[name]
                    res["n"] += n
                    res["lat"] += lat
                    res["secs"] += secs
                    print(f"  round {r + 1} {name}: {n / secs:,.0f} req/s", flush=True)
            time.sleep(1.2)  # other cores' counters are published once a second
            print(
                f"\nsteering bench: {args.conns} connections over {PARTITIONS} partitions, --cores 2, "
                f"one-record produce acks=1, closed loop, {args.rounds} x {args.seconds:g} s per broker"
            )
            print(f"{'':24}{'req/s':>10}{'p50 us':>9}{'p99 us':>9}{'p99.9 us':>10}{'fwd/req':>9}")
            for name, b in brokers.items():
                res = results[name]
                lat = sorted(res["lat"])
                fwd = (forwarded(b.bootstrap) - res["fwd0"]) / max(1, res["n"])
                print(
                    f"{name:24}{res['n'] / res['secs']:>10,.0f}{pct(lat, 0.5):>9.0f}{pct(lat, 0.99):>9.0f}"
                    f"{pct(lat, 0.999):>10.0f}{fwd:>9.3f}"
                )
            steer = brokers["steered (eBPF)"].bpf() or {}
            print(f"steered broker's reuseport counters: {steer.get('steer')}")
        finally:
            for b in brokers.values():
                b.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
