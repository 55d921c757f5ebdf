"""Simulated nodes: ``dgx-h100``, ``dgx-h100-mig``, ``dgx-a100-mig``, ``dgx-a100-mig-room``,
``sriov-nic``, ``sriov-novfs``, ``amd-mi300x``, ``empty``.

``dgx-h100-mig`` and ``dgx-a100-mig-room`` have MIG-mode GPUs with room to partition (empty,
or partly taken by instances someone else made) for ``--mig dynamic``; ``sriov-novfs`` is
``sriov-nic`` before any VF was created, for ``--vfs dynamic``.

Each profile writes a sysfs tree, a procfs subset (routes, NVIDIA driver version) and /dev
stand-ins under a work directory, and pairs them with a FakeNvml. Bus numbers, NUMA nodes,
netdev and RDMA names follow the published DGX port maps; where a value is inferred (bridge
device numbers, the A100 root buses) it is marked ``[inf]``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from discovery.simulate.fake_nvml import (
    A100_80GB_PROFILES,
    H100_80GB_PROFILES,
    FakeGpu,
    FakeMig,
    FakeNvml,
)
from discovery.simulate.sriov import SimulatedSriov
from discovery.simulate.tree import PciSpec, SysfsBuilder, touch_nodes, write_numa
from discovery.sources import ProcRoutes, Sources

MARKER = ".dra-agent-simulated"
MELLANOX, NVIDIA, INTEL, BROADCOM = 0x15B3, 0x10DE, 0x8086, 0x1000
CLASS_ETH, CLASS_IB, CLASS_3D = 0x020000, 0x020700, 0x030200


class ProfileError(ValueError):
    """Unknown profile, or a work directory that holds something other than a simulation."""


@dataclass
class _Node:
    """Everything a profile writes; turned into files by ``_finish``."""

    sys: SysfsBuilder
    gpus: list[FakeGpu]
    dev_nodes: list[str]
    routes: list[tuple[str, str, str]]  # iface, destination hex, mask hex (/proc/net/route)
    driver: str = "550.54.15"


def _bdf(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn}"


def _ib_addr(guid: str) -> str:
    raw = "00000829fe800000" + "0000" + "0000" + guid.replace(":", "")
    return ":".join(raw[i : i + 2] for i in range(0, 40, 2))


def _mac(seed: int) -> str:
    return "58:a2:e1:" + ":".join(f"{(seed >> s) & 0xFF:02x}" for s in (16, 8, 0))


def _netfiles(addr: str, mtu: int, speed: int, link_type: int, up: bool = True) -> dict[str, str]:
    return {
        "address": addr, "mtu": str(mtu), "speed": str(speed if up else -1),
        "operstate": "up" if up else "down", "carrier": "1" if up else "0",
        "type": str(link_type),
    }


def _common_virtual(node: _Node) -> None:
    """Interfaces every Linux node has and discovery must ignore."""
    node.sys.virtual_net("lo", {"address": "00:00:00:00:00:00", "mtu": "65536",
                                "operstate": "unknown", "type": "772"})
    node.sys.virtual_net("docker0", _netfiles("02:42:ac:11:00:01", 1500, -1, 1, up=False))
    node.sys.virtual_net("veth1a2b3c", _netfiles("6a:1f:00:00:00:01", 1500, 10000, 1))
    node.sys.bridge("pci0000:00", (), _bdf(0), vendor=INTEL, device=0x09A2)  # host bridge


def _mgmt_nic(node: _Node, bus: int, ifname: str, numa: int, cpus: str) -> None:
    """An on-board Intel port carrying the default route: must be reserved, never offered."""
    root = f"pci0000:{bus - 1:02x}"
    port = _bdf(bus - 1, 1)
    node.sys.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)
    dev = node.sys.function(PciSpec(_bdf(bus), root, (port,), INTEL, 0x1563, CLASS_ETH,
                                    (INTEL, 0x35D4), numa, cpus, "ixgbe", "8.0 GT/s PCIe", 4))
    node.sys.net(dev, ifname, _netfiles("3c:ec:ef:00:00:01", 1500, 10000, 1))
    node.routes += [(ifname, "00000000", "00000000"), (ifname, "000A0A0A", "00FFFFFF")]


def _cx(node: _Node, spec: PciSpec, ifname: str, ibdev: int, *, ib: bool, speed: int,
        hca: str) -> None:
    dev = node.sys.function(spec)
    guid = f"58a2:e103:00{ibdev:02x}:{int(spec.bdf[5:7], 16):02x}76"
    addr = _ib_addr(guid) if ib else _mac(ibdev * 256 + int(spec.bdf[5:7], 16))
    node.sys.net(dev, ifname, _netfiles(addr, 4092 if ib else 9000, speed, 32 if ib else 1))
    rate = f"{speed // 1000} Gb/sec (4X {'NDR' if speed >= 400000 else 'HDR'})"
    node.sys.rdma(dev, f"mlx5_{ibdev}", uverbs=ibdev,
                  link_layer="InfiniBand" if ib else "Ethernet", rate=rate, guid=guid, hca=hca)
    node.dev_nodes.append(f"infiniband/uverbs{ibdev}")


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


def _h100_room(index: int) -> tuple[tuple[int, int], list[FakeMig]]:
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


def _dgx_h100(node: _Node, migs: MigLayout = _no_mig) -> None:
    s = node.sys
    for k, (r, mlx, numa) in enumerate(H100_PAIRS):
        root, cpus = f"pci0000:{r:02x}", H100_CPUS[numa]
        port, up = _bdf(r, 1), _bdf(r + 1)
        nic_down, gpu_down = _bdf(r + 2), _bdf(r + 2, 1)
        gpu_up, gpu_down2 = _bdf(r + 4), _bdf(r + 5)
        s.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)  # [inf]
        sw = {"vendor": BROADCOM, "device": 0xC030, "numa_node": numa}
        s.bridge(root, (port,), up, **sw)
        s.bridge(root, (port, up), nic_down, **sw)
        s.bridge(root, (port, up), gpu_down, **sw)
        s.bridge(root, (port, up, gpu_down), gpu_up, **sw)
        s.bridge(root, (port, up, gpu_down, gpu_up), gpu_down2, **sw)
        nic = PciSpec(_bdf(r + 3), root, (port, up, nic_down), MELLANOX, 0x1021, CLASS_IB,
                      (MELLANOX, 0x0023), numa, cpus, "mlx5_core")
        _cx(node, nic, f"ibp{r + 3}s0", mlx, ib=True, speed=400000, hca="MT4129")
        gpu_bdf = _bdf(r + 6)
        s.function(PciSpec(gpu_bdf, root, (port, up, gpu_down, gpu_up, gpu_down2), NVIDIA,
                           0x2330, CLASS_3D, (NVIDIA, 0x16C1), numa, cpus, "nvidia"))
        mig_mode, layout = migs(k)
        node.gpus.append(FakeGpu(k, k, gpu_bdf, "NVIDIA H100 80GB HBM3", H100_MEMORY, 0x2330,
                                 9, (9, 0), mig_mode=mig_mode, migs=layout))
        node.dev_nodes.append(f"nvidia{k}")
    # Storage: two dual-port CX-7 cards, port 1 InfiniBand, port 2 Ethernet (RoCE).
    for bus, mlx, numa in ((0x29, 1, 0), (0xAA, 7, 1)):
        root, port = f"pci0000:{bus - 1:02x}", _bdf(bus - 1, 1)
        s.bridge(root, (), port, vendor=INTEL, device=0x352A, numa_node=numa)
        for fn in (0, 1):
            spec = PciSpec(_bdf(bus, 0, fn), root, (port,), MELLANOX, 0x1021,
                           CLASS_IB if fn == 0 else CLASS_ETH, (MELLANOX, 0x0023), numa,
                           H100_CPUS[numa], "mlx5_core")
            ifname = f"ibp{bus}s0f0" if fn == 0 else f"enp{bus}s0f1np1"
            _cx(node, spec, ifname, mlx + fn, ib=fn == 0, speed=400000 if fn == 0 else 200000,
                hca="MT4129")
    # 4 NVSwitch functions: class 0x0680, never offered.
    for bus in range(5, 9):
        s.function(PciSpec(_bdf(bus), "pci0000:00", (), NVIDIA, 0x22A3, 0x068000,
                           (NVIDIA, 0x1796), 0, H100_CPUS[0], "nvidia-nvswitch"))
    _mgmt_nic(node, 0x0B, "eno3", 0, H100_CPUS[0])
    write_numa(s, H100_NUMA, near=12, far=21)
    _mig_cap_nodes(node)


def _mig_cap_nodes(node: _Node) -> None:
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


def _a100_room(index: int) -> tuple[tuple[int, int], list[FakeMig]]:
    """dgx-a100-mig-room: GPUs 0-1 as in dgx-a100-mig, 2 only its 3g at 4 (room at 0-3), 3-5
    MIG mode on and empty, 6-7 MIG mode off."""
    if index < 2:
        return _a100_migs(index)
    if index == 2:
        return (1, 1), [FakeMig(2, 0, A100_80GB_PROFILES[9], 4)]
    if index < 6:
        return (1, 1), []
    return (0, 0), []


def _dgx_a100(node: _Node, migs: MigLayout = _a100_migs) -> None:
    s = node.sys
    index = 0
    for r, numa, gpu_buses, nics in A100_COMPLEXES:
        root, cpus = f"pci0000:{r:02x}", A100_CPUS[numa]
        port, up = _bdf(r, 1, 1), _bdf(r + 1)
        s.bridge(root, (), port, vendor=0x1022, device=0x1483, numa_node=numa)
        s.bridge(root, (port,), up, vendor=BROADCOM, device=0xC010, numa_node=numa)
        for j, bus in enumerate(gpu_buses):
            down = _bdf(r + 2, j)
            s.bridge(root, (port, up), down, vendor=BROADCOM, device=0xC010, numa_node=numa)
            s.function(PciSpec(_bdf(bus), root, (port, up, down), NVIDIA, 0x20B2, CLASS_3D,
                               (NVIDIA, 0x1463), numa, cpus, "nvidia", "16.0 GT/s PCIe"))
            mig_mode, layout = migs(index)
            node.gpus.append(FakeGpu(index, index, _bdf(bus), "NVIDIA A100-SXM4-80GB",
                                     A100_MEMORY, 0x20B2, 7, (8, 0), mig_mode=mig_mode,
                                     migs=layout))
            node.dev_nodes.append(f"nvidia{index}")
            index += 1
        for j, (bus, mlx) in enumerate(nics):
            down = _bdf(r + 2, 2 + j)
            s.bridge(root, (port, up), down, vendor=BROADCOM, device=0xC010, numa_node=numa)
            spec = PciSpec(_bdf(bus), root, (port, up, down), MELLANOX, 0x101B, CLASS_IB,
                           (MELLANOX, 0x0007), numa, cpus, "mlx5_core", "16.0 GT/s PCIe")
            _cx(node, spec, f"ibp{bus}s0", mlx, ib=True, speed=200000, hca="MT4123")
    for bus, mlx, numa in ((0x61, 4, 0), (0xE1, 10, 6)):  # storage, Ethernet
        root, port = f"pci0000:{bus - 1:02x}", _bdf(bus - 1, 1, 1)
        s.bridge(root, (), port, vendor=0x1022, device=0x1483, numa_node=numa)
        for fn in (0, 1):
            spec = PciSpec(_bdf(bus, 0, fn), root, (port,), MELLANOX, 0x101B, CLASS_ETH,
                           (MELLANOX, 0x0007), numa, A100_CPUS[numa], "mlx5_core",
                           "16.0 GT/s PCIe")
            _cx(node, spec, f"enp{bus}s0f{fn}", mlx + fn, ib=False, speed=200000, hca="MT4123")
    write_numa(s, A100_NUMA, near=12, far=32)
    # In-band management runs over the second storage card's first port.
    node.routes += [("enp225s0f0", "00000000", "00000000"),
                    ("enp225s0f0", "000A0A0A", "00FFFFFF")]
    _mig_cap_nodes(node)


# -- sriov-nic ---------------------------------------------------------------------------

SRIOV_VFS = 64
SRIOV_VFIO_FROM = (48, 32)  # per PF: VFs from this index on are bound to vfio-pci


def _sriov(node: _Node, vfs: int = SRIOV_VFS) -> None:
    """Dual-port ConnectX-6 Dx, TotalVFs 64 per port; ``vfs`` of them created."""
    s = node.sys
    root, port, cpus = "pci0000:3a", _bdf(0x3A, 0), "0-31"
    s.bridge(root, (), port, vendor=INTEL, device=0x347A, numa_node=0)
    group = 40
    for pf_fn in (0, 1):
        pf_bdf = _bdf(0x3B, 0, pf_fn)
        pf = s.function(PciSpec(pf_bdf, root, (port,), MELLANOX, 0x101D, CLASS_ETH,
                                (MELLANOX, 0x0016), 0, cpus, "mlx5_core", "16.0 GT/s PCIe"))
        s.net(pf, f"enp59s0f{pf_fn}np{pf_fn}", _netfiles(_mac(pf_fn), 9000, 100000, 1))
        s.rdma(pf, f"mlx5_{pf_fn}", uverbs=pf_fn, link_layer="Ethernet",
               rate="100 Gb/sec (4X EDR)", guid=f"0c42:a103:00{pf_fn:02x}:0000", hca="MT4125")
        offset = 2 if pf_fn == 0 else 1 + SRIOV_VFS
        s.sriov(pf, total=SRIOV_VFS, num=vfs, offset=offset, stride=1, vf_device=0x101E)
        s.iommu_group(pf, pf_bdf, 30 + pf_fn)
        for i in range(vfs):
            devfn = pf_fn + offset + i
            vf_bdf = _bdf(0x3B, devfn >> 3, devfn & 7)
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
                      _netfiles(_mac(0x1000 + pf_fn * 256 + i), 1500, 100000, 1))
                s.rdma(vf, f"mlx5_{ib}", uverbs=ib, link_layer="Ethernet",
                       rate="100 Gb/sec (4X EDR)", guid=f"0c42:a103:{pf_fn:02x}{i:02x}:0001",
                       hca="MT4126")
            group += 1
    node.dev_nodes.append("vfio/vfio")
    _mgmt_nic(node, 0x02, "eno1", 0, cpus)


# -- amd-mi300x --------------------------------------------------------------------------

AMD = 0x1002
CLASS_ACCEL = 0x120000  # "Processing accelerators", as lspci lists an Instinct MI300X
MI300X_DEVICE = 0x74A1  # [inf] Aqua Vanjaram [Instinct MI300X]
MI300X_VRAM = 206_158_430_208  # 192 GiB of HBM3 (mem_info_vram_total) [inf]
MI300X_ROOTS = (0x05, 0x25, 0x45, 0x65, 0x85, 0xA5, 0xC5, 0xE5)  # [inf] one root per OAM


def _amd_mi300x(node: _Node) -> None:
    """Eight AMD Instinct MI300X (amdgpu, DRM + /dev/kfd) and a 400G RoCE NIC per socket:
    GPUs the DRM path finds, for sharing and exclusive claims without NVML."""
    s = node.sys
    for k, bus in enumerate(MI300X_ROOTS):
        numa = 0 if k < 4 else 1
        cpus = "0-47,96-143" if numa == 0 else "48-95,144-191"
        root, port = f"pci0000:{bus - 1:02x}", _bdf(bus - 1, 1)
        s.bridge(root, (), port, vendor=AMD, device=0x14AB, numa_node=numa)  # [inf]
        dev = s.function(PciSpec(_bdf(bus), root, (port,), AMD, MI300X_DEVICE, CLASS_ACCEL,
                                 (AMD, 0x74A1), numa, cpus, "amdgpu"))
        s.drm(dev, card=k + 1, render=128 + k)
        (dev / "mem_info_vram_total").write_text(f"{MI300X_VRAM}\n")
        node.dev_nodes += [f"dri/card{k + 1}", f"dri/renderD{128 + k}"]
        if k in (0, 4):  # a RoCE NIC beside the first GPU of each socket
            nic = PciSpec(_bdf(bus, 0, 1), root, (port,), MELLANOX, 0x1021, CLASS_ETH,
                          (MELLANOX, 0x0023), numa, cpus, "mlx5_core")
            _cx(node, nic, f"enp{bus}s0f1np1", k // 4, ib=False, speed=400000,
                hca="MT4129")
    node.dev_nodes.append("kfd")
    _mgmt_nic(node, 0x02, "eno1", 0, "0-47,96-143")


def _empty(node: _Node) -> None:
    """A node with nothing to offer (a CPU worker): only virtual devices."""


PROFILES: dict[str, Callable[[_Node], None]] = {
    "dgx-h100": _dgx_h100,
    "dgx-h100-mig": partial(_dgx_h100, migs=_h100_room),
    "dgx-a100-mig": _dgx_a100,
    "dgx-a100-mig-room": partial(_dgx_a100, migs=_a100_room),
    "sriov-nic": _sriov,
    "sriov-novfs": partial(_sriov, vfs=0),
    "amd-mi300x": _amd_mi300x,
    "empty": _empty,
}


def _write_proc(proc: Path, node: _Node) -> None:
    (proc / "net").mkdir(parents=True, exist_ok=True)
    lines = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    for iface, dest, mask in node.routes:
        gateway = "010A0A0A" if dest == "00000000" else "00000000"
        lines.append(f"{iface}\t{dest}\t{gateway}\t0003\t0\t0\t0\t{mask}\t0\t0\t0")
    (proc / "net" / "route").write_text("\n".join(lines) + "\n")
    if node.gpus:
        (proc / "driver" / "nvidia").mkdir(parents=True, exist_ok=True)
        (proc / "driver" / "nvidia" / "version").write_text(
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {node.driver}  "
            "Release Build  (simulated)\nGCC version:  gcc version 12.3.0\n"
        )
        (proc / "devices").write_text(
            "Character devices:\n195 nvidia-frontend\n231 infiniband_verbs\n"
            "235 nvidia-caps\n510 nvidia-uvm\n"
        )


def scratch_parent() -> str | None:
    """Where to put a throw-away simulation: tmpfs (/dev/shm) when writable, since a profile
    is a few thousand small files and a busy disk makes writing them 50x slower."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="dra-agent-sim-", dir=scratch_parent())


