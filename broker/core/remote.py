"""Links to other brokers' cores over TCP, without I/O: which link carries a request, failures,
reconnects. Replication's follower fetches from its leader's core through it.

Rules this module keeps:
- No sockets, no clock of its own. A backend implements ONE primitive, handed in:

      open_remote(host: str, port: int, long_poll: bool) -> RemoteChannel | None

  "Start connecting to the broker core listening at host:port (an IP literal: a name lookup would
  block the loop) over TCP, with TCP_NODELAY and a connect timeout (`REMOTE_CONNECT_TIMEOUT_S`,
  broker/core/limits.py), without blocking the loop" (io_uring: a connect SQE with a linked
  timeout; asyncio: `loop.sock_connect`). None: it could not even start. The channel queues what
  is sent before the connection is up; it calls `on_gone(exc)` once when it closes, for whatever
  reason, and then fails what is pending on its link.
- The remote end is an ordinary broker listener, the remote core's direct port: our frame protocol
  (its first bytes choose the decoder there), nothing special server-side. The frames sent are
  ordinary requests (Metadata, Fetch, ...) and their answers are matched by correlation id by the
  same `PeerLink` (broker/core/forwarding.py) as inter-core forwarding.
- Links: one per (local core, remote core, long_poll), as forwarding has per peer core. Each
  worker's core has its own `RemoteLinks` (`BackendCore.remote_links`, also `Core.remote_links`),
  and per remote address one link for ordinary requests and one for long polls. The remote core
  answers a connection in request order, so a long poll would hold back every answer behind it:
  long polls (`long_poll=True`) go on the long-poll link only, where a second long poll waits
  behind the first; a caller keeps one long poll in flight per remote core (a follower's fetcher
  does) and sends everything else as ordinary requests, which never wait behind a long poll.
- Failures, exactly as a lost inter-core link: a link that cannot connect (refused, unreachable,
  the connect timeout) or is lost fails every request pending on it with a `PeerLinkError`
  through its `done(exc)`. Each request has a deadline (a `clock` reading, `NO_DEADLINE` for
  none); a watch every `PEER_WATCH_S` while requests are pending closes a link holding a request
  past its deadline and fails what is on it with `PeerTimeout` (answers come in order: nothing
  behind it can come sooner).
- Reconnects: a link lost with requests pending, or that failed to connect, puts its address in
  back-off, `REMOTE_RETRY_S_MIN` doubling to `REMOTE_RETRY_S_MAX` while links keep failing, reset
  by the first answer. Requests made meanwhile wait here, in order, and go on a new link when the
  back-off ends (one whose deadline passes first fails with `PeerTimeout`): a caller that retries
  at once after a failure does not spin. A link the remote closed while idle (its
  --connection-idle-ms) is simply reopened by the next request.
- Logins: where the remote cores want SASL (`--sasl-mechanisms`; a cluster's nodes share their
  settings), every new link first runs the exchange of docs/PROTOCOL.md §4.15 as the
  inter-broker user (`login`, a `SaslLogin` of ringlog_proto/sasl.py per link), and what is
  sent on it meanwhile waits in order behind the exchange: the remote answers anything else sent before with
  ILLEGAL_SASL_STATE and closes. A refused login fails the link like a refused connect (its
  requests fail, the address backs off), logged once until a login there succeeds again.
- Owned by the core's event-loop thread; timers from the backend's `call_later`. At shutdown
  (`close_all`) everything pending or waiting fails.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Final, Protocol

from broker.core.forwarding import (
    NO_DEADLINE,
    PEER_WATCH_S,
    CallLater,
    Done,
    PeerLink,
    PeerLinkError,
    PeerTimeout,
)
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame
from ringlog_proto.sasl import SaslLogin

log = logging.getLogger(__name__)

# The first back-off after a failed link, doubling while links keep failing: a restarting broker
# listens again within about a second, and is found within one back-off of that; a broker that
# stays down costs one connect attempt per `REMOTE_RETRY_S_MAX` (the supervisor's worker restarts
# back off the same way, 0.25 s doubling to 2 s).
REMOTE_RETRY_S_MIN: Final = 0.1
REMOTE_RETRY_S_MAX: Final = 2.0

# How long a new link's login may take (a remote that accepts and never answers is closed).
LOGIN_TIMEOUT_S: Final = 10.0

Address = tuple[str, int]  # (IP literal, port) of a remote core's direct listener


def address_label(host: str, port: int) -> str:
    """How logs and errors name a remote core: host:port, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RemoteChannel(Protocol):
    """What a backend's end of one TCP link to another broker's core offers `RemoteLinks`."""

    link: PeerLink
    on_gone: Callable[[BaseException | None], None] | None

    def send(self, frame: Frame, done: Done | None, deadline: float = NO_DEADLINE) -> None: ...
    def close(self) -> None: ...


OpenRemote = Callable[[str, int, bool], RemoteChannel | None]


