"""What the metrics/health listener answers: ``/metrics``, ``/healthz`` and ``/readyz``.

Health checks are plain callables registered by name; each returns ``(ok, reason)``. The
answer format follows the Kubernetes components' verbose health output (``[+]name ok`` /
``[-]name failed: reason``) so operators read it the way they read the kubelet's own.
``/healthz/<name>`` and ``/readyz/<name>`` run one check, for debugging a failing probe.

``Handler`` answers one request whose head the listener (agent/httplistener.py) has read
already; what it serves comes from a ``Site``, which ``HealthServer`` (agent/httpserver.py) is.
"""

from __future__ import annotations

import gzip
import io
import logging
import socket
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["Handler", "HeadRead", "HealthCheck", "Served", "Site", "run_checks"]

# The listener's logger: one name for the whole metrics/health server in the agent's log.
log = logging.getLogger("agent.httpserver")

#: ``() -> (ok, reason)``; the reason is shown on failure (and on success when not empty).
HealthCheck = Callable[[], tuple[bool, str]]


class Site(Protocol):
    """What the answers are made of: the metrics registry and the named checks."""

    registry: CollectorRegistry

    def checks_for(self, kind: str) -> dict[str, HealthCheck]:
        """The checks behind ``/healthz`` or ``/readyz``, in registration order."""
        ...


class HeadRead(Protocol):
    """The handler's ``request``: a connection whose request head the listener has read."""

    @property
    def sock(self) -> socket.socket: ...

    @property
    def head(self) -> bytes: ...


class Served(Protocol):
    """The handler's ``server``: the listener, of which it uses only ``owner``."""

    @property
    def owner(self) -> Site: ...


def run_checks(checks: Mapping[str, HealthCheck]) -> tuple[bool, list[str]]:
    """Run every check: whether all passed, and one verbose line per check."""
    ok_all = True
    lines: list[str] = []
    for name, check in checks.items():
        try:
            ok, reason = check()
        except Exception as err:  # a broken check is a failed check, never a 500
            ok, reason = False, f"check raised {type(err).__name__}: {err}"
        reason = " ".join(str(reason).split())  # one line per check, whatever the reason holds
        if ok:
            lines.append(f"[+]{name} ok" + (f": {reason}" if reason else ""))
        else:
            ok_all = False
            lines.append(f"[-]{name} failed: {reason or 'no reason given'}")
    return ok_all, lines


class Handler(BaseHTTPRequestHandler):
    """Answers one request whose head the listener has read already."""

    server: Served  # type: ignore[assignment]
    request: HeadRead
    protocol_version = "HTTP/1.1"
    server_version = "dra-agent"
    sys_version = ""
    # Headers and body leave in two writes; with Nagle on, a keep-alive client (Prometheus)
    # waits out its delayed ACK, about 40 ms, for every scrape.
    disable_nagle_algorithm = True
    keep_alive = False

    def setup(self) -> None:
        self.connection = self.request.sock
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.rfile = io.BytesIO(self.request.head)
        self.wfile = self.connection.makefile("wb")

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        # Only the head was read: a request with a body cannot share the connection.
        headers = getattr(self, "headers", None)  # absent when the request line was bad
        has_body = headers is not None and (
            headers.get("Content-Length", "0").strip() not in ("", "0")
            or "Transfer-Encoding" in headers
        )
        self.keep_alive = not self.close_connection and not has_body

    def finish(self) -> None:
        try:
            self.wfile.flush()
        finally:
            self.wfile.close()

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        owner = self.server.owner
        if path == "/metrics":
            self._metrics(send_body)
            return
        for kind in ("healthz", "readyz"):
            prefix = "/" + kind
            if path == prefix or path.startswith(prefix + "/"):
                checks = owner.checks_for(kind)
                name = path[len(prefix) + 1 :]
                if name:
                    if name not in checks:
                        self._reply(404, f"no {kind} check named {name!r}\n", send_body)
                        return
                    checks = {name: checks[name]}
                ok, lines = run_checks(checks)
                verdict = f"{kind} check {'passed' if ok else 'failed'}"
                self._reply(200 if ok else 503, "\n".join([*lines, verdict, ""]), send_body)
                return
        self._reply(404, "try /metrics, /healthz or /readyz\n", send_body)

    def _metrics(self, send_body: bool) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(self.server.owner.registry)
        headers = {"Content-Type": content_type}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, headers, send_body)

    def _reply(self, code: int, text: str, send_body: bool) -> None:
        headers = {
            "Content-Type": "text/plain; charset=utf-8",
            # Probe answers change second to second; proxies must not keep them.
            "Cache-Control": "no-store",
        }
        self._send(code, text.encode(), headers, send_body)

    def _send(self, code: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes arrive every few seconds: request lines are debug noise, not operator news.
        log.debug("http request", extra={"client": self.client_address[0], "line": format % args})
