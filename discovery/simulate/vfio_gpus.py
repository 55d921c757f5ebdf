"""The simulated GPU passthrough nodes (``--gpu-passthrough``), one per vendor, each GPU in an
IOMMU group of its own unless said otherwise, ``vfio-pci`` loaded:

* ``passthrough-nvidia``: four NVIDIA GPUs. 0 and 1 (L40S) are plain; 2 (RTX 6000 Ada) has
  its HD-audio function in its group, on ``snd_hda_intel`` (the host uses it: passthrough is
  refused, naming it); 3 (L40S) is on vfio-pci from boot, so NVML lists only 0-2;
* ``passthrough-amd``: four Instinct MI210 (amdgpu, DRM + /dev/kfd); 2 and 3 sit behind one
  switch without ACS, so they share one IOMMU group (one claim at a time may hold it);
* ``passthrough-intel``: two Data Center GPU Flex 170 (i915) and a Max 1100 (xe), whose
  group also holds its switch's downstream port (a bridge, which a VM's group may hold).

Device ids are the vendors' published ones; bus numbers and group numbers are inferred.
"""

from __future__ import annotations

from discovery.simulate.fake_nvml import FakeGpu
from discovery.simulate.parts import INTEL, NVIDIA, Node, bdf, mgmt_nic
from discovery.simulate.tree import PciSpec

AMD = 0x1002
CLASS_VGA, CLASS_3D, CLASS_DISPLAY, CLASS_AUDIO = 0x030000, 0x030200, 0x038000, 0x040300
L40S, RTX6000_ADA, RTX6000_ADA_AUDIO = 0x26B9, 0x26B1, 0x22BA
MI210 = 0x740F
FLEX_170, MAX_1100 = 0x56C0, 0x0BDA
L40S_MEMORY = 48 * 1024 ** 3
MI210_VRAM = 64 * 1024 ** 3
#: ``vfio-pci`` is loaded on every such node (its driver directory exists).
VFIO_DIR = "bus/pci/drivers/vfio-pci"


def _vfio_loaded(node: Node) -> None:
    (node.sys.root / VFIO_DIR).mkdir(parents=True, exist_ok=True)
    node.dev_nodes.append("vfio/vfio")


def _gpu(node: Node, bus: int, spec_of: tuple[int, int, int], driver: str, *, group: int,
         numa: int, cpus: str) -> tuple[str, str, tuple[str, ...]]:
    """One GPU under a root port of its own: (root, its BDF, the chain to it)."""
    vendor, device, pci_class = spec_of
    root, port = f"pci0000:{bus - 1:02x}", bdf(bus - 1, 1)
    node.sys.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)
    gpu = bdf(bus)
    path = node.sys.function(PciSpec(gpu, root, (port,), vendor, device, pci_class,
                                     (vendor, device), numa, cpus, driver))
    node.sys.iommu_group(path, gpu, group)
    node.dev_nodes.append(f"vfio/{group}")
    return root, gpu, (port,)


def passthrough_nvidia(node: Node) -> None:
    _vfio_loaded(node)
    cpus = "0-31"
    layout = ((0x18, L40S, "nvidia"), (0x3B, L40S, "nvidia"), (0x5E, RTX6000_ADA, "nvidia"),
              (0xAF, L40S, "vfio-pci"))
    for k, (bus, device, driver) in enumerate(layout):
        numa = 0 if k < 2 else 1
        klass = CLASS_VGA if device == RTX6000_ADA else CLASS_3D
        root, gpu, chain = _gpu(node, bus, (NVIDIA, device, klass), driver, group=20 + k,
                                numa=numa, cpus=cpus)
        name = "NVIDIA RTX 6000 Ada Generation" if device == RTX6000_ADA else "NVIDIA L40S"
        node.gpus.append(FakeGpu(k, k, gpu, name, L40S_MEMORY, device, 8, (8, 9)))
        node.dev_nodes.append(f"nvidia{k}")
        if device == RTX6000_ADA:  # its audio function, in its group, used by the host
            audio = bdf(bus, 0, 1)
            path = node.sys.function(PciSpec(audio, root, chain, NVIDIA, RTX6000_ADA_AUDIO,
                                             CLASS_AUDIO, (NVIDIA, 0x16A1), numa, cpus,
                                             "snd_hda_intel"))
            node.sys.iommu_group(path, audio, 20 + k)
    mgmt_nic(node, 0x02, "eno1", 0, cpus)


