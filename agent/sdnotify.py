"""systemd service notification (``sd_notify``) on the plain socket protocol.

systemd hands a ``Type=notify`` service the address of a datagram socket in ``$NOTIFY_SOCKET``;
the service sends newline-separated ``KEY=VALUE`` assignments to it. That is the whole protocol,
so we speak it directly rather than pull in libsystemd bindings (a C build dependency on a node
agent that must also run in a slim container image, where the variable is simply absent).

Notification is best effort, as in libsystemd: a missing or broken socket is logged once and the
agent carries on, because an agent that crashes when its supervisor is gone helps nobody.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping

__all__ = ["Notifier", "NotifyError", "watchdog_interval"]

log = logging.getLogger(__name__)


class NotifyError(ValueError):
    """``$NOTIFY_SOCKET`` names an address this module cannot use."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"NOTIFY_SOCKET={address!r}: {reason}")
        self.address = address
        self.reason = reason


def _socket_address(address: str) -> str | bytes:
    """Translate ``$NOTIFY_SOCKET`` into an ``AF_UNIX`` address for ``sendto``.

    A leading ``@`` denotes the Linux abstract namespace (a leading NUL byte on the wire). systemd
    also accepts ``vsock:`` addresses for VMs; a node agent never runs as a VM's init, so those
    are rejected rather than half-supported.
    """
    if address.startswith("@"):
        if len(address) < 2:
            raise NotifyError(address, "empty abstract socket name")
        return b"\0" + address[1:].encode()
    if address.startswith("/"):
        if len(address.encode()) >= 108:
            raise NotifyError(address, "path longer than the 107 bytes AF_UNIX allows")
        return address
    raise NotifyError(address, "must be an absolute path or an abstract '@name'")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds within which systemd expects ``WATCHDOG=1``, or None when no watchdog is on.

    Mirrors ``sd_watchdog_enabled``: ``WATCHDOG_USEC`` must be a positive integer and, when
    ``WATCHDOG_PID`` is set, it must name this process (the variables are inherited by children,
    which must not ping on their parent's behalf).
    """
    env = os.environ if environ is None else environ
    raw = env.get("WATCHDOG_USEC", "")
    try:
        usec = int(raw)
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 1_000_000


class Notifier:
    """Sends state changes to systemd; every method is a no-op outside a notify service.

    Safe to share between threads: each notification is one ``sendto`` of one datagram.
    """

    def __init__(self, address: str | None = None) -> None:
        self._address = _socket_address(address) if address else None
        self._display = address or ""
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET``; disabled when unset, logged when unusable."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        try:
            return cls(address or None)
        except NotifyError as err:
            log.warning("systemd notification disabled", extra={"error": str(err)})
            return cls(None)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` assignments in one datagram; True when it was delivered.

        Newlines inside values would start a new assignment on systemd's side, so they are
        folded to spaces (a STATUS= built from an exception message must not inject ``READY=1``).
        """
        if self._address is None or not fields:
            return False
        lines = [f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items()]
        payload = ("\n".join(lines) + "\n").encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(
                        socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    )
                self._sock.sendto(payload, self._address)
            except OSError as err:
                # Log the first failure only: the watchdog would otherwise repeat it forever.
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "systemd notification failed",
                        extra={"socket": self._display, "error": err.strerror or str(err)},
                    )
                return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup is complete: systemd moves the unit to active and starts dependants."""
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """Free-form status shown by ``systemctl status``."""
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        """Keep-alive for ``WatchdogSec=``."""
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown has begun, so systemd does not mistake the exit for a crash mid-start."""
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more start (or stop) time, e.g. while NVML initialises many GPUs."""
        return self.notify(EXTEND_TIMEOUT_USEC=int(seconds * 1_000_000))

    def run_watchdog(
        self,
        stop: threading.Event,
        healthy: Callable[[], bool] = lambda: True,
        environ: Mapping[str, str] | None = None,
    ) -> threading.Thread | None:
        """Ping the watchdog at half its interval while ``healthy()`` holds, until ``stop``.

        Skipping pings while unhealthy is the point of the watchdog: systemd then restarts a
        wedged agent. Returns the thread, or None when systemd asked for no watchdog.
        """
        interval = watchdog_interval(environ)
        if interval is None or not self.enabled:
            return None

        def loop() -> None:
            while not stop.wait(interval / 2):
                try:
                    ok = healthy()
                except Exception:
                    log.exception("watchdog health check raised")
                    ok = False
                if ok:
                    self.watchdog()
                else:
                    log.warning("watchdog ping withheld: agent unhealthy")

        thread = threading.Thread(target=loop, name="sd-watchdog", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
