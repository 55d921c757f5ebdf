"""VFs on demand at prepare (``--vfs dynamic``) as an effect: a claim allocated a candidate VF
of a PF that has no VFs gets them made, all at once, then the VF as the kernel made it.

Pre-size on first use (``discovery.vfs`` says why): the first such prepare writes the PF's
TotalVFs to ``sriov_numvfs``; the VF count is never changed again by the agent, so nothing
needs undoing: a failed prepare or an unprepare leaves the VFs idle for the next claim, and a
crash between the write and the checkpoint leaves nothing half-made (the write is the whole
step, and repeating it is a no-op).

A claim's ``vf.driver`` (``netdev``: the PF's kernel driver, or ``vfio-pci``) binds the VF to
that driver before it is handed out (driver_override, unbind, drivers_probe); the driver it
had is kept in the record and restored at unprepare, and the VF's MAC (what a pod set) is
unset on its PF, so the VF goes back to the pool as it was. Without ``vf.driver`` the VF is
handed out as it is.

What a release does is checked against what discovery publishes now, never taken from the
record alone (``vf_problem``): the VF, its address, its PF and index, the driver it goes back
to. A record naming anything else (a PF, a path, another VF's cap) changes nothing.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from agent.checkpoint.model import ClaimRecord, PreparedDevice
from agent.claim.model import ClaimError
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.devices import SpecDevice, identified
from agent.prepare.effects.base import BaseEffect, Release, Step, refused
from agent.prepare.errors import admin_refusal
from discovery.model import Device, DeviceType, Inventory
from discovery.pcidrivers import DRIVER_NAME
from discovery.vfs import (
    EXTRA_CANDIDATE,
    EXTRA_RATE,
    EXTRA_TOTAL,
    SriovControl,
    SriovError,
)

log = logging.getLogger(__name__)

#: PreparedDevice.extra: the driver a VF had before the claim's ``vf.driver`` rebound it.
RESTORE = "vfRestoreDriver"
#: PreparedDevice.extra: {"pf", "index"} of a VF whose MAC unprepare unsets.
MAC = "vfMacReset"
#: PreparedDevice.extra: {"pf", "index"} of a VF capped at its bandwidth (--vf-bandwidth),
#: whose cap unprepare lifts.
RATE = "vfRateCap"


class VfError(ClaimError):
    """The VF of a claim could not be made; names the device, its PF and the kernel's cause."""

    reason = "sriov"


def candidate_index(device: Device) -> int | None:
    if device.type != DeviceType.VF or EXTRA_CANDIDATE not in device.host.extra:
        return None
    return int(device.host.extra[EXTRA_CANDIDATE])


