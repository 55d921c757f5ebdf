"""NIC link health from sysfs: carrier/operstate, RDMA port state, functions that vanished.

Read on every poll (cheap: a few small files per NIC) and whenever a udev event hints at a
change. What counts as down:

* ``carrier`` is ``0``, or ``operstate`` says the layer below is missing
  (``lowerlayerdown``, ``notpresent``). An interface that is administratively down has no
  readable carrier; that is configuration, not a fault, so it is not reported.
* An RDMA port whose state is not ACTIVE (``1: DOWN``, ``2: INIT``, ``3: ARMED``): an
  InfiniBand port the subnet manager has not brought up cannot carry traffic yet.
* The PCI function itself vanished (hot-removal, PF reset) before the next rescan.

A netdev missing while its PCI function exists is not a fault: the interface may have been
moved into a pod's network namespace. VFs follow their PF: when the PF vanished or its link
is down, every VF of it gets the condition too (a VF bound to vfio-pci has no netdev of its
own to read).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from agent.health.model import Condition, Kind
from discovery.model import Device, DeviceType, Inventory
from discovery.vfs import EXTRA_CANDIDATE

log = logging.getLogger("agent.health.nic")

SOURCE = "nic"
_NIC_TYPES = (DeviceType.NIC, DeviceType.VF)
_DOWN_OPERSTATES = frozenset({"lowerlayerdown", "notpresent"})
_ACTIVE_PORT_STATES = frozenset({"4", "5"})  # ACTIVE, ACTIVE_DEFER
#: More than any of the files read holds ("4: ACTIVE", "lowerlayerdown").
_MAX_READ = 4096


def _read(path: str) -> str | None:
    """File contents stripped; None when absent or unreadable (e.g. carrier while admin-down
    answers EINVAL). One open and one read of a string path: a poll reads three files per
    NIC, and pathlib's joins and text wrapper were three quarters of its time."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        _unreadable(path, err)
        return None
    try:
        data = os.read(fd, _MAX_READ)
    except OSError as err:
        _unreadable(path, err)
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace").strip()


def _unreadable(path: str, err: OSError) -> None:
    if err.errno != errno.EINVAL:
        log.debug("cannot read", extra={"path": path, "error": err.strerror})


class NicProbe:
    """Reads the link state of every NIC and VF of an inventory under ``sysfs_root``."""

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root
        root = str(sysfs_root)
        self._pci = f"{root}/bus/pci/devices/"
        self._net = f"{root}/class/net/"
        self._ib = f"{root}/class/infiniband/"

    def _function_exists(self, bdf: str) -> bool:
        try:
            os.stat(self._pci + bdf)
        except OSError:
            return False
        return True

    def _netdev(self, if_name: str) -> list[Condition]:
        base = self._net + if_name
        operstate = _read(base + "/operstate")
        if operstate is None:
            return []  # not in our namespace (moved into a pod) or gone with its function
        carrier = _read(base + "/carrier")
        if carrier == "0":
            return [Condition(Kind.LINK_DOWN, "carrier",
                              f"link down on {if_name} (carrier 0, operstate {operstate})")]
        if operstate in _DOWN_OPERSTATES:
            return [Condition(Kind.LINK_DOWN, "operstate",
                              f"link down on {if_name} (operstate {operstate})")]
        return []

    def _rdma(self, rdma: str) -> list[Condition]:
        ports = f"{self._ib}{rdma}/ports/"
        try:
            names = sorted(os.listdir(ports))
        except OSError:
            return []
        out = []
        for port in names:
            state = _read(f"{ports}{port}/state")
            if state is None:
                continue
            number, _, label = state.partition(":")
            if number.strip() not in _ACTIVE_PORT_STATES:
                out.append(Condition(
                    Kind.LINK_DOWN, f"rdma-port-{port}",
                    f"RDMA {rdma} port {port} {label.strip() or number.strip()}",
                ))
        return out

    def _own(self, device: Device) -> list[Condition]:
        h = device.host
        if EXTRA_CANDIDATE in h.extra:  # --vfs dynamic: a VF made at prepare, sound as its PF
            return []
        if h.pci_address and not self._function_exists(h.pci_address):
            return [Condition(Kind.LINK_DOWN, "gone", f"PCI function {h.pci_address} vanished")]
        out = self._netdev(h.if_name) if h.if_name else []
        if h.rdma_device:
            out += self._rdma(h.rdma_device)
        return out

    def poll(self, inventory: Inventory) -> dict[str, list[Condition]]:
        """Device name -> link conditions asserted now (devices without any are left out)."""
        nics = [d for d in inventory.devices if d.type in _NIC_TYPES]
        own = {d.name: self._own(d) for d in nics}
        by_address = {d.host.pci_address: d for d in nics if d.host.pci_address}
        out: dict[str, list[Condition]] = {}
        for device in nics:
            conds = list(own[device.name])
            pf = device.host.parent_pf
            if pf:
                conds += self._from_pf(pf, by_address.get(pf), own)
            if conds:
                out[device.name] = conds
        return out

    def _from_pf(self, pf: str, pf_device: Device | None,
                 own: dict[str, list[Condition]]) -> list[Condition]:
        if pf_device is None:  # the PF is not offered (e.g. reserved): only its presence
            if self._function_exists(pf):
                return []
            return [Condition(Kind.LINK_DOWN, "pf-gone", f"parent PF {pf} vanished")]
        out = []
        for cond in own.get(pf_device.name, ()):
            out.append(Condition(Kind.LINK_DOWN, f"pf-{cond.value}",
                                 f"parent PF {pf_device.name}: {cond.message}"))
        return out
