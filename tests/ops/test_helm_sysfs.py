"""What of the host's /sys the chart lets the agent write: nothing, unless ``vfs: dynamic``, and
then exactly the PCI part of sysfs that VFs on demand write (``discovery.vfs.SysfsSriov``:
``sriov_numvfs``, ``driver_override``, ``unbind``, ``drivers_probe``), each path as the kernel
resolves it through sysfs's links, never the rest (kernel, modules, power, CPU hotplug).

The writes are not listed by hand: the agent's own SysfsSriov runs against a simulated node's
sysfs tree (links laid out as the kernel's), and every file it changed is looked up in the
rendered DaemonSet's mounts, the deepest mount holding it deciding, as in the container.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from discovery.simulate import simulated_sources
from discovery.vfs import SriovError, SysfsSriov
from tests.ops.test_helm import _container, template

Obj = dict[str, Any]

# The first test may build helm (tests/ops/conftest.py), inside its own setup.
pytestmark = pytest.mark.timeout(1800)

#: Host paths that stay read-only whatever the values: plain sysfs, no submount of its own
#: (cgroupfs, debugfs, securityfs are mounts of their own, outside what these mounts decide).
STAYS_READ_ONLY = (
    "/sys/power/state",  # suspend the machine
    "/sys/kernel/uevent_helper",  # a program the kernel runs as root
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/module/mlx5_core/parameters/prof_sel",  # module parameters
    "/sys/devices/system/cpu/cpu1/online",  # CPU and memory hotplug
    "/sys/devices/system/memory/memory0/online",
    "/sys/devices/virtual/net/lo/mtu",  # virtual devices
    "/sys/bus/usb/drivers_probe",  # other buses
    "/sys/class/gpio/export",  # class attributes
    "/sys/firmware/acpi/tables/DSDT",
)


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every regular file under ``root`` (links not followed: each file once, at its real
    path), its modification time and bytes (a write of the same bytes changes the time)."""
    out: dict[str, tuple[int, bytes]] = {}
    for top, _, names in os.walk(root):
        for name in names:
            path = Path(top, name)
            if not path.is_symlink():
                out[str(path.relative_to(root))] = (path.stat().st_mtime_ns, path.read_bytes())
    return out


def _sriov_writes(tmp: Path) -> set[str]:
    """The host paths SysfsSriov writes to make a PF's VFs and rebind one (vf.driver)."""
    sysfs = simulated_sources("sriov-nic", tmp / "node").sysfs_root
    devices = sysfs / "bus" / "pci" / "devices"
    pf = next(d.name for d in sorted(devices.iterdir()) if (d / "virtfn0").exists())
    vf = (devices / pf / "virtfn0").resolve().name
    total = int((devices / pf / "sriov_totalvfs").read_text())
    before = _files(sysfs)
    time.sleep(0.01)  # past the file system's time granularity
    control = SysfsSriov(sysfs, timeout_s=0)
    control.set_num_vfs(pf, total)  # the simulated VFs exist already: no wait
    with contextlib.suppress(SriovError):  # nothing binds in a file tree
        control.bind(vf, "vfio-pci")
    after = _files(sysfs)
    return {f"/sys/{p}" for p, data in after.items() if before.get(p) != data}


def _mount_of(container: Obj, path: str) -> Obj:
    """The mount that holds ``path`` in the container: the deepest whose path contains it."""
    holding = [m for m in container["volumeMounts"]
               if PurePosixPath(path).is_relative_to(m["mountPath"])]
    assert holding, path
    return max(holding, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))


def _writable(container: Obj, path: str) -> bool:
    return not _mount_of(container, path).get("readOnly", False)


