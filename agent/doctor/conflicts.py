"""Another driver handing out the same devices: a device plugin serving this node's GPUs or
RDMA devices lets the kubelet give one GPU to two pods (one through DRA, one through the
plugin), and neither side knows.

The agent itself refuses to start only where a DeviceClass maps the device plugin's resource
name (extendedResourceName, agent/deviceplugins.py); a device plugin for the same hardware
without such a class is as much a double allocation, so doctor names any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.doctor.context import Context
from agent.doctor.host import HostFileError
from agent.doctor.model import Check, fail, ok, skipped, warn

DEVICE_PLUGINS, CAPACITY = "device plugins", "node capacity"
#: The kubelet's record of every registered device plugin and the device IDs it advertises.
CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
MAX_CHECKPOINT_BYTES = 8 << 20
#: Extended resource names (or prefixes, ending in / or -) that name devices the agent offers,
#: by the device types that offer them.
OVERLAPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("nvidia.com/gpu", frozenset({"gpu", "mig"})),
    ("nvidia.com/mig-", frozenset({"gpu", "mig"})),
    ("amd.com/gpu", frozenset({"gpu"})),
    ("gpu.intel.com/i915", frozenset({"gpu"})),
    ("gpu.intel.com/xe", frozenset({"gpu"})),
    ("rdma/", frozenset({"nic", "vf"})),
)


def overlapping(resource: str, device_types: tuple[str, ...]) -> bool:
    for name, types in OVERLAPS:
        if not types & set(device_types):
            continue
        if resource == name or (name.endswith(("/", "-")) and resource.startswith(name)):
            return True
    return False


def registered_devices(ctx: Context) -> Mapping[str, list[Any]] | None:
    """Resource name -> device IDs from the kubelet's checkpoint; None when there is none.
    Raises ``HostFileError`` for a checkpoint that cannot be read or has the wrong shape."""
    path = f"{ctx.options.kubelet_dir}/{CHECKPOINT}"
    try:
        doc = ctx.host.read_json(path, MAX_CHECKPOINT_BYTES)
    except FileNotFoundError:
        return None
    data = doc.get("Data") if isinstance(doc, dict) else None
    devices = data.get("RegisteredDevices") if isinstance(data, dict) else None
    if devices is None and isinstance(data, dict):
        return {}
    if not isinstance(devices, dict):
        raise HostFileError(f"{path}: Data.RegisteredDevices is not an object")
    return {str(k): v if isinstance(v, list) else [] for k, v in devices.items()}


def check_device_plugins(ctx: Context) -> Check:
    types = ctx.options.device_types
    plugins = f"{ctx.options.kubelet_dir}/device-plugins"
    if not ctx.host.is_dir(plugins):
        # The kubelet always creates it (its kubelet.sock lives there): missing means not
        # visible here, e.g. in the agent's pod, which mounts only its own directories.
        return skipped(DEVICE_PLUGINS, f"no {plugins} here (mount the host's / and give "
                       "--host-root)")
    try:
        devices = registered_devices(ctx)
    except HostFileError as err:
        return warn(DEVICE_PLUGINS, str(err), "nothing to fix in the file (the kubelet owns "
                    "it); check for device plugins with kubectl get pods -A -o wide")
    if devices is None:
        return ok(DEVICE_PLUGINS, "no device plugin checkpoint: no device plugin has registered")
    clash = {k: v for k, v in sorted(devices.items()) if overlapping(k, types)}
    if clash:
        shown = ", ".join(f"{k} ({len(v)} device(s))" for k, v in clash.items())
        return fail(DEVICE_PLUGINS, f"device plugins serve {shown}: the same devices would be "
                    "handed out twice",
                    "remove that device plugin from this node (e.g. nvidia-device-plugin's "
                    "DaemonSet), or run the agent with --device-types for the other devices")
    others = ", ".join(sorted(devices)) or "none"
    return ok(DEVICE_PLUGINS, f"registered device plugin resources: {others}; none overlaps "
              f"{','.join(types)}")


def check_capacity(ctx: Context) -> Check:
    node, why = ctx.node()
    if node is None:
        return skipped(CAPACITY, why)
    from agent.deviceplugins import advertised_in_capacity

    status = node.get("status")
    capacity = status.get("capacity") if isinstance(status, dict) else None
    if not isinstance(capacity, dict):
        return warn(CAPACITY, "the Node has no status.capacity", "check the kubelet's health")
    # Non-zero extended resources, as the agent's own start-up check reads them (a stopped
    # device plugin leaves its resource at 0).
    advertised = advertised_in_capacity(node)
    clash = sorted(f"{k}={capacity[k]}" for k in advertised
                   if overlapping(k, ctx.options.device_types))
    if clash:
        return fail(CAPACITY, f"Node {ctx.options.node_name} advertises {', '.join(clash)} "
                    "through a device plugin",
                    "remove the device plugin from this node; the capacity goes once its "
                    "plugin is gone and the kubelet restarts")
    return ok(CAPACITY, f"no extended resource for {','.join(ctx.options.device_types)} devices "
              "in the Node's capacity")