class VfEffect(BaseEffect):
    """Makes a PF's VFs when a claim first needs one; ``rescan`` reads the node again (the
    VF's interface, driver and IOMMU group exist only once the kernel made it). The default
    ``reapply`` is ``apply``: a reboot drops the VFs the agent made (the PF is back at 0 VFs,
    its candidates under the same names), so a rewrite makes them again, on the drivers and
    caps the claim asked for, before the spec names them."""

    name = "vfs"
    manual_fix = "rebind the VF by hand (driverctl) and lift its cap (ip link set PF vf N "\
                 "max_tx_rate 0)"

    def __init__(self, control: SriovControl, rescan: Callable[[], Inventory],
                 failpoints: Failpoints | None = None, *,
                 inventory: Callable[[], Inventory] | None = None) -> None:
        self.control = control
        self.rescan = rescan
        #: What discovery publishes now, that a record's fields are checked against.
        self.inventory = inventory or rescan
        self.failpoints = failpoints
        self._lock = threading.Lock()

    def touches(self, record: ClaimRecord) -> bool:
        return any(key in d.extra for d in record.devices for key in (RESTORE, MAC, RATE))

    def plan(self, step: Step) -> None:
        """Refuse what would change a VF allocated with admin access: its driver
        (``vf.driver``), or VFs a candidate needs made. Such a VF gets no cap and no MAC
        reset either (``_prepare``): its holder's pod set them."""
        for item in step.devices:
            if not item.admin_access:
                continue
            if item.vf_driver is not None:
                raise admin_refusal(str(step.ref), item.device.name, item.request,
                                    "vf.driver would rebind the VF under its holder's pod; "
                                    "drop vf.driver for admin-access requests")
            if candidate_index(item.device) is not None:
                raise admin_refusal(str(step.ref), item.device.name, item.request,
                                    "the VF does not exist yet, and admin access does not "
                                    "make it; ask for a VF that exists")

    def apply(self, step: Step) -> None:
        step.record, step.devices = self._prepare(str(step.ref), step.record, step.devices,
                                                  step.save)
        made = {d.device.name: d.device for d in step.devices}
        step.record = replace(step.record, devices=identified(step.record.devices, step.pool,
                                                              made))

    def _prepare(self, claim: str, record: ClaimRecord, devices: Sequence[SpecDevice],
                 save: Callable[[ClaimRecord], None]) -> tuple[ClaimRecord, list[SpecDevice]]:
        """Make the VFs candidates need, bind what ``vf.driver`` asks, cap each at its
        bandwidth (--vf-bandwidth), then read made or rebound VFs back (one rescan); the
        record names the driver each rebound VF goes back to and the caps to lift.

        That record is handed to ``save`` (the PrepareStarted record, written to the
        checkpoint) before the first change, so a prepare that fails or dies after it is
        undone by the rollback or by start-up (``release`` of a rollback). One more durable
        write, for claims that rebind or cap a VF only: the bind and the driver's probe cost
        more.
        """
        record = _with_mac_reset(record, devices)
        affected, made_vfs = [], False
        for i, item in enumerate(devices):
            if item.admin_access:
                continue  # another claim's VF, perhaps: never capped, reset or rebound
            index = candidate_index(item.device)
            if index is None and item.vf_driver is None and _rate(item.device) is None:
                continue
            if index is not None:
                self._ensure(claim, item.device, item.device.host.parent_pf or "", index)
                made_vfs = True
            affected.append(i)
        if not affected:
            return record, list(devices)
        binds: dict[str, tuple[str, str, str]] = {}  # device -> (VF, driver, driver before)
        for i in affected:  # after every VF exists: a candidate's address is its VF's
            item = devices[i]
            if item.vf_driver is not None:
                vf = item.device.host.pci_address or ""
                plan = self._plan(claim, item.device.name, vf,
                                  item.device.host.parent_pf or "", item.vf_driver)
                if plan is not None:
                    binds[item.device.name] = (vf, *plan)
        caps = {devices[i].device.name: cap for i in affected
                if (cap := _rate(devices[i].device)) is not None}
        if binds or caps:
            marks: dict[str, dict[str, object]] = {}
            for name, (_, _, before) in binds.items():
                marks.setdefault(name, {})[RESTORE] = before
            for name, (pf, index, _) in caps.items():
                marks.setdefault(name, {})[RATE] = {"pf": pf, "index": index}
            record = _marked(record, marks)
            save(record)
            hit(self.failpoints, Point.VF_AFTER_INTENT, record.uid)
            for name, (vf, target, before) in binds.items():
                self._bind(claim, name, vf, target, before)
            for name, (pf, index, mbps) in caps.items():
                try:
                    self.control.set_vf_rate(pf, index, mbps)
                except SriovError as err:
                    raise VfError(claim, f"device {name}: {err}") from err
                log.info("VF rate capped", extra={"claim": claim, "device": name,
                                                  "max_tx_rate_mbps": mbps})
            hit(self.failpoints, Point.VF_AFTER_BOUND, record.uid)
        if not made_vfs and not binds:
            return record, list(devices)  # a cap changes nothing discovery reads
        fresh = self.rescan().by_name()
        out = list(devices)
        for i in affected:
            item = devices[i]
            made = fresh.get(item.device.name)
            if made is None or made.host.parent_pf != item.device.host.parent_pf:
                raise VfError(claim, f"device {item.device.name}: VF of PF "
                                        f"{item.device.host.parent_pf} not found after the VFs "
                                        "were created")
            out[i] = replace(item, device=made)
        return record, out

    def _plan(self, claim: str, name: str, vf: str, pf: str, wanted: str
              ) -> tuple[str, str] | None:
        """(driver to bind ``vf`` to, driver it has now) for ``wanted`` (netdev: the PF's
        driver); None when it has that driver already."""
        try:
            target = wanted if wanted != "netdev" else self.control.driver(pf)
            if target is None:
                raise SriovError(f"PF {pf} has no driver to bind its VF {vf} to")
            current = self.control.driver(vf)
        except SriovError as err:
            raise VfError(claim, f"device {name}: {err}") from err
        return None if current == target else (target, current or "")

    def _bind(self, claim: str, name: str, vf: str, target: str, before: str) -> None:
        try:
            self.control.bind(vf, target)
        except SriovError as err:
            raise VfError(claim, f"device {name}: {err}") from err
        log.info("VF driver bound", extra={"claim": claim, "device": name, "driver": target,
                                           "was": before or "none"})

    def release(self, how: Release) -> None:
        """Unset the claim's VFs' MACs and give rebound VFs back their driver, so each goes
        back to the pool as it was; VfError (the kubelet retries) on failure.

        A rollback undoes a prepare that never completed, whose pod never ran (no MAC to
        unset), perhaps before a bind or a reboot (a VF already on its old driver, or gone
        with the VFs a reboot drops, needs nothing).

        Only what discovery publishes is touched (``vf_problem``): the record's device must
        be a published VF of a published PF, its ``pciAddress`` that VF's full address, its
        cap and MAC that VF's own PF and index, the driver it goes back to one the kernel
        has. Anything else is one line and left alone.
        """
        if how.record is None or not self.touches(how.record):
            return
        claim, restore_only = how.claim, how.rollback
        published = self.inventory().by_name()
        for held in how.record.devices:
            if not any(key in held.extra for key in (RESTORE, MAC, RATE)):
                continue
            vf, why = vf_problem(published, held)
            if held.admin_access:  # prepare marks none: the record was written by hand
                vf, why = None, "the device is held with admin access, which changes nothing"
            if vf is None:
                for key in (k for k in (RESTORE, MAC, RATE) if k in held.extra):
                    refused(claim, held.device, key, why)
                continue
            if RATE in held.extra and self._own(claim, held, vf, RATE) \
                    and not (restore_only and not self._exists(vf.host.pci_address)):
                pf, index = _pf_index(vf)
                try:
                    self.control.set_vf_rate(pf, index, 0)
                except SriovError as err:
                    raise VfError(claim, f"device {held.device}: {err}") from err
                log.info("VF rate cap lifted", extra={"claim": claim, "device": held.device})
            if MAC in held.extra and self._own(claim, held, vf, MAC) and not restore_only:
                try:
                    self.control.reset_vf_mac(*_pf_index(vf))
                except SriovError as err:
                    raise VfError(claim, f"device {held.device}: {err}") from err
            before = held.extra.get(RESTORE)
            if before is None or before == "" or not self._restorable(claim, held, vf, before):
                continue
            function = vf.host.pci_address or ""
            assert isinstance(before, str)  # _restorable checked it
            try:
                if restore_only and (not self._exists(function)
                                     or self.control.driver(function) == before):
                    continue
                self.control.bind(function, before)
            except SriovError as err:
                raise VfError(claim, f"device {held.device}: giving it back to {before}: "
                                     f"{err}") from err
            log.info("VF driver restored", extra={"claim": claim, "device": held.device,
                                                  "driver": before})

    def _own(self, claim: str, held: PreparedDevice, vf: Device, key: str) -> bool:
        """The record's cap or MAC mark names ``vf``'s own PF and index (else one line)."""
        pf, index = _pf_index(vf)
        mark = held.extra.get(key)
        if mark == {"pf": pf, "index": index} and isinstance(mark, dict) \
                and type(mark["index"]) is int:
            return True
        refused(claim, held.device, key, f"names {str(mark)[:80]!a}, not PF {pf} VF {index} "
                                         f"as discovery has {held.device}")
        return False

    def _restorable(self, claim: str, held: PreparedDevice, vf: Device, before: object) -> bool:
        """The record's address is ``vf``'s and the driver to give it back to is one the
        kernel has (else one line)."""
        if held.pci_address != vf.host.pci_address or held.pci_address is None \
                or not PCI_ADDRESS.fullmatch(held.pci_address):
            why = (f"pciAddress {str(held.pci_address)[:80]!a} is not "
                   f"{vf.host.pci_address}, the VF discovery has as {held.device}")
            refused(claim, held.device, "pciAddress", why)
            return False
        if not isinstance(before, str) or not DRIVER_NAME.fullmatch(before) \
                or not self.control.has_driver(before):
            refused(claim, held.device, RESTORE,
                    f"{str(before)[:80]!a} is no driver under /sys/bus/pci/drivers")
            return False
        return True

    def _exists(self, function: str | None) -> bool:
        return bool(function) and self.control.exists(function or "")

    def _ensure(self, claim: str, device: Device, pf: str, index: int) -> None:
        total = int(device.host.extra.get(EXTRA_TOTAL, "0"))
        with self._lock:
            try:
                current = self.control.num_vfs(pf)
                if current == 0:
                    self.control.set_num_vfs(pf, total)
                    log.info("created the VFs of a PF", extra={
                        "claim": claim, "device": device.name, "pf": pf, "vfs": total})
                elif index >= current:
                    raise VfError(claim, f"device {device.name}: PF {pf} has {current} VFs, not "
                                         f"VF {index}, and the kernel changes the VF count only "
                                         "from 0; set sriov_numvfs to 0 when no VF is in use")
            except SriovError as err:
                raise VfError(claim, f"device {device.name}: {err}") from err