def passthrough_amd(node: Node) -> None:
    _vfio_loaded(node)
    cpus = "0-63"
    for k, bus in enumerate((0x23, 0x43)):
        _, gpu, _ = _gpu(node, bus, (AMD, MI210, CLASS_DISPLAY), "amdgpu", group=30 + k,
                         numa=0, cpus=cpus)
        _drm(node, gpu, k)
    # Two MI210 behind one switch without ACS: the kernel puts both in IOMMU group 32.
    root, port, up = "pci0000:82", bdf(0x82, 1), bdf(0x83)
    node.sys.bridge(root, (), port, vendor=AMD, device=0x14AB, numa_node=1)
    node.sys.bridge(root, (port,), up, vendor=AMD, device=0x14A0, numa_node=1)
    for k in (2, 3):
        down = bdf(0x84, k - 2)
        node.sys.bridge(root, (port, up), down, vendor=AMD, device=0x14A1, numa_node=1)
        gpu = bdf(0x85 + k - 2)
        path = node.sys.function(PciSpec(gpu, root, (port, up, down), AMD, MI210,
                                         CLASS_DISPLAY, (AMD, 0x0C34), 1, cpus, "amdgpu"))
        node.sys.iommu_group(path, gpu, 32)
        _drm(node, gpu, k)
    node.dev_nodes += ["vfio/32", "kfd"]
    mgmt_nic(node, 0x02, "eno1", 0, cpus)


def _drm(node: Node, gpu: str, k: int) -> None:
    path = (node.sys.root / "bus/pci/devices" / gpu).resolve()
    node.sys.drm(path, card=k + 1, render=128 + k)
    (path / "mem_info_vram_total").write_text(f"{MI210_VRAM}\n")
    node.dev_nodes += [f"dri/card{k + 1}", f"dri/renderD{128 + k}"]


def passthrough_intel(node: Node) -> None:
    _vfio_loaded(node)
    cpus = "0-55"
    for k, bus in enumerate((0x4D, 0x9A)):
        _, gpu, _ = _gpu(node, bus, (INTEL, FLEX_170, CLASS_DISPLAY), "i915", group=40 + k,
                         numa=k, cpus=cpus)
        path = (node.sys.root / "bus/pci/devices" / gpu).resolve()
        node.sys.drm(path, card=k + 1, render=128 + k)
        node.dev_nodes += [f"dri/card{k + 1}", f"dri/renderD{128 + k}"]
    # A Max 1100 behind its card's switch: the downstream port is in the GPU's group.
    root, port, up, down = "pci0000:c9", bdf(0xC9, 1), bdf(0xCA), bdf(0xCB)
    node.sys.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=1)
    node.sys.bridge(root, (port,), up, vendor=INTEL, device=0x4FA0, numa_node=1)
    node.sys.bridge(root, (port, up), down, vendor=INTEL, device=0x4FA4, numa_node=1)
    gpu = bdf(0xCC)
    path = node.sys.function(PciSpec(gpu, root, (port, up, down), INTEL, MAX_1100,
                                     CLASS_DISPLAY, (INTEL, 0x0000), 1, cpus, "xe"))
    node.sys.iommu_group(path, gpu, 42)
    node.sys.iommu_group((node.sys.root / "bus/pci/devices" / down).resolve(), down, 42)
    node.sys.drm(path, card=3, render=130)
    node.dev_nodes += ["vfio/42", "dri/card3", "dri/renderD130"]
    mgmt_nic(node, 0x02, "eno1", 0, cpus)
