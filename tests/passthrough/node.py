"""A simulated passthrough node per vendor, and a preparer over it as a running agent has one.

The "hardware" is the generated tree under ``root/sim``: drivers, DRM nodes and what the NVML
fake lists live there, so a preparer built again (a restarted agent, a kill test's child) meets
the GPUs as the last one left them. ``Live`` is what a running agent publishes: read once, and
again at each rescan (the effect's, after a bind or a restore).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from agent.common.failpoints import Failpoints
from agent.prepare import DevicePreparer
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.metadatafiles import HostMetadataFiles
from cdi.edits import EditsProvider, SimulatedNodes
from discovery.model import Device, Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import FakeNvml, simulated_sources
from discovery.simulate.pcibind import SimulatedPciDrivers
from discovery.sources import ProcRoutes, Sources
from tests.plugnode import DRIVER, NODE, device_preparer, make_claim

OPTIONS = DiscoveryOptions(gpu_passthrough=True)
METADATA_DIR = "metadata"


@dataclass(frozen=True)
class Vendor:
    """One vendor's node and the GPU its tests pass through."""

    profile: str
    #: The VFIO form, its function, the driver it has, and its container form.
    device: str
    bdf: str
    driver: str
    gpu: str
    group: str


VENDORS = {
    "nvidia": Vendor("passthrough-nvidia", "gpu-vfio-0000-18-00-0", "0000:18:00.0", "nvidia",
                     "gpu-0", "20"),
    "amd": Vendor("passthrough-amd", "gpu-vfio-0000-23-00-0", "0000:23:00.0", "amdgpu",
                  "gpu-0000-23-00-0", "30"),
    # The Max 1100, whose group also holds its switch's downstream port.
    "intel": Vendor("passthrough-intel", "gpu-vfio-0000-cc-00-0", "0000:cc:00.0", "xe",
                    "gpu-0000-cc-00-0", "42"),
}


class Live:
    """What the agent publishes: read at start, again at every rescan."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.now = discover(sources, OPTIONS)

    def __call__(self) -> Inventory:
        return self.now

    def rescan(self) -> Inventory:
        self.now = discover(self.sources, OPTIONS)
        return self.now


class StandIn:
    """Stand-in device nodes without CAP_MKNOD: a regular file naming what it stands for."""

    def is_stand_in(self, path: Path) -> bool:
        return path.is_file() and not path.is_symlink() and path.read_text() == "c 1:3"

    def make(self, path: Path) -> None:
        path.write_text("c 1:3")


def make_node(root: Path, vendor: str) -> None:
    """Generate the vendor's node under ``root/sim`` (a boot: every GPU on its driver)."""
    simulated_sources(VENDORS[vendor].profile, root / "sim")
    (root / "vendor").write_text(vendor)


def node_sources(root: Path) -> Sources:
    """The tree as it stands, with the NVML fake of its GPUs listing those on nvidia."""
    profile = VENDORS[(root / "vendor").read_text()].profile
    gpus = cast("FakeNvml", simulated_sources(profile, root / "scratch").gpu).gpus
    sim = root / "sim"
    return Sources(sysfs_root=sim / "sys", gpu=FakeNvml(gpus, sysfs_root=sim / "sys"),
                   dev_root=sim / "dev", routes=ProcRoutes(sim / "proc"),
                   proc_root=sim / "proc", label=f"simulated {profile}",
                   pci_drivers=SimulatedPciDrivers(sim / "sys"))


def preparer(root: Path, failpoints: Failpoints | None = None, **kwargs: Any
             ) -> DevicePreparer:
    """The node's preparer with --gpu-passthrough and device metadata on, its specs naming
    stand-ins of the device nodes a real GPU on vfio-pci has."""
    sources = node_sources(root)
    live = Live(sources)
    edits = EditsProvider(simulated=True,
                          simulated_nodes=SimulatedNodes(root / "stand-ins", StandIn()))
    metadata = ClaimMetadata(DRIVER, HostMetadataFiles(root / METADATA_DIR), enabled=True)
    return device_preparer(root, live, edits=edits, failpoints=failpoints, metadata=metadata,
                           pci_drivers=sources.pci_drivers, rescan=live.rescan, **kwargs)


def published(made: DevicePreparer) -> dict[str, Device]:
    """What the preparer's agent publishes now (its ``Live``)."""
    return made.inventory().by_name()


def driver_of(root: Path, bdf: str) -> str | None:
    link = root / "sim/sys/bus/pci/devices" / bdf / "driver"
    return link.resolve().name if link.is_symlink() else None


def vm_claim(*devices: str, name: str = "vm", uid: str | None = None) -> dict[str, Any]:
    """A claim for the VFIO forms ``devices`` (what KubeVirt's virt-launcher pod gets)."""
    return make_claim(name, list(devices), uid=uid)


__all__ = ["DRIVER", "NODE", "VENDORS", "Live", "driver_of", "make_node", "node_sources",
           "preparer", "published", "vm_claim"]
