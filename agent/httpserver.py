"""One HTTP listener for Prometheus metrics, ``/healthz`` and ``/readyz``.

Kubelet probes and Prometheus reach the agent on the same port, so a DaemonSet needs one
address and a systemd host one firewall rule. ``HealthServer`` holds the address, the registry
and the named checks, and binds the socket; ``/readyz`` runs the liveness checks too: an agent
that is not alive is not ready either.

The parts: agent/httplistener.py reads requests without a thread per client (the port is
reachable from the whole cluster); agent/httproutes.py answers them, in the Kubernetes
components' verbose health format.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from agent.httplistener import Listener
from agent.httproutes import HealthCheck

__all__ = ["HealthServer", "HealthServerError", "parse_address"]

log = logging.getLogger(__name__)


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


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As http.server does: a restarted agent rebinds at once over TIME_WAIT connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        #: Monotonic seconds, for the request and idle timeouts (tests move it).
        self.clock = clock
        self.registry = registry
        self._host, self._requested_port = parse_address(address)
        self._checks: dict[str, HealthCheck] = dict(checks or {})
        self._ready_checks: dict[str, HealthCheck] = dict(ready_checks or {})
        self._reuse_port = reuse_port
        self._lock = threading.Lock()
        self._server: Listener | None = None

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
        return int(self._server.address[1])

    @property
    def url(self) -> str:
        host = self._host or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in background threads; raises HealthServerError when it cannot bind."""
        if self._server is not None:
            return
        try:
            sock = _bind(self._host, self._requested_port, self._reuse_port)
        except OSError as err:
            raise HealthServerError(self.address, err.strerror or str(err)) from err
        self._server = Listener(sock, self, self.clock)
        self._server.start()
        log.info("metrics and health serving", extra={"address": self.url})

    def stop(self) -> None:
        """Stop accepting, close the socket and every waiting connection; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
