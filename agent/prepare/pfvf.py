"""A PF and its VFs are prepared for one claim at a time (#28, finding 4).

A PF's holder controls every VF of it: with NET_ADMIN in its pod it sets their MACs, VLANs and
rates (``ip link set <pf> vf N ...``), its own traffic takes the bandwidth the VFs were promised,
and once its netdev leaves the host's namespace the VFs' caps and MAC resets fail, so their
unprepares fail on every retry. Under ``--vfs dynamic`` the scheduler is told (the PF consumes
the whole of its counter set, ``discovery.vfs.on_demand``); this is the second line of
defence, on every node: a stale scheduler cache, a node whose slices say nothing of it
(``--vfs static``), a claim allocated by hand. One claim holding a PF and its VFs is one
tenant, and admin access (which changes nothing) holds nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.checkpoint.model import ClaimRecord
from agent.claim.model import AllocatedDevice, ClaimRef
from agent.prepare.errors import DeviceTakenError
from discovery.model import Device, DeviceType


def check_pf_and_vfs(
    ref: ClaimRef,
    results: Sequence[AllocatedDevice],
    claims: Mapping[str, ClaimRecord],
    *,
    inventory: Mapping[str, Device],
    pool: str,
) -> None:
    """Refuse a PF one of whose VFs another claim holds, and a VF whose PF another holds."""
    mine = [d for r in results if r.pool == pool and not r.admin_access
            if (d := inventory.get(r.device)) is not None
            and d.type in (DeviceType.NIC, DeviceType.VF)]
    if not mine:
        return
    held: dict[str, ClaimRecord] = {}  # device name -> another claim holding it
    for record in claims.values():
        if record.uid != ref.uid:
            held.update((h.device, record) for h in record.devices
                        if h.pool == pool and not h.admin_access)
    if not held:
        return
    for device in mine:
        for relative, why in _relatives(device, held, inventory):
            other = held[relative]
            raise DeviceTakenError(
                str(ref),
                f"device {pool}/{device.name} {why} {relative}, which is prepared for claim "
                f"{other.namespace}/{other.name} ({other.uid}); a PF's holder controls its "
                "VFs, so a PF and its VFs are never prepared for two claims at once; it is "
                "released when the pods using that claim are gone",
            )


def _relatives(device: Device, held: Mapping[str, ClaimRecord],
               inventory: Mapping[str, Device]) -> list[tuple[str, str]]:
    """(name, relation) of each held device that is ``device``'s PF, or a VF of it."""
    if device.type == DeviceType.VF:
        return [(name, "is a VF of PF") for name in held
                if (d := inventory.get(name)) is not None and d.type == DeviceType.NIC
                and device.host.parent_pf and d.host.pci_address == device.host.parent_pf]
    return [(name, "is the PF of VF") for name in held
            if (d := inventory.get(name)) is not None and d.type == DeviceType.VF
            and device.host.pci_address and d.host.parent_pf == device.host.pci_address]
