"""What /healthz, /readyz, systemd's watchdog and STATUS= line say about the running agent:
pure functions of its parts, each answering (ok, why) in one line."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parts' modules are imported as they start, not with the daemon
    from agent.health import HealthMonitor
    from agent.plugin import PluginServer
    from agent.slices import Controller
    from discovery.model import Inventory

Check = tuple[bool, str]


def plugin_serving(plugin: PluginServer | None) -> Check:
    ok = plugin is not None and plugin.serving
    return ok, "DRA socket serving" if ok else "DRA socket not serving"


def threads_alive(threads: Mapping[str, threading.Thread], controller: Controller | None,
                  health: HealthMonitor | None, plugin: PluginServer | None,
                  stopping: bool) -> Check:
    dead = sorted(n for n, t in threads.items() if not t.is_alive())
    if controller is not None and not controller.alive():
        dead.append("resourceslice-controller")
    if health is not None and not health.alive():
        dead.append("health-monitor")
    if plugin is not None and not plugin.registration.alive():
        dead.append("registration-watchdog")
    if dead and not stopping:
        return False, f"background thread(s) ended: {', '.join(dead)}"
    return True, "background threads alive"


def registered(plugin: PluginServer | None) -> Check:
    """Readiness only: the kubelet has confirmed the registration of the socket now
    listening. Sockets alone are not enough (a rolling update would stop the old instance
    before the kubelet knows the new one); a kubelet that is down must not fail liveness.
    """
    if plugin is None or not plugin.serving or not plugin.paths.registration.is_socket():
        return False, "registration socket not serving"
    status = plugin.registration.status
    if status is None:
        return False, "sockets serving, the kubelet has not confirmed the registration yet"
    if not status.registered:
        return False, (f"sockets serving, the kubelet refused the registration "
                       f"({status.error or 'no reason given'}); the socket is recreated")
    return True, "registered with the kubelet"


def slices_synced(controller: Controller | None) -> Check:
    if controller is None or not controller.active:
        return True, "no API server: nothing to publish"
    ok = bool(controller.synced(0))
    return ok, "ResourceSlices published" if ok else "ResourceSlices not yet in sync"


def device_counts(inventory: Inventory,
                  health: HealthMonitor | None) -> dict[tuple[str, str], int]:
    """Devices by (type, health) for ``dra_agent_devices``: health is healthy, unhealthy or
    unmonitored (healthy where no monitor runs)."""
    states = {n: str(h.state) for n, h in health.snapshot().items()} if health is not None \
        else {}
    counts: dict[tuple[str, str], int] = {}
    for device in inventory.devices:
        key = (str(device.type), states.get(device.name, "healthy"))
        counts[key] = counts.get(key, 0) + 1
    return counts


def status_text(plugin: PluginServer | None, controller: Controller | None,
                devices: int) -> str:
    """systemd's STATUS= line: the kubelet's registration, devices, slices."""
    confirmed = plugin is not None and plugin.registered
    slices = "published" if controller is not None and controller.active \
        else "not published (no API)"
    return (f"{'registered with the kubelet' if confirmed else 'waiting for the kubelet'}; "
            f"serving {devices} devices; slices {slices}")
