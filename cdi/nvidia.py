"""Container edits for NVIDIA GPUs and MIG devices.

Common edits (once per claim): the control nodes, every user-space library of the loaded
driver version, the tools, GSP firmware, IPC sockets, and either the toolkit's hooks (links +
ld cache) or, without a hook binary, extra mounts that put each library under its SONAME
where ``ld.so`` looks by default and under ``/usr/local/nvidia`` where CUDA images point
``LD_LIBRARY_PATH`` and ``PATH``. Per device: ``/dev/nvidia<minor>``, and for MIG the GPU- and
compute-instance access capabilities.
"""

from __future__ import annotations

import os
from pathlib import Path

from cdi.host import (
    HostLookupError,
    char_node,
    in_root,
    read_key_values,
    read_proc_devices,
)
from cdi.nvidia_driver import DriverFile, DriverRoot, HookBinary
from cdi.spec import ContainerEdits, DeviceNode, Hook, Mount

REQUIRED_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
OPTIONAL_CONTROL_NODES = ("/dev/nvidia-modeset",)
FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")
HOOKLESS_LIB_DIR = "/usr/local/nvidia/lib64"
HOOKLESS_BIN_DIR = "/usr/local/nvidia/bin"
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES=void"
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
#: First nvidia-cdi-hook releases with these subcommands (older binaries fail on them).
CUDA_COMPAT_SINCE = (1, 17, 5)
NODE_MODIFICATION_SINCE = (1, 18, 0)
NODE_CREATION_HINT = (
    "the driver's device nodes are created by nvidia-modprobe (run by nvidia-smi) or by "
    "'nvidia-ctk system create-device-nodes --control-devices'"
)


def control_nodes(dev_root: Path) -> tuple[DeviceNode, ...]:
    """The shared NVIDIA nodes; ``HostLookupError`` if a required one is missing."""
    nodes: list[DeviceNode] = []
    for path in REQUIRED_CONTROL_NODES:
        try:
            nodes.append(char_node(dev_root, path))
        except HostLookupError as err:
            raise HostLookupError(f"{err.reason}; {NODE_CREATION_HINT}") from err
    for path in OPTIONAL_CONTROL_NODES:
        try:
            nodes.append(char_node(dev_root, path))
        except HostLookupError:
            continue  # nvidia-modeset is loaded only on display-capable setups
    return tuple(nodes)


def _host(host_root: Path, path: str) -> str:
    return str(in_root(host_root, path))


def _file_mount(host_root: Path, file: DriverFile, container_path: str) -> Mount:
    return Mount(_host(host_root, file.path), container_path, FILE_MOUNT_OPTIONS)


def driver_edits(driver: DriverRoot, host_root: Path) -> ContainerEdits:
    """Mounts, hooks and env for the driver installation (no device nodes).

    ``host_root`` is where the host (the runtime) sees the driver root: equal to
    ``driver.root`` unless the agent sees the driver at another path.
    """
    mounts: list[Mount] = []
    hooks: list[Hook] = []
    hook = driver.hook
    for lib in driver.libraries:
        mounts.append(_file_mount(host_root, lib.file, lib.file.link_path))
    if hook is None:
        mounts += _hookless_library_mounts(driver, host_root)
    for binary in driver.binaries:
        mounts.append(_file_mount(host_root, binary, binary.link_path))
        if hook is None:
            name = os.path.basename(binary.link_path)
            mounts.append(_file_mount(host_root, binary, f"{HOOKLESS_BIN_DIR}/{name}"))
    for firmware in driver.firmware:
        mounts.append(_file_mount(host_root, firmware, firmware.link_path))
    for ipc in driver.ipc:
        mounts.append(Mount(_host(host_root, ipc.path), ipc.path, IPC_MOUNT_OPTIONS))
    if hook is not None:
        hooks = _hooks(driver, hook, host_root)
    return ContainerEdits(env=(VISIBLE_DEVICES_ENV,), mounts=tuple(mounts), hooks=tuple(hooks))


def _links(driver: DriverRoot) -> list[tuple[str, str]]:
    """(target, link) pairs a container needs: SONAME links and ``libcuda.so``."""
    links: list[tuple[str, str]] = []
    for lib in driver.libraries:
        folder, name = os.path.split(lib.file.link_path)
        if lib.soname and lib.soname != name:
            links.append((name, f"{folder}/{lib.soname}"))
            # Many programs dlopen("libcuda.so") although only the SONAME is an ABI promise.
            if lib.soname == "libcuda.so.1":
                links.append((lib.soname, f"{folder}/libcuda.so"))
    return links


