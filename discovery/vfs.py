"""VFs on demand (``--vfs dynamic``): a PF with SR-IOV and no VFs yet offers the VFs it could
have as candidate devices consuming from its counter set (``<pf>-vfs``: ``vfs`` = TotalVFs).

The kernel changes ``sriov_numvfs`` only from 0 to N or from N to 0: VFs cannot be added one
at a time, and going back to 0 destroys every VF, in use or not. So the agent **pre-sizes on
first use** (``agent.prepare.vfs``): the first prepare of a candidate of a PF with no VFs writes
TotalVFs, once; every VF then exists and later claims get idle ones. The agent never writes any
other value (no shrinking, no growing while VFs exist), so a VF in use is never destroyed. A PF
that already has VFs is offered as today: its VFs as they are, no candidates.

A candidate is named as its VF will be (``vf-<pci address>``, the address from the PF's
``sriov_offset``/``sriov_stride``: routing ID = PF's + offset + stride x index), so a claim's
device keeps its name once the VF exists.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from discovery.model import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceType,
    HostInfo,
)
from discovery.names import pci_name

COUNTER = "vfs"
#: HostInfo.extra of a candidate: the VF's index under its PF.
EXTRA_CANDIDATE = "sriovCandidateIndex"
EXTRA_TOTAL = "sriovTotalVFs"
_COPIED = (PCIE_ROOT, NUMA_NODE, "pcieSwitch", "vendor", "pciVendorID", "linkType", "mtu")


def counter_set_name(pf_name: str) -> str:
    return f"{pf_name}-vfs"


def vf_address(pf_bdf: str, offset: int, stride: int, index: int) -> str:
    """The PCI address of VF ``index`` of the PF at ``pf_bdf`` (SR-IOV routing IDs)."""
    domain, bus, rest = pf_bdf.split(":")
    dev, fn = rest.split(".")
    rid = (int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn)) + offset + stride * index
    return f"{domain}:{rid >> 8 & 0xFF:02x}:{rid >> 3 & 0x1F:02x}.{rid & 7}"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 0)
    except (OSError, ValueError):
        return None


def _read_int_hex(path: Path) -> int | None:
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def candidates(sysfs_root: Path, nics: Sequence[Device]) -> tuple[list[CounterSet], list[Device]]:
    """Counter sets and candidate VFs of every offered PF that has SR-IOV and no VFs."""
    sets: list[CounterSet] = []
    out: list[Device] = []
    for pf in nics:
        if pf.type != DeviceType.NIC or not pf.host.pci_address:
            continue
        base = sysfs_root / "bus" / "pci" / "devices" / pf.host.pci_address
        total, num = _read_int(base / "sriov_totalvfs"), _read_int(base / "sriov_numvfs")
        offset, stride = _read_int(base / "sriov_offset"), _read_int(base / "sriov_stride")
        if not total or num != 0 or offset is None or stride is None:
            continue  # no SR-IOV, VFs already there (offered as they are), or unreadable
        set_name = counter_set_name(pf.name)
        sets.append(CounterSet(set_name, {COUNTER: str(total)}))
        shared: dict[str, AttributeValue] = {
            k: v for k, v in pf.attributes.items() if k in _COPIED}
        shared.update(isVF=True, parentPF=pf.host.pci_address, partition=True)
        vf_device = _read_int_hex(base / "sriov_vf_device")
        if vf_device is not None:
            shared["pciDeviceID"] = f"{vf_device:04x}"
        for index in range(total):
            bdf = vf_address(pf.host.pci_address, offset, stride, index)
            attrs = {**shared, "vfIndex": index, PCI_BUS_ID: bdf}
            host = HostInfo(pci_address=bdf, vendor=pf.host.vendor, parent_pf=pf.host.pci_address,
                            extra={EXTRA_CANDIDATE: str(index), EXTRA_TOTAL: str(total)})
            out.append(Device(pci_name("vf", bdf), DeviceType.VF, attrs, {}, host,
                              consumes=(CounterConsumption(set_name, {COUNTER: "1"}),)))
    return sets, out


class SriovError(Exception):
    """A change of ``sriov_numvfs`` the kernel refused; names the PF and the cause."""


class SriovControl(Protocol):
    """The SR-IOV changes the agent makes: a PF's VF count (0 -> N), a VF's driver."""

    def num_vfs(self, pf: str) -> int: ...
    def set_num_vfs(self, pf: str, count: int) -> None: ...
    def exists(self, function: str) -> bool: ...
    def driver(self, function: str) -> str | None: ...
    def bind(self, function: str, driver: str) -> None: ...
    def reset_vf_mac(self, pf: str, index: int) -> None: ...


class SysfsSriov:
    """The kernel's ``/sys/bus/pci/devices/<pf>/sriov_numvfs``. The write returns once the
    VFs are enumerated; their drivers probe after, so it waits (bounded) for the last one."""

    def __init__(self, sysfs_root: Path, timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sysfs_root = sysfs_root
        self.timeout_s = timeout_s
        self.clock = clock

    def _pf(self, pf: str) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices" / pf

    def num_vfs(self, pf: str) -> int:
        value = _read_int(self._pf(pf) / "sriov_numvfs")
        if value is None:
            raise SriovError(f"PF {pf}: no readable sriov_numvfs (SR-IOV disabled?)")
        return value

    def exists(self, function: str) -> bool:
        return self._pf(function).is_dir()

    def driver(self, function: str) -> str | None:
        link = self._pf(function) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def bind(self, function: str, driver: str) -> None:
        """``driver_override``, unbind from the current driver, ``drivers_probe``: the
        kernel's way to move one function to another driver (driverctl does the same)."""
        dev = self._pf(function)
        current = self.driver(function)
        if current == driver:
            return
        try:
            (dev / "driver_override").write_text(f"{driver}\n")
            if current is not None:
                (dev / "driver" / "unbind").write_text(function)
            (self.sysfs_root / "bus" / "pci" / "drivers_probe").write_text(function)
        except OSError as err:
            raise SriovError(f"VF {function}: binding to {driver}: "
                             f"{err.strerror or err}") from err
        if self.driver(function) != driver:
            raise SriovError(f"VF {function}: {driver} did not bind (is its module loaded?)")

    def reset_vf_mac(self, pf: str, index: int) -> None:
        """Unset VF ``index``'s MAC on its PF (``ip link set <pf> vf <index> mac 00:..:00``),
        through rtnetlink: what a pod set does not follow the VF to the next one."""
        nets = sorted(p.name for p in (self._pf(pf) / "net").glob("*"))
        if not nets:
            raise SriovError(f"PF {pf} has no network interface to reset VF {index}'s MAC on")
        ifindex = _read_int(self.sysfs_root / "class" / "net" / nets[0] / "ifindex")
        if ifindex is None:
            raise SriovError(f"PF {pf}: no ifindex for {nets[0]}")
        try:
            send_netlink(vf_mac_message(ifindex, index, b"\0" * 6))
        except OSError as err:
            raise SriovError(f"PF {pf} ({nets[0]}): resetting VF {index}'s MAC over netlink: "
                             f"{err.strerror or err}") from err

    def set_num_vfs(self, pf: str, count: int) -> None:
        path = self._pf(pf) / "sriov_numvfs"
        try:
            path.write_text(f"{count}\n")
        except OSError as err:
            why = err.strerror or str(err)
            if err.errno == errno.EBUSY:
                why += " (the kernel changes the VF count only from 0)"
            raise SriovError(f"PF {pf}: writing {count} to {path}: {why}") from err
        last = self._pf(pf) / f"virtfn{count - 1}" / "driver"
        deadline = self.clock() + self.timeout_s
        while count and not last.exists():
            if self.clock() > deadline:
                raise SriovError(f"PF {pf}: VF {count - 1} has no driver {self.timeout_s:g} s "
                                 "after the VFs were created")
            time.sleep(0.05)


