"""RemoteLinks without I/O (broker/core/remote.py): which link carries a request, the back-off
after a failed link and its reset, deadlines of waiting and sent requests, shutdown, and the SASL
login that runs first on every new link (against scramp's SCRAM server). The links
over real sockets, on both backends, are tests/backends/test_remote_links.py."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from broker.core.forwarding import NO_DEADLINE, PEER_WATCH_S, PeerLink, PeerLinkError, PeerTimeout
from broker.core.remote import REMOTE_RETRY_S_MAX, REMOTE_RETRY_S_MIN, RemoteLinks
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame, FrameDecoder
from ringlog_proto.sasl import SaslLogin

ADDRESS = ("10.0.0.2", 9101)


def frame_of(req: m.Request) -> Frame:
    return m.request_frame(req, 1)


class FakeChannel:
    """A backend's end of a link: records what was sent; `fail` is the connection going."""

    def __init__(self, long_poll: bool) -> None:
        self.long_poll = long_poll
        self.link = PeerLink(-1, "remote")
        self.on_gone: Callable[[BaseException | None], None] | None = None
        self.sent: list[Frame] = []
        self.closed = False

    def send(self, frame: Frame, done, deadline: float = NO_DEADLINE) -> None:  # type: ignore[no-untyped-def]
        d = FrameDecoder()
        d.feed(b"".join(self.link.request(frame, done, deadline)))
        sent = d.next_frame()
        assert isinstance(sent, Frame)
        self.sent.append(sent)

    def answer(self, i: int = -1) -> None:
        req = self.sent[i]
        self.link.receive(b"".join(m.encode_response(m.MetadataResponse(), req.correlation_id, None, 0, 0)))

    def fail(self, exc: BaseException | None = None) -> None:
        if not self.closed:
            self.closed = True
            assert self.on_gone is not None
            self.on_gone(exc)
            self.link.lost(exc)

    close = fail


