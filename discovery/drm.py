"""AMD and Intel GPUs from sysfs/DRM: ``type=gpu`` with a ``vendor`` attribute.

NVIDIA GPUs come from NVML (gpus.py), which knows far more; emulated display adapters
(bochs, virtio-gpu, BMC VGA) are not offered since no workload wants them.
"""

from __future__ import annotations

from collections.abc import Mapping

from discovery.attrs import pci_attributes, vendor_name
from discovery.model import AttributeValue, Device, DeviceType, HostInfo
from discovery.names import pci_name
from discovery.sysfs import PciFunction, read_int

AMD = 0x1002
INTEL = 0x8086
#: PCI base class of display controllers, and of "processing accelerators", which is what an
#: AMD Instinct MI300 reports (older Instincts and every Intel GPU report a display class).
DISPLAY, ACCELERATOR = 0x03, 0x12


def is_other_gpu(fn: PciFunction) -> bool:
    if fn.vendor not in (AMD, INTEL) or fn.pci_class is None:
        return False
    base = fn.pci_class >> 16
    return base == DISPLAY or (base == ACCELERATOR and fn.vendor == AMD
                               and fn.driver == "amdgpu")


def vram_capacity(fn: PciFunction) -> dict[str, str]:
    """``memory`` as amdgpu reports it (``mem_info_vram_total``, bytes); i915 and xe give no
    such file, so an Intel GPU has no memory capacity."""
    total = read_int(fn.path / "mem_info_vram_total")
    if total is None or total <= 0:
        return {}
    return {"memory": f"{total >> 20}Mi" if total % (1 << 20) == 0 else str(total)}


def scan_drm_gpus(
    pci: Mapping[str, PciFunction], below: Mapping[str, frozenset[str]]
) -> list[Device]:
    out: list[Device] = []
    for fn in sorted(pci.values(), key=lambda f: f.bdf):
        if not is_other_gpu(fn):
            continue
        vendor = vendor_name(fn.vendor) or ""
        attrs: dict[str, AttributeValue] = {"vendor": vendor}
        nodes: list[str] = []
        for node in fn.drm_nodes:
            if node.startswith("renderD"):
                attrs["renderIndex"] = int(node[len("renderD"):])
            elif node[len("card"):].isdigit():
                attrs["cardIndex"] = int(node[len("card"):])
            nodes.append(f"/dev/dri/{node}")
        if fn.vendor == AMD and fn.driver == "amdgpu":
            nodes.append("/dev/kfd")  # ROCm compute needs the KFD node as well
        if fn.physfn:
            attrs["isVF"] = True
            attrs["parentPF"] = fn.physfn
        attrs.update(pci_attributes(fn, below))
        host = HostInfo(
            pci_address=fn.bdf,
            vendor=vendor,
            dev_nodes=tuple(nodes),
            driver=fn.driver,
            iommu_group=fn.iommu_group,
            parent_pf=fn.physfn,
        )
        capacity = vram_capacity(fn) if fn.vendor == AMD else {}
        out.append(Device(pci_name("gpu", fn.bdf), DeviceType.GPU, attrs, capacity, host))
    return out
