"""The simulated NVIDIA DGX machines: ``dgx-h100`` (8 H100 with a 400G InfiniBand NIC under
each GPU's PCIe switch) and ``dgx-a100-mig`` (8 A100, four in MIG mode with mixed layouts),
each also with room to partition (``dgx-h100-mig``, ``dgx-a100-mig-room``) for ``--mig
dynamic``, and ``hgx-h100-nvswitch``, the H100 machine with its NVLinks trained. Bus
numbers, NUMA nodes, netdev and RDMA names follow the published DGX port maps; where a value
is inferred it is marked ``[inf]``.
"""

from __future__ import annotations

from collections.abc import Callable

from discovery.simulate.fake_nvml import (
    A100_80GB_PROFILES,
    H100_80GB_PROFILES,
    FakeGpu,
    FakeMig,
)
from discovery.simulate.nvlink_nodes import wire_nvswitches
from discovery.simulate.parts import (
    BROADCOM,
    CLASS_3D,
    CLASS_ETH,
    CLASS_IB,
    INTEL,
    MELLANOX,
    NVIDIA,
    Node,
    bdf,
    connectx,
    mgmt_nic,
)
from discovery.simulate.tree import PciSpec, write_numa

# -- dgx-h100 ----------------------------------------------------------------------------

H100_PAIRS = (  # root bus, mlx5 index, NUMA; NIC = root+3, GPU = root+6
    (0x15, 0, 0), (0x3D, 3, 0), (0x4C, 4, 0), (0x5B, 5, 0),
    (0x97, 6, 1), (0xBD, 9, 1), (0xCB, 10, 1), (0xD9, 11, 1),
)
H100_CPUS = ("0-55,112-167", "56-111,168-223")
#: Sub-NUMA clustering (SNC-2): 2 sockets of 2 NUMA nodes each, socket 0 = nodes 0 and 2, so
#: the devices keep sitting on nodes 0 and 1 and their numaNode lists are [0, 2] and [1, 3].
H100_NUMA = {0: (0, "0-27,112-139"), 2: (0, "28-55,140-167"),
             1: (1, "56-83,168-195"), 3: (1, "84-111,196-223")}
H100_MEMORY = 85_520_809_984  # 81559 MiB, as NVML reports it


MigLayout = Callable[[int], tuple[tuple[int, int], list[FakeMig]]]


def _no_mig(index: int) -> tuple[tuple[int, int], list[FakeMig]]:
    return (0, 0), []


def h100_room(index: int) -> tuple[tuple[int, int], list[FakeMig]]:
    """dgx-h100-mig: GPUs 0-3 MIG mode on and empty; 4 holds a foreign 3g at 0 (GI 2); 5 two
    foreign 1g at 0 and 1 (GI 7, 8); 6-7 MIG mode off."""
    p = H100_80GB_PROFILES
    if index < 4:
        return (1, 1), []
    if index == 4:
        return (1, 1), [FakeMig(2, 0, p[9], 0)]
    if index == 5:
        return (1, 1), [FakeMig(7, 0, p[19], 0), FakeMig(8, 0, p[19], 1)]
    return (0, 0), []


