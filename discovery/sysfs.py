"""Reading PCI functions from a sysfs tree (the real /sys or a simulated one).

Everything is read relative to an injectable root, following the same relative symlinks the
kernel creates (``bus/pci/devices/<bdf> -> ../../../devices/pci0000:15/.../<bdf>``), so the
simulated profiles exercise exactly this code. A file that cannot be read or parsed never
aborts a scan: the field is left out (or the device skipped when it vanished) with one log
line naming the file.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from discovery.numa import NumaReader, valid_node

log = logging.getLogger("discovery.sysfs")

BDF_RE = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
ROOT_RE = re.compile(r"pci([0-9a-f]{4,8}):([0-9a-f]{2})")


class DeviceVanishedError(Exception):
    """A device disappeared while it was being read (hot-unplug, VF teardown)."""

    def __init__(self, bdf: str, path: Path) -> None:
        self.bdf = bdf
        self.path = path
        super().__init__(f"PCI device {bdf} vanished during the scan ({path})")


@dataclass(frozen=True, slots=True)
class PciFunction:
    """What sysfs says about one PCI function."""

    bdf: str  # 0000:1b:00.0
    path: Path  # resolved device directory
    chain: tuple[str, ...]  # BDFs from the root port down to (excluding) this function
    pcie_root: str | None  # pci0000:15
    vendor: int | None
    device: int | None
    pci_class: int | None
    numa_node: int | None  # None when sysfs says -1 or the file is missing
    driver: str | None
    iommu_group: str | None
    sriov_total_vfs: int | None
    sriov_num_vfs: int | None
    physfn: str | None  # VF: BDF of its PF
    net_ifaces: tuple[str, ...] = ()
    rdma_devices: tuple[str, ...] = ()
    uverbs: tuple[str, ...] = ()  # uverbsN char devices of the RDMA device(s)
    drm_nodes: tuple[str, ...] = ()  # cardN / renderDN
    #: numa_node first, then its equidistant same-socket nodes (discovery/numa.py); empty
    #: when numa_node is None.
    numa_nodes: tuple[int, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def slot(self) -> str:
        """domain:bus:device, the physical device several functions share."""
        return self.bdf.rsplit(".", 1)[0]

    @property
    def is_bridge(self) -> bool:
        return self.pci_class is not None and self.pci_class >> 8 == 0x0604


def read_text(path: Path | str) -> str | None:
    """A sysfs attribute without its newline, or None (logged) when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as err:
        # EINVAL/EACCES are normal for some attributes (carrier of a down link); say which.
        log.info("cannot read sysfs file", extra={"file": str(path), "error": err.strerror})
        return None


def read_int(path: Path | str, base: int = 10) -> int | None:
    """An integer attribute; a garbage value is logged with the file name and ignored."""
    text = read_text(path)
    if text is None or text == "":
        return None
    try:
        return int(text, base)
    except ValueError:
        log.warning("ignoring unparsable sysfs value",
                    extra={"file": str(path), "value": text[:40]})
        return None


