"""Container edits for AMD and Intel GPUs: their DRM nodes, and ``/dev/kfd`` for AMD compute."""

from __future__ import annotations

import os
from pathlib import Path

from cdi.host import HostLookupError, char_node
from cdi.spec import DeviceNode

KFD = "/dev/kfd"


def drm_nodes(dev_root: Path, sysfs_root: Path, pci_address: str) -> tuple[DeviceNode, ...]:
    """``/dev/dri/cardN`` and ``renderDN`` of the GPU, from its sysfs ``drm`` directory."""
    drm = sysfs_root / "bus" / "pci" / "devices" / pci_address / "drm"
    try:
        names = sorted(
            n for n in os.listdir(drm) if n.startswith("card") or n.startswith("renderD")
        )
    except OSError as err:
        raise HostLookupError(
            f"GPU {pci_address} has no DRM devices ({drm}: {err.strerror}); "
            "is its kernel driver loaded?"
        ) from err
    if not names:
        raise HostLookupError(f"GPU {pci_address} has no card or renderD node in {drm}")
    return tuple(char_node(dev_root, f"/dev/dri/{name}") for name in names)