#: A PCI function's full address as the kernel names it under /sys/bus/pci/devices.
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", re.ASCII)


def vf_problem(published: Mapping[str, Device], held: PreparedDevice
               ) -> tuple[Device | None, str]:
    """The published VF the record's device is, or None and why it is none: a VF of a PF
    this node publishes, with its index, as discovery sees it now."""
    vf = published.get(held.device)
    if vf is None or vf.type != DeviceType.VF:
        return None, f"{held.device} is not a VF this node publishes"
    pf, index = vf.host.parent_pf, vf.attributes.get("vfIndex")
    if not pf or not any(d.host.pci_address == pf for d in published.values()):
        return None, f"the PF of {held.device} is not a device this node publishes"
    if type(index) is not int or not PCI_ADDRESS.fullmatch(vf.host.pci_address or ""):
        return None, f"discovery has no index or address of {held.device}"
    return vf, ""


def _pf_index(vf: Device) -> tuple[str, int]:
    index = vf.attributes.get("vfIndex")
    assert vf.host.parent_pf and isinstance(index, int)  # vf_problem checked them
    return vf.host.parent_pf, index


def _rate(device: Device) -> tuple[str, int, int] | None:
    """(PF, VF index, Mbit/s) of a VF published with a bandwidth (--vf-bandwidth)."""
    mbps, index = device.host.extra.get(EXTRA_RATE), device.attributes.get("vfIndex")
    if device.type != DeviceType.VF or not mbps or not device.host.parent_pf \
            or not isinstance(index, int) or isinstance(index, bool):
        return None
    return device.host.parent_pf, index, int(mbps)


def _with_mac_reset(record: ClaimRecord, devices: Sequence[SpecDevice]) -> ClaimRecord:
    """The record naming, for each VF of the claim, the PF and index unprepare resets."""
    marks: dict[str, dict[str, object]] = {}
    for item in devices:
        d = item.device
        index = d.attributes.get("vfIndex")
        if d.type == DeviceType.VF and d.host.parent_pf and isinstance(index, int) \
                and not isinstance(index, bool) and not item.admin_access:
            marks[d.name] = {"pf": d.host.parent_pf, "index": index}
    return _marked(record, {name: {MAC: mark} for name, mark in marks.items()})


def _marked(record: ClaimRecord, marks: dict[str, dict[str, object]]) -> ClaimRecord:
    """``record`` with each named device's extra gaining ``marks[device]``."""
    if not marks:
        return record
    return replace(record, devices=tuple(
        replace(h, extra={**h.extra, **marks[h.device]}) if h.device in marks else h
        for h in record.devices))
