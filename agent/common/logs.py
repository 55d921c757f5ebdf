"""Structured logging: one line per event, logfmt by default, JSON on request.

Code logs with the standard library and passes fields through ``extra``::

    log.info("claim prepared", extra={"claim": uid, "devices": "gpu-0,gpu-1"})

Every attribute that is not a standard ``LogRecord`` attribute is rendered as a field, so
no wrapper type is needed and discovery/cdi stay free of agent imports.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, TextIO

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of a record, in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class _Seconds:
    """The timestamp's whole seconds, formatted once per second: ``strftime`` was a fifth of
    a line's formatting, and the agent logs a line or two per claim prepared."""

    __slots__ = ("_text",)

    def __init__(self) -> None:
        self._text = (-1, "")

    def __call__(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        cached, text = self._text  # one tuple: read and replaced whole by any thread
        if cached != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._text = (second, text)
        return f"{text}.{int(record.msecs):03d}Z"


_timestamp = _Seconds()

#: What makes a logfmt value need quotes.
_NEEDS_QUOTES = re.compile(r'[ ="\\\n\t]')


def _logfmt_value(value: Any) -> str:
    text = value if type(value) is str else str(value)
    if not text or _NEEDS_QUOTES.search(text):
        return json.dumps(text, ensure_ascii=False)  # UTF-8 stays readable; controls escaped
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"time={_timestamp(record)}",
            f"level={_LEVELS.get(record.levelno) or record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_logfmt_value(record.getMessage())}",
        ]
        parts += [f"{k}={_logfmt_value(v)}" for k, v in vars(record).items()
                  if k not in _STANDARD]
        if record.exc_info:
            parts.append(f"error={_logfmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


_LEVELS = {n: logging.getLevelName(n).lower() for n in
           (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            out[key] = value if isinstance(value, (int, float, bool, type(None))) else str(value)
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"))


def setup_logging(fmt: str = "logfmt", verbosity: int = 0, stream: TextIO | None = None) -> None:
    """Configure the root logger once per process (CLI entry points only)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    levels = {0: logging.WARNING, 1: logging.INFO}
    root.setLevel(levels.get(verbosity, logging.DEBUG))
    # Python warnings (urllib3's InsecureRequestWarning, say) as one log line each, not a
    # two-line text on stderr between the structured lines.
    logging.captureWarnings(True)
    # urllib3 warns "Retrying (Retry(...))" before each retry of its own, repeating what our
    # one line per outage says (agent.slices); -vv (debug) shows it again.
    logging.getLogger("urllib3").setLevel(logging.DEBUG if verbosity >= 2 else logging.ERROR)
