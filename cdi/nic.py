"""Container edits for NICs: RDMA character devices, the netdev itself, VFIO functions."""

from __future__ import annotations

import os
import re
from pathlib import Path

from cdi.host import HostLookupError, char_node, dev_host_path
from cdi.spec import DeviceNode, NetDevice

RDMA_CM = "/dev/infiniband/rdma_cm"
VFIO_CONTAINER = "/dev/vfio/vfio"
#: Linux interface names: 1-15 bytes, no '/', ':' or whitespace, not "." or "..".
_IFNAME_RE = re.compile(r"^[^/:\s]{1,15}$")


def _matching_class_devices(sysfs_root: Path, klass: str, prefix: str, ibdev: str) -> list[str]:
    """Names of ``/sys/class/<klass>/<prefix>N`` whose ``ibdev`` is ``ibdev``, sorted by N."""
    base = sysfs_root / "class" / klass
    hits: list[tuple[int, str]] = []
    try:
        entries = os.listdir(base)
    except OSError:
        return []
    for name in entries:
        if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
            continue
        try:
            owner = (base / name / "ibdev").read_text().strip()
        except OSError:
            continue
        if owner == ibdev:  # exact match: mlx5_1 must not claim mlx5_10's nodes
            hits.append((int(name[len(prefix) :]), name))
    return [name for _, name in sorted(hits)]


def rdma_nodes(dev_root: Path, sysfs_root: Path, rdma_device: str) -> tuple[DeviceNode, ...]:
    """``uverbsN`` of the RDMA device (required) plus its ``umad``/``issm`` nodes if present."""
    verbs = _matching_class_devices(sysfs_root, "infiniband_verbs", "uverbs", rdma_device)
    if not verbs:
        raise HostLookupError(
            f"RDMA device {rdma_device} has no uverbs device under "
            f"{sysfs_root}/class/infiniband_verbs (is ib_uverbs loaded?)"
        )
    nodes = [char_node(dev_root, f"/dev/infiniband/{name}") for name in verbs]
    for prefix in ("umad", "issm"):
        for name in _matching_class_devices(sysfs_root, "infiniband_mad", prefix, rdma_device):
            try:
                nodes.append(char_node(dev_root, f"/dev/infiniband/{name}"))
            except HostLookupError:
                continue  # management nodes are optional: verbs work without them
    return tuple(nodes)


def rdma_cm_node(dev_root: Path) -> DeviceNode | None:
    """The shared connection-manager node, when ``rdma_ucm`` is loaded."""
    try:
        return char_node(dev_root, RDMA_CM)
    except HostLookupError:
        return None


def validate_interface_name(name: str) -> None:
    if not _IFNAME_RE.fullmatch(name) or name in (".", ".."):
        raise HostLookupError(
            f"interface name {name!r} is not a valid Linux interface name (1-15 characters, "
            "no '/', ':' or whitespace)"
        )


def net_device(host_interface: str, pod_interface: str | None = None) -> NetDevice:
    """Move ``host_interface`` into the container's network namespace (CDI 1.1.0)."""
    name = pod_interface or host_interface
    validate_interface_name(host_interface)
    validate_interface_name(name)
    return NetDevice(host_interface_name=host_interface, name=name)


def iommu_group(sysfs_root: Path, pci_address: str) -> str:
    link = sysfs_root / "bus" / "pci" / "devices" / pci_address / "iommu_group"
    try:
        return os.path.basename(os.readlink(link))
    except OSError as err:
        raise HostLookupError(
            f"{pci_address} has no IOMMU group ({link}: {err.strerror}); is the IOMMU on?"
        ) from err


def vfio_group_node(dev_root: Path, group: str) -> DeviceNode:
    """``/dev/vfio/<group>``; in no-IOMMU mode the host node is ``noiommu-<group>``."""
    path = f"/dev/vfio/{group}"
    if not dev_host_path(dev_root, path).exists():
        noiommu = dev_host_path(dev_root, f"/dev/vfio/noiommu-{group}")
        if noiommu.exists():
            node = char_node(dev_root, f"/dev/vfio/noiommu-{group}")
            return DeviceNode(
                path=path,
                host_path=str(noiommu),
                type=node.type,
                major=node.major,
                minor=node.minor,
                file_mode=node.file_mode,
            )
    try:
        return char_node(dev_root, path)
    except HostLookupError as err:
        raise HostLookupError(f"{err.reason}; is the device bound to vfio-pci?") from err