def dgx_h100(node: Node, migs: MigLayout = _no_mig, fabric_manager: bool = False) -> None:
    """``fabric_manager``: NVLinks trained (``hgx-h100-nvswitch``); else untrained, as
    before nvidia-fabricmanager has run (``dgx-h100``)."""
    s = node.sys
    for k, (r, mlx, numa) in enumerate(H100_PAIRS):
        root, cpus = f"pci0000:{r:02x}", H100_CPUS[numa]
        port, up = bdf(r, 1), bdf(r + 1)
        nic_down, gpu_down = bdf(r + 2), bdf(r + 2, 1)
        gpu_up, gpu_down2 = bdf(r + 4), bdf(r + 5)
        s.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)  # [inf]
        sw = {"vendor": BROADCOM, "device": 0xC030, "numa_node": numa}
        s.bridge(root, (port,), up, **sw)
        s.bridge(root, (port, up), nic_down, **sw)
        s.bridge(root, (port, up), gpu_down, **sw)
        s.bridge(root, (port, up, gpu_down), gpu_up, **sw)
        s.bridge(root, (port, up, gpu_down, gpu_up), gpu_down2, **sw)
        nic = PciSpec(bdf(r + 3), root, (port, up, nic_down), MELLANOX, 0x1021, CLASS_IB,
                      (MELLANOX, 0x0023), numa, cpus, "mlx5_core")
        connectx(node, nic, f"ibp{r + 3}s0", mlx, ib=True, speed=400000, hca="MT4129")
        gpu_bdf = bdf(r + 6)
        s.function(PciSpec(gpu_bdf, root, (port, up, gpu_down, gpu_up, gpu_down2), NVIDIA,
                           0x2330, CLASS_3D, (NVIDIA, 0x16C1), numa, cpus, "nvidia"))
        mig_mode, layout = migs(k)
        node.gpus.append(FakeGpu(k, k, gpu_bdf, "NVIDIA H100 80GB HBM3", H100_MEMORY, 0x2330,
                                 9, (9, 0), mig_mode=mig_mode, migs=layout))
        node.dev_nodes.append(f"nvidia{k}")
    # Storage: two dual-port CX-7 cards, port 1 InfiniBand, port 2 Ethernet (RoCE).
    for bus, mlx, numa in ((0x29, 1, 0), (0xAA, 7, 1)):
        root, port = f"pci0000:{bus - 1:02x}", bdf(bus - 1, 1)
        s.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)
        for fn in (0, 1):
            spec = PciSpec(bdf(bus, 0, fn), root, (port,), MELLANOX, 0x1021,
                           CLASS_IB if fn == 0 else CLASS_ETH, (MELLANOX, 0x0023), numa,
                           H100_CPUS[numa], "mlx5_core")
            ifname = f"ibp{bus}s0f0" if fn == 0 else f"enp{bus}s0f1np1"
            connectx(node, spec, ifname, mlx + fn, ib=fn == 0, speed=400000 if fn == 0 else 200000,
                hca="MT4129")
    # 4 NVSwitch functions: class 0x0680, never offered; every GPU's NVLinks end there.
    for bus in range(5, 9):
        s.function(PciSpec(bdf(bus), "pci0000:00", (), NVIDIA, 0x22A3, 0x068000,
                           (NVIDIA, 0x1796), 0, H100_CPUS[0], "nvidia-nvswitch"))
    wire_nvswitches(node.gpus, [bdf(bus) for bus in range(5, 9)], trained=fabric_manager)
    mgmt_nic(node, 0x0B, "eno3", 0, H100_CPUS[0])
    write_numa(s, H100_NUMA, near=12, far=21)
    _mig_cap_nodes(node)


def _mig_cap_nodes(node: Node) -> None:
    """/dev/nvidia-caps nodes of the instances that exist when the machine is made."""
    for gpu in node.gpus:
        for mig in gpu.migs:
            base = 135 * gpu.minor + 9 * mig.gi
            node.dev_nodes += [f"nvidia-caps/nvidia-cap{3 + base}",
                               f"nvidia-caps/nvidia-cap{4 + base + mig.ci}"]


# -- dgx-a100-mig ------------------------------------------------------------------------

A100_COMPLEXES = (  # root bus, NUMA, GPU buses, (NIC bus, mlx5 index) x2   [inf] root buses
    (0x00, 3, (0x07, 0x0F), ((0x0C, 0), (0x12, 1))),
    (0x40, 1, (0x47, 0x4E), ((0x4B, 2), (0x54, 3))),
    (0x80, 7, (0x87, 0x90), ((0x8D, 6), (0x94, 7))),
    (0xB0, 5, (0xB7, 0xBD), ((0xBA, 8), (0xCC, 9))),
)
A100_CPUS = {3: "48-63,176-191", 1: "16-31,144-159", 7: "112-127,240-255",
             5: "80-95,208-223", 0: "0-15,128-143", 6: "96-111,224-239"}
