"""Device health: taints that come and go with the hardware, and the kubelet health stream.

    monitor = HealthMonitor(sources, driver, HealthOptions(), on_change, metrics)
    monitor.start(inventory_provider)      # first state computed before it returns
    resources = build_resources(monitor.apply_taints(inventory), pool)
    servicer = HealthServicer(monitor, pool_name)   # PluginServer(health_servicer=...)
    monitor.stop()

Signals: NVML events (Xids outside the ignore list, double-bit ECC, lost GPUs; polled
fallback), NIC carrier/operstate and RDMA port state from sysfs, vanished PCI functions.
Effects: ``<driver>/xid|ecc|gpu-lost|link-down|unmonitored`` device taints and the
``v1alpha1.DRAResourceHealth`` stream; a device whose signal stays clear for the quiet period
is healthy again.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.health.model import ChangeFeed, Condition, DeviceHealth, HealthState, Kind
    from agent.health.monitor import HealthMonitor
    from agent.health.options import (
        DEFAULT_EFFECTS,
        HealthConfigError,
        HealthOptions,
        parse_effects,
        parse_xids,
    )
    from agent.health.stream import HEALTH_SERVICES, HealthServicer, add_health_services
    from agent.health.taints import apply_taints, taint_key
    from agent.health.xids import DEFAULT_IGNORED_XIDS, describe_xid

#: Where each name lives. Loaded on first use: ``dra-agent run`` reads the options (its flags)
#: before it serves the kubelet's sockets, and the monitor and the stream (NVML's bindings,
#: the health protos) after.
_WHERE = {
    "ChangeFeed": "model", "Condition": "model", "DeviceHealth": "model",
    "HealthState": "model", "Kind": "model", "HealthMonitor": "monitor",
    "DEFAULT_EFFECTS": "options", "HealthConfigError": "options", "HealthOptions": "options",
    "parse_effects": "options", "parse_xids": "options", "HEALTH_SERVICES": "stream",
    "HealthServicer": "stream", "add_health_services": "stream", "apply_taints": "taints",
    "taint_key": "taints", "DEFAULT_IGNORED_XIDS": "xids", "describe_xid": "xids",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"agent.health.{where}"), name)
    globals()[name] = value  # once: later lookups are a plain module attribute
    return value


__all__ = [
    "DEFAULT_EFFECTS",
    "DEFAULT_IGNORED_XIDS",
    "HEALTH_SERVICES",
    "ChangeFeed",
    "Condition",
    "DeviceHealth",
    "HealthConfigError",
    "HealthMonitor",
    "HealthOptions",
    "HealthServicer",
    "HealthState",
    "Kind",
    "add_health_services",
    "apply_taints",
    "describe_xid",
    "parse_effects",
    "parse_xids",
    "taint_key",
]