class _Waiting:
    __slots__ = ("deadline", "done", "frame", "long_poll")

    def __init__(self, frame: Frame, deadline: float, done: Done, long_poll: bool) -> None:
        self.frame = frame
        self.deadline = deadline
        self.done = done
        self.long_poll = long_poll


class _Remote:
    """One remote address: its two links, its back-off and the requests waiting for it to end."""

    __slots__ = (
        "address",
        "backoff_s",
        "held",
        "label",
        "links",
        "login_failed",
        "retry_at",
        "retry_scheduled",
        "waiting",
    )

    def __init__(self, address: Address) -> None:
        self.address = address
        self.label = address_label(*address)
        self.links: dict[bool, RemoteChannel] = {}  # long_poll -> the open link
        # long_poll -> what was sent on that link while its login runs: (frame, deadline, done)
        self.held: dict[bool, list[tuple[Frame, float, Done]]] = {}
        self.login_failed = False  # logged: the next refusals are quiet until a login succeeds
        self.backoff_s = 0.0  # the last back-off (0: the last link did not fail)
        self.retry_at = -math.inf  # no new link before this clock reading
        self.retry_scheduled = False
        self.waiting: deque[_Waiting] = deque()  # requests made during the back-off, in order


class RemoteLinks:
    """The TCP links of one core to other brokers' cores (module rules). Use from the core's loop:

        links.request(("10.0.0.2", 9101), frame, clock() + 5.0, done, long_poll=False)

    `done(answer_frame)` or `done(exc)` is called exactly once (never from inside `request`
    unless the request fails at once: shutting down, or a backend that cannot open a socket).
    """

    def __init__(
        self,
        open_remote: OpenRemote,
        call_later: CallLater,
        stopping: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        login: Callable[[], SaslLogin] | None = None,
    ) -> None:
        self._open_remote = open_remote
        self._login = login  # None: the remotes take requests without authentication
        self._call_later = call_later
        self._stopping = stopping
        self.clock = clock
        self._remotes: dict[Address, _Remote] = {}
        self._watching = False

    @property
    def pending(self) -> int:
        """Requests sent and not answered, plus those waiting for a back-off to end."""
        return sum(
            len(r.waiting)
            + sum(pc.link.pending for pc in r.links.values())
            + sum(len(h) for h in r.held.values())
            for r in self._remotes.values()
        )

    def request(
        self, address: Address, frame: Frame, deadline: float, done: Done, *, long_poll: bool = False
    ) -> None:
        """Send `frame` (a request; its correlation id is the link's to choose) to the core at
        `address`; `done` gets the answer or an exception by `deadline` (a `clock` reading) at the
        latest (a long poll's deadline leaves it its max_wait, plus the time to answer). Raises
        ValueError for a host that is not an IP address."""
        if self._stopping():
            done(PeerLinkError("shutting down"))
            return
        remote = self._remotes.get(address)
        if remote is None:
            host, port = address
            ipaddress.ip_address(host)  # ValueError for a name: resolving it would block the loop
            if not 0 < port <= 0xFFFF:
                raise ValueError(f"not a port: {port}")
            remote = self._remotes[address] = _Remote(address)
        if remote.waiting or self.clock() < remote.retry_at:
            remote.waiting.append(_Waiting(frame, deadline, done, long_poll))
            self._retry_later(remote)
            self._watch_soon()
            return
        self._send(remote, frame, deadline, done, long_poll)

    def close(self, address: Address) -> None:
        """Close the links to `address` and fail what is pending or waiting for them."""
        remote = self._remotes.pop(address, None)
        if remote is not None:
            self._close_remote(remote, PeerLinkError(f"links to {remote.label} closed"))

    def close_all(self) -> None:
        """Shutdown: close every link, failing what is pending or waiting."""
        remotes, self._remotes = self._remotes, {}
        for remote in remotes.values():
            self._close_remote(remote, PeerLinkError(f"{remote.label}: shutting down"))

    # ------------------------------------------------------------------------- links

    def _send(self, remote: _Remote, frame: Frame, deadline: float, done: Done, long_poll: bool) -> None:
        pc = remote.links.get(long_poll)
        if pc is None or pc.link.closed:
            pc = self._open(remote, long_poll)
            if pc is None:
                self._back_off(remote)
                done(PeerLinkError(f"cannot connect to {remote.label}"))
                return

        def answered(result: Frame | BaseException) -> None:
            if not isinstance(result, BaseException):
                remote.backoff_s = 0.0  # it answers: the next failure starts the back-off afresh
            done(result)

        held = remote.held.get(long_poll)
        if held is not None:
            held.append((frame, deadline, answered))  # behind the link's login
        else:
            pc.send(frame, answered, deadline)
        self._watch_soon()

    def _open(self, remote: _Remote, long_poll: bool) -> RemoteChannel | None:
        host, port = remote.address
        pc = self._open_remote(host, port, long_poll)
        if pc is None:
            return None
        remote.links[long_poll] = pc

        def gone(exc: BaseException | None) -> None:
            # Before its link fails what it carries: a request re-sent from a `done` finds the
            # back-off (or, after an idle close, opens a new link).
            if remote.links.get(long_poll) is not pc:
                return  # closed here already (`_close_link`)
            del remote.links[long_poll]
            held = remote.held.pop(long_poll, [])
            if pc.link.pending or held:
                log.warning("link to %s lost: %s", remote.label, exc or "closed by the remote")
                self._back_off(remote)
            if held:
                reason = PeerLinkError(f"link to {remote.label} lost: {exc or 'closed by the remote'}")
                for _, _, done in held:
                    done(reason)

        pc.on_gone = gone
        if self._login is not None:
            remote.held[long_poll] = []
            self._log_in(remote, long_poll, pc, self._login())
        return pc

    def _log_in(self, remote: _Remote, long_poll: bool, pc: RemoteChannel, login: SaslLogin) -> None:
        """Run `login` on the new link `pc`, then send what waited behind it (module rules)."""
        deadline = self.clock() + LOGIN_TIMEOUT_S

        def step(result: Frame | BaseException) -> None:
            if isinstance(result, BaseException) or remote.links.get(long_poll) is not pc:
                return  # the link is gone: `gone` or `_close_link` failed what it held
            try:
                following = login.answer(m.decode_response(result))
            except (ValueError, m.MalformedBody) as exc:
                if not remote.login_failed:
                    log.error("cannot log in to %s as the inter-broker user: %s", remote.label, exc)
                    remote.login_failed = True
                self._close_link(remote, long_poll, PeerLinkError(f"login to {remote.label} refused: {exc}"))
                self._back_off(remote)
                return
            if following is not None:
                pc.send(m.request_frame(following), step, deadline)
                return
            if remote.login_failed:
                log.info("logged in to %s", remote.label)
                remote.login_failed = False
            for frame, request_deadline, done in remote.held.pop(long_poll, []):
                pc.send(frame, done, request_deadline)

        pc.send(m.request_frame(login.first()), step, deadline)

    def _back_off(self, remote: _Remote) -> None:
        last = remote.backoff_s
        remote.backoff_s = min(REMOTE_RETRY_S_MAX, last * 2) if last else REMOTE_RETRY_S_MIN
        remote.retry_at = self.clock() + remote.backoff_s

    def _close_link(self, remote: _Remote, long_poll: bool, reason: PeerLinkError) -> None:
        pc = remote.links.pop(long_poll, None)
        if pc is not None:
            pc.link.lost(reason)
            pc.close()
        for _, _, done in remote.held.pop(long_poll, []):
            done(reason)

    def _close_remote(self, remote: _Remote, reason: PeerLinkError) -> None:
        waiting, remote.waiting = remote.waiting, deque()
        for long_poll in list(remote.links):
            self._close_link(remote, long_poll, reason)
        for w in waiting:
            w.done(reason)

    # ------------------------------------------------------------------------- back-off and deadlines

    def _retry_later(self, remote: _Remote) -> None:
        if remote.retry_scheduled:
            return
        remote.retry_scheduled = True
        self._call_later(max(0.0, remote.retry_at - self.clock()), lambda: self._retry(remote))

    def _retry(self, remote: _Remote) -> None:
        """The back-off ended: the waiting requests go, in order, on new links (until a link
        fails to open again, which starts the next back-off for the rest)."""
        remote.retry_scheduled = False
        if self._remotes.get(remote.address) is not remote:
            return  # closed meanwhile (its waiting requests failed then)
        waiting = remote.waiting
        while waiting and self.clock() >= remote.retry_at:
            w = waiting.popleft()
            if w.deadline < self.clock():
                w.done(PeerTimeout(f"{remote.label} was not reachable before the request's deadline"))
            else:
                self._send(remote, w.frame, w.deadline, w.done, w.long_poll)
        if waiting:
            self._retry_later(remote)

    def _watch_soon(self) -> None:
        if not self._watching:
            self._watching = True
            self._call_later(PEER_WATCH_S, self._watch)

    def _watch(self) -> None:
        """Close the links holding a request past its deadline; fail waiting ones past theirs."""
        self._watching = False
        now = self.clock()
        busy = False
        for remote in list(self._remotes.values()):
            for long_poll, pc in list(remote.links.items()):
                if pc.link.overdue(now):
                    self._close_link(
                        remote, long_poll, PeerTimeout(f"{remote.label} did not answer by the deadline")
                    )
                    self._back_off(remote)
                elif pc.link.pending:
                    busy = True
            if remote.waiting:
                late = [w for w in remote.waiting if w.deadline < now]
                for w in late:
                    remote.waiting.remove(w)
                    w.done(PeerTimeout(f"{remote.label} was not reachable before the request's deadline"))
                busy = busy or bool(remote.waiting)
        if busy:
            self._watch_soon()
