"""A preparer with dynamic MIG on a simulated dgx-h100-mig whose MIG instances persist in a
state file (the "hardware"), for the partition tests and their kill -9 subprocess."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.checkpoint.store import CheckpointStore
from agent.common.failpoints import Failpoints
from agent.prepare import DevicePreparer
from agent.prepare.cdispecs import DeviceEdits
from agent.prepare.effects.migcontrol import MigPartitions
from agent.prepare.effects.miginstance import owned_instances
from cdi.edits import EditsProvider
from discovery.model import Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import FakeNvml, simulated_sources
from discovery.sources import Sources
from tests.plugnode import device_preparer

DRIVER = "dra-agent.io"
NODE = "node-a"  # tests.plugnode.NODE: make_claim allocates from it


@dataclass
class MigNode:
    sources: Sources
    preparer: DevicePreparer

    @property
    def nvml(self) -> FakeNvml:
        assert isinstance(self.sources.gpu, FakeNvml)
        return self.sources.gpu

    def migs(self, index: int) -> list[tuple[int, int, int, int]]:
        """(GI, CI, profile id, start) of GPU ``index``'s instances, as NVML has them."""
        gpu = next(g for g in self.nvml.gpus if g.index == index)
        return sorted((m.gi, m.ci, m.profile.id, m.start) for m in gpu.migs)


def mig_node(root: Path, *, failpoints: Failpoints | None = None,
             edits: DeviceEdits | None = None, boot_id: str = "boot-1") -> MigNode:
    """The node under ``root``: same ``root``, same checkpoint, CDI dir and MIG layout."""
    sim = root / "sim"
    sim.mkdir(parents=True, exist_ok=True)
    sources = simulated_sources("dgx-h100-mig", sim, mig_state=root / "mig-state.json")
    checkpoint = CheckpointStore(root / "state" / "checkpoint.json")
    options = DiscoveryOptions(mig="dynamic",
                               mig_owned=lambda: owned_instances(checkpoint.claims()))
    # Discovered once, up front: a prepare never changes what is published (and a test's
    # NVML faults are for the prepare, not for discovery).
    found = discover(sources, options)

    def inventory() -> Inventory:
        return found

    assert sources.gpu is not None
    preparer = device_preparer(root, inventory, edits=edits or EditsProvider(simulated=True),
                               checkpoint=checkpoint, boot_id=boot_id, failpoints=failpoints,
                               mig=MigPartitions(sources.gpu, failpoints))
    return MigNode(sources, preparer)
