"""What every API module of our protocol is handed: the core, and the answers it writes.

Rules this module keeps:
- One `Context` per core, made by our protocol's adapter (broker/ringlog/adapter.py): an API
  module is plain functions of `(ctx, request, frame) -> Outcome`, registered in the adapter's
  table, as the Kafka adapter's are (broker/kafka/context.py).
- An answer names the topic and partition of the request's frame header, as its request did.
- Every error answer is counted in the core's metrics, whichever API or step writes it; errors are
  the core's (`broker.core.errors.error_of`), answered in our codes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.core.core import Core
from broker.core.errors import error_of
from broker.core.outcomes import Outcome, Reply
from broker.ringlog.metadata_entries import TopicEntries
from broker.storage.errors import OutOfSpaceError
from ringlog_proto import messages as m
from ringlog_proto.frames import Frame

log = logging.getLogger("broker.ringlog.adapter")

Handler = Callable[["Context", m.Request, Frame], Outcome]


class Context:
    """The core, its settings and metrics, and the answers to a frame (module rules)."""

    __slots__ = ("config", "core", "metadata_entries", "metrics")

    def __init__(self, core: Core) -> None:
        self.core = core
        self.config = core.config
        self.metrics = core.metrics
        self.metadata_entries = TopicEntries()  # Metadata's encoded topics, kept per core

    def reply(self, frame: Frame, resp: m.Response) -> Reply:
        return Reply(m.encode_response(resp, frame.correlation_id, None, frame.topic_id, frame.partition))

    def error(self, frame: Frame, code: m.ErrorCode, message: str) -> Reply:
        """The error response with `code` to `frame`."""
        self.metrics.error()
        resp = m.error_response(frame.api_key, code, message)
        return Reply(
            m.encode_response(resp, frame.correlation_id, frame.api_key, frame.topic_id, frame.partition)
        )

    def error_reply(self, frame: Frame, exc: BaseException) -> Reply:
        """The error response for `exc`, raised while serving `frame`."""
        code, message = error_of(exc)
        return self.error(frame, code, message)

    def again(self, handler: Handler, req: m.Request, frame: Frame) -> Callable[[], Outcome]:
        """A parked fetch's `Wait.again`: woken, `handler` runs on the request as decoded, not
        on the frame dispatched anew (a follower's fetch wakes on every produce), and what it
        raises is answered as the adapter's dispatch answers it (a partition that moved or went
        away while it waited is NOT_LEADER or UNKNOWN_TOPIC, not a failed wake)."""

        def run() -> Outcome:
            try:
                return handler(self, req, frame)
            except Exception as exc:
                return self.error(frame, *self.failure(frame, exc))

        return run

    def failure(self, frame: Frame, exc: Exception) -> tuple[m.ErrorCode, str]:
        """The code and message that answer `exc`, raised while serving `frame`, after what it
        tells the core: a write that met ENOSPC marks the disk full, an error nobody expected is
        logged with its traceback (called inside the `except`)."""
        code, message = error_of(exc)
        if code == m.ErrorCode.OUT_OF_SPACE and not isinstance(exc, OutOfSpaceError):
            self.core.space.saw_full(exc)  # a write failed with ENOSPC (a roll, a commit, a create)
        if code == m.ErrorCode.UNKNOWN_SERVER_ERROR:
            log.exception("unexpected error handling api %d", frame.api_key)
        return code, message
