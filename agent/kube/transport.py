"""One small JSON-over-HTTP transport to the API server, for every part of the agent.

The agent only ever sends and receives plain JSON dicts: the typed models of the
``kubernetes`` package drop fields they do not know, and importing them costs about 30 MiB of
resident memory for nothing the agent uses. ``KubeHTTP`` therefore speaks HTTP itself
(urllib3) and leaves credentials to a backend:

* the lean backend (``agent.kube.lean``): our own kubeconfig / in-cluster loading, no
  import of ``kubernetes`` at all. ``agent.kube.client.api_client`` uses it whenever it can.
* the official backend (``agent.kube.official``): an existing
  ``kubernetes.client.ApiClient`` supplies host, auth headers (its refresh hooks run on every
  request, so exec-plugin tokens stay fresh) and its urllib3 pool (TLS, proxy). Tests pass such
  clients, and kubeconfigs that need exec plugins or auth providers are loaded that way.

``request`` answers every HTTP status with a ``Response``; only a request that got no HTTP
answer at all raises (``KubeAPIError`` with status 0). ``Response.raise_for_status`` turns a
non-2xx answer into a ``KubeAPIError`` carrying the server's Status (reason, message, causes).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

#: (connect, read) seconds; a stuck server must never stall a caller for long.
DEFAULT_TIMEOUT = (5.0, 30.0)
TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})
Timeout = float | tuple[float, float]
Query = Sequence[tuple[str, str]] | Mapping[str, str]

__all__ = [
    "DEFAULT_TIMEOUT",
    "Backend",
    "Cause",
    "KubeAPIError",
    "KubeHTTP",
    "LineStream",
    "Response",
    "as_kubehttp",
    "parse_status",
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


def parse_status(verb: str, path: str, status: int, data: bytes | str) -> KubeAPIError:
    """The error for an answer ``data`` (a Status object, or anything a proxy may send)."""
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
        causes=causes, details=details,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Response:
    """A whole answer, read and its connection returned to the pool."""

    method: str
    path: str
    status: int
    reason: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The decoded body ({} when empty); a body that is not JSON is a KubeAPIError."""
        if not self.body:
            return {}
        try:
            return json.loads(self.body)
        except ValueError as err:
            raise KubeAPIError(
                self.method, self.path, 0, "BadResponse", f"answer is not JSON: {err}"
            ) from err

    def error(self) -> KubeAPIError:
        return parse_status(self.method, self.path, self.status, self.body)

    def raise_for_status(self) -> Response:
        if not self.ok:
            raise self.error()
        return self


class Backend(Protocol):
    """Where requests go: a base URL, auth headers and a urllib3 pool."""

    @property
    def server(self) -> str: ...

    def send(
        self,
        method: str,
        path_and_query: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: Any,
    ) -> Any:
        """Send one request; return the unread urllib3 ``HTTPResponse`` (any status)."""
        ...

    def close(self) -> None: ...


