"""A seeded, deterministic network of SWIM nodes in virtual time (tests/cluster, bench/swim.py).

Rules this module keeps:
- One `random.Random(seed)` drives the network (loss, latency) and seeds each node's own
  generator: a seed replays a run exactly. No wall clock, no sockets.
- Events (packet arrivals, node timers from `next_deadline()`) run in time order from one heap;
  equal times keep insertion order.
- A packet is lost with the link's loss rate (`loss`, or `link_loss[(src, dst)]`), and never
  crosses a partition (`partition(groups)`; nodes in no group are cut off from everyone). Latency is
  uniform in [latency_min, latency_max].
- crash: the node stops (no timers, packets to it vanish). pause: packets to it queue, its timers
  stop; resume delivers the queue, then ticks (a stopped process's socket buffer, then its clock).
  restart: a new Swim with a higher incarnation joins through the seeds again. leave: graceful.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

from broker.cluster.swim import MemberEvent, Swim, SwimConfig
from ringlog_proto.membership import ALIVE, SUSPECT, Addr, Keyring, Member

KEYRING = Keyring([bytes(range(32))])  # the simulated cluster's key: every packet is signed as on the wire


def member(nid: int, rack: str = "") -> Member:
    return Member(nid, f"10.0.{nid >> 8}.{nid & 255}", 9092, 7946, (40000 + nid, 41000 + nid), 2, 100, rack)


@dataclass(slots=True)
class SimNode:
    nid: int
    swim: Swim
    crashed: bool = False
    paused: bool = False
    wake: float = math.inf
    inbox: list[tuple[Addr, bytes]] = field(default_factory=list)  # queued while paused


class Sim:
    def __init__(
        self,
        seed: int = 1,
        loss: float = 0.0,
        latency_min: float = 0.0002,
        latency_max: float = 0.002,
        config: SwimConfig | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.loss = loss
        self.link_loss: dict[tuple[int, int], float] = {}
        self.latency = (latency_min, latency_max)
        self.config = config or SwimConfig()
        self.now = 0.0
        self.nodes: dict[int, SimNode] = {}
        self.by_addr: dict[Addr, int] = {}
        self.groups: dict[int, int] | None = None
        self.events: list[tuple[float, int, MemberEvent]] = []  # (time, observer, event)
        self.packets = 0
        self.lost = 0
        self._heap: list[tuple[float, int, int, object]] = []
        self._n = 0
        self._incarnation = 1

    # ------------------------------------------------------------------------- nodes

    def add(self, nid: int, seeds: list[int] = (), rack: str = "") -> Swim:  # type: ignore[assignment]
        m = member(nid, rack)
        self._incarnation += 1
        swim = Swim(
            m, KEYRING, self.config, random.Random(self.rng.getrandbits(64)), self.now, self._incarnation
        )
        node = SimNode(nid, swim)
        self.nodes[nid] = node
        self.by_addr[m.addr] = nid
        if seeds:
            swim.join([self.nodes[s].swim.me.addr for s in seeds], self.now)
        self._after(node)
        return swim

    def crash(self, nid: int) -> None:
        self.nodes[nid].crashed = True

    def restart(self, nid: int, seeds: list[int]) -> Swim:
        old = self.nodes[nid].swim
        self._incarnation = max(self._incarnation, old.incarnation)
        return self.add(nid, seeds, old.me.rack)

    def pause(self, nid: int) -> None:
        self.nodes[nid].paused = True

    def resume(self, nid: int) -> None:
        node = self.nodes[nid]
        node.paused = False
        inbox, node.inbox = node.inbox, []
        for src, data in inbox:
            node.swim.receive(data, src, self.now)
        node.swim.tick(self.now)
        self._after(node)

    def leave(self, nid: int) -> None:
        node = self.nodes[nid]
        node.swim.leave(self.now)
        self._after(node)

    def partition(self, *groups: set[int]) -> None:
        self.groups = {nid: i for i, g in enumerate(groups) for nid in g}

    def heal(self) -> None:
        self.groups = None

    def live(self) -> list[int]:
        return [nid for nid, n in self.nodes.items() if not n.crashed and not n.swim.left]

    # ------------------------------------------------------------------------- running

    def run_until(self, t: float) -> None:
        while self._heap and self._heap[0][0] <= t:
            when, _, kind, what = heapq.heappop(self._heap)
            self.now = when
            if kind == 0:
                nid = what
                node = self.nodes[nid]  # type: ignore[index]
                if node.wake != when or node.crashed or node.paused:
                    continue
                node.wake = math.inf
                node.swim.tick(when)
                self._after(node)
            else:
                src, dst, data = what  # type: ignore[misc]
                nid = self.by_addr.get(dst)
                if nid is None:
                    continue
                node = self.nodes[nid]
                if node.crashed:
                    continue
                if node.paused:
                    node.inbox.append((src, data))
                    continue
                node.swim.receive(data, src, when)
                self._after(node)
        self.now = t

    def run_for(self, dt: float) -> None:
        self.run_until(self.now + dt)

    def _push(self, when: float, kind: int, what: object) -> None:
        self._n += 1
        heapq.heappush(self._heap, (when, self._n, kind, what))

    def _after(self, node: SimNode) -> None:
        swim = node.swim
        for ev in swim.take_events():
            self.events.append((self.now, node.nid, ev))
        src = swim.me.addr
        for dst, data in swim.take_outgoing():
            self.packets += 1
            dst_id = self.by_addr.get(dst)
            if node.crashed or dst_id is None or not self._connected(node.nid, dst_id):
                self.lost += 1
                continue
            if self.rng.random() < self.link_loss.get((node.nid, dst_id), self.loss):
                self.lost += 1
                continue
            self._push(self.now + self.rng.uniform(*self.latency), 1, (src, dst, data))
        d = swim.next_deadline()
        if d < node.wake and not node.crashed:
            node.wake = max(d, self.now)
            self._push(node.wake, 0, node.nid)

    def _connected(self, a: int, b: int) -> bool:
        if self.groups is None:
            return True
        ga, gb = self.groups.get(a), self.groups.get(b)
        return ga is not None and ga == gb

    # ------------------------------------------------------------------------- views

    def state_of(self, observer: int, nid: int) -> str | None:
        for v in self.nodes[observer].swim.members():
            if v.member.node_id == nid:
                return v.state
        return None

    def converged(self, nodes: list[int] | None = None) -> bool:
        """Every live node (or each of `nodes`) holds exactly the live nodes as members (alive, or
        suspect: under loss some suspicion is always being refuted somewhere)."""
        live = set(self.live())
        for nid in nodes if nodes is not None else live:
            alive = {v.member.node_id for v in self.nodes[nid].swim.members() if v.state in (ALIVE, SUSPECT)}
            if alive != live:
                return False
        return True

    def run_until_converged(self, limit: float, step: float = 0.1) -> float | None:
        """Virtual seconds until converged (checked every `step`), None if not within `limit`."""
        start = self.now
        while self.now - start < limit:
            self.run_for(step)
            if self.converged():
                return self.now - start
        return None
