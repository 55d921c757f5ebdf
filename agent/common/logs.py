"""Structured logging: one line per event, logfmt by default, JSON on request.

Code logs with the standard library and passes fields through ``extra``::

    log.info("claim prepared", extra={"claim": uid, "devices": "gpu-0,gpu-1"})

Every attribute that is not a standard ``LogRecord`` attribute is rendered as a field, so
no wrapper type is needed and discovery/cdi stay free of agent imports.
"""

from __future__ import annotations

import json
import logging
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


def _timestamp(record: logging.LogRecord) -> str:
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{base}.{int(record.msecs):03d}Z"


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        return json.dumps(text, ensure_ascii=False)  # UTF-8 stays readable; controls escaped
    return text


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"time={_timestamp(record)}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_logfmt_value(record.getMessage())}",
        ]
        parts += [f"{k}={_logfmt_value(v)}" for k, v in record_fields(record).items()]
        if record.exc_info:
            parts.append(f"error={_logfmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


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
