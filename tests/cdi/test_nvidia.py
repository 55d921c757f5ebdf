"""NVIDIA GPU and MIG edits from fixture driver installations, injected by the real library."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdi.edits import EditsProvider
from cdi.errors import DeviceEditsError
from cdi.files import write_spec
from cdi.spec import CDIDevice, Spec
from discovery.model import Device, DeviceType, HostInfo
from tests.cdi.conftest import Checker, gpu, mig
from tests.cdi.fakeroot import DRIVER_LIBS, LIB_DIR, RM, FakeHost, make_char_node, write

KIND = "k8s.dra-agent.io/claim"
UID = "5b1f0a52-3c1e-4d7e-9a55-0d9a3f1e2b7c"
OPTS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]


def provider(host: FakeHost, **kw: Any) -> EditsProvider:
    return EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys, **kw)


def claim_spec(p: EditsProvider, devices: list[Device]) -> Spec:
    return Spec(
        KIND,
        tuple(CDIDevice(f"{UID}-{d.name}", p.edits_for(d)) for d in devices),
        p.common_edits_for(devices),
    )


def inject(checker: Checker, tmp: Path, spec: Spec) -> dict[str, Any]:
    cdi_dir = tmp / "cdi"
    path = write_spec(cdi_dir, f"k8s.dra-agent.io-claim_{UID}.json", spec)
    checker.validate(path)
    return checker.inject(cdi_dir, *spec.qualified_names())


@pytest.fixture
def nvidia(host: FakeHost) -> FakeHost:
    host.install_driver()
    host.make_control_nodes()
    host.add_gpu(0, "0000:1b:00.0")
    return host


def expected_devices(host: FakeHost, paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        major, minor, mode = host.node(path)
        out.append({"path": path, "type": "c", "major": major, "minor": minor,
                    "fileMode": mode})  # fmt: skip
    return out


def lib_paths() -> list[str]:
    libs = [f"{LIB_DIR}/{stem}.{RM}" for stem in DRIVER_LIBS]
    return sorted([*libs, f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.{RM}"])


def test_hookless_gpu_spec_injects_nodes_libraries_tools_and_soname_mounts(
    nvidia: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    oci = inject(checker, tmp_path, claim_spec(provider(nvidia), [gpu()]))
    control = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    devices = [{k: d[k] for k in ("path", "type", "major", "minor", "fileMode")}
               for d in oci["linux"]["devices"]]  # fmt: skip
    assert devices == expected_devices(nvidia, [*control, "/dev/nvidia0"])
    mounts = {m["destination"]: m for m in oci["mounts"]}
    sonames = {f"{stem}.{major}" for stem, major in DRIVER_LIBS.items() if major}
    expected = {
        *lib_paths(),
        *(f"{LIB_DIR}/{s}" for s in sonames),
        *(f"/usr/local/nvidia/lib64/{s}" for s in sonames),
        f"{LIB_DIR}/vdpau/libvdpau_nvidia.so.1",
        "/usr/local/nvidia/lib64/libvdpau_nvidia.so.1",
        f"{LIB_DIR}/libcuda.so",
        "/usr/local/nvidia/lib64/libcuda.so",
        f"/usr/local/nvidia/lib64/libnvidia-gpucomp.so.{RM}",  # no SONAME of its own
        *(f"{d}/{t}" for d in ("/usr/bin", "/usr/local/nvidia/bin")
          for t in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")),
        f"/lib/firmware/nvidia/{RM}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{RM}/gsp_tu10x.bin",
        "/run/nvidia-persistenced/socket",
    }  # fmt: skip
    assert set(mounts) == expected
    root = str(nvidia.root)
    assert mounts[f"{LIB_DIR}/libcuda.so.1"]["source"] == f"{root}{LIB_DIR}/libcuda.so.{RM}"
    assert mounts["/usr/local/nvidia/lib64/libnvidia-ml.so.1"]["source"] == (
        f"{root}{LIB_DIR}/libnvidia-ml.so.{RM}"
    )
    assert mounts["/usr/bin/nvidia-smi"]["options"] == OPTS
    assert mounts["/run/nvidia-persistenced/socket"]["options"] == [
        "nosuid", "nodev", "rbind", "rprivate", "noexec",
    ]  # fmt: skip
    assert oci["process"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert "hooks" not in oci


def test_spec_with_hook_binary_uses_links_and_ldcache_hooks_instead(
    host: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    host.install_driver(hook="1.18.0")
    host.make_control_nodes(modeset=False)
    host.add_gpu(0, "0000:1b:00.0")
    oci = inject(checker, tmp_path, claim_spec(provider(host), [gpu()]))
    assert {m["destination"] for m in oci["mounts"]} == {
        *lib_paths(),
        "/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
        f"/lib/firmware/nvidia/{RM}/gsp_ga10x.bin", f"/lib/firmware/nvidia/{RM}/gsp_tu10x.bin",
        "/run/nvidia-persistenced/socket",
    }  # fmt: skip
    hook_path = f"{host.root}/usr/bin/nvidia-cdi-hook"
    hooks = oci["hooks"]["createContainer"]
    assert [h["args"][1] for h in hooks] == [
        "create-symlinks", "enable-cuda-compat", "update-ldcache",
        "disable-device-node-modification",
    ]  # fmt: skip
    assert all(h["path"] == hook_path and h["env"] == ["NVIDIA_CTK_DEBUG=false"] for h in hooks)
    links = hooks[0]["args"][2:]
    assert links[0::2] == ["--link"] * (len(links) // 2)
    assert f"libcuda.so.{RM}::{LIB_DIR}/libcuda.so.1" in links
    assert f"libcuda.so.1::{LIB_DIR}/libcuda.so" in links
    assert f"libnvidia-nvvm.so.{RM}::{LIB_DIR}/libnvidia-nvvm.so.4" in links
    assert not any("gpucomp" in link for link in links)  # its SONAME is its file name
    assert hooks[1]["args"][2:] == [f"--host-driver-version={RM}"]
    assert hooks[2]["args"][2:] == [
        "--folder", LIB_DIR, "--folder", f"{LIB_DIR}/vdpau", "--ldconfig-path", "/sbin/ldconfig",
    ]  # fmt: skip
    assert "/dev/nvidia-modeset" not in {d["path"] for d in oci["linux"]["devices"]}


def test_the_mps_pipe_directory_is_no_common_edit(nvidia: FakeHost) -> None:
    """The MPS control daemon's pipe directory holds its control socket: mounted into every
    NVIDIA container, it hands every tenant the node's MPS daemon (#28). Only an MPS share's
    devices get it (``agent.prepare.effects.mps``), so the driver's edits never name it."""
    (nvidia.root / "tmp" / "nvidia-mps").mkdir(parents=True)
    edits = provider(nvidia).common_edits_for([gpu()])
    assert not [m for m in edits.mounts if "nvidia-mps" in m.container_path]


