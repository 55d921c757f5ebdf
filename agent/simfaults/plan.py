"""What a fault request does to the simulated GPUs, decided before the request is consumed.

A request the agent cannot deliver (health monitoring off, GPUs that are not simulated, an
unknown device, a NIC, a MIG partition without an instance) is refused here, with the reason
its writer is shown.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.simfaults.request import FaultKind, FaultRequest, FaultRequestError

if TYPE_CHECKING:
    from agent.health.options import HealthOptions
    from discovery.model import Device, Inventory
    from discovery.simulate.fake_nvml import FakeNvml

__all__ = ["Plan", "plan_fault"]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a request will do, decided (and refused, if it must be) before it is consumed."""

    action: Callable[[], None]
    fields: Mapping[str, str] = field(default_factory=dict)


def plan_fault(request: FaultRequest, nvml: FakeNvml | None,
               inventory_of: Callable[[], Inventory], health: HealthOptions | None) -> Plan:
    """The action for ``request`` on ``nvml`` and the fields of its log line; raises
    ``FaultRequestError`` when it cannot be delivered (``health`` None: monitoring is off)."""
    from agent.health.gpu import devices_for
    from agent.health.model import Kind
    from discovery.gpulib import WHOLE_GPU
    from discovery.model import DeviceType

    if health is None:
        raise FaultRequestError("device health monitoring is off (--no-health): nothing "
                                "would see the fault")
    if nvml is None:
        raise FaultRequestError("this agent's GPUs are not simulated NVIDIA GPUs")
    inventory = inventory_of()
    by_name = inventory.by_name()
    gpus = sorted(n for n, d in by_name.items() if d.type in (DeviceType.GPU, DeviceType.MIG))
    device: Device | None = by_name.get(request.device)
    if device is None:
        raise FaultRequestError(f"no device {request.device} on this node; its GPU and MIG "
                                f"devices: {_listing(gpus)}")
    if device.type not in (DeviceType.GPU, DeviceType.MIG):
        raise FaultRequestError(f"{request.device} is a {device.type} device: simulated "
                                f"faults are NVML's, for GPU and MIG devices "
                                f"({_listing(gpus)})")
    gpu_uuid = device.host.parent_uuid or device.host.uuid
    if gpu_uuid is None:
        raise FaultRequestError(f"{request.device} has no NVIDIA GPU behind it")
    fields = {"device": request.device, "fault": str(request.fault)}
    whole = request.fault in (FaultKind.LOST, FaultKind.RECOVER)
    if whole:
        uuid, gi, ci = gpu_uuid, WHOLE_GPU, WHOLE_GPU
    elif device.host.uuid is None:
        raise FaultRequestError(
            f"{request.device} is a MIG partition without an instance yet (made at "
            f"prepare): an {request.fault} error needs one; name its GPU instead")
    else:
        uuid = device.host.uuid
        gi = device.host.mig_gi if device.host.mig_gi is not None else WHOLE_GPU
        ci = device.host.mig_ci if device.host.mig_ci is not None else WHOLE_GPU
    action: Callable[[], None]
    kind: Kind | None = None
    if request.fault is FaultKind.XID:
        assert request.xid is not None
        action, kind = functools.partial(nvml.inject_xid, uuid, request.xid), Kind.XID
        fields["xid"] = str(request.xid)
        if request.xid in health.ignored_xids:
            fields["note"] = f"Xid {request.xid} is ignored (--health-ignore-xids): no taint"
    elif request.fault is FaultKind.ECC:
        action, kind = functools.partial(nvml.inject_ecc, uuid, double_bit=True), Kind.ECC
    elif request.fault is FaultKind.LOST:
        action, kind = functools.partial(nvml.set_lost, uuid), Kind.GPU_LOST
    else:
        action = functools.partial(nvml.recover, uuid)
        fields["note"] = "taints clear once the quiet period passes (--health-quiet-period)"
    fields["uuid"] = uuid
    fields["devices"] = ",".join(devices_for(inventory, gpu_uuid, gi, ci)) or "-"
    if kind is not None:
        fields["effect"] = health.effect(kind) or "off"
    return Plan(action, fields)


def _listing(names: list[str], limit: int = 12) -> str:
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
