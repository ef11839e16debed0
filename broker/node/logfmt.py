"""The one log format of every broker process: logfmt, one `key=value` line per event.

Its own module so that the command line (the supervisor's process) and the workers share it without
the worker importing the command line.
"""

from __future__ import annotations

import json
import logging
import time

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")  # --log-level's choices, for every process


class LogfmtFormatter(logging.Formatter):
    """One `key=value` line per event (logfmt), so that logs can be filtered and parsed.

    `fields` (e.g. {"core": 3}) are added to every line: a worker's lines carry its core.
    """

    def __init__(self, fields: dict[str, object] | None = None) -> None:
        super().__init__()
        self._extra = "".join(f" {k}={v}" for k, v in (fields or {}).items())

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        msg = record.getMessage()
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        return (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} pid={record.process}"
            f"{self._extra} logger={record.name} msg={json.dumps(msg)}"
        )