RTM_SETLINK = 19
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLMSG_ERROR = 2
IFLA_VFINFO_LIST, IFLA_VF_INFO, IFLA_VF_MAC = 22, 1, 1
NLA_F_NESTED = 0x8000


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def vf_mac_message(ifindex: int, vf: int, mac: bytes, seq: int = 1) -> bytes:
    """RTM_SETLINK for ``ifindex`` with IFLA_VFINFO_LIST > IFLA_VF_INFO > IFLA_VF_MAC
    (``struct ifla_vf_mac {__u32 vf; __u8 mac[32];}``), asking for an ack."""
    vf_mac = struct.pack("=I32s", vf, mac)
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0) + _attr(
        IFLA_VFINFO_LIST | NLA_F_NESTED, _attr(IFLA_VF_INFO | NLA_F_NESTED,
                                               _attr(IFLA_VF_MAC, vf_mac)))
    return struct.pack("=IHHII", 16 + len(body), RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK,
                       seq, 0) + body


def send_netlink(message: bytes, timeout_s: float = 5.0) -> None:
    """Send one rtnetlink request and wait for its ack; OSError with the kernel's errno."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.settimeout(timeout_s)
        sock.bind((0, 0))
        sock.send(message)
        reply = sock.recv(65536)
    if len(reply) < 20:
        raise OSError(errno.EIO, "short netlink reply")
    _, kind = struct.unpack_from("=IH", reply)
    code = struct.unpack_from("=i", reply, 16)[0] if kind == NLMSG_ERROR else 0
    if code:
        raise OSError(-code, os.strerror(-code))
