"""Writing a sysfs-like tree on disk, the way the kernel lays it out.

Device directories live under ``devices/pci<domain>:<bus>/<root port>/.../<bdf>``; every
``bus/pci/devices``, ``class/*`` entry, ``driver``, ``iommu_group``, ``physfn`` and
``virtfn<N>`` is a *relative* symlink into that tree, exactly as consumers (our scanner, the
Kubernetes deviceattribute helper, NCCL) expect. Files hold what the kernel prints, newline
included.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def _write(path: Path, text: str) -> None:
    path.write_text(text + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    os.symlink(os.path.relpath(target, link.parent), link)


@dataclass(frozen=True, slots=True)
class PciSpec:
    """One PCI function to create. ``chain`` lists the bridges from the root port down."""

    bdf: str
    root: str  # pci0000:15
    chain: tuple[str, ...]
    vendor: int
    device: int
    pci_class: int
    subsystem: tuple[int, int] = (0, 0)
    numa_node: int = -1
    cpulist: str = ""
    driver: str | None = None
    link_speed: str = "32.0 GT/s PCIe"
    link_width: int = 16


class SysfsBuilder:
    """Builds ``<root>/{devices,bus,class,kernel}`` for simulated hardware."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._bridges: set[str] = set()
        for sub in ("devices", "bus/pci/devices", "bus/pci/drivers", "class/net",
                    "class/infiniband", "class/infiniband_verbs", "kernel/iommu_groups"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def _dir(self, root: str, chain: Sequence[str], bdf: str) -> Path:
        return self.root.joinpath("devices", root, *chain, bdf)

    def _attrs(self, path: Path, spec: PciSpec) -> None:
        path.mkdir(parents=True, exist_ok=True)
        _write(path / "vendor", f"0x{spec.vendor:04x}")
        _write(path / "device", f"0x{spec.device:04x}")
        _write(path / "subsystem_vendor", f"0x{spec.subsystem[0]:04x}")
        _write(path / "subsystem_device", f"0x{spec.subsystem[1]:04x}")
        _write(path / "class", f"0x{spec.pci_class:06x}")
        _write(path / "numa_node", str(spec.numa_node))
        if spec.cpulist:
            _write(path / "local_cpulist", spec.cpulist)
        _write(path / "current_link_speed", spec.link_speed)
        _write(path / "max_link_speed", spec.link_speed)
        _write(path / "current_link_width", str(spec.link_width))
        _write(path / "max_link_width", str(spec.link_width))
        _link(self.root / "bus/pci/devices" / spec.bdf, path)
        if spec.driver:
            drv = self.root / "bus/pci/drivers" / spec.driver
            drv.mkdir(exist_ok=True)
            _link(path / "driver", drv)
            _link(drv / spec.bdf, path)

    def bridge(self, root: str, chain: Sequence[str], bdf: str, *, vendor: int, device: int,
               numa_node: int = -1) -> None:
        """A root port or switch port (class 0x060400), created once."""
        if bdf in self._bridges:
            return
        self._bridges.add(bdf)
        spec = PciSpec(bdf, root, tuple(chain), vendor, device, 0x060400,
                       numa_node=numa_node, driver="pcieport")
        self._attrs(self._dir(root, chain, bdf), spec)

    def function(self, spec: PciSpec) -> Path:
        path = self._dir(spec.root, spec.chain, spec.bdf)
        self._attrs(path, spec)
        return path

    def net(self, dev: Path, ifname: str, attrs: Mapping[str, str]) -> Path:
        """``<dev>/net/<ifname>`` plus ``class/net/<ifname>``; attrs are file -> content."""
        path = dev / "net" / ifname
        path.mkdir(parents=True, exist_ok=True)
        for key, value in attrs.items():
            _write(path / key, value)
        _link(path / "device", dev)
        _link(self.root / "class/net" / ifname, path)
        return path

    def virtual_net(self, ifname: str, attrs: Mapping[str, str]) -> None:
        path = self.root / "devices/virtual/net" / ifname
        path.mkdir(parents=True, exist_ok=True)
        for key, value in attrs.items():
            _write(path / key, value)
        _link(self.root / "class/net" / ifname, path)

    def rdma(self, dev: Path, ibdev: str, *, uverbs: int, link_layer: str, rate: str,
             guid: str, hca: str) -> None:
        ib = dev / "infiniband" / ibdev
        (ib / "ports/1").mkdir(parents=True, exist_ok=True)
        _write(ib / "node_guid", guid)
        _write(ib / "hca_type", hca)
        _write(ib / "node_type", "1: CA")
        _write(ib / "ports/1/state", "4: ACTIVE")
        _write(ib / "ports/1/phys_state", "5: LinkUp")
        _write(ib / "ports/1/link_layer", link_layer)
        _write(ib / "ports/1/rate", rate)
        _link(ib / "device", dev)
        _link(self.root / "class/infiniband" / ibdev, ib)
        verbs = dev / "infiniband_verbs" / f"uverbs{uverbs}"
        verbs.mkdir(parents=True, exist_ok=True)
        _write(verbs / "ibdev", ibdev)
        major, minor = (231, 192 + uverbs) if uverbs < 32 else (240, uverbs - 32)
        _write(verbs / "dev", f"{major}:{minor}")
        _link(self.root / "class/infiniband_verbs" / f"uverbs{uverbs}", verbs)

    def iommu_group(self, dev: Path, bdf: str, group: int) -> None:
        grp = self.root / "kernel/iommu_groups" / str(group)
        (grp / "devices").mkdir(parents=True, exist_ok=True)
        _link(grp / "devices" / bdf, dev)
        _link(dev / "iommu_group", grp)

    def sriov(self, pf: Path, *, total: int, num: int, offset: int, stride: int,
              vf_device: int) -> None:
        _write(pf / "sriov_totalvfs", str(total))
        _write(pf / "sriov_numvfs", str(num))
        _write(pf / "sriov_offset", str(offset))
        _write(pf / "sriov_stride", str(stride))
        _write(pf / "sriov_vf_device", f"{vf_device:x}")

    def link_vf(self, pf: Path, vf: Path, index: int) -> None:
        _link(pf / f"virtfn{index}", vf)
        _link(vf / "physfn", pf)

    def drm(self, dev: Path, card: int, render: int) -> None:
        for node in (f"card{card}", f"renderD{render}"):
            (dev / "drm" / node).mkdir(parents=True, exist_ok=True)


def write_numa(builder: SysfsBuilder, nodes: Mapping[int, tuple[int, str]], *,
               near: int, far: int) -> None:
    """``devices/system/{node,cpu}``: node id -> (socket, cpulist), with a SLIT that puts
    same-socket nodes at ``near`` and the others at ``far`` (the kernel's format: one row of
    distances per node, ``cpuN/topology/physical_package_id``)."""
    from discovery.numa import parse_cpulist

    ids = range(max(nodes) + 1)
    for node, (socket, cpus) in nodes.items():
        path = builder.root / "devices" / "system" / "node" / f"node{node}"
        path.mkdir(parents=True, exist_ok=True)
        row = [10 if i == node else near if nodes.get(i, (None,))[0] == socket else far
               for i in ids]
        _write(path / "distance", " ".join(str(d) for d in row))
        _write(path / "cpulist", cpus)
        # Only the node's first CPU, the one a node's socket is read from: every CPU's
        # directory (224 on a DGX H100) would double the time a profile takes to write.
        cpu = parse_cpulist(cpus)[0]
        topo = builder.root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True, exist_ok=True)
        _write(topo / "physical_package_id", str(socket))


def touch_nodes(dev_root: Path, names: Sequence[str]) -> None:
    """Stand-ins for device nodes (plain files: creating char devices needs root)."""
    for name in names:
        path = dev_root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
