"""The simulated ``sriov-nic`` node: a dual-port ConnectX-6 Dx with SR-IOV, 64 VFs per port,
some bound to vfio-pci; ``sriov-novfs`` is the same before any VF was created (``--vfs
dynamic``)."""

from __future__ import annotations

from discovery.simulate.parts import CLASS_ETH, INTEL, MELLANOX, Node, bdf, mac, mgmt_nic, netfiles
from discovery.simulate.tree import PciSpec

SRIOV_VFS = 64
SRIOV_VFIO_FROM = (48, 32)  # per PF: VFs from this index on are bound to vfio-pci


def sriov(node: Node, vfs: int = SRIOV_VFS) -> None:
    """Dual-port ConnectX-6 Dx, TotalVFs 64 per port; ``vfs`` of them created."""
    s = node.sys
    root, port, cpus = "pci0000:3a", bdf(0x3A, 0), "0-31"
    s.bridge(root, (), port, vendor=INTEL, device=0x347A, numa_node=0)
    group = 40
    for pf_fn in (0, 1):
        pf_bdf = bdf(0x3B, 0, pf_fn)
        pf = s.function(PciSpec(pf_bdf, root, (port,), MELLANOX, 0x101D, CLASS_ETH,
                                (MELLANOX, 0x0016), 0, cpus, "mlx5_core", "16.0 GT/s PCIe"))
        s.net(pf, f"enp59s0f{pf_fn}np{pf_fn}", netfiles(mac(pf_fn), 9000, 100000, 1))
        s.rdma(pf, f"mlx5_{pf_fn}", uverbs=pf_fn, link_layer="Ethernet",
               rate="100 Gb/sec (4X EDR)", guid=f"0c42:a103:00{pf_fn:02x}:0000", hca="MT4125")
        offset = 2 if pf_fn == 0 else 1 + SRIOV_VFS
        s.sriov(pf, total=SRIOV_VFS, num=vfs, offset=offset, stride=1, vf_device=0x101E)
        s.iommu_group(pf, pf_bdf, 30 + pf_fn)
        for i in range(vfs):
            devfn = pf_fn + offset + i
            vf_bdf = bdf(0x3B, devfn >> 3, devfn & 7)
            vfio = i >= SRIOV_VFIO_FROM[pf_fn]
            vf = s.function(PciSpec(vf_bdf, root, (port,), MELLANOX, 0x101E, CLASS_ETH,
                                    (MELLANOX, 0x0016), 0, cpus,
                                    "vfio-pci" if vfio else "mlx5_core", "16.0 GT/s PCIe"))
            s.link_vf(pf, vf, i)
            s.iommu_group(vf, vf_bdf, group)
            if vfio:
                node.dev_nodes.append(f"vfio/{group}")
            else:
                ib = 2 + pf_fn * SRIOV_VFS + i
                s.net(vf, f"enp59s0f{pf_fn}v{i}",
                      netfiles(mac(0x1000 + pf_fn * 256 + i), 1500, 100000, 1))
                s.rdma(vf, f"mlx5_{ib}", uverbs=ib, link_layer="Ethernet",
                       rate="100 Gb/sec (4X EDR)", guid=f"0c42:a103:{pf_fn:02x}{i:02x}:0001",
                       hca="MT4126")
            group += 1
    node.dev_nodes.append("vfio/vfio")
    mgmt_nic(node, 0x02, "eno1", 0, cpus)
