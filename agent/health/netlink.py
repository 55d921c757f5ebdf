"""Link-change wake-ups from rtnetlink (RTMGRP_LINK), so a cable pull is seen at once.

Carrier and operstate changes do not produce uevents; the kernel announces them as
RTM_NEWLINK messages on the rtnetlink link group. We do not parse them: any message only
means "read sysfs now", so sysfs stays the single source of truth and a lost message costs
at most one poll period. Only meaningful in the host network namespace (bare metal, or a pod
with hostNetwork), which is where the NICs we offer live.
"""

from __future__ import annotations

import logging
import select
import socket

from discovery.hotplug import DeviceEvent

log = logging.getLogger("agent.health.netlink")

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1
_EVENT = DeviceEvent("net", "change", "rtnetlink")


class LinkEvents:
    """A ``DeviceEvents`` source: one event per burst of rtnetlink link messages."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
            try:
                sock.bind((0, RTMGRP_LINK))
            except OSError:
                sock.close()
                raise
        sock.setblocking(False)
        self._sock: socket.socket | None = sock

    def poll(self, timeout: float) -> DeviceEvent | None:
        sock = self._sock
        if sock is None:
            return None
        ready, _, _ = select.select([sock], [], [], max(timeout, 0))
        if not ready:
            return None
        drained = False
        while True:  # a burst (every VF of a PF going down) becomes one wake-up
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # ENOBUFS: we fell behind; a poll reads the truth anyway
                log.debug("rtnetlink receive failed", extra={"error": err.strerror})
                drained = True
                break
            if not data:
                break
            drained = True
        return _EVENT if drained else None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def open_link_events() -> LinkEvents | None:
    """The host's link events, or None where netlink is not available (logged once)."""
    try:
        return LinkEvents()
    except OSError as err:
        log.info("no rtnetlink link events; link state is polled only",
                 extra={"error": err.strerror or str(err)})
        return None