def _link_name(path: Path | str) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _list(path: Path | str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def parse_chain(real: Path) -> tuple[str | None, tuple[str, ...]]:
    """Split a resolved device path into its ``pciDDDD:BB`` root and the BDFs below it."""
    parts = real.parts
    for i, part in enumerate(parts):
        if ROOT_RE.fullmatch(part):
            bdfs = tuple(p for p in parts[i + 1 :] if BDF_RE.fullmatch(p))
            return part, bdfs
    return None, ()


class Sysfs:
    """A sysfs tree under ``root`` (``/sys`` on a real host)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pci_addresses(self) -> list[str]:
        return [n for n in _list(self.root / "bus" / "pci" / "devices") if BDF_RE.fullmatch(n)]

    def resolve(self, bdf: str) -> str:
        """The device directory behind ``bus/pci/devices/<bdf>``.

        The kernel's link points straight into ``devices/``, so one readlink plus normpath
        gives the same answer as realpath at a fraction of the syscalls (realpath lstats
        every component, and this runs for every PCI function on every rescan).
        """
        link = os.path.join(self.root, "bus", "pci", "devices", bdf)
        try:
            target = os.readlink(link)
        except FileNotFoundError as err:
            raise DeviceVanishedError(bdf, Path(link)) from err
        except OSError:  # not a symlink: let realpath decide
            try:
                return os.path.realpath(link, strict=True)
            except OSError as err:
                raise DeviceVanishedError(bdf, Path(link)) from err
        return os.path.normpath(os.path.join(os.path.dirname(link), target))

    def read_function(self, bdf: str, numa: NumaReader | None = None) -> PciFunction:
        """Everything we use about one function; raises DeviceVanishedError if it went away.

        Only network and display functions are read in full; bridges and other functions
        are needed for the topology alone, and skipping their files halves a rescan.
        """
        real = self.resolve(bdf)
        j = os.path.join
        root, chain = parse_chain(Path(real))
        if not os.path.exists(j(real, "vendor")):
            # Name the dangling bus link when the whole directory went, else the file.
            gone = j(real, "vendor") if os.path.isdir(real) else j(
                self.root, "bus", "pci", "devices", bdf)
            raise DeviceVanishedError(bdf, Path(gone))
        pci_class = read_int(j(real, "class"), 16)
        # Only network, display and accelerator functions (an AMD Instinct MI300 is 0x12)
        # are ever offered; the rest need no more than their place in the tree.
        light = pci_class is not None and pci_class >> 16 not in (0x02, 0x03, 0x12)
        chain = chain[:-1] if chain and chain[-1] == bdf else chain
        if light:
            return PciFunction(bdf, Path(real), chain, root, None, None, pci_class, None, None,
                               None, None, None, None)
        node = valid_node(read_int(j(real, "numa_node")), j(real, "numa_node"))
        reader = numa if numa is not None else NumaReader(self.root)
        physfn = _link_name(j(real, "physfn"))
        return PciFunction(
            bdf=bdf,
            path=Path(real),
            chain=chain,
            pcie_root=root,
            pci_class=pci_class,
            vendor=read_int(j(real, "vendor"), 16),
            device=read_int(j(real, "device"), 16),
            numa_node=node,
            driver=_link_name(j(real, "driver")),
            iommu_group=_link_name(j(real, "iommu_group")),
            sriov_total_vfs=read_int(j(real, "sriov_totalvfs")),
            sriov_num_vfs=read_int(j(real, "sriov_numvfs")),
            physfn=physfn if physfn and BDF_RE.fullmatch(physfn) else None,
            net_ifaces=tuple(_net_ifaces(real)),
            rdma_devices=tuple(_list(j(real, "infiniband"))),
            uverbs=tuple(_list(j(real, "infiniband_verbs"))),
            drm_nodes=tuple(n for n in _list(j(real, "drm")) if n.startswith(("card", "renderD"))),
            numa_nodes=reader.nodes_for(node) if node is not None else (),
        )

    def scan(self) -> dict[str, PciFunction]:
        """All PCI functions by BDF; vanished or unreadable ones are logged and left out."""
        out: dict[str, PciFunction] = {}
        numa = NumaReader(self.root)  # one per scan: each node's files read once
        for bdf in self.pci_addresses():
            try:
                out[bdf] = self.read_function(bdf, numa)
            except DeviceVanishedError as err:
                log.info("skipping PCI device", extra={"pci": bdf, "file": str(err.path)})
        return out


def _net_ifaces(real: str) -> Iterable[str]:
    """Netdevs of a PCI function: ``<dev>/net/*`` or, for virtio, ``<dev>/virtio*/net/*``."""
    found = _list(os.path.join(real, "net"))
    if not found:
        for child in _list(real):
            if child.startswith("virtio"):
                found += _list(os.path.join(real, child, "net"))
    return found


def net_dir(fn: PciFunction, iface: str) -> Path:
    direct = fn.path / "net" / iface
    if direct.exists():
        return direct
    for child in _list(fn.path):
        if child.startswith("virtio") and (fn.path / child / "net" / iface).exists():
            return fn.path / child / "net" / iface
    return direct


def endpoints_below(functions: Mapping[str, PciFunction]) -> dict[str, frozenset[str]]:
    """Bridge BDF -> the physical devices (slots) of the endpoints in its subtree."""
    below: dict[str, set[str]] = {}
    for fn in functions.values():
        if fn.is_bridge:
            continue
        for port in fn.chain:
            below.setdefault(port, set()).add(fn.slot)
    return {k: frozenset(v) for k, v in below.items()}


def switch_of(fn: PciFunction, below: Mapping[str, frozenset[str]]) -> str | None:
    """The ``pcieSwitch`` attribute: the nearest upstream PCIe switch this device shares.

    Below a root port the bridges alternate: a switch's upstream port, then one of its
    downstream ports. A switch is named by its upstream port's BDF. We take the nearest switch
    whose subtree also holds another physical device (functions of one card do not count), so
    a GPU behind a private baseboard switch still matches the NIC one level up; with no shared
    switch the top-most one is used, and with no switch at all the attribute is omitted. It
    depends on the topology only, never on which devices are offered. ``below`` comes from
    ``endpoints_below``.
    """
    upstream_ports = fn.chain[1::2]  # chain[0] is the root port
    if not upstream_ports:
        return None
    for port in reversed(upstream_ports):
        if len(below.get(port, frozenset()) - {fn.slot}) > 0:
            return port
    return upstream_ports[0]