def _hookless_library_mounts(driver: DriverRoot, host_root: Path) -> list[Mount]:
    # No hook can create links or refresh the ld cache, so bind the real file again under
    # each name a program may look for: beside it (a default search dir on the host's distro
    # family) and in /usr/local/nvidia/lib64 (on CUDA images' LD_LIBRARY_PATH).
    by_name = {os.path.basename(lib.file.link_path): lib for lib in driver.libraries}
    mounts: list[Mount] = []
    for target, link in _links(driver):
        lib = by_name.get(target) or next((x for x in driver.libraries if x.soname == target), None)
        if lib is None:
            continue
        name = os.path.basename(link)
        mounts.append(_file_mount(host_root, lib.file, link))
        mounts.append(_file_mount(host_root, lib.file, f"{HOOKLESS_LIB_DIR}/{name}"))
    for lib in driver.libraries:
        # A library loaded by its full versioned name (libnvidia-gpucomp) must be found in
        # the dedicated dir too, for images whose default dirs differ from the host's.
        name = os.path.basename(lib.file.link_path)
        if lib.soname in (None, name):
            mounts.append(_file_mount(host_root, lib.file, f"{HOOKLESS_LIB_DIR}/{name}"))
    return mounts


def _hooks(driver: DriverRoot, hook: HookBinary, host_root: Path) -> list[Hook]:
    # The runtime runs the hook on the host, so the path is the host's view of it.
    path = _host(host_root, hook.path) if hook.under_root else hook.path

    def make(subcommand: str, *args: str) -> Hook:
        return Hook("createContainer", path, hook.argv(subcommand, *args), HOOK_ENV)

    hooks: list[Hook] = []
    link_args = [a for target, link in _links(driver) for a in ("--link", f"{target}::{link}")]
    if link_args:
        hooks.append(make("create-symlinks", *link_args))
    # enable-cuda-compat only drops an ld.so.conf.d file; update-ldcache must run after it.
    if hook.supports(CUDA_COMPAT_SINCE):
        hooks.append(make("enable-cuda-compat", f"--host-driver-version={driver.version}"))
    folders = [a for d in driver.library_dirs for a in ("--folder", d)]
    if driver.ldconfig is not None:
        folders += ["--ldconfig-path", driver.ldconfig]
    hooks.append(make("update-ldcache", *folders))
    if hook.supports(NODE_MODIFICATION_SINCE):
        hooks.append(make("disable-device-node-modification"))
    return hooks


def gpu_minor_from_proc(proc_root: Path, pci_address: str) -> int:
    """``Device Minor`` of the GPU at ``pci_address`` from the driver's procfs."""
    info = read_key_values(
        proc_root / "driver" / "nvidia" / "gpus" / pci_address.lower() / "information"
    )
    value = info.get("Device Minor", "")
    if not value.isdigit():
        raise HostLookupError(f"no Device Minor for GPU {pci_address} in the driver's procfs")
    return int(value)


def gpu_node(dev_root: Path, minor: int) -> DeviceNode:
    try:
        return char_node(dev_root, f"/dev/nvidia{minor}")
    except HostLookupError as err:
        raise HostLookupError(f"{err.reason}; {NODE_CREATION_HINT}") from err


def mig_cap_nodes(proc_root: Path, parent_minor: int, gi: int, ci: int) -> tuple[DeviceNode, ...]:
    """The GPU-instance and compute-instance access capability nodes of one MIG device.

    Built from the driver's capability files with explicit numbers and no host path: the
    nodes under /dev/nvidia-caps appear only after something runs nvidia-smi, and the
    runtime creates a node with explicit type and major without looking at the host.
    """
    majors = read_proc_devices(proc_root)
    if "nvidia-caps" not in majors:
        raise HostLookupError(f"no nvidia-caps major in {proc_root}/devices")
    base = proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{parent_minor}" / "mig"
    nodes = []
    for cap in (base / f"gi{gi}" / "access", base / f"gi{gi}" / f"ci{ci}" / "access"):
        try:
            info = read_key_values(cap)
        except HostLookupError as err:
            raise HostLookupError(
                f"MIG instance gi{gi}/ci{ci} of GPU minor {parent_minor} does not exist "
                f"({err.reason})"
            ) from err
        minor, mode = info.get("DeviceFileMinor", ""), info.get("DeviceFileMode", "")
        if not minor.isdigit() or not mode.isdigit():
            raise HostLookupError(f"{cap}: no DeviceFileMinor/DeviceFileMode")
        nodes.append(
            DeviceNode(
                path=f"/dev/nvidia-caps/nvidia-cap{minor}",
                type="c",
                major=majors["nvidia-caps"],
                minor=int(minor),
                file_mode=int(mode) & 0o777,
            )
        )
    return tuple(nodes)