@pytest.mark.parametrize("version", ["1.16.2", "garbage"])
def test_older_or_unknown_hook_gets_only_the_subcommands_every_release_has(
    host: FakeHost, version: str
) -> None:
    host.install_driver(hook=version)
    host.make_control_nodes()
    edits = provider(host).common_edits_for([gpu()])
    assert [h.args[1] for h in edits.hooks] == ["create-symlinks", "update-ldcache"]


def test_nvidia_ctk_is_called_through_its_hook_subcommand(nvidia: FakeHost) -> None:
    write(nvidia.root / "usr/bin/nvidia-ctk", "#!/bin/sh\necho 'CLI version 1.17.8'\n", 0o755)
    edits = provider(nvidia).common_edits_for([gpu()])
    assert [h.args[:3] for h in edits.hooks] == [
        ("nvidia-ctk", "hook", "create-symlinks"), ("nvidia-ctk", "hook", "enable-cuda-compat"),
        ("nvidia-ctk", "hook", "update-ldcache"),
    ]  # fmt: skip


def test_host_driver_root_rewrites_host_paths_only(nvidia: FakeHost) -> None:
    p = provider(nvidia, host_driver_root=Path("/run/nvidia/driver"))
    edits = p.common_edits_for([gpu()])
    cuda = next(m for m in edits.mounts if m.container_path == f"{LIB_DIR}/libcuda.so.{RM}")
    assert cuda.host_path == f"/run/nvidia/driver{LIB_DIR}/libcuda.so.{RM}"


def test_gpu_without_its_device_node_is_an_error_not_an_empty_spec(nvidia: FakeHost) -> None:
    nvidia.add_gpu(1, "0000:2b:00.0", node=False)
    with pytest.raises(DeviceEditsError, match=r"nvidia1 does not exist.*nvidia-modprobe") as info:
        provider(nvidia).edits_for(gpu("gpu-1", minor=1, pci="0000:2b:00.0"))
    assert info.value.device == "gpu-1"


def test_missing_control_node_fails_until_it_appears(nvidia: FakeHost) -> None:
    (nvidia.dev / "nvidia-uvm").unlink()
    p = provider(nvidia)
    with pytest.raises(DeviceEditsError, match="nvidia-uvm does not exist") as info:
        p.common_edits_for([gpu()])
    assert info.value.device == "gpu-0"
    make_char_node(nvidia.dev / "nvidia-uvm", 510, 0)
    nodes = [n.path for n in p.common_edits_for([gpu()]).device_nodes]
    assert "/dev/nvidia-uvm" in nodes


