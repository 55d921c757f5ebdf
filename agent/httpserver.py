"""One HTTP listener for Prometheus metrics, ``/healthz`` and ``/readyz``.

Kubelet probes and Prometheus reach the agent on the same port, so a DaemonSet needs one
address and a systemd host one firewall rule. Health checks are plain callables registered by
name; each returns ``(ok, reason)``. The answer format follows the Kubernetes components'
verbose health output (``[+]name ok`` / ``[-]name failed: reason``) so operators read it the
way they read the kubelet's own.

``/readyz`` runs the liveness checks too: an agent that is not alive is not ready either.
``/healthz/<name>`` and ``/readyz/<name>`` run one check, for debugging a failing probe.
"""

from __future__ import annotations

import gzip
import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["HealthCheck", "HealthServer", "HealthServerError", "parse_address"]

log = logging.getLogger(__name__)

#: ``() -> (ok, reason)``; the reason is shown on failure (and on success when not empty).
HealthCheck = Callable[[], tuple[bool, str]]


class HealthServerError(RuntimeError):
    """The metrics/health listener could not be set up at ``address``."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"metrics/health address {address!r}: {reason}")
        self.address = address
        self.reason = reason


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces) -> (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise HealthServerError(address, "expected host:port")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    elif ":" in host:
        # "::1:80" is ambiguous (is 80 part of the address?), so IPv6 needs brackets.
        raise HealthServerError(address, "IPv6 hosts must be written [addr]:port")
    try:
        port = int(port_text)
    except ValueError:
        raise HealthServerError(address, f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise HealthServerError(address, f"port {port} out of range 0-65535")
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise HealthServerError(address, f"{host!r} is not an IPv6 address") from None
    return host, port


def _run_checks(checks: Mapping[str, HealthCheck]) -> tuple[bool, list[str]]:
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


class _Server(ThreadingHTTPServer):
    # Probe and scrape threads must never keep a stopping agent alive.
    daemon_threads = True
    block_on_close = False

    def __init__(self, addr: tuple[str, int], owner: HealthServer, reuse_port: bool) -> None:
        self.owner = owner
        self._reuse_port = reuse_port
        host = addr[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__(addr, _Handler)

    def server_bind(self) -> None:
        if self._reuse_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "dra-agent"
    sys_version = ""
    # Scrapers keep connections open; an idle or stalled one is dropped after this many
    # seconds so it cannot pin a thread forever.
    timeout = 60
    # Headers and body leave in two writes; with Nagle on, a keep-alive client (Prometheus)
    # waits out its delayed ACK, about 40 ms, for every scrape.
    disable_nagle_algorithm = True

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
                ok, lines = _run_checks(checks)
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


class HealthServer:
    """Serves ``registry`` on ``/metrics`` and the named checks on ``/healthz`` and ``/readyz``.

    ``address`` is ``host:port``; port 0 picks a free port (read it back from ``.port``).
    ``reuse_port`` sets ``SO_REUSEPORT`` so a DaemonSet rolling update with ``hostNetwork`` can
    start the new agent while the old one still holds the port.
    """

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        checks: Mapping[str, HealthCheck] | None = None,
        ready_checks: Mapping[str, HealthCheck] | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        self.address = address
        self.registry = registry
        self._host, self._requested_port = parse_address(address)
        self._checks: dict[str, HealthCheck] = dict(checks or {})
        self._ready_checks: dict[str, HealthCheck] = dict(ready_checks or {})
        self._reuse_port = reuse_port
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def add_check(self, name: str, check: HealthCheck) -> None:
        """Add (or replace) a liveness check; it also counts for readiness."""
        with self._lock:
            self._checks[name] = check

    def add_ready_check(self, name: str, check: HealthCheck) -> None:
        """Add (or replace) a readiness-only check."""
        with self._lock:
            self._ready_checks[name] = check

    def checks_for(self, kind: str) -> dict[str, HealthCheck]:
        """The checks behind ``/healthz`` or ``/readyz``, in registration order."""
        with self._lock:
            if kind == "healthz":
                return dict(self._checks)
            return {**self._checks, **self._ready_checks}

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        if self._server is None:
            raise RuntimeError("HealthServer.port read before start()")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._host or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a background thread; raises HealthServerError when it cannot bind."""
        if self._server is not None:
            return
        try:
            server = _Server((self._host, self._requested_port), self, self._reuse_port)
        except OSError as err:
            raise HealthServerError(self.address, err.strerror or str(err)) from err
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )
        self._thread.start()
        log.info("metrics and health serving", extra={"address": self.url})

    def stop(self) -> None:
        """Stop accepting, close the socket and wait for the serving thread; idempotent."""
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()
        self._server = None
        self._thread = None

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
