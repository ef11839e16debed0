"""The least the trips of R4 (bench/scale.py) can take on this machine: the same hops between bare
processes that do nothing else, so that R4's figures can be read as the machine's share and ours.

- `replicated`: a 1 KiB message from the client to a "leader", which sends it to two "followers"
  and answers the client once both have answered it (8 bytes each): the five hops of an acks=all
  produce sent alone (produce, the leader's answers to the followers' parked fetches, their next
  fetches, the reply).
- `one`: the client to a lone "node" and back: the two hops of one node's acks=1 produce.

The nodes are placed as `broker serve --cores 1 --node-id N` pins its worker (node 1 leads; on 2
CPUs it shares its CPU with node 3, as R4's leader shares its CPU with a follower); the client is
not pinned, as the bench's is not. Each hop is a blocking `sendall` and `recv` on loopback TCP
(TCP_NODELAY), one Python call each: the interpreter's share is a few microseconds a hop, the
rest is the kernel's and the VM's (waking a process, often on a halted vCPU).

Run by bench/scale.py for R4 (in a process of its own: it forks); alone:
`.venv/bin/python bench/hops_floor.py [--records N]`. Prints one JSON object: p50 and p90 of
each shape in µs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.node.supervisor import worker_cpus
from labkit.kafka_requests import read_exactly

MESSAGE = b"v" * 1024
ANSWER = b"answered"
IDLE_EXIT_S = 60.0  # a node whose peer vanished (the bench killed) leaves on its own


def _nodelay(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(IDLE_EXIT_S)
    return s


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def _follower(listener: socket.socket) -> None:
    conn = _nodelay(listener.accept()[0])
    while True:
        read_exactly(conn, len(MESSAGE))
        conn.sendall(ANSWER)


def _leader(listener: socket.socket, addresses: list[tuple[str, int]]) -> None:
    conn = _nodelay(listener.accept()[0])
    followers = [_nodelay(socket.create_connection(a)) for a in addresses]
    while True:
        message = read_exactly(conn, len(MESSAGE))
        for f in followers:
            f.sendall(message)
        for f in followers:
            read_exactly(f, len(ANSWER))
        conn.sendall(ANSWER)


def _spawn(cpu: int, run: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: pinned, serves until its peer goes, never returns
        code = 0
        try:
            os.sched_setaffinity(0, {cpu})
            run()
        except OSError:  # its peer closed (read_exactly's ConnectionError) or vanished
            pass
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    return pid


def trips(shape: str, records: int, warmup: int = 100) -> list[float]:
    """Round trips of `records` messages through `shape` ("replicated" or "one"), µs, sorted."""
    cpus = sorted(os.sched_getaffinity(0))
    place = {node: worker_cpus(cpus, 1, node)[0] for node in (1, 2, 3)}
    leader = _listener()
    pids: list[int] = []
    try:
        addresses: list[tuple[str, int]] = []
        if shape == "replicated":
            for node in (2, 3):
                listener = _listener()
                pids.append(_spawn(place[node], lambda listener=listener: _follower(listener)))
                addresses.append(listener.getsockname())
                listener.close()  # the follower's copy accepts the leader
        pids.append(_spawn(place[1], lambda: _leader(leader, addresses)))
        client = _nodelay(socket.create_connection(leader.getsockname()))
        samples = []
        with client:
            for i in range(warmup + records):
                t0 = time.perf_counter_ns()
                client.sendall(MESSAGE)
                read_exactly(client, len(ANSWER))
                if i >= warmup:
                    samples.append((time.perf_counter_ns() - t0) / 1e3)
        return sorted(samples)
    finally:
        leader.close()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2000)
    args = ap.parse_args()
    out = {}
    for shape in ("replicated", "one"):
        s = trips(shape, args.records)
        out[shape] = {"p50_us": statistics.median(s), "p90_us": s[int(len(s) * 0.9)]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