def test_libraries_of_another_version_than_the_loaded_module_are_refused(
    nvidia: FakeHost,
) -> None:
    nvidia.load_kernel_module("575.51.02")
    with pytest.raises(DeviceEditsError, match=r"575\.51\.02.*found libraries of 570\.86\.15"):
        provider(nvidia).common_edits_for([gpu()])


def test_no_driver_at_all_is_an_error(host: FakeHost) -> None:
    host.make_control_nodes()
    with pytest.raises(DeviceEditsError, match="no NVIDIA driver"):
        provider(host).common_edits_for([gpu()])


def test_driver_version_comes_from_libraries_without_procfs(nvidia: FakeHost) -> None:
    (nvidia.proc / "driver/nvidia/version").unlink()
    assert provider(nvidia).driver().version == RM


def test_common_edits_are_cached_and_rebuilt_on_driver_or_node_change(nvidia: FakeHost) -> None:
    p = provider(nvidia)
    first = p.driver()
    edits = p.common_edits_for([gpu()])
    assert p.driver() is first
    assert p.common_edits_for([gpu(), gpu("gpu-1", 1)]) is edits
    # A driver upgrade: new libraries, new module version.
    lib = nvidia.root / LIB_DIR.lstrip("/")
    for f in lib.glob(f"*.so.{RM}"):
        os.rename(f, str(f).replace(RM, "580.65.06"))
    nvidia.load_kernel_module("580.65.06")
    assert p.driver().version == "580.65.06"
    # A control node re-created (new inode, e.g. after a module reload).
    before = p.driver()
    (nvidia.dev / "nvidiactl").unlink()
    make_char_node(nvidia.dev / "nvidiactl", 195, 255)
    assert p.driver() is not before


def test_minor_is_read_from_procfs_when_inventory_lacks_it(nvidia: FakeHost) -> None:
    nvidia.add_gpu(3, "0000:5d:00.0")
    device = Device("gpu-3", DeviceType.GPU, {}, {},
                    host=HostInfo(pci_address="0000:5d:00.0", vendor="nvidia"))  # fmt: skip
    (node,) = provider(nvidia).edits_for(device).device_nodes
    assert node.path == "/dev/nvidia3"
    assert (node.major, node.minor) == nvidia.node("/dev/nvidia3")[:2]


def test_mig_device_gets_parent_node_and_its_two_capabilities(
    nvidia: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    gi_minor, ci_minor = nvidia.add_mig(0, gi=1, ci=0)
    assert (gi_minor, ci_minor) == (12, 13)
    spec = claim_spec(provider(nvidia), [mig()])
    oci = inject(checker, tmp_path, spec)
    by_path = {d["path"]: d for d in oci["linux"]["devices"]}
    assert by_path["/dev/nvidia-caps/nvidia-cap12"] == {
        "path": "/dev/nvidia-caps/nvidia-cap12", "type": "c", "major": 235, "minor": 12,
        "fileMode": 292,
    }  # fmt: skip
    assert by_path["/dev/nvidia-caps/nvidia-cap13"]["minor"] == 13
    assert "/dev/nvidia0" in by_path and "/dev/nvidiactl" in by_path
    raw = json.loads(spec_json := json.dumps(spec.to_dict()))
    caps = raw["devices"][0]["containerEdits"]["deviceNodes"][1:]
    assert all("hostPath" not in c for c in caps), spec_json


def test_discovered_node_lists_do_not_override_the_kind_rules(nvidia: FakeHost) -> None:
    nvidia.add_mig(0, gi=1, ci=0)
    base = mig()
    listed = ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13",
              "/dev/nvidiactl")  # fmt: skip
    device = Device(base.name, base.type, {}, {},
                    replace(base.host, dev_nodes=listed))  # fmt: skip
    # The cap nodes do not exist under /dev yet: they come from procfs, not from the list.
    edits = provider(nvidia).edits_for(device)
    assert [n.path for n in edits.device_nodes] == list(listed[:3])


def test_mig_instance_that_no_longer_exists_is_an_error(nvidia: FakeHost) -> None:
    nvidia.add_mig(0, gi=1, ci=0)
    with pytest.raises(DeviceEditsError, match="gi2/ci0 of GPU minor 0 does not exist"):
        provider(nvidia).edits_for(mig(gi=2))


def test_eight_gpu_claim_is_valid_and_shares_one_set_of_driver_edits(
    nvidia: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    devices = [gpu()]
    for m in range(1, 8):
        nvidia.add_gpu(m, f"0000:{m:02x}:00.0")
        devices.append(gpu(f"gpu-{m}", m, f"0000:{m:02x}:00.0"))
    oci = inject(checker, tmp_path, claim_spec(provider(nvidia), devices))
    paths = [d["path"] for d in oci["linux"]["devices"]]
    assert paths.count("/dev/nvidiactl") == 1
    assert {f"/dev/nvidia{m}" for m in range(8)} <= set(paths)
