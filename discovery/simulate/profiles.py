"""Simulated nodes: ``dgx-h100``, ``dgx-h100-mig``, ``dgx-a100-mig``, ``dgx-a100-mig-room``,
``sriov-nic``, ``sriov-novfs``, ``amd-mi300x``, ``passthrough-nvidia``, ``passthrough-amd``,
``passthrough-intel``, ``empty``, and the NVLink machines ``pcie-nvlink-pairs``,
``hgx-h100-nvswitch``, ``gb200-nvl72``.

``dgx-h100-mig`` and ``dgx-a100-mig-room`` have MIG-mode GPUs with room to partition (empty,
or partly taken by instances someone else made) for ``--mig dynamic``; ``sriov-novfs`` is
``sriov-nic`` before any VF was created, for ``--vfs dynamic``; the ``passthrough-*`` nodes
have a GPU per IOMMU group (and the cases where they share one) for ``--gpu-passthrough``
(``vfio_gpus``).

Each profile writes a sysfs tree, a procfs subset (routes, NVIDIA driver version) and /dev
stand-ins under a work directory, and pairs them with a FakeNvml. Bus numbers, NUMA nodes,
netdev and RDMA names follow the published DGX port maps; where a value is inferred (bridge
device numbers, the A100 root buses) it is marked ``[inf]``.

The machines are built in ``dgx``, ``nvlink_nodes``, ``sriov_nic`` and ``amd_mi300x`` from
the shared ``parts``; this module names them and writes one out.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from discovery.simulate.amd_mi300x import amd_mi300x
from discovery.simulate.dgx import a100_room, dgx_a100, dgx_h100, h100_room
from discovery.simulate.fake_nvml import FakeNvml
from discovery.simulate.nvlink_nodes import gb200_nvl72, pcie_nvlink_pairs
from discovery.simulate.parts import Node, common_virtual
from discovery.simulate.pcibind import SimulatedPciDrivers
from discovery.simulate.sriov import SimulatedSriov
from discovery.simulate.sriov_nic import sriov
from discovery.simulate.tree import SysfsBuilder, touch_nodes
from discovery.simulate.vfio_gpus import passthrough_amd, passthrough_intel, passthrough_nvidia
from discovery.sources import ProcRoutes, Sources

MARKER = ".dra-agent-simulated"


class ProfileError(ValueError):
    """Unknown profile, or a work directory that holds something other than a simulation."""


def _empty(node: Node) -> None:
    """A node with nothing to offer (a CPU worker): only virtual devices."""


PROFILES: dict[str, Callable[[Node], None]] = {
    "dgx-h100": dgx_h100,
    "dgx-h100-mig": partial(dgx_h100, migs=h100_room),
    "dgx-a100-mig": dgx_a100,
    "dgx-a100-mig-room": partial(dgx_a100, migs=a100_room),
    "sriov-nic": sriov,
    "sriov-novfs": partial(sriov, vfs=0),
    "amd-mi300x": amd_mi300x,
    "pcie-nvlink-pairs": pcie_nvlink_pairs,
    "hgx-h100-nvswitch": partial(dgx_h100, fabric_manager=True),
    "gb200-nvl72": gb200_nvl72,
    "passthrough-nvidia": passthrough_nvidia,
    "passthrough-amd": passthrough_amd,
    "passthrough-intel": passthrough_intel,
    "empty": _empty,
}


def _write_proc(proc: Path, node: Node) -> None:
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
    node = Node(SysfsBuilder(workdir / "sys"), [], [], [])
    common_virtual(node)
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
        gpu=FakeNvml(node.gpus, driver=node.driver, state_path=mig_state,
                     sysfs_root=workdir / "sys"),
        dev_root=dev,
        routes=ProcRoutes(workdir / "proc"),
        proc_root=workdir / "proc",
        label=f"simulated {profile}",
        sriov=SimulatedSriov(workdir / "sys"),
        pci_drivers=SimulatedPciDrivers(workdir / "sys"),
    )