class Rig:
    """RemoteLinks with a hand-driven clock and timers."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.opened: list[FakeChannel] = []
        self.refuse = False
        self.results: list[Frame | BaseException] = []

        def open_remote(host: str, port: int, long_poll: bool) -> FakeChannel | None:
            if self.refuse:
                return None
            ch = FakeChannel(long_poll)
            self.opened.append(ch)
            return ch

        self.links = RemoteLinks(
            open_remote,
            lambda delay, fn: self.timers.append((self.now + delay, fn)),
            lambda: False,
            clock=lambda: self.now,
        )

    def request(self, long_poll: bool = False, timeout: float = 10.0) -> None:
        frame = frame_of(m.MetadataRequest())
        self.links.request(ADDRESS, frame, self.now + timeout, self.results.append, long_poll=long_poll)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        while due := [t for t in self.timers if t[0] <= self.now]:
            for t in due:
                self.timers.remove(t)
                t[1]()


def test_one_link_for_ordinary_requests_and_one_for_long_polls_answers_by_correlation_id() -> None:
    rig = Rig()
    rig.request(long_poll=True)
    rig.request()
    rig.request()
    assert [ch.long_poll for ch in rig.opened] == [True, False]
    poll, ordinary = rig.opened
    assert len(poll.sent) == 1
    assert len(ordinary.sent) == 2 and ordinary.sent[0].correlation_id != ordinary.sent[1].correlation_id
    ordinary.answer(1)
    ordinary.answer(0)
    assert len(rig.results) == 2 and all(isinstance(r, Frame) for r in rig.results)
    assert rig.links.pending == 1  # the long poll
    with pytest.raises(ValueError):
        rig.links.request(("broker-2.local", 9101), frame_of(m.MetadataRequest()), 0.0, rig.results.append)


def test_a_failed_link_fails_its_requests_then_backs_off_doubling_and_an_answer_resets_it() -> None:
    rig = Rig()
    rig.request()
    rig.opened[0].fail(ConnectionRefusedError(111, "refused"))
    assert isinstance(rig.results[-1], PeerLinkError)
    backoffs = []
    for _ in range(7):  # retried at once each time: it waits for the back-off, no new link before
        opened = len(rig.opened)
        rig.request()
        waited = 0.0
        while len(rig.opened) == opened:
            rig.advance(0.05)
            waited += 0.05
        backoffs.append(round(waited, 2))
        rig.opened[-1].fail(ConnectionRefusedError(111, "refused"))
    assert backoffs[0] == pytest.approx(REMOTE_RETRY_S_MIN, abs=0.06)
    assert backoffs[1] == pytest.approx(2 * REMOTE_RETRY_S_MIN, abs=0.06)
    assert backoffs[-1] == pytest.approx(REMOTE_RETRY_S_MAX, abs=0.06)
    # Back again: the waiting request goes on a new link, and its answer resets the back-off.
    rig.request()
    rig.advance(REMOTE_RETRY_S_MAX)
    rig.opened[-1].answer()
    assert isinstance(rig.results[-1], Frame)
    rig.opened[-1].fail(None)  # then lost with nothing pending (an idle close): no back-off
    rig.request()
    assert len(rig.opened[-1].sent) == 1 and not rig.opened[-1].closed


def test_deadlines_fail_waiting_requests_and_close_a_link_holding_an_overdue_one() -> None:
    rig = Rig()
    rig.refuse = True  # the backend cannot even make a socket: failed at once, back-off starts
    rig.request()
    assert isinstance(rig.results[-1], PeerLinkError) and not rig.opened
    rig.request(timeout=0.05)  # waits for the back-off and its deadline comes first
    rig.advance(PEER_WATCH_S)
    assert isinstance(rig.results[-1], PeerTimeout)
    rig.refuse = False
    rig.advance(REMOTE_RETRY_S_MIN)
    rig.request(timeout=0.3)
    rig.request(timeout=5.0)  # behind the silent one on the same link
    rig.advance(PEER_WATCH_S)
    assert len(rig.results) == 2
    rig.advance(0.3)
    assert [type(r) for r in rig.results[2:]] == [PeerTimeout, PeerTimeout]
    assert rig.opened[-1].closed and rig.links.pending == 0


def test_close_all_fails_what_is_pending_and_what_waits() -> None:
    rig = Rig()
    rig.request(long_poll=True)
    rig.opened[0].fail(OSError("reset"))
    rig.request()  # waits for the back-off
    rig.request(long_poll=True)
    assert rig.links.pending == 2
    rig.links.close_all()
    assert len(rig.results) == 3 and all(isinstance(r, PeerLinkError) for r in rig.results)
    assert rig.links.pending == 0


# ----------------------------------------------------------------------------- logins (SASL)


def answer_with(ch: FakeChannel, resp: m.Response) -> None:
    ch.link.receive(b"".join(m.encode_response(resp, ch.sent[-1].correlation_id, None, 0, 0)))


def login_rig(mechanism: str, password: str = "pw") -> Rig:
    rig = Rig()
    rig.links._login = lambda: SaslLogin(mechanism, "broker", password)
    return rig


def test_requests_wait_in_order_behind_a_new_links_login() -> None:
    rig = login_rig("PLAIN")
    rig.request()
    rig.request()
    (ch,) = rig.opened
    assert [f.api_key for f in ch.sent] == [m.ApiKey.SASL_HANDSHAKE]
    assert rig.links.pending == 3  # the handshake and the two held behind it
    answer_with(ch, m.SaslHandshakeResponse(mechanisms=("PLAIN",)))
    auth = m.decode_request(ch.sent[-1])
    assert isinstance(auth, m.SaslAuthenticateRequest) and auth.auth_bytes == b"\0broker\0pw"
    answer_with(ch, m.SaslAuthenticateResponse())
    assert [f.api_key for f in ch.sent[2:]] == [m.ApiKey.METADATA, m.ApiKey.METADATA]
    rig.request()  # logged in: straight onto the link
    assert len(ch.sent) == 5
    for i in (2, 3, 4):
        ch.answer(i)
    assert len(rig.results) == 3 and all(isinstance(r, Frame) for r in rig.results)


def test_a_refused_login_fails_what_waited_closes_the_link_and_backs_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = login_rig("PLAIN")
    rig.request()
    ch = rig.opened[0]
    answer_with(ch, m.SaslHandshakeResponse(mechanisms=("PLAIN",)))
    answer_with(
        ch, m.SaslAuthenticateResponse(m.ErrorCode.SASL_AUTHENTICATION_FAILED, "Authentication failed")
    )
    assert ch.closed and isinstance(rig.results[-1], PeerLinkError)
    assert "login to 10.0.0.2:9101 refused: SASL_AUTHENTICATION_FAILED" in str(rig.results[-1])
    assert "cannot log in to 10.0.0.2:9101" in caplog.text
    rig.request()
    assert len(rig.opened) == 1  # backing off: no new link at once
    rig.advance(REMOTE_RETRY_S_MIN)
    assert len(rig.opened) == 2 and rig.opened[1].sent[0].api_key == m.ApiKey.SASL_HANDSHAKE


def test_a_link_lost_during_its_login_fails_what_waited() -> None:
    rig = login_rig("SCRAM-SHA-512")
    rig.request()
    rig.request(long_poll=True)
    for ch in rig.opened:
        ch.fail(ConnectionResetError(104, "reset"))
    assert len(rig.results) == 2 and all(isinstance(r, PeerLinkError) for r in rig.results)
    assert rig.links.pending == 0


@pytest.mark.parametrize("forged", [False, True])
def test_scram_login_checks_the_servers_proof(forged: bool) -> None:
    from scramp import ScramMechanism

    mechanism = ScramMechanism("SCRAM-SHA-512")
    auth_info = mechanism.make_auth_info("the-password" if not forged else "another", iteration_count=4096)
    server = mechanism.make_server(lambda _user: auth_info)
    rig = login_rig("SCRAM-SHA-512", "the-password")
    rig.request()
    ch = rig.opened[0]
    answer_with(ch, m.SaslHandshakeResponse(mechanisms=("SCRAM-SHA-512",)))
    client_first = m.decode_request(ch.sent[-1])
    assert isinstance(client_first, m.SaslAuthenticateRequest)
    server.set_client_first(client_first.auth_bytes.decode())
    answer_with(ch, m.SaslAuthenticateResponse(auth_bytes=server.get_server_first().encode()))
    client_final = m.decode_request(ch.sent[-1])
    assert isinstance(client_final, m.SaslAuthenticateRequest)
    if forged:  # a server that does not know the password: it cannot make the signature
        final = b"v=" + base64.b64encode(b"\0" * 64)
    else:
        server.set_client_final(client_final.auth_bytes.decode())
        final = server.get_server_final().encode()
    answer_with(ch, m.SaslAuthenticateResponse(auth_bytes=final))
    if forged:
        assert ch.closed and isinstance(rig.results[-1], PeerLinkError)
        assert "did not prove it knows the password" in str(rig.results[-1])
    else:
        assert ch.sent[-1].api_key == m.ApiKey.METADATA and not ch.closed
