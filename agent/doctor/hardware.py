"""Hardware and drivers: NVML, the NVIDIA container toolkit, IOMMU for VFIO, RDMA namespaces
and SR-IOV. Each reads the host's sysfs under the host root, and what discovery found."""

from __future__ import annotations

from agent.doctor.context import Context
from agent.doctor.host import HostFileError, HostRoot, table
from agent.doctor.model import Check, fail, ok, skipped, warn

NVML, TOOLKIT_MODE, TOOLKIT_ENVVAR, IOMMU, RDMA_NETNS, SRIOV = (
    "NVML", "toolkit mode", "toolkit envvar", "IOMMU", "RDMA netns", "SR-IOV")
PCI = "/sys/bus/pci/devices"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
NETNS_MODE = "/sys/module/ib_core/parameters/netns_mode"
#: sysfs attributes report a 4096-byte size whatever they hold.
SYSFS_CAP = 1 << 16


def _attr(host: HostRoot, bdf: str, name: str) -> str:
    try:
        return host.read_text(f"{PCI}/{bdf}/{name}", SYSFS_CAP).strip()
    except (FileNotFoundError, HostFileError):
        return ""


def nvidia_gpus(host: HostRoot) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers (vendor 0x10de, class 0x03xxxx)."""
    return [bdf for bdf in host.listdir(PCI)
            if _attr(host, bdf, "vendor") == "0x10de" and _attr(host, bdf, "class")[:4] == "0x03"]


def check_nvml(ctx: Context) -> Check:
    from discovery.gpulib import DriverNotLoadedError, GpuLibraryError, LibraryNotFoundError

    gpus = nvidia_gpus(ctx.host)
    if ctx.gpu is None:
        return skipped(NVML, "NVIDIA support off (--device-types has neither gpu nor mig)")
    if not gpus:
        return skipped(NVML, "no NVIDIA GPU on the PCI bus")
    try:
        ctx.gpu.init()
        try:
            driver, count = ctx.gpu.driver_version(), ctx.gpu.device_count()
        finally:
            ctx.gpu.shutdown()
    except (LibraryNotFoundError, DriverNotLoadedError) as err:
        return fail(NVML, f"{len(gpus)} NVIDIA GPU(s) on the PCI bus, but NVML: {err}",
                    "install the NVIDIA driver (and load nvidia.ko); in a pod, mount the "
                    "driver's libnvidia-ml.so.1 (the toolkit's runtime class does)")
    except GpuLibraryError as err:
        return fail(NVML, f"NVML: {err}", "run nvidia-smi on the node: it shows the same error")
    if count < len(gpus):
        return warn(NVML, f"driver {driver}: NVML sees {count} of the {len(gpus)} NVIDIA GPUs "
                    "on the PCI bus", "look for Xid errors or a GPU fallen off the bus: "
                    "dmesg | grep -i nvrm")
    return ok(NVML, f"driver {driver}, {count} GPU(s)")


def _toolkit(ctx: Context, name: str) -> tuple[dict[str, object] | None, Check | None]:
    if not nvidia_gpus(ctx.host):
        return None, skipped(name, "no NVIDIA GPU on the PCI bus")
    try:
        return ctx.host.read_toml(TOOLKIT_CONFIG), None
    except FileNotFoundError:
        return None, warn(name, f"NVIDIA GPUs but no {TOOLKIT_CONFIG}",
                          "install nvidia-container-toolkit: the CDI specs' hooks "
                          "(nvidia-cdi-hook) come from it")
    except HostFileError as err:
        return None, warn(name, str(err), f"fix {TOOLKIT_CONFIG} (nvidia-ctk config)")


def check_toolkit_mode(ctx: Context) -> Check:
    doc, early = _toolkit(ctx, TOOLKIT_MODE)
    if doc is None:
        assert early is not None
        return early
    mode = table(doc, "nvidia-container-runtime").get("mode", "auto")
    if mode in ("cdi", "auto"):
        return ok(TOOLKIT_MODE, f"nvidia-container-runtime mode = {mode}")
    # legacy mode hands GPUs to containers by NVIDIA_VISIBLE_DEVICES, not by CDI device
    # requests: a pod gets what an env var names, not what its claim was allocated.
    return warn(TOOLKIT_MODE, f"nvidia-container-runtime mode = {mode!r}: GPUs are chosen by "
                "NVIDIA_VISIBLE_DEVICES, not by CDI", "nvidia-ctk config --in-place --set "
                "nvidia-container-runtime.mode=cdi")


def check_toolkit_envvar(ctx: Context) -> Check:
    doc, early = _toolkit(ctx, TOOLKIT_ENVVAR)
    if doc is None:
        assert early is not None
        return early
    value = doc.get(ENVVAR_KEY, True)  # the toolkit's default is true
    if value is False:
        return ok(TOOLKIT_ENVVAR, f"{ENVVAR_KEY} = false")
    return warn(TOOLKIT_ENVVAR, f"{ENVVAR_KEY} = {str(value).lower()}"
                f"{'' if ENVVAR_KEY in doc else ' (the default)'}: any unprivileged container "
                "can take GPUs by setting NVIDIA_VISIBLE_DEVICES",
                f"nvidia-ctk config --in-place --set {ENVVAR_KEY}=false")


def check_iommu(ctx: Context) -> Check:
    """VFIO devices need the IOMMU; a GPU for VMs (``--gpu-passthrough``) also needs vfio-pci
    loaded, a group, and a group whose other functions the host does not use (a VM gets the
    whole group: prepare refuses the GPU otherwise, naming the same functions)."""
    devices = ctx.inventory().devices
    vfio = [d for d in devices if d.host.driver == "vfio-pci" or d.type == "vfio"]
    if not vfio:
        return skipped(IOMMU, "no device bound to vfio-pci")
    groups = ctx.host.listdir(GROUPS)
    if not groups:
        return fail(IOMMU, f"{len(vfio)} VFIO device(s) but {GROUPS} is empty",
                    "boot with intel_iommu=on iommu=pt (AMD: amd_iommu=on) and enable VT-d / "
                    "AMD-Vi in the firmware")
    gpus = [d for d in vfio if d.type == "vfio"]
    if gpus and not ctx.host.is_dir("/sys/bus/pci/drivers/vfio-pci"):
        return fail(IOMMU, f"{len(gpus)} GPU(s) offered for VMs but vfio-pci is not loaded",
                    "modprobe vfio-pci (persist: vfio-pci in /etc/modules-load.d)")
    lonely = [d.name for d in gpus if not d.host.iommu_group]
    if lonely:
        return fail(IOMMU, f"{', '.join(lonely[:4])}: no IOMMU group (the IOMMU is off for "
                    "them)", "boot with intel_iommu=on (AMD: amd_iommu=on), VT-d / AMD-Vi on")
    blocked = [f"{d.name}: group {d.host.iommu_group} also holds {', '.join(used)}"
               for d in gpus if (used := _host_members(ctx.host, d.host.iommu_group or "",
                                                       d.host.pci_address or ""))]
    if blocked:
        return warn(IOMMU, "; ".join(blocked[:4]) + " (a VM gets the whole group: passthrough "
                    "of these GPUs is refused)", "bind them to vfio-pci: driverctl "
                    "set-override ADDRESS vfio-pci")
    return ok(IOMMU, f"{len(groups)} IOMMU group(s) for {len(vfio)} VFIO device(s)" + (
        f"; {len(gpus)} GPU(s) for VMs, each in a group a VM can have" if gpus else ""))


GROUPS = "/sys/kernel/iommu_groups"
#: Drivers a group member may have and leave the group to a VM (discovery.passthrough).
_VM_SAFE = ("vfio-pci", "pci-stub", "pcieport")


def _host_members(host: HostRoot, group: str, own: str) -> list[str]:
    """``ADDRESS on DRIVER`` for each other function of ``group`` the host uses."""
    used = []
    for bdf in host.listdir(f"{GROUPS}/{group}/devices"):
        if bdf == own or _attr(host, bdf, "class").startswith("0x0604"):
            continue  # the GPU itself; a bridge, which a VM's group may hold
        link = f"{PCI}/{bdf}/driver"
        driver = host.path(link).name if host.exists(link) else None
        if driver is not None and driver not in _VM_SAFE:
            used.append(f"{bdf} on {driver}")
    return used


def check_rdma_netns(ctx: Context) -> Check:
    rdma = [d.name for d in ctx.inventory().devices if d.host.rdma_device]
    if not rdma:
        return skipped(RDMA_NETNS, "no RDMA device offered")
    try:
        mode = ctx.host.read_text(NETNS_MODE, SYSFS_CAP).strip()
    except FileNotFoundError:
        return warn(RDMA_NETNS, f"{len(rdma)} RDMA device(s) offered but no {NETNS_MODE} "
                    "(ib_core not loaded?)", "modprobe ib_core; then see this check again")
    except HostFileError as err:
        return warn(RDMA_NETNS, str(err), f"check {NETNS_MODE}")
    # ib_core's netns_mode: Y/1 = shared (the default: every namespace sees every RDMA
    # device), N/0 = exclusive (an RDMA device lives in one namespace, like a netdev).
    if mode in ("Y", "1"):
        return warn(RDMA_NETNS, f"netns_mode = {mode} (shared): every pod sees all "
                    f"{len(rdma)} offered RDMA device(s), not only its claim's",
                    "rdma system set netns exclusive (persist: options ib_core netns_mode=0 "
                    "in /etc/modprobe.d), then reload the RDMA modules")
    if mode in ("N", "0"):
        return ok(RDMA_NETNS, f"netns_mode = {mode} (exclusive), {len(rdma)} RDMA device(s)")
    return warn(RDMA_NETNS, f"netns_mode = {mode[:20]!r}: not Y/N", f"check {NETNS_MODE}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def check_sriov(ctx: Context) -> Check:
    types = ctx.options.device_types
    if "vf" not in types:
        return skipped(SRIOV, "VFs not offered (--device-types)")
    pfs = {bdf: (_int(_attr(ctx.host, bdf, "sriov_totalvfs")),
                 _int(_attr(ctx.host, bdf, "sriov_numvfs")))
           for bdf in ctx.host.listdir(PCI) if _attr(ctx.host, bdf, "sriov_totalvfs")}
    if not pfs:
        return skipped(SRIOV, "no SR-IOV capable device")
    enabled = {b: v for b, v in pfs.items() if v[0] > 0}
    # VFs are expected when the agent was told to offer VFs and not whole NICs.
    expected = "nic" not in types
    if not enabled:
        found = f"SR-IOV off on {', '.join(sorted(pfs))} (sriov_totalvfs = 0)"
        fix = "enable SR-IOV in the NIC's firmware (mlxconfig set SRIOV_EN=1 NUM_OF_VFS=N)"
        return fail(SRIOV, found, fix) if expected else skipped(SRIOV, found + "; no VFs to "
                                                                "offer")
    idle = sorted(b for b, (_, num) in enabled.items() if num == 0)
    total = sum(num for _, num in enabled.values())
    if idle:
        return warn(SRIOV, f"SR-IOV enabled but no VF created on {', '.join(idle)}",
                    f"echo N > /sys/bus/pci/devices/{idle[0]}/sriov_numvfs (or the SR-IOV "
                    "operator's policy)")
    return ok(SRIOV, f"{total} VF(s) on {len(enabled)} PF(s)")
