"""What went wrong with a request to the API server, as one exception type.

``KubeAPIError`` carries the server's Status (reason, message, causes, details) for an answer
that was not 2xx; status 0 means no HTTP answer at all (refused, timed out, reset), with
``unreachable`` saying why in a few words (``unreachable_reason``).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})

__all__ = [
    "TRANSIENT_STATUSES",
    "Cause",
    "KubeAPIError",
    "no_answer",
    "parse_status",
    "unreachable_reason",
]


@dataclass(frozen=True, slots=True)
class Cause:
    """One ``details.causes`` entry of a Status (which field, why)."""

    field: str
    reason: str
    message: str


class KubeAPIError(Exception):
    """A request that failed; ``status`` 0 means no HTTP answer (refused, timed out, reset)."""

    def __init__(
        self,
        verb: str,
        path: str,
        status: int,
        reason: str,
        message: str,
        *,
        causes: Sequence[Cause] = (),
        details: Mapping[str, Any] | None = None,
        server: str = "",
        unreachable: str = "",
        retry_after: float | None = None,
    ) -> None:
        where = f"{verb} {path}"
        text = f"{where}: {status} {reason}: {message}" if status else f"{where}: {message}"
        super().__init__(text)
        self.verb = verb
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = tuple(causes)
        #: The Status ``details`` (name, kind, group): tells "no such object" from "no such API".
        self.details: Mapping[str, Any] = dict(details or {})
        #: The API server asked, when known ("" otherwise).
        self.server = server
        #: For status 0: why there was no answer, in a few words ("connection refused").
        self.unreachable = unreachable
        #: Seconds the server asked us to wait (``Retry-After`` of a 429 or 503), if it did.
        self.retry_after = retry_after

    @property
    def transient(self) -> bool:
        """Worth retrying unchanged after a pause (server or network trouble)."""
        return self.status in TRANSIENT_STATUSES

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def invalid(self) -> bool:
        return self.status == 422

    @property
    def expired(self) -> bool:
        return self.status == 410

    @property
    def forbidden(self) -> bool:
        return self.status == 403

    def about(self, kind: str, name: str) -> bool:
        """Does the Status name this object? A 404 that does not means the API is not served."""
        return self.details.get("kind") == kind and self.details.get("name") == name


#: The longest ``Retry-After`` taken from a server: past it the caller's own back-off rules.
RETRY_AFTER_MAX_S = 600.0


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds (kube-apiserver sends a whole number; an HTTP date, or
    anything else, is not used), at most ``RETRY_AFTER_MAX_S``."""
    value = headers.get("retry-after", "").strip()
    if not (value.isascii() and value.isdigit()):
        return None
    return min(float(value), RETRY_AFTER_MAX_S)


def parse_status(verb: str, path: str, status: int, data: bytes | str,
                 headers: Mapping[str, str] | None = None) -> KubeAPIError:
    """The error for an answer ``data`` (a Status object, or anything a proxy may send), with
    the ``Retry-After`` of its ``headers`` (lower-case names)."""
    reason, message = "", ""
    causes: list[Cause] = []
    details: Mapping[str, Any] = {}
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        body = {}
        message = (data.decode(errors="replace") if isinstance(data, bytes) else data)[:500]
    if isinstance(body, Mapping):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or message)
        raw_details = body.get("details")
        details = raw_details if isinstance(raw_details, Mapping) else {}
        for cause in details.get("causes") or []:
            if isinstance(cause, Mapping):
                causes.append(
                    Cause(
                        str(cause.get("field") or ""),
                        str(cause.get("reason") or ""),
                        str(cause.get("message") or ""),
                    )
                )
        if not status and isinstance(body.get("code"), int):
            status = body["code"]
    return KubeAPIError(
        verb, path, status, reason or "Unknown", message or "no message",
        causes=causes, details=details, retry_after=retry_after_s(headers or {}),
    )  # fmt: skip


def no_answer(method: str, path: str, err: BaseException, prefix: str = "",
              server: str = "") -> KubeAPIError:
    """The error for a request that got no HTTP answer because of ``err``."""
    return KubeAPIError(method, path, 0, type(err).__name__, prefix + (str(err) or repr(err)),
                        server=server, unreachable=unreachable_reason(err))


#: urllib3 exception names (not imported here: urllib3 stays out of this module's import).
_URLLIB3_REASONS = {"ConnectTimeoutError": "connection timed out",
                    "ReadTimeoutError": "no answer in time", "NameResolutionError":
                    "host name not resolved", "ProxyError": "proxy refused the connection"}


def unreachable_reason(err: BaseException) -> str:
    """Why a request got no HTTP answer, in a few words, from the innermost known cause.

    urllib3 nests the socket error two or three levels deep (MaxRetryError.reason, then the
    cause); its own text repeats the pool, the URL and the retry count, one long line.
    """
    import ssl  # loaded by urllib3 already

    seen: set[int] = set()
    todo: list[BaseException] = [err]
    found = ""
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, ConnectionResetError):
            return "connection reset"
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"TLS: {e.verify_message or 'certificate not trusted'}"
        if isinstance(e, ssl.SSLError):
            return f"TLS: {e.reason or e}"
        if isinstance(e, socket.gaierror):
            return "host name not resolved"
        if isinstance(e, OSError) and e.errno is not None and e.strerror:
            return e.strerror.lower()
        found = found or _URLLIB3_REASONS.get(type(e).__name__, "")
        if isinstance(e, TimeoutError):
            found = found or "timed out"
        for nxt in (getattr(e, "reason", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return found or type(err).__name__
