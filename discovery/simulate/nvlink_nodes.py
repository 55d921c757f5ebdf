"""The simulated NVLink machines, and the NVSwitch wiring the DGX H100 profiles share.

- ``pcie-nvlink-pairs``: a 2-socket PCIe server with 8 H100 NVL, each on a root port of its
  own, GPUs 0+1, 2+3 and 4+5 joined by NVLink bridges and GPUs 6 and 7 without one: the
  pairs are visible to NVLink only (no PCIe root or switch is shared).
- ``hgx-h100-nvswitch`` (built in ``dgx``): ``dgx-h100`` with its fabric manager running,
  every GPU's 18 links trained to the 4 NVSwitches, so all 8 GPUs are one NVLink domain.
  ``dgx-h100`` itself is the same machine before the fabric manager ran: links untrained,
  fabric state "not started", no NVLink attributes.
- ``gb200-nvl72``: one compute tray of a GB200 NVL72 rack: 4 GPUs whose NVSwitches sit in
  the rack's switch trays (no PCI function on this node), registered in the rack's NVLink
  fabric (cluster UUID, clique id).

Values marked ``[inf]`` are inferred, not read from a capture: link counts per bridge and per
switch, the GB200 PCI domains and ids, what NVML reports for a switch outside the node.
"""

from __future__ import annotations

from collections.abc import Sequence

from discovery.gpulib import (
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_STARTED,
    NVLINK_REMOTE_GPU,
    NVLINK_REMOTE_SWITCH,
    FabricInfo,
)
from discovery.simulate.fake_nvml import FakeGpu, FakeNvLink
from discovery.simulate.parts import CLASS_3D, NVIDIA, Node, bdf, mgmt_nic
from discovery.simulate.tree import PciSpec, write_numa

#: Links an H100 SXM has, and how many go to each of the 4 NVSwitches (5+4+4+5) [inf].
H100_LINKS = 18
HGX_SWITCH_LINKS = (5, 4, 4, 5)
#: The cluster UUID a single-node HGX reports: zero, since no multi-node fabric exists [inf].
NO_CLUSTER = "00000000-0000-0000-0000-000000000000"


def wire_nvswitches(gpus: Sequence[FakeGpu], switches: Sequence[str], trained: bool) -> None:
    """Every GPU's links to the NVSwitches at ``switches``; ``trained``: the fabric manager
    has run (links active, fabric state completed), else links down and "not started"."""
    for gpu in gpus:
        gpu.nvlink_count = H100_LINKS
        link = 0
        for switch, count in zip(switches, HGX_SWITCH_LINKS, strict=True):
            for _ in range(count):
                gpu.nvlinks[link] = FakeNvLink(switch, NVLINK_REMOTE_SWITCH, active=trained)
                link += 1
        gpu.fabric = FabricInfo(NO_CLUSTER, 0, FABRIC_STATE_COMPLETED if trained
                                else FABRIC_STATE_NOT_STARTED, 0)


# -- pcie-nvlink-pairs -----------------------------------------------------------------------

H100_NVL = "NVIDIA H100 NVL"
H100_NVL_MEMORY = 100_485_038_080  # 95830 MiB [inf]
#: Root bus of each GPU's root port; GPU k sits at bus root+1. Sockets: GPUs 0-3, 4-7.
PAIR_ROOTS = (0x17, 0x2A, 0x3D, 0x50, 0x97, 0xAA, 0xBD, 0xD0)
PAIR_CPUS = ("0-31,64-95", "32-63,96-127")
#: Bridged pairs (three NVLink bridges of 4 links each per pair) [inf].
BRIDGED = ((0, 1), (2, 3), (4, 5))
BRIDGE_LINKS = 12


def pcie_nvlink_pairs(node: Node) -> None:
    s = node.sys
    for k, r in enumerate(PAIR_ROOTS):
        numa = k // 4
        root, port = f"pci0000:{r:02x}", bdf(r, 1)
        s.bridge(root, (), port, vendor=0x8086, device=0x352A, numa_node=numa)
        s.function(PciSpec(bdf(r + 1), root, (port,), NVIDIA, 0x2321, CLASS_3D,
                           (NVIDIA, 0x1839), numa, PAIR_CPUS[numa], "nvidia", "32.0 GT/s PCIe"))
        node.gpus.append(FakeGpu(k, k, bdf(r + 1), H100_NVL, H100_NVL_MEMORY, 0x2321, 9, (9, 0),
                                 nvlink_count=H100_LINKS))
        node.dev_nodes.append(f"nvidia{k}")
    for a, b in BRIDGED:
        for one, other in ((a, b), (b, a)):
            peer = node.gpus[other].bdf
            node.gpus[one].nvlinks.update(
                {i: FakeNvLink(peer, NVLINK_REMOTE_GPU) for i in range(BRIDGE_LINKS)})
    mgmt_nic(node, 0x02, "eno1", 0, PAIR_CPUS[0])
    write_numa(s, {0: (0, PAIR_CPUS[0]), 1: (1, PAIR_CPUS[1])}, near=12, far=21)


# -- gb200-nvl72 -----------------------------------------------------------------------------

GB200 = "NVIDIA GB200"
GB200_MEMORY = 198_674_350_080  # 189472 MiB [inf]
#: The PCI domains of a compute tray's 4 GPUs, each at <domain>:01:00.0; two per Grace [inf].
GB200_DOMAINS = (0x0008, 0x0009, 0x0018, 0x0019)
GB200_CPUS = ("0-71", "72-143")
#: The rack's NVLink fabric, as every GPU of its trays reports it.
NVL72_CLUSTER = "6b8f2a41-9c3d-4e57-8a1b-2f0c7d9e5a13"
NVL72_CLIQUE = 1


def gb200_nvl72(node: Node) -> None:
    s = node.sys
    node.driver = "570.124.06"
    for k, domain in enumerate(GB200_DOMAINS):
        numa = k // 2
        root, port = f"pci{domain:04x}:00", f"{domain:04x}:00:00.0"
        gpu_bdf = f"{domain:04x}:01:00.0"
        s.bridge(root, (), port, vendor=NVIDIA, device=0x22B2, numa_node=numa)  # [inf]
        s.function(PciSpec(gpu_bdf, root, (port,), NVIDIA, 0x2941, CLASS_3D, (NVIDIA, 0x2046),
                           numa, GB200_CPUS[numa], "nvidia", "32.0 GT/s PCIe"))
        gpu = FakeGpu(k, k, gpu_bdf, GB200, GB200_MEMORY, 0x2941, 10, (10, 0),
                      nvlink_count=H100_LINKS)
        # The NVSwitches are in the rack's switch trays: no PCI info on this node [inf].
        gpu.nvlinks = {i: FakeNvLink("", NVLINK_REMOTE_SWITCH) for i in range(H100_LINKS)}
        gpu.fabric = FabricInfo(NVL72_CLUSTER, NVL72_CLIQUE, FABRIC_STATE_COMPLETED, 0)
        node.gpus.append(gpu)
        node.dev_nodes.append(f"nvidia{k}")
    mgmt_nic(node, 0x02, "enP6p3s0f0np0", 0, GB200_CPUS[0])
    write_numa(s, {0: (0, GB200_CPUS[0]), 1: (1, GB200_CPUS[1])}, near=12, far=40)