class KubeHTTP:
    """JSON requests against the API server through one ``Backend``; thread-safe."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def server(self) -> str:
        return self.backend.server

    def __repr__(self) -> str:
        return f"KubeHTTP({type(self.backend).__name__}, {self.server})"

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> Response:
        """One request; ``body`` is sent as is when bytes/str, else as JSON."""
        raw = self._send(method, path, query, body, content_type=content_type, timeout=timeout)
        try:
            data = raw.data
        except Exception as err:  # reset while reading: still no complete answer
            raise _no_answer(method, path, err, "reading the answer: ",
                              server=self.server) from err
        finally:
            _release(raw)
        headers = {k.lower(): v for k, v in dict(getattr(raw, "headers", {}) or {}).items()}
        return Response(
            method, path, int(raw.status), str(getattr(raw, "reason", "") or ""), headers,
            bytes(data or b""),
        )  # fmt: skip

    def stream(
        self,
        method: str,
        path: str,
        query: Query | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> LineStream:
        """A long answer read line by line (watch); a non-2xx answer raises at once."""
        raw = self._send(method, path, query, None, timeout=timeout)
        if not 200 <= int(raw.status) < 300:
            try:
                data = raw.data
            except Exception:  # the body of an error is best effort
                data = b""
            finally:
                _release(raw)
            raise parse_status(method, path, int(raw.status), data or b"")
        return LineStream(raw, method, path)

    def close(self) -> None:
        self.backend.close()

    def _send(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        *,
        content_type: str = "application/json",
        timeout: Timeout,
    ) -> Any:
        headers = {"Accept": "application/json"}
        payload: bytes | None = None
        if body is not None:
            headers["Content-Type"] = content_type
            if isinstance(body, bytes):
                payload = body
            elif isinstance(body, str):
                payload = body.encode()
            else:
                payload = json.dumps(body, separators=(",", ":")).encode()
        items = list(query.items()) if isinstance(query, Mapping) else list(query or ())
        target = f"{path}?{urlencode(items)}" if items else path
        try:
            return self.backend.send(method, target, headers, payload, _timeout(timeout))
        except KubeAPIError:
            raise
        except Exception as err:  # urllib3/socket/ssl errors: no HTTP answer at all
            raise _no_answer(method, path, err, server=self.server) from err


class LineStream:
    """Non-empty lines of a chunked answer; ``close`` from another thread ends the reading."""

    def __init__(self, raw: Any, method: str, path: str) -> None:
        self._raw = raw
        self._method = method
        self._path = path
        self._closed = False
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        buffer = bytearray()
        try:
            for chunk in self._raw.stream(amt=None, decode_content=False):
                buffer.extend(chunk)
                while (end := buffer.find(b"\n")) != -1:
                    line = bytes(buffer[:end]).strip()
                    del buffer[: end + 1]
                    if line:
                        yield line
            if tail := bytes(buffer).strip():
                yield tail
        except GeneratorExit:
            raise
        except Exception as err:
            if self._closed:
                return
            raise _no_answer(self._method, self._path, err) from err
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # shutdown() unblocks a read in another thread; close() alone would not.
        try:
            if hasattr(self._raw, "shutdown"):
                self._raw.shutdown()
            else:  # urllib3 < 2.3
                sock = getattr(getattr(self._raw, "connection", None), "sock", None)
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError, RuntimeError, AttributeError):  # already closed
            pass
        try:
            self._raw.release_conn()
            self._raw.close()
        except Exception:  # the connection is being thrown away anyway
            pass


def _release(raw: Any) -> None:
    # A broken connection is dropped by the pool anyway.
    with contextlib.suppress(Exception):
        raw.release_conn()


def _no_answer(method: str, path: str, err: BaseException, prefix: str = "",
               server: str = "") -> KubeAPIError:
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


def _timeout(timeout: Timeout) -> Any:
    import urllib3  # already loaded by any backend; kept out of this module's import

    if isinstance(timeout, tuple):
        return urllib3.Timeout(connect=timeout[0], read=timeout[1])
    return urllib3.Timeout(total=timeout)


def as_kubehttp(client: Any) -> KubeHTTP:
    """``client`` as a KubeHTTP: a KubeHTTP as is, a ``kubernetes.client.ApiClient`` wrapped."""
    if isinstance(client, KubeHTTP):
        return client
    if not hasattr(client, "param_serialize") or not hasattr(client, "rest_client"):
        # Older clients (< 37) have another call_api; fail loudly instead of retrying an
        # AttributeError forever as if the server were down.
        version = "unknown"
        try:
            import kubernetes

            version = getattr(kubernetes, "__version__", "unknown")
        except ImportError:
            version = "not installed"
        raise TypeError(
            "the agent needs a KubeHTTP or a kubernetes (python client) >= 37 ApiClient, "
            f"got {type(client).__name__} (kubernetes {version})"
        )
    from agent.kube.official import OfficialBackend

    return KubeHTTP(OfficialBackend(client))
