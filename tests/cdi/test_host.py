"""Host lookups: rooted symlinks, /proc/devices, the driver version, explicit hook paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.edits import EditsProvider
from cdi.errors import DeviceEditsError
from cdi.host import HostLookupError, read_proc_devices, resolve_in_root, stat_char_node
from cdi.nvidia_driver import kernel_driver_version
from tests.cdi.conftest import gpu
from tests.cdi.fakeroot import LIB_DIR, RM, FakeHost, write


def test_absolute_links_inside_a_driver_root_stay_inside_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    real = write(root / "opt/nvidia/lib/libcuda.so.1.2", b"x")
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libcuda.so.1").symlink_to("/opt/nvidia/lib/libcuda.so.1.2")
    (root / "usr/lib/up").symlink_to("../../opt/./nvidia/lib")
    assert resolve_in_root(root, root / "usr/lib/libcuda.so.1") == real
    assert resolve_in_root(root, root / "usr/lib/up/libcuda.so.1.2") == real
    (root / "loop").symlink_to("/loop")
    with pytest.raises(HostLookupError, match="symbolic links"):
        resolve_in_root(root, root / "loop")


def test_driver_libraries_behind_absolute_links_are_bound_from_the_real_file(
    host: FakeHost,
) -> None:
    host.install_driver()
    host.make_control_nodes()
    lib = host.root / LIB_DIR.lstrip("/")
    target = host.root / "opt/nvidia" / f"libcuda.so.{RM}"
    target.parent.mkdir(parents=True)
    os.rename(lib / f"libcuda.so.{RM}", target)
    (lib / f"libcuda.so.{RM}").symlink_to(f"/opt/nvidia/libcuda.so.{RM}")
    edits = EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys).common_edits_for(
        [gpu()]
    )
    cuda = [m for m in edits.mounts if m.host_path == str(target)]
    # Mounted where the host linker finds it, so ld.so in the container looks there too.
    assert {m.container_path for m in cuda} == {
        f"{LIB_DIR}/libcuda.so.{RM}", f"{LIB_DIR}/libcuda.so.1", f"{LIB_DIR}/libcuda.so",
        "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so",
    }  # fmt: skip


def test_proc_devices_majors_come_from_the_character_section(tmp_path: Path) -> None:
    write(tmp_path / "devices", "Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n\n"
          "Block devices:\n259 blkext\n  8 nvidia-uvm\n")  # fmt: skip
    assert read_proc_devices(tmp_path) == {"nvidia-frontend": 195, "nvidia-uvm": 511}
    with pytest.raises(HostLookupError, match="cannot read"):
        read_proc_devices(tmp_path / "missing")


@pytest.mark.parametrize(
    ("line", "version"),
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC "
         "2024", "550.54.15"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
         "(dvs-builder@U16)  Tue Jan  7 17:41:15 UTC 2025", "570.86.15"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  575.51  Release Build",
         "575.51"),
        ("garbage", None),
    ],
)  # fmt: skip
def test_kernel_driver_version_from_both_module_flavours(
    tmp_path: Path, line: str, version: str | None
) -> None:
    write(tmp_path / "driver/nvidia/version", line + "\nGCC version:  gcc version 12.3.0\n")
    assert kernel_driver_version(tmp_path) == version


def test_kernel_driver_version_falls_back_to_sysfs(tmp_path: Path) -> None:
    write(tmp_path / "sys/module/nvidia/version", "550.54.15\n")
    assert kernel_driver_version(tmp_path / "proc", tmp_path / "sys") == "550.54.15"
    assert kernel_driver_version(tmp_path / "proc") is None


def test_non_char_nodes_are_refused(tmp_path: Path) -> None:
    write(tmp_path / "nvidia0", "")
    with pytest.raises(HostLookupError, match="not a character device"):
        stat_char_node(tmp_path / "nvidia0")


def test_explicit_hook_outside_the_driver_root_keeps_its_own_path(
    host: FakeHost, tmp_path: Path
) -> None:
    host.install_driver()
    host.make_control_nodes()
    hook = write(tmp_path / "toolkit/nvidia-cdi-hook", "#!/bin/sh\necho version 1.17.5\n", 0o755)
    p = EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys, hook_path=str(hook))
    hooks = p.common_edits_for([gpu()]).hooks
    assert {h.path for h in hooks} == {str(hook)}
    assert [h.args[1] for h in hooks] == ["create-symlinks", "enable-cuda-compat",
                                          "update-ldcache"]  # fmt: skip
    missing = EditsProvider(host.root, host.dev, host.proc, hook_path="/nope/nvidia-cdi-hook")
    with pytest.raises(DeviceEditsError, match="hook binary /nope/nvidia-cdi-hook not found"):
        missing.common_edits_for([gpu()])
