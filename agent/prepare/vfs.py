"""VFs on demand at prepare (``--vfs dynamic``): a claim allocated a candidate VF of a PF
that has no VFs gets them made, all at once, then the VF as the kernel made it.

Pre-size on first use (``discovery.vfs`` says why): the first such prepare writes the PF's
TotalVFs to ``sriov_numvfs``; the VF count is never changed again by the agent, so nothing
needs undoing: a failed prepare or an unprepare leaves the VFs idle for the next claim, and a
crash between the write and the checkpoint leaves nothing half-made (the write is the whole
step, and repeating it is a no-op). The VF is handed out bound to the PF's driver (a netdev
for mlx5); choosing vfio-pci per claim is not done yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from agent.claim.model import ClaimError, ClaimRef
from agent.prepare.devices import SpecDevice
from discovery.model import Device, DeviceType, Inventory
from discovery.vfs import EXTRA_CANDIDATE, EXTRA_TOTAL, SriovControl, SriovError

log = logging.getLogger(__name__)


class VfError(ClaimError):
    """The VF of a claim could not be made; names the device, its PF and the kernel's cause."""

    reason = "sriov"


def candidate_index(device: Device) -> int | None:
    if device.type != DeviceType.VF or EXTRA_CANDIDATE not in device.host.extra:
        return None
    return int(device.host.extra[EXTRA_CANDIDATE])


class VfProvisioner:
    """Makes a PF's VFs when a claim first needs one; ``rescan`` reads the node again (the
    VF's interface, driver and IOMMU group exist only once the kernel made it)."""

    def __init__(self, control: SriovControl, rescan: Callable[[], Inventory]) -> None:
        self.control = control
        self.rescan = rescan
        self._lock = threading.Lock()

    def prepare(self, ref: ClaimRef, devices: Sequence[SpecDevice]) -> list[SpecDevice]:
        out = list(devices)
        fresh: dict[str, Device] | None = None
        for i, item in enumerate(devices):
            index = candidate_index(item.device)
            if index is None:
                continue
            pf = item.device.host.parent_pf or ""
            self._ensure(str(ref), item.device, pf, index)
            if fresh is None:
                fresh = self.rescan().by_name()
            made = fresh.get(item.device.name)
            if made is None or made.host.parent_pf != pf:
                raise VfError(str(ref), f"device {item.device.name}: VF {index} of PF {pf} not "
                                        "found after the VFs were created")
            out[i] = replace(item, device=made)
        return out

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
