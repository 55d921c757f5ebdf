"""The kernel's side of ``sriov_numvfs`` on a simulated tree: writing N to a PF with no VFs
makes its N VFs (PCI functions beside the PF, ``virtfn<i>``/``physfn`` links, an IOMMU group
each, a netdev bound to the PF's driver), as ``pci_enable_sriov`` does; any other change while
VFs exist is EBUSY, as the kernel answers (``sriov_numvfs_store``)."""

from __future__ import annotations

import errno
import os
import shutil
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

    def exists(self, function: str) -> bool:
        return self._pf(function).is_dir()

    def driver(self, function: str) -> str | None:
        link = self._pf(function) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    #: Drivers the simulated kernel has (others do not bind, as without their module).
    DRIVERS = ("mlx5_core", "vfio-pci")

    def has_driver(self, driver: str) -> bool:
        return driver in self.DRIVERS

    def bind(self, function: str, driver: str) -> None:
        with self._lock:
            dev = self._pf(function).resolve()
            current = self.driver(function)
            if current == driver:
                return
            if driver not in self.DRIVERS:
                raise SriovError(f"VF {function}: {driver} did not bind (is its module "
                                 "loaded?)")
            drivers = self.sysfs_root / "bus" / "pci" / "drivers"
            if current is not None:
                (drivers / current / function).unlink(missing_ok=True)
            (dev / "driver").unlink(missing_ok=True)
            (drivers / driver).mkdir(exist_ok=True)
            os.symlink(os.path.relpath(drivers / driver, dev), dev / "driver")
            os.symlink(os.path.relpath(dev, drivers / driver), drivers / driver / function)
            if driver == "vfio-pci":  # the netdev goes with the network driver
                for net in list((dev / "net").glob("*")) if (dev / "net").is_dir() else []:
                    (self.sysfs_root / "class" / "net" / net.name).unlink(missing_ok=True)
                    shutil.rmtree(net)
            else:
                self._netdev(SysfsBuilder(self.sysfs_root), dev)

    def reset_vf_mac(self, pf: str, index: int) -> None:
        vf = self._pf(pf) / f"virtfn{index}"
        if not vf.exists():
            raise SriovError(f"PF {pf} has no VF {index}")
        for net in (vf / "net").glob("*/address"):
            net.write_text("00:00:00:00:00:00\n")

    def set_vf_rate(self, pf: str, index: int, max_mbps: int) -> None:
        """Where mlx5 shows it: ``<pf>/sriov/<index>/max_tx_rate`` (Mbit/s, 0: no cap)."""
        if not (self._pf(pf) / f"virtfn{index}").exists():
            raise SriovError(f"PF {pf} has no VF {index}")
        where = self._pf(pf) / "sriov" / str(index)
        where.mkdir(parents=True, exist_ok=True)
        (where / "max_tx_rate").write_text(f"{max_mbps}\n")

    def _netdev(self, builder: SysfsBuilder, vf: Path) -> None:
        physfn = vf / "physfn"
        if not physfn.exists() or ((vf / "net").is_dir() and any((vf / "net").iterdir())):
            return
        pf = physfn.resolve()
        index = next(int(p.name[len("virtfn"):]) for p in pf.glob("virtfn*")
                     if p.resolve() == vf)
        ifaces = sorted(p.name for p in (pf / "net").iterdir()) if (pf / "net").is_dir() else []
        if ifaces:
            builder.net(vf, f"{ifaces[0].rsplit('np', 1)[0]}v{index}", {
                "address": f"00:00:00:00:{index >> 8:02x}:{index & 0xFF:02x}",
                "mtu": "1500", "speed": "100000", "operstate": "up", "carrier": "1",
                "type": "1"})

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
                self._netdev(builder, vf)
