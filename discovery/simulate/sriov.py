"""The kernel's side of ``sriov_numvfs`` on a simulated tree: writing N to a PF with no VFs
makes its N VFs (PCI functions beside the PF, ``virtfn<i>``/``physfn`` links, an IOMMU group
each, a netdev bound to the PF's driver), as ``pci_enable_sriov`` does; any other change while
VFs exist is EBUSY, as the kernel answers (``sriov_numvfs_store``)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from discovery.simulate.tree import PciSpec, SysfsBuilder
from discovery.vfs import SriovError, vf_address


def _read(path: Path) -> str:
    return path.read_text().strip()


class SimulatedSriov:
    """SriovControl over a generated sysfs tree (``simulated_sources``)."""

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root
        self._lock = threading.Lock()

    def _pf(self, pf: str) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices" / pf

    def num_vfs(self, pf: str) -> int:
        try:
            return int(_read(self._pf(pf) / "sriov_numvfs"))
        except (OSError, ValueError) as err:
            raise SriovError(f"PF {pf}: no readable sriov_numvfs (SR-IOV disabled?)") from err

    def set_num_vfs(self, pf: str, count: int) -> None:
        with self._lock:
            base = self._pf(pf)
            total = int(_read(base / "sriov_totalvfs")) if (base / "sriov_totalvfs").exists() \
                else 0
            current = self.num_vfs(pf)
            if count > total:
                raise SriovError(f"PF {pf}: writing {count} to sriov_numvfs: "
                                 f"{os.strerror(errno.ERANGE)} (TotalVFs is {total})")
            if current and count != current:
                raise SriovError(f"PF {pf}: writing {count} to sriov_numvfs: "
                                 f"{os.strerror(errno.EBUSY)} (the kernel changes the VF count "
                                 "only from 0)")
            if current == count:
                return
            self._make(pf, base, count)
            (base / "sriov_numvfs").write_text(f"{count}\n")

    def _make(self, pf: str, base: Path, count: int) -> None:
        real = base.resolve()
        rel = real.relative_to((self.sysfs_root / "devices").resolve()).parts
        root, chain = rel[0], tuple(rel[1:-1])
        builder = SysfsBuilder(self.sysfs_root)
        offset, stride = int(_read(base / "sriov_offset")), int(_read(base / "sriov_stride"))
        vf_device = int(_read(base / "sriov_vf_device"), 16)
        driver = os.path.basename(os.readlink(base / "driver")) if (base / "driver").exists() \
            else None
        groups = self.sysfs_root / "kernel" / "iommu_groups"
        group = max((int(g.name) for g in groups.iterdir() if g.name.isdigit()), default=0) + 1
        iface = next(iter(sorted(p.name for p in (base / "net").iterdir())), "") \
            if (base / "net").is_dir() else ""
        for index in range(count):
            bdf = vf_address(pf, offset, stride, index)
            spec = PciSpec(
                bdf, root, chain, int(_read(base / "vendor"), 16), vf_device,
                int(_read(base / "class"), 16),
                (int(_read(base / "subsystem_vendor"), 16),
                 int(_read(base / "subsystem_device"), 16)),
                int(_read(base / "numa_node")),
                _read(base / "local_cpulist") if (base / "local_cpulist").exists() else "",
                driver, _read(base / "current_link_speed"),
            )
            vf = builder.function(spec)
            builder.link_vf(real, vf, index)
            builder.iommu_group(vf, bdf, group + index)
            if iface and driver != "vfio-pci":
                builder.net(vf, f"{iface.rsplit('np', 1)[0]}v{index}", {
                    "address": f"00:00:00:00:{index >> 8:02x}:{index & 0xFF:02x}",
                    "mtu": "1500", "speed": "100000", "operstate": "up", "carrier": "1",
                    "type": "1"})
