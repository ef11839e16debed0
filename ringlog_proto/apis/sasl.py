"""Requests and responses of SASL authentication: SaslHandshake (the mechanism) and
SaslAuthenticate (its messages). The mechanisms themselves are in ringlog_proto/sasl.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ringlog_proto.apis.body import (
    Reader,
    Request,
    Response,
    Writer,
)
from ringlog_proto.apis.codes import ApiKey
from ringlog_proto.frames import Frame


@dataclass(frozen=True, slots=True)
class SaslHandshakeRequest(Request):
    # mechanism str: "SCRAM-SHA-512", "SCRAM-SHA-256" or "PLAIN"
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    mechanism: str = ""

    def write(self, w: Writer) -> None:
        w.str(self.mechanism)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> SaslHandshakeRequest:
        return cls(r.str())


@dataclass(frozen=True, slots=True)
class SaslAuthenticateRequest(Request):
    # auth_bytes bytes: the mechanism's next client message
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes = b""

    def write(self, w: Writer) -> None:
        w.bytes(self.auth_bytes)

    @classmethod
    def read(cls, r: Reader, frame: Frame) -> SaslAuthenticateRequest:
        return cls(r.bytes())


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Response):
    # mechanisms array<str>: what this connection may use (on UNSUPPORTED_SASL_MECHANISM the
    # message names them, since an error body ends after the message)
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    mechanisms: tuple[str, ...] = ()

    def write(self, w: Writer) -> None:
        w.array(len(self.mechanisms))
        for name in self.mechanisms:
            w.str(name)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"mechanisms": tuple(r.str() for _ in range(r.array(2)))}


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Response):
    # auth_bytes bytes: the mechanism's next server message (empty when there is none)
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes = b""

    def write(self, w: Writer) -> None:
        w.bytes(self.auth_bytes)

    @classmethod
    def read(cls, r: Reader) -> dict[str, object]:
        return {"auth_bytes": r.bytes()}
