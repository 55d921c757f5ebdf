"""The options of device preparation, one object the composition root passes whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class PrepareOptions:
    driver_name: str
    node_name: str
    #: The plugin's directory: the checkpoint and the device metadata files live here.
    plugin_dir: Path
    cdi_dir: Path = Path("/var/run/cdi")
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    #: Pool of this node's devices; the DESIGN names it after the node.
    pool_name: str | None = None
    #: Write a device metadata file per request and mount it into the containers
    #: (``agent.prepare.metadata``). On by default, where the upstream helper's
    #: ``EnableDeviceMetadata`` option is off unless a driver enables it: the file holds only
    #: what the ResourceSlice publishes, and 1.35's runtimes apply the mount like any other.
    device_metadata: bool = True
    #: The node's MPS control daemon's pipe directory, for shares asking for MPS
    #: (``agent.prepare.effects.mps``); None: no daemon the agent knows of.
    mps_pipe_dir: Path | None = None

    @property
    def pool(self) -> str:
        return self.pool_name or self.node_name

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / "checkpoint.json"
