"""The kernel's side of a driver change on a simulated tree (``--gpu-passthrough``): the
function's ``driver`` link and the driver's entry move, ``driver_override`` holds the new
driver, and what a driver makes goes with it: a GPU's DRM nodes (``drm/``) exist only while
amdgpu, i915 or xe has it, and NVML (``FakeNvml`` over the same tree) lists a GPU only while
``nvidia`` has it. A driver whose directory is missing does not bind, as without its module.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from discovery.passthrough import PciDriverError, SysfsPciDrivers

#: Drivers that make DRM nodes under the function (``drm/cardN``, ``drm/renderDN``).
DRM_DRIVERS = frozenset({"amdgpu", "i915", "xe"})
#: Where a simulated unbind keeps the DRM nodes, to give them back on the next bind: the
#: kernel makes them again with the driver; the scanner reads ``drm/`` only.
PARKED = ".drm-unbound"


class SimulatedPciDrivers(SysfsPciDrivers):
    """``PciDrivers`` over a generated sysfs tree (``simulated_sources``)."""

    def __init__(self, sysfs_root: Path) -> None:
        super().__init__(sysfs_root)
        self._lock = threading.Lock()
        #: Functions whose driver refuses to let go (a busy GPU), for tests.
        self.stuck: set[str] = set()

    def bind(self, function: str, driver: str) -> None:
        with self._lock:
            current = self.driver(function)
            if current == driver:
                return
            if not self.has_driver(driver):
                raise PciDriverError(f"GPU {function}: {driver} did not bind (is its module "
                                     "loaded?)")
            if function in self.stuck:
                raise PciDriverError(f"GPU {function}: binding to {driver}: Device or "
                                     "resource busy")
            dev = self._dev(function).resolve()
            drivers = self.sysfs_root / "bus" / "pci" / "drivers"
            (dev / "driver_override").write_text(f"{driver}\n")
            if current is not None:
                (drivers / current / function).unlink(missing_ok=True)
                (dev / "driver").unlink(missing_ok=True)
                if current in DRM_DRIVERS and (dev / "drm").is_dir():
                    (dev / "drm").rename(dev / PARKED)
            os.symlink(os.path.relpath(drivers / driver, dev), dev / "driver")
            os.symlink(os.path.relpath(dev, drivers / driver), drivers / driver / function)
            if driver in DRM_DRIVERS and (dev / PARKED).is_dir():
                (dev / PARKED).rename(dev / "drm")
