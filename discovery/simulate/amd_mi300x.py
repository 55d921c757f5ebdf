"""The simulated ``amd-mi300x`` node: eight AMD Instinct MI300X that the DRM path finds
(no NVML), with a RoCE NIC per socket."""

from __future__ import annotations

from discovery.simulate.parts import CLASS_ETH, MELLANOX, Node, bdf, connectx, mgmt_nic
from discovery.simulate.tree import PciSpec

AMD = 0x1002
CLASS_ACCEL = 0x120000  # "Processing accelerators", as lspci lists an Instinct MI300X
MI300X_DEVICE = 0x74A1  # [inf] Aqua Vanjaram [Instinct MI300X]
MI300X_VRAM = 206_158_430_208  # 192 GiB of HBM3 (mem_info_vram_total) [inf]
MI300X_ROOTS = (0x05, 0x25, 0x45, 0x65, 0x85, 0xA5, 0xC5, 0xE5)  # [inf] one root per OAM


def amd_mi300x(node: Node) -> None:
    """Eight AMD Instinct MI300X (amdgpu, DRM + /dev/kfd) and a 400G RoCE NIC per socket:
    GPUs the DRM path finds, for sharing and exclusive claims without NVML."""
    s = node.sys
    for k, bus in enumerate(MI300X_ROOTS):
        numa = 0 if k < 4 else 1
        cpus = "0-47,96-143" if numa == 0 else "48-95,144-191"
        root, port = f"pci0000:{bus - 1:02x}", bdf(bus - 1, 1)
        s.bridge(root, (), port, vendor=AMD, device=0x14AB, numa_node=numa)  # [inf]
        dev = s.function(PciSpec(bdf(bus), root, (port,), AMD, MI300X_DEVICE, CLASS_ACCEL,
                                 (AMD, 0x74A1), numa, cpus, "amdgpu"))
        s.drm(dev, card=k + 1, render=128 + k)
        (dev / "mem_info_vram_total").write_text(f"{MI300X_VRAM}\n")
        node.dev_nodes += [f"dri/card{k + 1}", f"dri/renderD{128 + k}"]
        if k in (0, 4):  # a RoCE NIC beside the first GPU of each socket
            nic = PciSpec(bdf(bus, 0, 1), root, (port,), MELLANOX, 0x1021, CLASS_ETH,
                          (MELLANOX, 0x0023), numa, cpus, "mlx5_core")
            connectx(node, nic, f"enp{bus}s0f1np1", k // 4, ib=False, speed=400000,
                hca="MT4129")
    node.dev_nodes.append("kfd")
    mgmt_nic(node, 0x02, "eno1", 0, "0-47,96-143")
