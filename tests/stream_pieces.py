"""How the decoder tests deliver a byte stream: cut anywhere, and received into the space a
lending decoder (native/frames.c, "Lending") offers, as the backends' reads are. Shared by the
twin tests of our frames' decoder (tests/ringlog_proto) and Kafka's (tests/kafka)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any


def cut_stream(parts: list[bytes], cuts: list[int]) -> list[bytes]:
    """The stream `parts` make, cut at each of `cuts` that falls inside it."""
    data = b"".join(parts)
    bounds = [0, *sorted(c for c in cuts if c < len(data)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def receive_lent(decoder: Any, piece: bytes, lend: int, take: Callable[[], None]) -> None:
    """`piece` received into the decoder's lent space (`buffer(n)`, `received(k)`), `lend`
    bytes at a time at most (an empty piece: one receive of nothing), `take()` after each."""
    pos = 0
    while True:
        view = decoder.buffer(lend)
        assert len(view) == lend
        n = min(lend, len(piece) - pos)
        view[:n] = piece[pos : pos + n]
        view.release()
        decoder.received(n)
        pos += n
        take()
        if pos == len(piece):
            return
