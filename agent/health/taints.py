"""Health as ResourceSlice device taints: ``<driver>/<kind>=<value>:<effect>``.

One taint per condition kind (the API wants keys to mean one thing per device); its value is
the first condition of that kind still in force, e.g. the first Xid, which is usually the
cause of the ones that follow. Taints the device already carries under other keys are kept.
``timeAdded`` is left to the API server; the slice controller carries the stored time over on
later writes, so an unchanged taint never looks new.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from agent.health.model import KIND_ORDER, DeviceHealth, Kind
from agent.health.options import HealthOptions
from discovery.model import Device, Inventory, Taint


def taint_key(driver: str, kind: Kind) -> str:
    return f"{driver}/{kind.value}"


def taints_for(health: DeviceHealth, driver: str, options: HealthOptions) -> tuple[Taint, ...]:
    out: list[Taint] = []
    seen: set[Kind] = set()
    for cond in sorted(health.conditions, key=lambda c: KIND_ORDER[c.kind]):
        if cond.kind in seen:
            continue
        seen.add(cond.kind)
        effect = options.effect(cond.kind)
        if effect is None:
            continue
        out.append(Taint(key=taint_key(driver, cond.kind), effect=effect, value=cond.value))
    return tuple(out)


def _ours(taint: Taint, driver: str) -> bool:
    return any(taint.key == taint_key(driver, k) for k in Kind)


def apply_taints(inventory: Inventory, health: Mapping[str, DeviceHealth], driver: str,
                 options: HealthOptions) -> Inventory:
    """``inventory`` with health taints on its devices (removed from healthy ones).

    Returns the same object when nothing changes, so callers can compare cheaply.
    """
    changed = False
    devices: list[Device] = []
    for device in inventory.devices:
        kept = tuple(t for t in device.taints if not _ours(t, driver))
        state = health.get(device.name)
        taints = kept + (taints_for(state, driver, options) if state is not None else ())
        if taints != device.taints:
            devices.append(replace(device, taints=taints))
            changed = True
        else:
            devices.append(device)
    if not changed:
        return inventory
    return replace(inventory, devices=tuple(devices))
