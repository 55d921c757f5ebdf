"""Sources of the real machine: /sys, NVML through pynvml, /dev and /proc routes."""

from __future__ import annotations

from pathlib import Path

from discovery.nvml import NvmlLibrary
from discovery.sources import ProcRoutes, Sources


def host_sources(
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    dev_root: Path = Path("/dev"),
    nvml: bool = True,
) -> Sources:
    """Sources for this host. ``nvml=False`` leaves NVIDIA GPUs out without touching NVML
    (e.g. when another driver owns them). Nothing is opened until ``discover`` runs."""
    return Sources(
        sysfs_root=sysfs_root,
        gpu=NvmlLibrary() if nvml else None,
        dev_root=dev_root,
        routes=ProcRoutes(proc_root),
        proc_root=proc_root,
        label="host",
    )