def _sys_mounts(objects: list[Obj]) -> dict[str, tuple[str, bool]]:
    """mountPath -> (host path, writable) of every mount at or under /sys."""
    pod = _pod(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    (container,) = pod["containers"]
    return {m["mountPath"]: (volumes[m["name"]]["hostPath"]["path"],
                             not m.get("readOnly", False))
            for m in container["volumeMounts"]
            if PurePosixPath(m["mountPath"]).is_relative_to("/sys")}


def _pod(objects: list[Obj]) -> Obj:
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert isinstance(pod, dict)
    return pod


def test_what_vfs_on_demand_write_is_what_sysfs_sriov_writes(tmp_path: Path) -> None:
    writes = _sriov_writes(tmp_path)
    names = sorted(PurePosixPath(p).name for p in writes)
    assert names == ["driver_override", "drivers_probe", "sriov_numvfs", "unbind"], writes
    assert {p for p in writes if not p.startswith("/sys/devices/pci")} == {
        "/sys/bus/pci/drivers_probe", "/sys/bus/pci/drivers/mlx5_core/unbind"}


def test_vfs_dynamic_can_write_what_it_writes(helm: Path, tmp_path: Path) -> None:
    container = _container(template(helm, tmp_path, {"vfs": "dynamic"}))
    for path in sorted(_sriov_writes(tmp_path)):
        assert _writable(container, path), (path, _mount_of(container, path))


def test_vfs_dynamic_cannot_write_the_rest_of_sys(helm: Path, tmp_path: Path) -> None:
    container = _container(template(helm, tmp_path, {"vfs": "dynamic"}))
    for path in STAYS_READ_ONLY:
        assert not _writable(container, path), (path, _mount_of(container, path))


def test_gpu_passthrough_gets_the_rebinds_it_makes_and_no_more(helm: Path,
                                                                tmp_path: Path) -> None:
    """--gpu-passthrough writes driver_override, unbind and drivers_probe, as a VF's rebind."""
    objects = template(helm, tmp_path, {"gpuPassthrough": True})
    container = _container(objects)
    assert "--gpu-passthrough" in container["args"]
    for path in sorted(p for p in _sriov_writes(tmp_path) if not p.endswith("sriov_numvfs")):
        assert _writable(container, path), (path, _mount_of(container, path))
    for path in STAYS_READ_ONLY:
        assert not _writable(container, path), (path, _mount_of(container, path))
    assert _sys_mounts(objects) == _sys_mounts(template(helm, tmp_path, {"vfs": "dynamic"}))


def test_vfs_dynamic_mounts_sysfs_at_its_host_paths(helm: Path, tmp_path: Path) -> None:
    mounts = _sys_mounts(template(helm, tmp_path, {"vfs": "dynamic"}))
    assert mounts == {"/sys": ("/sys", False), "/sys/bus/pci": ("/sys/bus/pci", True),
                      "/sys/devices": ("/sys/devices", True),
                      "/sys/devices/system": ("/sys/devices/system", False),
                      "/sys/devices/virtual": ("/sys/devices/virtual", False)}


@pytest.mark.parametrize("values", [{}, {"vfs": "static"}, {"mig": "dynamic"}])
def test_without_vfs_on_demand_sys_is_read_only(helm: Path, tmp_path: Path,
                                                values: Obj) -> None:
    assert _sys_mounts(template(helm, tmp_path, values)) == {"/sys": ("/sys", False)}


_PROBE = """\
import json, os, sys
view, paths = sys.argv[1], json.loads(sys.argv[2])
print(json.dumps({p: os.access(view + p, os.W_OK) for p in paths}))
"""


def _real_paths() -> tuple[list[str], list[str]] | None:
    """(paths VFs on demand write, paths that must stay read-only) on this machine's sysfs,
    as the agent names them (through /sys/bus/pci/devices and its links); None without a PCI
    function bound to a driver."""
    devices = Path("/sys/bus/pci/devices")
    bound = sorted(d.name for d in devices.iterdir() if (d / "driver").is_symlink()) \
        if devices.is_dir() else []
    if not bound:
        return None
    fn = f"/sys/bus/pci/devices/{bound[0]}"
    stays = [p for p in ("/sys/power/state", "/sys/kernel/uevent_helper",
                         "/sys/devices/system/cpu/online", "/sys/module/kernel/parameters/panic")
             if os.path.exists(p)]
    stays += [str(next(Path("/sys/devices/virtual").rglob("uevent")))]
    return [f"{fn}/driver_override", f"{fn}/driver/unbind", "/sys/bus/pci/drivers_probe"], stays


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare: the chart's /sys mounts made for real")
def test_the_charts_sys_mounts_on_this_kernel(helm: Path, tmp_path: Path) -> None:
    """The rendered mounts made as a runtime makes them (host path bound recursively at the
    mount path, parents first, read-only ones remounted so), in a private mount namespace over
    this machine's /sys; what is writable is asked with access(2), nothing is written."""
    paths = _real_paths()
    if paths is None:
        pytest.skip("no PCI function bound to a driver on this machine")
    writes, stays = paths
    view = tmp_path / "view"
    mounts = sorted(_sys_mounts(template(helm, tmp_path, {"vfs": "dynamic"})).items(),
                    key=lambda m: len(PurePosixPath(m[0]).parts))
    steps = []
    for where, (host, writable) in mounts:
        target = f"{view}{where}"
        steps.append(f"mkdir -p {target} && mount --rbind {host} {target}")
        if not writable:
            steps.append(f"mount -o remount,bind,ro {target}")
    script = " && ".join([*steps, f'exec {sys.executable} -c "$1" {view} "$2"'])
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                          "sh", _PROBE, json.dumps(writes + stays)],
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0 and "unshare:" in out.stderr:
        pytest.skip(f"no private mount namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    writable = json.loads(out.stdout)
    assert {p: writable[p] for p in writes} == dict.fromkeys(writes, True)
    assert {p: writable[p] for p in stays} == dict.fromkeys(stays, False)


def test_the_hosts_pod_namespaces_are_mounted_only_for_rdma_exclusive(helm: Path,
                                                                       tmp_path: Path) -> None:
    """HostToContainer on a host whose /run/netns is a private mount fails the agent's
    container ("not a shared or slave mount", seen on the whole node): off by default."""
    def netns(values: Obj) -> list[Any]:
        return [m for m in _container(template(helm, tmp_path, values))["volumeMounts"]
                if m["mountPath"] == "/run/netns"]

    assert netns({}) == []
    assert netns({"rdmaExclusive": True}) == [{"name": "netns", "mountPath": "/run/netns",
                                               "readOnly": True,
                                               "mountPropagation": "HostToContainer"}]
