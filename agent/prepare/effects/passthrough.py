"""Whole GPUs for VMs (``--gpu-passthrough``) as an effect: a claim's VFIO form of a GPU
(``gpu-vfio-<address>``, ``discovery.passthrough``) is bound to vfio-pci before it is handed
out, and given back the driver it had at unprepare.

A VM gets a whole IOMMU group, never one function of it, so the group is checked first, under
the checkpoint's lock (``check``): every other function in it must be free of the host (on
vfio-pci, pci-stub, no driver, or a bridge) and of every other claim; a function the same
claim passes through counts as free. A refusal names each function in the way, its driver or
the claim holding it, and what to do. The container form of a GPU whose VFIO form another
claim holds (and the reverse) is refused too: the counter both forms consume keeps the
scheduler from allocating both, and this keeps a cluster without counters
(``DRAPartitionableDevices`` off) from doing it.

Crash-safe as the VF rebinding (``agent.prepare.effects.vfs``): the driver each GPU goes back
to is in the record, durably, before the first bind, so a failed prepare's rollback, start-up
after a kill -9 and unprepare all find it. The bind is the kernel's (driver_override, unbind,
drivers_probe); a rescan then reads the GPU on vfio-pci, with its ``/dev/vfio/<group>``, which
the CDI spec hands out with ``/dev/vfio/vfio`` (``cdi.edits``, ``DeviceKind.VFIO``). A reboot
gives the GPU back its driver; the spec's rewrite binds it again (``reapply``).

What a release touches is checked against what discovery publishes now, never taken from the
record alone: the record's device must be a published VFIO form, its ``pciAddress`` that
form's, the driver to restore one the kernel has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from agent.checkpoint.model import ClaimRecord, PreparedDevice
from agent.claim.model import ClaimError
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.devices import SpecDevice, identified
from agent.prepare.effects.base import BaseEffect, Release, Step, refused
from agent.prepare.effects.vfs import PCI_ADDRESS
from agent.prepare.errors import admin_refusal
from discovery.model import Device, DeviceType, Inventory
from discovery.passthrough import VFIO_DRIVER, PciDriverError, PciDrivers
from discovery.pcidrivers import DRIVER_NAME

log = logging.getLogger(__name__)

#: PreparedDevice.extra: the driver a GPU had before it was bound to vfio-pci ("" for none).
RESTORE = "gpuRestoreDriver"


class PassthroughError(ClaimError):
    """A GPU could not be handed to a VM; names the device, the function and the cause."""

    reason = "passthrough"


class PassthroughEffect(BaseEffect):
    """Binds a claim's VFIO forms to vfio-pci; ``rescan`` reads the node again (the GPU's
    driver and device nodes change with the bind), ``inventory`` is what discovery publishes
    now, that a record is checked against."""

    name = "passthrough"
    manual_fix = "give the GPU back its driver by hand (driverctl unset-override ADDRESS, or " \
                 "clear its driver_override and write ADDRESS to /sys/bus/pci/drivers_probe)"

    def __init__(self, control: PciDrivers, rescan: Callable[[], Inventory],
                 failpoints: Failpoints | None = None, *,
                 inventory: Callable[[], Inventory] | None = None) -> None:
        self.control = control
        self.rescan = rescan
        self.inventory = inventory or rescan
        self.failpoints = failpoints

    def touches(self, record: ClaimRecord) -> bool:
        return any(RESTORE in d.extra for d in record.devices)

    def plan(self, step: Step) -> None:
        """A VFIO form allocated with admin access is refused: it would be bound to vfio-pci
        and, at unprepare, given back its driver, under the VM that holds it."""
        for item in step.devices:
            if item.admin_access and item.device.type == DeviceType.VFIO:
                raise admin_refusal(str(step.ref), item.device.name, item.request,
                                    "a VM's GPU is bound to vfio-pci at prepare and given "
                                    "back its driver at unprepare, and admin access rebinds "
                                    "nothing; monitor the GPU's container form instead")

    # -- check: the group, and both forms of one GPU ---------------------------------------

    def check(self, step: Step, claims: Mapping[str, ClaimRecord]) -> None:
        vfio = [i.device for i in step.devices if i.device.type == DeviceType.VFIO]
        gpus = [i.device for i in step.devices if i.device.type == DeviceType.GPU]
        if not vfio and not gpus:
            return
        claim = str(step.ref)
        published = self.inventory().by_name()
        held = _held_addresses(step, claims, published)
        passed = {d.host.pci_address for d in vfio}
        for gpu in gpus:
            other = held.get(gpu.host.pci_address or "")
            by = "this claim" if gpu.host.pci_address in passed else \
                other[1] if other is not None and other[0].type == DeviceType.VFIO else None
            if by is not None:
                raise PassthroughError(claim, f"device {gpu.name}: GPU {gpu.host.pci_address} "
                                              f"is handed to a VM by {by} (its VFIO form); "
                                              "one GPU is either a container's or a VM's")
        for device in vfio:
            self._check_group(claim, device, held, passed)

    def _check_group(self, claim: str, device: Device,
                     held: Mapping[str, tuple[Device, str]], passed: set[str | None]) -> None:
        bdf = device.host.pci_address or ""
        try:
            group = self.control.group(bdf)
        except OSError as err:
            raise PassthroughError(claim, f"device {device.name}: the IOMMU group of "
                                          f"{bdf} is unreadable: {err}") from err
        if group is None:
            raise PassthroughError(claim, f"device {device.name}: GPU {bdf} has no IOMMU group; "
                                          "is the IOMMU on? (boot with intel_iommu=on or "
                                          "amd_iommu=on, and VT-d / AMD-Vi in the firmware)")
        number, members = group
        problems: list[str] = []
        for member in members:
            holder = held.get(member.bdf)
            if holder is not None:
                problems.append(f"{member.bdf} ({holder[0].name}) is held by {holder[1]}")
            elif member.bdf != bdf and member.bdf not in passed and not member.is_bridge \
                    and not member.vm_safe:
                problems.append(f"{member.bdf} is on {member.driver}, in use by the host")
        if problems:
            raise PassthroughError(claim, f"device {device.name}: a VM gets the whole IOMMU "
                                          f"group {number} of GPU {bdf}, and " +
                                          "; ".join(problems) + "; bind the host's functions "
                                          "to vfio-pci (driverctl set-override ADDRESS "
                                          "vfio-pci) or wait for the claims to go")

    # -- apply: record, then bind ----------------------------------------------------------

    def apply(self, step: Step) -> None:
        claim = str(step.ref)
        affected = [i for i, item in enumerate(step.devices)
                    if item.device.type == DeviceType.VFIO]
        if not affected:
            return
        binds: dict[str, tuple[str, str]] = {}  # device -> (address, driver before)
        for i in affected:
            device = step.devices[i].device
            bdf = device.host.pci_address or ""
            try:
                current = self.control.driver(bdf)
            except OSError as err:
                raise PassthroughError(claim, f"device {device.name}: the driver of {bdf} is "
                                              f"unreadable: {err}") from err
            if current != VFIO_DRIVER:
                binds[device.name] = (bdf, current or "")
        record = step.record
        if binds:
            record = _marked(record, {name: before for name, (_, before) in binds.items()})
            step.save(record)
            hit(self.failpoints, Point.GPU_VFIO_AFTER_INTENT, record.uid)
            for name, (bdf, before) in binds.items():
                try:
                    self.control.bind(bdf, VFIO_DRIVER)
                except PciDriverError as err:
                    raise PassthroughError(claim, f"device {name}: {err}") from err
                log.info("GPU bound to vfio-pci", extra={"claim": claim, "device": name,
                                                         "pci": bdf, "was": before or "none"})
            hit(self.failpoints, Point.GPU_VFIO_AFTER_BOUND, record.uid)
        fresh = (self.rescan() if binds else self.inventory()).by_name()
        step.devices = _bound(claim, step.devices, affected, fresh)
        made = {step.devices[i].device.name: step.devices[i].device for i in affected}
        step.record = replace(record, devices=identified(record.devices, step.pool, made))

    # -- release: give each GPU back its driver --------------------------------------------

    def release(self, how: Release) -> None:
        """Bind each of the record's GPUs back to the driver it had; a rollback skips one
        already there (the prepare died before its bind) or gone. PassthroughError (the
        kubelet retries) when the kernel refuses."""
        if how.record is None or not self.touches(how.record):
            return
        published = self.inventory().by_name()
        restored = False
        for held in how.record.devices:
            if RESTORE not in held.extra:
                continue
            if held.admin_access:  # prepare binds nothing for it: written by hand
                refused(how.claim, held.device, RESTORE, "the device is held with admin "
                        "access, which rebinds nothing")
                continue
            bdf, before = self._restorable(how.claim, held, published)
            if bdf is None or before is None:
                continue
            try:
                if how.rollback and (not self.control.exists(bdf)
                                     or self.control.driver(bdf) == before):
                    continue
                self.control.bind(bdf, before)
            except PciDriverError as err:
                raise PassthroughError(how.claim, f"device {held.device}: giving it back to "
                                                  f"{before}: {err}") from err
            restored = True
            log.info("GPU driver restored", extra={"claim": how.claim, "device": held.device,
                                                   "pci": bdf, "driver": before})
        if restored:
            self.rescan()  # its container form is back (NVML lists it again): publish it

    def _restorable(self, claim: str, held: PreparedDevice, published: Mapping[str, Device]
                    ) -> tuple[str | None, str | None]:
        """(the GPU's address, the driver it goes back to), or Nones and one line."""
        device = published.get(held.device)
        before = held.extra.get(RESTORE)
        if device is None or device.type != DeviceType.VFIO:
            refused(claim, held.device, RESTORE, f"{held.device} is not a GPU's VFIO form this "
                                                 "node publishes")
            return None, None
        bdf = device.host.pci_address
        if held.pci_address != bdf or bdf is None or not PCI_ADDRESS.fullmatch(bdf):
            refused(claim, held.device, "pciAddress", f"pciAddress {str(held.pci_address)[:80]!a}"
                                                      f" is not {bdf}, the GPU discovery has "
                                                      f"as {held.device}")
            return None, None
        if before == "":
            log.info("GPU had no driver before; it stays on vfio-pci", extra={
                "claim": claim, "device": held.device, "pci": bdf})
            return None, None
        if not isinstance(before, str) or not DRIVER_NAME.fullmatch(before) \
                or not self.control.has_driver(before):
            refused(claim, held.device, RESTORE,
                    f"{str(before)[:80]!a} is no driver under /sys/bus/pci/drivers")
            return None, None
        return bdf, before


def _held_addresses(step: Step, claims: Mapping[str, ClaimRecord],
                    published: Mapping[str, Device]) -> dict[str, tuple[Device, str]]:
    """PCI address -> (the published device, the claim holding it) for the devices of every
    other prepared claim on this node."""
    out: dict[str, tuple[Device, str]] = {}
    for other in claims.values():
        if other.uid == step.record.uid:
            continue
        for held in other.devices:
            device = published.get(held.device) if held.pool == step.pool else None
            if device is not None and device.host.pci_address:
                out.setdefault(device.host.pci_address, (
                    device, f"claim {other.namespace}/{other.name} ({other.uid})"))
    return out


def _bound(claim: str, devices: Sequence[SpecDevice], affected: Sequence[int],
           fresh: Mapping[str, Device]) -> list[SpecDevice]:
    """``devices`` with each VFIO form as discovery reads it now: on vfio-pci, in a group."""
    out = list(devices)
    for i in affected:
        item = devices[i]
        now = fresh.get(item.device.name)
        if now is None or now.host.pci_address != item.device.host.pci_address \
                or now.host.driver != VFIO_DRIVER or not now.host.iommu_group:
            raise PassthroughError(claim, f"device {item.device.name}: GPU "
                                          f"{item.device.host.pci_address} is not on vfio-pci "
                                          "in an IOMMU group after the bind")
        out[i] = replace(item, device=now)
    return out


def _marked(record: ClaimRecord, before: Mapping[str, str]) -> ClaimRecord:
    """``record`` naming, for each device in ``before``, the driver it goes back to; one it
    names already keeps it (a rewrite after a reboot finds the GPU on whatever came up)."""
    return replace(record, devices=tuple(
        replace(h, extra={**h.extra, RESTORE: h.extra.get(RESTORE, before[h.device])})
        if h.device in before else h for h in record.devices))
