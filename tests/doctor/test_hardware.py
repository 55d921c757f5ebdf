"""Hardware checks: NVML through the project's seam, the toolkit, IOMMU, RDMA netns, SR-IOV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.doctor import hardware
from agent.doctor.context import Options
from agent.doctor.model import Status
from discovery.gpulib import LibraryNotFoundError
from discovery.model import Device, DeviceType, HostInfo, Inventory
from discovery.simulate import FakeGpu, FakeNvml
from tests.doctor.conftest import Tree, assert_check, context

TOOLKIT = "/etc/nvidia-container-runtime/config.toml"
NETNS = "/sys/module/ib_core/parameters/netns_mode"


def _pci(tree: Tree, bdf: str, **attrs: str) -> None:
    for name, value in attrs.items():
        tree.write(f"/sys/bus/pci/devices/{bdf}/{name}", value + "\n")


def _gpu_on_bus(tree: Tree) -> None:
    _pci(tree, "0000:18:00.0", vendor="0x10de", **{"class": "0x030200"})


def _fake(n: int, **kw: Any) -> FakeNvml:
    gpus = [FakeGpu(i, i, f"0000:{0x18 + i:02x}:00.0", "NVIDIA H100", 80 << 30, 0x2330, 9,
                    (9, 0)) for i in range(n)]
    return FakeNvml(gpus, driver="550.54.15", **kw)


def test_nvml_ok_and_missing_gpus(tree: Tree) -> None:
    _gpu_on_bus(tree)
    assert_check(hardware.check_nvml(context(tree, gpu=_fake(1))), Status.OK,
                 "driver 550.54.15, 1 GPU(s)")
    _pci(tree, "0000:19:00.0", vendor="0x10de", **{"class": "0x030200"})
    assert_check(hardware.check_nvml(context(tree, gpu=_fake(1))), Status.WARN,
                 "NVML sees 1 of the 2", fix="Xid")


def test_nvml_not_loadable(tree: Tree) -> None:
    broken = _fake(0, init_error=LibraryNotFoundError("libnvidia-ml.so.1 not found", call="init"))
    assert_check(hardware.check_nvml(context(tree, gpu=broken)), Status.SKIPPED,
                 "no NVIDIA GPU on the PCI bus")
    _gpu_on_bus(tree)
    assert_check(hardware.check_nvml(context(tree, gpu=broken)), Status.FAIL,
                 "1 NVIDIA GPU(s) on the PCI bus, but NVML", fix="install the NVIDIA driver")
    assert_check(hardware.check_nvml(context(tree)), Status.SKIPPED, "NVIDIA support off")


def test_toolkit_mode_and_envvar(tree: Tree) -> None:
    assert_check(hardware.check_toolkit_mode(context(tree)), Status.SKIPPED, "no NVIDIA GPU")
    _gpu_on_bus(tree)
    assert_check(hardware.check_toolkit_mode(context(tree)), Status.WARN, f"no {TOOLKIT}",
                 fix="install nvidia-container-toolkit")
    tree.write(TOOLKIT, '[nvidia-container-runtime]\nmode = "legacy"\n')
    ctx = context(tree)
    assert_check(hardware.check_toolkit_mode(ctx), Status.WARN, "mode = 'legacy'",
                 fix="nvidia-container-runtime.mode=cdi")
    assert_check(hardware.check_toolkit_envvar(ctx), Status.WARN, "= true (the default)",
                 fix="unprivileged=false")
    tree.write(TOOLKIT, "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
               '[nvidia-container-runtime]\nmode = "cdi"\n')
    assert_check(hardware.check_toolkit_mode(ctx), Status.OK, "mode = cdi")
    assert_check(hardware.check_toolkit_envvar(ctx), Status.OK, "= false")
    tree.write(TOOLKIT, "[nvidia-container-runtime\n")
    assert_check(hardware.check_toolkit_envvar(ctx), Status.WARN, "not valid TOML",
                 fix="nvidia-ctk")


def _inventory(**host: Any) -> Inventory:
    return Inventory((Device("nic-0", DeviceType.NIC, {}, {}, HostInfo(**host)),))


def test_iommu(tree: Tree) -> None:
    assert_check(hardware.check_iommu(context(tree, discover=_inventory)),
                 Status.SKIPPED, "no device bound to vfio-pci")
    vfio = context(tree, discover=lambda: _inventory(driver="vfio-pci", iommu_group="40"))
    tree.dir("/sys/kernel/iommu_groups")
    assert_check(hardware.check_iommu(vfio), Status.FAIL, "iommu_groups is empty",
                 fix="intel_iommu=on")
    tree.dir("/sys/kernel/iommu_groups/40")
    assert_check(hardware.check_iommu(vfio), Status.OK, "1 IOMMU group(s) for 1 VFIO device")


def test_rdma_netns(tree: Tree) -> None:
    rdma = context(tree, discover=lambda: _inventory(rdma_device="mlx5_0"))
    assert_check(hardware.check_rdma_netns(context(tree, discover=_inventory)),
                 Status.SKIPPED, "no RDMA device")
    assert_check(hardware.check_rdma_netns(rdma), Status.WARN, "ib_core not loaded",
                 fix="modprobe")
    tree.write(NETNS, "Y\n")
    assert_check(hardware.check_rdma_netns(rdma), Status.WARN, "netns_mode = Y (shared)",
                 fix="rdma system set netns exclusive")
    tree.write(NETNS, "N\n")
    assert_check(hardware.check_rdma_netns(rdma), Status.OK, "netns_mode = N (exclusive)")
    tree.local(NETNS).unlink()
    tree.fifo(NETNS)
    assert_check(hardware.check_rdma_netns(rdma), Status.WARN, "is a FIFO", fix=NETNS)


def test_sriov(tree: Tree) -> None:
    vfs = Options(device_types=("vf",))
    assert_check(hardware.check_sriov(context(tree, options=vfs)), Status.SKIPPED,
                 "no SR-IOV capable device")
    _pci(tree, "0000:3b:00.0", sriov_totalvfs="0", sriov_numvfs="0")
    assert_check(hardware.check_sriov(context(tree, options=vfs)), Status.FAIL,
                 "SR-IOV off on 0000:3b:00.0", fix="SRIOV_EN=1")
    # Offering whole NICs too: VFs are not expected, a disabled SR-IOV is no fault.
    assert_check(hardware.check_sriov(context(tree)), Status.SKIPPED, "no VFs to offer")
    _pci(tree, "0000:3b:00.0", sriov_totalvfs="64", sriov_numvfs="0")
    assert_check(hardware.check_sriov(context(tree, options=vfs)), Status.WARN,
                 "no VF created on 0000:3b:00.0", fix="sriov_numvfs")
    _pci(tree, "0000:3b:00.0", sriov_totalvfs="64", sriov_numvfs="8")
    assert_check(hardware.check_sriov(context(tree, options=vfs)), Status.OK,
                 "8 VF(s) on 1 PF(s)")
    assert_check(hardware.check_sriov(context(tree, options=Options(device_types=("gpu",)))),
                 Status.SKIPPED, "VFs not offered")


def test_pci_attributes_through_sysfs_symlinks(tree: Tree) -> None:
    # Real sysfs: bus/pci/devices/<bdf> is a relative link into /sys/devices.
    tree.write("/sys/devices/pci0000:17/0000:18:00.0/vendor", "0x10de\n")
    tree.write("/sys/devices/pci0000:17/0000:18:00.0/class", "0x030200\n")
    tree.symlink("/sys/bus/pci/devices/0000:18:00.0", "../../../devices/pci0000:17/0000:18:00.0")
    assert hardware.nvidia_gpus(context(tree).host) == ["0000:18:00.0"]
    assert Path(tree.root, "sys/bus/pci/devices/0000:18:00.0").is_symlink()
