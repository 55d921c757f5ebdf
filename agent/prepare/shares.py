"""Shares of one device (KEP-5075 consumable capacity), checked again on the node.

The scheduler hands out parts of a shareable device and records each as a result with a
``shareID`` and its ``consumedCapacity``. The agent checks the same facts once more, inside
the checkpoint update that reserves the devices (atomically across claims), because a stale
scheduler cache or a force-deleted pod can still over-commit a device:

* a share of a device this node publishes exclusive (sharing switched off since the slice the
  scheduler read) is refused;
* for each capacity of a shared device, what every prepared share holds plus what this claim
  asks for must not exceed the device's capacity. A share whose record has no consumed amounts
  (written before they were kept, or by a scheduler that sent none) counts as what the
  device's request policy gives by default, as the scheduler would have consumed.

Exclusive use against shares is refused by ``DevicePreparer._check_free``, which sees both.
``check_config`` refuses the ``sharing`` knobs (time slice, MPS) on a device nothing bounds by
them: a share of another vendor's GPU, a NIC, an exclusive device.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from agent.checkpoint.model import ClaimRecord, PreparedDevice, holders
from agent.claim.model import AllocatedDevice, ClaimRef
from agent.common.quantity import QuantityError, format_quantity, parse_quantity
from agent.prepare.devices import SpecDevice
from agent.prepare.errors import (
    BadConfigError,
    CapacityExceededError,
    NotShareableError,
    admin_refusal,
)
from discovery.model import Device, DeviceType


def consumed_by(device: Device, consumed: Mapping[str, str]) -> dict[str, Fraction]:
    """What one share holds of each of ``device``'s capacities."""
    out: dict[str, Fraction] = {}
    for name, total in device.capacity.items():
        amount = consumed.get(name)
        if amount is None:
            policy = device.request_policies.get(name)
            amount = policy.default if policy is not None else total
        try:
            out[name] = parse_quantity(amount)
        except QuantityError:  # a published value we wrote; never expected to fail
            out[name] = parse_quantity(total)
    return out


def _held(
    claims: Mapping[str, ClaimRecord], uid: str, pool: str, device: Device
) -> tuple[dict[str, Fraction], int]:
    """Capacity held by the shares other claims have prepared on ``device``, and by how many
    claims."""
    held: dict[str, Fraction] = defaultdict(Fraction)
    claims_holding: set[str] = set()
    for other, share in holders(claims, pool, device.name, besides=uid):
        if not share.share_id:
            continue
        claims_holding.add(other.uid)
        for name, amount in consumed_by(device, share.consumed).items():
            held[name] += amount
    return held, len(claims_holding)


def check_shares(
    ref: ClaimRef,
    results: Sequence[AllocatedDevice],
    prepared: Iterable[PreparedDevice],
    claims: Mapping[str, ClaimRecord],
    *,
    inventory: Mapping[str, Device],
    pool: str,
) -> None:
    """Raise a per-claim error when a share of this claim cannot be held on this node."""
    mine: dict[str, dict[str, Fraction]] = {}
    for result, record in zip(results, prepared, strict=True):
        if not result.share_id or result.pool != pool:
            continue
        device = inventory.get(result.device)
        if device is None:
            continue  # spec_device has refused it already
        if not device.allow_multiple_allocations:
            raise NotShareableError(
                str(ref),
                f"device {pool}/{device.name} was allocated as a share (shareID "
                f"{result.share_id}) but this node publishes it exclusive (--sharing); the "
                "allocation was made from an older ResourceSlice, so delete and re-create "
                "the claim",
            )
        total = mine.setdefault(device.name, defaultdict(Fraction))
        for name, amount in consumed_by(device, record.consumed).items():
            total[name] += amount
    for name, asked in mine.items():
        device = inventory[name]
        held, holders = _held(claims, ref.uid, pool, device)
        for capacity, amount in sorted(asked.items()):
            limit = parse_quantity(device.capacity[capacity])
            if held[capacity] + amount <= limit:
                continue
            left = max(limit - held[capacity], Fraction(0))
            raise CapacityExceededError(
                str(ref),
                f"device {pool}/{name} has {format_quantity(left)} of "
                f"{device.capacity[capacity]} {capacity} left ({holders} other claim(s) hold "
                f"{format_quantity(held[capacity])}) and this claim's share needs "
                f"{format_quantity(amount)}; the scheduler's view of the device was stale, "
                "the kubelet retries once a share is released",
            )


def _bounded(device: Device) -> bool:
    return (device.type == DeviceType.GPU and device.host.vendor == "nvidia"
            and device.allow_multiple_allocations)


def check_config(ref: ClaimRef, item: SpecDevice, request: str) -> None:
    """Refuse ``sharing`` settings on a device that nothing could bound by them."""
    sharing = item.sharing
    if not sharing.is_set:
        return
    device = item.device
    if item.admin_access:
        raise admin_refusal(str(ref), device.name, request,
                            "sharing would set the GPU's time slice or MPS limits for every "
                            "share of it; drop sharing for admin-access requests")
    where = f"opaque config for request {request}: sharing"
    if not item.share_id or not device.allow_multiple_allocations:
        raise BadConfigError(str(ref), f"{where}: device {device.name} is not allocated as a "
                                       "share; timeSlice and mps bound shares of a GPU only")
    if not _bounded(device):
        vendor = device.host.vendor or str(device.type)
        raise BadConfigError(str(ref), f"{where}: device {device.name} ({vendor}) is shared "
                                       "for scheduling only; timeSlice and mps are NVIDIA's")
    if sharing.time_slice and not device.host.uuid:
        raise BadConfigError(str(ref), f"{where}.timeSlice: device {device.name} has no UUID "
                                       "to name it to the driver")