A100_MEMORY = 85_899_345_920  # 81920 MiB
#: AMD Rome NPS4: 2 sockets of 4 NUMA nodes, node n holds CPUs 16n.. and 128+16n..
A100_NUMA = {n: (n // 4, f"{16 * n}-{16 * n + 15},{128 + 16 * n}-{128 + 16 * n + 15}")
             for n in range(8)}


def _a100_migs(index: int) -> tuple[tuple[int, int], list[FakeMig]]:
    """MIG layouts of GPUs 0-3 (mixed profiles); GPUs 4-7 have MIG off."""
    p = A100_80GB_PROFILES
    if index == 0:  # seven 1g.10gb; the driver handed out GI 7..13
        return (1, 1), [FakeMig(7 + i, 0, p[19], i) for i in range(7)]
    if index == 1:  # 2g + 1g + 1g + 3g, GI ids as seen in a real capture
        return (1, 1), [FakeMig(3, 0, p[14], 0), FakeMig(9, 0, p[19], 2),
                        FakeMig(10, 0, p[19], 3), FakeMig(2, 0, p[9], 4)]
    if index == 2:
        return (1, 1), [FakeMig(1, 0, p[5], 0), FakeMig(2, 0, p[9], 4)]
    if index == 3:  # a 3g split into three 1c compute instances, 1g.20gb and 1g.10gb+me
        return (1, 1), [FakeMig(1, c, p[9], 0, ci_slices=1) for c in range(3)] + [
            FakeMig(5, 0, p[15], 4), FakeMig(13, 0, p[20], 6)]
    return (0, 0), []


def a100_room(index: int) -> tuple[tuple[int, int], list[FakeMig]]:
    """dgx-a100-mig-room: GPUs 0-1 as in dgx-a100-mig, 2 only its 3g at 4 (room at 0-3), 3-5
    MIG mode on and empty, 6-7 MIG mode off."""
    if index < 2:
        return _a100_migs(index)
    if index == 2:
        return (1, 1), [FakeMig(2, 0, A100_80GB_PROFILES[9], 4)]
    if index < 6:
        return (1, 1), []
    return (0, 0), []


def dgx_a100(node: Node, migs: MigLayout = _a100_migs) -> None:
    s = node.sys
    index = 0
    for r, numa, gpu_buses, nics in A100_COMPLEXES:
        root, cpus = f"pci0000:{r:02x}", A100_CPUS[numa]
        port, up = bdf(r, 1, 1), bdf(r + 1)
        s.bridge(root, (), port, vendor=0x1022, device=0x1483, numa_node=numa)
        s.bridge(root, (port,), up, vendor=BROADCOM, device=0xC010, numa_node=numa)
        for j, bus in enumerate(gpu_buses):
            down = bdf(r + 2, j)
            s.bridge(root, (port, up), down, vendor=BROADCOM, device=0xC010, numa_node=numa)
            s.function(PciSpec(bdf(bus), root, (port, up, down), NVIDIA, 0x20B2, CLASS_3D,
                               (NVIDIA, 0x1463), numa, cpus, "nvidia", "16.0 GT/s PCIe"))
            mig_mode, layout = migs(index)
            node.gpus.append(FakeGpu(index, index, bdf(bus), "NVIDIA A100-SXM4-80GB",
                                     A100_MEMORY, 0x20B2, 7, (8, 0), mig_mode=mig_mode,
                                     migs=layout))
            node.dev_nodes.append(f"nvidia{index}")
            index += 1
        for j, (bus, mlx) in enumerate(nics):
            down = bdf(r + 2, 2 + j)
            s.bridge(root, (port, up), down, vendor=BROADCOM, device=0xC010, numa_node=numa)
            spec = PciSpec(bdf(bus), root, (port, up, down), MELLANOX, 0x101B, CLASS_IB,
                           (MELLANOX, 0x0007), numa, cpus, "mlx5_core", "16.0 GT/s PCIe")
            connectx(node, spec, f"ibp{bus}s0", mlx, ib=True, speed=200000, hca="MT4123")
    for bus, mlx, numa in ((0x61, 4, 0), (0xE1, 10, 6)):  # storage, Ethernet
        root, port = f"pci0000:{bus - 1:02x}", bdf(bus - 1, 1, 1)
        s.bridge(root, (), port, vendor=0x1022, device=0x1483, numa_node=numa)
        for fn in (0, 1):
            spec = PciSpec(bdf(bus, 0, fn), root, (port,), MELLANOX, 0x101B, CLASS_ETH,
                           (MELLANOX, 0x0007), numa, A100_CPUS[numa], "mlx5_core",
                           "16.0 GT/s PCIe")
            connectx(node, spec, f"enp{bus}s0f{fn}", mlx + fn, ib=False, speed=200000, hca="MT4123")
    write_numa(s, A100_NUMA, near=12, far=32)
    # In-band management runs over the second storage card's first port.
    node.routes += [("enp225s0f0", "00000000", "00000000"),
                    ("enp225s0f0", "000A0A0A", "00FFFFFF")]
    _mig_cap_nodes(node)
