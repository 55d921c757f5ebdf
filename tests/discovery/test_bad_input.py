"""Odd sysfs trees, NVML failures and names: a device is skipped or a field omitted, with a
log line naming the file; the scan itself never fails."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from discovery.gpulib import (
    GpuIsLostError,
    GpuLibraryError,
    LibraryNotFoundError,
    NotSupportedError,
)
from discovery.host import host_sources
from discovery.model import NUMA_NODE, PCI_BUS_ID
from discovery.names import is_dns_label, mig_name, pci_name, sanitize
from discovery.nvml import NvmlLibrary
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import FakeNvml, simulated_sources
from discovery.simulate.tree import PciSpec, SysfsBuilder
from discovery.sources import Sources


class NoRoutes:
    def __init__(self, defaults: frozenset[str] = frozenset(),
                 addrs: Mapping[str, frozenset[str]] | None = None) -> None:
        self.defaults = defaults
        self.addrs = addrs or {}

    def default_route_interfaces(self) -> frozenset[str]:
        return self.defaults

    def interface_addresses(self) -> Mapping[str, frozenset[str]]:
        return self.addrs


def _mini(root: Path, count: int = 4) -> SysfsBuilder:
    """``count`` Ethernet NICs at 0000:0N:00.0 on pci0000:00, each with eth<N>."""
    sys = SysfsBuilder(root)
    for i in range(1, count + 1):
        dev = sys.function(PciSpec(f"0000:0{i}:00.0", "pci0000:00", (), 0x8086, 0x1572,
                                   0x020000, numa_node=0, driver="i40e"))
        sys.net(dev, f"eth{i}", {"address": f"02:00:00:00:00:0{i}", "mtu": "1500",
                                 "operstate": "up", "type": "1", "speed": "10000"})
    return sys


def _sources(root: Path, gpu: FakeNvml | None = None, routes: NoRoutes | None = None) -> Sources:
    return Sources(sysfs_root=root, gpu=gpu, dev_root=root / "dev", routes=routes or NoRoutes())


def _dev(root: Path, bdf: str) -> Path:
    return Path(os.path.realpath(root / "bus/pci/devices" / bdf))


def _logged_file(caplog: pytest.LogCaptureFixture, path: Path) -> bool:
    return any(getattr(r, "file", None) == str(path) for r in caplog.records)


def test_missing_and_minus_one_numa_node_are_omitted(workdir: Path) -> None:
    _mini(workdir)
    (_dev(workdir, "0000:01:00.0") / "numa_node").unlink()
    (_dev(workdir, "0000:02:00.0") / "numa_node").write_text("-1\n")
    devices = discover(_sources(workdir)).by_name()
    assert NUMA_NODE not in devices["nic-0000-01-00-0"].attributes
    assert NUMA_NODE not in devices["nic-0000-02-00-0"].attributes
    assert devices["nic-0000-03-00-0"].attributes[NUMA_NODE] == (0,)  # no distances: itself


def test_garbage_value_is_omitted_and_the_file_is_named(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _mini(workdir)
    bad = _dev(workdir, "0000:01:00.0") / "numa_node"
    bad.write_text("banana\n")
    mtu = _dev(workdir, "0000:02:00.0") / "net/eth2/mtu"
    mtu.write_bytes(b"\xff\xfe\n")
    with caplog.at_level(logging.INFO):
        devices = discover(_sources(workdir)).by_name()
    assert NUMA_NODE not in devices["nic-0000-01-00-0"].attributes
    assert "mtu" not in devices["nic-0000-02-00-0"].attributes
    assert _logged_file(caplog, bad) and _logged_file(caplog, mtu)


def test_unreadable_attribute_file_is_logged_not_fatal(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _mini(workdir)
    speed = _dev(workdir, "0000:03:00.0") / "net/eth3/speed"
    speed.unlink()
    speed.mkdir()  # reading it fails with EISDIR, like EINVAL on a down link
    with caplog.at_level(logging.INFO):
        devices = discover(_sources(workdir)).by_name()
    assert "speedMbps" not in devices["nic-0000-03-00-0"].host.extra
    assert devices["nic-0000-03-00-0"].attributes["ifName"] == "eth3"
    assert _logged_file(caplog, speed)


def test_device_removed_mid_scan_is_skipped(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _mini(workdir)
    shutil.rmtree(_dev(workdir, "0000:02:00.0"))  # the bus link now dangles
    vendorless = _dev(workdir, "0000:04:00.0")
    (vendorless / "vendor").unlink()  # half torn down
    with caplog.at_level(logging.INFO):
        inv = discover(_sources(workdir))
    assert sorted(inv.by_name()) == ["nic-0000-01-00-0", "nic-0000-03-00-0"]
    assert _logged_file(caplog, workdir / "bus/pci/devices/0000:02:00.0")
    assert _logged_file(caplog, vendorless / "vendor")


def test_bond_slave_of_the_default_route_is_reserved(workdir: Path) -> None:
    sys = _mini(workdir)
    sys.virtual_net("bond0", {"mtu": "1500"})
    for lower in ("eth1", "eth2"):
        os.symlink(f"../{lower}", workdir / "devices/virtual/net/bond0" / f"lower_{lower}")
    routes = NoRoutes(defaults=frozenset({"bond0"}),
                      addrs={"eth4": frozenset({"10.0.0.5"})})
    inv = discover(_sources(workdir, routes=routes), DiscoveryOptions(node_addresses=("10.0.0.5",)))
    assert inv.reserved == {
        "nic-0000-01-00-0": "eth1: stacked under bond0, which carries the default route",
        "nic-0000-02-00-0": "eth2: stacked under bond0, which carries the default route",
        "nic-0000-04-00-0": "eth4: holds the node address 10.0.0.5",
    }
    assert list(inv.by_name()) == ["nic-0000-03-00-0"]


def test_unusual_pci_domain_still_gives_dns_label_names(workdir: Path) -> None:
    sys = SysfsBuilder(workdir)
    sys.function(PciSpec("10000:e1:00.0", "pci10000:e0", (), 0x15B3, 0x1021, 0x020700))
    (device,) = discover(_sources(workdir)).devices
    assert device.name == "nic-10000-e1-00-0" and is_dns_label(device.name)


def test_names_are_sanitised_into_dns_labels(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert sanitize("GPU_0.Fast") == "gpu-0-fast"
    assert any(getattr(r, "original", None) == "GPU_0.Fast" for r in caplog.records)
    long_a, long_b = sanitize("x" * 80 + "a"), sanitize("x" * 80 + "b")
    assert len(long_a) <= 63 and is_dns_label(long_a) and long_a != long_b
    assert sanitize("---") == "device"
    assert mig_name(0, "1g.10gb+me", 6) == "gpu-0-mig-1g10gbme-6"
    assert pci_name("vf", "0000:3b:0a.7") == "vf-0000-3b-0a-7"


# -- NVML ---------------------------------------------------------------------------------


def _fake(sources: Sources) -> FakeNvml:
    assert isinstance(sources.gpu, FakeNvml)
    return sources.gpu


def test_nvml_error_on_one_gpu_skips_only_that_gpu(workdir: Path) -> None:
    sources = simulated_sources("dgx-h100", workdir)
    fake = _fake(sources)
    fake.fail("device_name", GpuLibraryError("Unknown Error"), uuid=fake.gpus[3].uuid)
    fake.set_lost(fake.gpus[5].uuid)
    inv = discover(sources)
    gpus = [d.name for d in inv.devices if d.type == "gpu"]
    assert gpus == ["gpu-0", "gpu-1", "gpu-2", "gpu-4", "gpu-6", "gpu-7"]
    assert len([d for d in inv.devices if d.type == "nic"]) == 12
    assert any("GPU index 3" in w and "Unknown Error" in w for w in inv.warnings)
    assert any("GPU index 5" in w and "lost" in w for w in inv.warnings)


def test_nvml_error_on_a_mig_device_skips_that_gpus_migs(workdir: Path) -> None:
    sources = simulated_sources("dgx-a100-mig", workdir)
    fake = _fake(sources)
    fake.fail("device_mig_attributes", GpuIsLostError("GPU is lost"), uuid=fake.gpus[1].uuid)
    fake.fail("driver_version", NotSupportedError("Not Supported"))
    inv = discover(sources)
    migs = [d.name for d in inv.devices if d.type == "mig"]
    assert not [m for m in migs if m.startswith("gpu-1-")]
    assert len(migs) == 18 - 4
    assert sum("gpu-1: MIG device" in w for w in inv.warnings) == 4
    assert "driverVersion" not in inv.devices[0].attributes
    assert any("driver version" in w for w in inv.warnings)


def test_no_nvml_library_skips_gpus_with_one_warning_and_keeps_nics(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sources = simulated_sources("dgx-h100", workdir)
    _fake(sources).init_error = LibraryNotFoundError("NVML Shared Library Not Found")
    with caplog.at_level(logging.INFO):
        inv = discover(sources)
        discover(sources)  # a rescan does not repeat the log line
    assert [d.type for d in inv.devices] == ["nic"] * 12
    assert len(inv.warnings) == 1 and "0000:1b:00.0" in inv.warnings[0]
    assert sum(r.getMessage() == "NVML not available, NVIDIA GPUs skipped"
               for r in caplog.records) == 1


def test_no_nvml_library_without_nvidia_hardware_is_silent(workdir: Path) -> None:
    sources = simulated_sources("sriov-nic", workdir)
    _fake(sources).init_error = LibraryNotFoundError("NVML Shared Library Not Found")
    assert discover(sources).warnings == ()


def test_real_nvml_library_missing_is_mapped_to_library_not_found() -> None:
    lib = NvmlLibrary()
    with pytest.raises(LibraryNotFoundError):
        lib.init()


def test_nvml_errors_are_translated_by_return_code() -> None:
    class NVMLError_GpuIsLost(Exception):  # noqa: N801, N818 - pynvml's own naming
        value = 15

    class Module:
        def nvmlInit(self) -> None:
            pass

        def nvmlDeviceGetCount(self) -> int:
            raise NVMLError_GpuIsLost("GPU is lost")

    lib = NvmlLibrary(module=Module())
    lib.init()
    with pytest.raises(GpuIsLostError) as err:
        lib.device_count()
    assert err.value.code == 15 and "device_count" in str(err.value)


def test_real_sysfs_of_this_machine_keeps_the_invariants() -> None:
    inv = discover(host_sources())
    assert inv.devices or inv.reserved  # this VM has at least its virtio NIC
    for device in inv.devices:
        assert is_dns_label(device.name)
        bdf = str(device.attributes[PCI_BUS_ID])
        assert device.name.endswith(bdf.replace(":", "-").replace(".", "-"))
        assert len(device.to_api()["attributes"]) + len(device.capacity) <= 32
    defaults = host_sources().routes.default_route_interfaces()
    offered_ifaces = {d.attributes.get("ifName") for d in inv.devices}
    assert not offered_ifaces & defaults
    for iface in defaults:  # a PCI NIC carrying the default route is listed as reserved
        if Path(f"/sys/class/net/{iface}/device").exists():
            assert any(r.startswith(f"{iface}: ") for r in inv.reserved.values())


def test_gpu_name_follows_the_minor_not_the_nvml_index(workdir: Path) -> None:
    sources = simulated_sources("dgx-h100", workdir)
    fake = _fake(sources)
    fake.gpus[0].minor, fake.gpus[3].minor = 3, 0  # a workstation-style numbering
    devices = discover(sources).by_name()
    assert devices["gpu-3"].attributes[PCI_BUS_ID] == "0000:1b:00.0"
    assert devices["gpu-3"].attributes["index"] == 0
    assert devices["gpu-3"].host.dev_nodes[0] == "/dev/nvidia3"
    assert devices["gpu-0"].attributes["index"] == 3


def test_amd_and_intel_gpus_come_from_drm(workdir: Path) -> None:
    sys = SysfsBuilder(workdir)
    amd = sys.function(PciSpec("0000:c1:00.0", "pci0000:c0", ("0000:c0:01.1",), 0x1002,
                               0x74A1, 0x038000, numa_node=1, driver="amdgpu"))
    sys.drm(amd, card=1, render=129)
    intel = sys.function(PciSpec("0000:00:02.0", "pci0000:00", (), 0x8086, 0x56C0, 0x030000,
                                 driver="i915"))
    sys.drm(intel, card=0, render=128)
    sys.function(PciSpec("0000:00:01.0", "pci0000:00", (), 0x1234, 0x1111, 0x030000))  # bochs
    devices = discover(_sources(workdir)).by_name()
    assert sorted(devices) == ["gpu-0000-00-02-0", "gpu-0000-c1-00-0"]
    mi = devices["gpu-0000-c1-00-0"]
    assert mi.type == "gpu" and mi.attributes["vendor"] == "amd"
    assert mi.attributes["cardIndex"] == 1 and mi.attributes["renderIndex"] == 129
    assert mi.attributes[NUMA_NODE] == (1,) and mi.attributes["pciDeviceID"] == "74a1"
    assert mi.host.dev_nodes == ("/dev/dri/card1", "/dev/dri/renderD129", "/dev/kfd")
    assert devices["gpu-0000-00-02-0"].host.dev_nodes == ("/dev/dri/card0", "/dev/dri/renderD128")
    no_gpus = discover(_sources(workdir), DiscoveryOptions(device_types=("nic",)))
    assert no_gpus.devices == ()


def test_oversized_devices_are_cut_to_the_api_limits(caplog: pytest.LogCaptureFixture) -> None:
    from discovery.attrs import fit_limits
    from discovery.model import Device, DeviceType

    attrs: dict[str, object] = {f"extra{i:02d}": i for i in range(40)}
    attrs.update(productName="x" * 100, pciVendorID="10de", driver="nvidia")
    device = Device("gpu-0", DeviceType.GPU, attrs, {"memory": "1Gi"})  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        fitted = fit_limits(device)
    api = fitted.to_api()
    assert len(api["attributes"]) + len(api["capacity"]) == 32
    assert fitted.attributes["productName"] == "x" * 64
    assert "pciVendorID" not in fitted.attributes and "driver" not in fitted.attributes
    assert any(getattr(r, "attribute", None) == "productName" for r in caplog.records)


def test_pci_names_are_matched_whole(tmp_path: Path) -> None:
    from discovery.sysfs import Sysfs, parse_chain

    devices = tmp_path / "bus" / "pci" / "devices"
    for name in ("0000:3b:00.0", "0000:3b:00.0\n", "0000:3b:00.1x", "x0000:3b:00.2"):
        (devices / name).mkdir(parents=True)
    assert Sysfs(tmp_path).pci_addresses() == ["0000:3b:00.0"]
    assert parse_chain(Path("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0")) == (
        "pci0000:3a", ("0000:3a:00.0", "0000:3b:00.0"))
    assert parse_chain(Path("/sys/devices/pci0000:3a\n/0000:3b:00.0")) == (None, ())