def simulated_sources(profile: str, workdir: Path, mig_state: Path | None = None) -> Sources:
    """Generate ``profile`` under ``workdir`` ({sys,proc,dev}) and return its Sources.

    ``mig_state``: a file the NVML fake keeps its MIG instances in, so they outlive the
    process like a real GPU's (``FakeNvml.state_path``).

    A work directory is only ever cleared when it holds a previous simulation (marker file),
    so a mistyped path never deletes anything else.
    """
    build = PROFILES.get(profile)
    if build is None:
        raise ProfileError(f"unknown profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
    workdir.mkdir(parents=True, exist_ok=True)
    marker = workdir / MARKER
    parts = [workdir / p for p in ("sys", "proc", "dev")]
    if any(p.exists() for p in parts) and not marker.exists():
        raise ProfileError(f"{workdir} holds files that are not a simulation; refusing to clear")
    for p in parts:
        shutil.rmtree(p, ignore_errors=True)
    marker.write_text(profile + "\n")
    node = _Node(SysfsBuilder(workdir / "sys"), [], [], [])
    _common_virtual(node)
    build(node)
    _write_proc(workdir / "proc", node)
    dev = workdir / "dev"
    dev.mkdir(exist_ok=True)
    if node.gpus:
        node.dev_nodes += ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    if any(n.startswith("infiniband/") for n in node.dev_nodes):
        node.dev_nodes.append("infiniband/rdma_cm")
    touch_nodes(dev, node.dev_nodes)
    return Sources(
        sysfs_root=workdir / "sys",
        gpu=FakeNvml(node.gpus, driver=node.driver, state_path=mig_state),
        dev_root=dev,
        routes=ProcRoutes(workdir / "proc"),
        proc_root=workdir / "proc",
        label=f"simulated {profile}",
        sriov=SimulatedSriov(workdir / "sys"),
    )
