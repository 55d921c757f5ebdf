"""Hotplug: udev events trigger a debounced rescan; the result is handed on only on change.

Events come through the ``DeviceEvents`` seam. ``UdevEvents`` listens on the kernel's
netlink uevent group (which works without udevd, e.g. in a container) and, where udevd
runs, also on udev's group so renames done by udev rules are seen. PCI, net and infiniband
add/remove/change/bind/unbind events count. A burst (64 VFs appearing) becomes one rescan:
we wait until ``debounce_s`` passes without a new event, bounded by ``max_delay_s``.
NVML-only changes (MIG reconfiguration) have no uevent, so a slow periodic rescan catches
them.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from discovery.model import Inventory
from discovery.scan import DiscoveryOptions, discover, inventory_key
from discovery.sources import Sources

log = logging.getLogger("discovery.hotplug")

SUBSYSTEMS = ("pci", "net", "infiniband")
ACTIONS = frozenset({"add", "remove", "change", "bind", "unbind", "move"})


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    subsystem: str
    action: str
    sys_path: str = ""


class DeviceEvents(Protocol):
    """A source of device events; ``poll`` returns None when ``timeout`` passes quietly."""

    def poll(self, timeout: float) -> DeviceEvent | None: ...

    def close(self) -> None: ...


class UdevEvents:
    """pyudev netlink monitors on the kernel (and, if possible, udev) sources."""

    def __init__(self, sources: tuple[str, ...] = ("kernel", "udev")) -> None:
        import pyudev  # needs libudev.so.1 at import; callers catch ImportError/OSError

        self._monitors: list[Any] = []
        context = pyudev.Context()
        for source in sources:
            try:
                monitor = pyudev.Monitor.from_netlink(context, source=source)
                for subsystem in SUBSYSTEMS:
                    monitor.filter_by(subsystem)
                monitor.start()
            except (OSError, ValueError) as err:
                log.info("udev source unavailable", extra={"source": source, "error": str(err)})
                continue
            self._monitors.append(monitor)
        if not self._monitors:
            raise OSError("no netlink uevent source could be opened")

    def poll(self, timeout: float) -> DeviceEvent | None:
        ready, _, _ = select.select(self._monitors, [], [], max(timeout, 0))
        for monitor in ready:
            device = monitor.poll(timeout=0)
            if device is not None:
                return DeviceEvent(
                    str(device.subsystem or ""), str(device.action or ""), str(device.sys_path)
                )
        return None

    def close(self) -> None:
        for monitor in self._monitors:
            try:
                monitor.stop()
            except Exception as err:  # closing is best effort
                log.debug("udev monitor stop failed", extra={"error": str(err)})
        self._monitors.clear()


class NullEvents:
    """DeviceEvents with no events: rescans come from the watcher's periodic timer only.

    For simulated hardware (no uevent describes a generated tree) and where netlink cannot be
    opened (a sandbox without AF_NETLINK, no permission).
    """

    def __init__(self, stop_event: threading.Event | None = None) -> None:
        self._stop = stop_event or threading.Event()

    def poll(self, timeout: float) -> DeviceEvent | None:
        self._stop.wait(timeout)
        return None

    def close(self) -> None:
        return None


def _relevant(event: DeviceEvent) -> bool:
    return event.subsystem in SUBSYSTEMS and event.action in ACTIONS


class HotplugWatcher:
    """Keeps an Inventory current and calls ``on_change`` only when it changed.

    ``run()`` blocks until ``stop_event`` is set (call it in the discovery worker thread).
    Without ``initial``, the first scan is reported as a change, so the caller publishes it.
    """

    def __init__(
        self,
        sources: Sources,
        options: DiscoveryOptions,
        on_change: Callable[[Inventory], None],
        events: DeviceEvents,
        *,
        debounce_s: float = 0.2,
        max_delay_s: float = 2.0,
        slow_rescan_s: float = 60.0,
        stop_event: threading.Event | None = None,
        initial: Inventory | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_scan: Callable[[Inventory, float], None] | None = None,
    ) -> None:
        self.sources = sources
        self.options = options
        self.on_change = on_change
        self.events = events
        self.debounce_s = debounce_s
        self.max_delay_s = max_delay_s
        self.slow_rescan_s = slow_rescan_s
        self.stop_event = stop_event or threading.Event()
        self.clock = clock
        self.current = initial
        self.scans = 0
        #: Called after every scan with its duration in seconds (the daemon records metrics
        #: here; discovery itself stays free of agent imports).
        self.on_scan = on_scan

    def rescan(self, reason: str) -> bool:
        """Scan now; hand the result on if it differs. Returns whether it changed."""
        self.scans += 1
        started = time.perf_counter()
        try:
            inventory = discover(self.sources, self.options)
        except Exception:
            log.exception("rescan failed", extra={"reason": reason})
            return False
        if self.on_scan is not None:
            try:
                self.on_scan(inventory, time.perf_counter() - started)
            except Exception:
                log.exception("scan observer failed")
        if self.current is not None and inventory_key(inventory) == inventory_key(self.current):
            log.debug("rescan: no change", extra={"reason": reason})
            return False
        self.current = inventory
        log.info("inventory changed", extra={"reason": reason,
                                              "devices": len(inventory.devices)})
        try:
            self.on_change(inventory)
        except Exception:
            log.exception("inventory change handler failed")
        return True

    def _debounce(self, first: DeviceEvent) -> None:
        """Swallow the rest of a burst: wait for a quiet ``debounce_s`` (at most max_delay)."""
        deadline = self.clock() + self.max_delay_s
        while not self.stop_event.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            event = self.events.poll(min(self.debounce_s, remaining))
            if event is None:
                return
            log.debug("uevent (debounced)", extra={"subsystem": event.subsystem,
                                                   "action": event.action})

    def run(self) -> None:
        if self.current is None:
            self.rescan("start")
        next_slow = self.clock() + self.slow_rescan_s
        try:
            while not self.stop_event.is_set():
                # Short polls so a stop request is noticed quickly.
                timeout = min(max(next_slow - self.clock(), 0), 0.5)
                event = self.events.poll(timeout)
                if event is not None and _relevant(event):
                    log.debug("uevent", extra={"subsystem": event.subsystem,
                                               "action": event.action, "path": event.sys_path})
                    self._debounce(event)
                    if self.stop_event.is_set():
                        break
                    self.rescan(f"{event.subsystem} {event.action}")
                    next_slow = self.clock() + self.slow_rescan_s
                elif self.clock() >= next_slow:
                    self.rescan("periodic")
                    next_slow = self.clock() + self.slow_rescan_s
        finally:
            self.events.close()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="discovery-hotplug", daemon=True)
        thread.start()
        return thread
