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

A backend with ``keepalive`` set (the lean one without a proxy) also has ``fetch``: a whole
request over kept-alive connections of its own (agent/kube/keepalive.py), which ``request``
uses instead of ``send``; watches always go through ``send``.

``request`` answers every HTTP status with a ``Response``; only a request that got no HTTP
answer at all raises (``KubeAPIError`` with status 0). ``Response.raise_for_status`` turns a
non-2xx answer into a ``KubeAPIError`` carrying the server's Status (reason, message, causes)
(agent/kube/errors.py); ``stream`` reads a watch line by line (agent/kube/stream.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

from agent.kube.errors import KubeAPIError, no_answer, parse_status
from agent.kube.stream import LineStream

#: (connect, read) seconds; a stuck server must never stall a caller for long.
DEFAULT_TIMEOUT = (5.0, 30.0)
Timeout = float | tuple[float, float]
Query = Sequence[tuple[str, str]] | Mapping[str, str]

__all__ = [
    "DEFAULT_TIMEOUT",
    "Backend",
    "KubeHTTP",
    "Response",
    "as_kubehttp",
]


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
        return parse_status(self.method, self.path, self.status, self.body, self.headers)

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
        *,
        stream: bool = False,
    ) -> Any:
        """Send one request; return the unread urllib3 ``HTTPResponse`` (any status).

        ``stream``: a long answer (a watch), which may go over connections of its own so
        that it does not hold one the short requests would reuse."""
        ...

    def close(self) -> None: ...


class KubeHTTP:
    """JSON requests against the API server through one ``Backend``; thread-safe."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # Whole requests over the backend's own kept-alive connections, where it has them.
        keepalive = getattr(backend, "keepalive", False)
        self._fetch = getattr(backend, "fetch", None) if keepalive else None
        self._open_stream = getattr(backend, "open_stream", None) if keepalive else None

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
        if self._fetch is not None:
            target, headers, payload = _prepare(path, query, body, content_type)
            try:
                answer = self._fetch(method, target, headers, payload, timeout)
            except KubeAPIError:
                raise
            except Exception as err:  # socket/ssl errors, a bad answer: no HTTP answer
                raise no_answer(method, path, err, server=self.server) from err
            return Response(method, path, answer.status, answer.reason, answer.headers,
                            answer.body)
        raw = self._send(method, path, query, body, content_type=content_type, timeout=timeout)
        try:
            data = raw.data
        except Exception as err:  # reset while reading: still no complete answer
            raise no_answer(method, path, err, "reading the answer: ",
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
        if self._open_stream is not None:
            target, headers, _ = _prepare(path, query, None, "")
            try:
                raw = self._open_stream(method, target, headers, timeout)
            except KubeAPIError:
                raise
            except Exception as err:  # socket/ssl errors, a bad answer: no HTTP answer
                raise no_answer(method, path, err, server=self.server) from err
        else:
            raw = self._send(method, path, query, None, timeout=timeout, stream=True)
        if not 200 <= int(raw.status) < 300:
            try:
                data = raw.data
            except Exception:  # the body of an error is best effort
                data = b""
            finally:
                _release(raw)
            headers = {k.lower(): v for k, v in dict(getattr(raw, "headers", {}) or {}).items()}
            raise parse_status(method, path, int(raw.status), data or b"", headers)
        return LineStream(raw, method, path)

    def close(self) -> None:
        self.backend.close()

    def connect(self) -> None:
        """Build the backend's connection pool now where it defers it (``LeanBackend``
        with ``connect=False``); ``CredentialsError`` when its TLS material is bad."""
        connect = getattr(self.backend, "connect", None)
        if connect is not None:
            connect()

    def _send(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        *,
        content_type: str = "application/json",
        timeout: Timeout,
        stream: bool = False,
    ) -> Any:
        target, headers, payload = _prepare(path, query, body, content_type)
        try:
            if stream:
                return self.backend.send(method, target, headers, payload, _timeout(timeout),
                                         stream=True)
            return self.backend.send(method, target, headers, payload, _timeout(timeout))
        except KubeAPIError:
            raise
        except Exception as err:  # urllib3/socket/ssl errors: no HTTP answer at all
            raise no_answer(method, path, err, server=self.server) from err


def _prepare(path: str, query: Query | None, body: Any, content_type: str
             ) -> tuple[str, dict[str, str], bytes | None]:
    """The target (path and query), headers and bytes of a request."""
    headers = {"Accept": "application/json"}
    payload: bytes | None = None
    if body is not None:
        headers["Content-Type"] = content_type
        if isinstance(body, bytes):
            payload = body
        elif isinstance(body, str):
            payload = body.encode()
        else:
            payload = json.dumps(body, separators=(",", ":"), default=_jsonable).encode()
    if not query:
        return path, headers, payload
    items = list(query.items()) if isinstance(query, Mapping) else list(query)
    return f"{path}?{urlencode(items)}", headers, payload


def _jsonable(value: Any) -> Any:
    """What ``json`` cannot encode by itself: any other mapping (a driver's read-only view,
    say) as a dict. Called only for such values, so plain dicts cost nothing."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _release(raw: Any) -> None:
    # A broken connection is dropped by the pool anyway.
    with contextlib.suppress(Exception):
        raw.release_conn()


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
