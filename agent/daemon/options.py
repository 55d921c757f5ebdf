"""The options of ``dra-agent run`` beyond the shared Config, and the daemon's own error."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.health.options import HealthOptions

if TYPE_CHECKING:  # the claim model loads with the plugin, after the sockets are served
    from agent.claim.model import ClaimRef


class DaemonError(RuntimeError):
    """The agent cannot start or a vital part of it died; the message says which and why."""


class StoppedWhileStarting(Exception):  # noqa: N818 (a stop request, not an error)
    """A stop was requested while the daemon was starting: the start ends, undone."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Options of ``dra-agent run`` beyond the shared Config."""

    rolling_update: bool = False
    pod_uid: str | None = None
    shutdown_grace_s: float = 10.0
    registration_timeout_s: float = 30.0
    #: Periodic rescan catching what no uevent announces (MIG changes, simulated trees).
    slow_rescan_s: float = 60.0
    hotplug_debounce_s: float = 0.2
    resync_period_s: float = 600.0
    #: Node addresses (e.g. its InternalIP) whose NIC must never be handed to a pod.
    node_addresses: tuple[str, ...] = ()
    #: Root of the NVIDIA driver installation (``/driver-root`` when the host's is mounted).
    driver_root: Path = Path("/")
    #: The same installation as the container runtime sees it (paths written into CDI specs).
    host_driver_root: Path = Path("/")
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    #: Device health monitoring (taints + the kubelet's health stream); None switches it off.
    health: HealthOptions | None = field(default_factory=HealthOptions)
    #: Device metadata files for workloads (``agent.prepare.metadata``).
    device_metadata: bool = True
    #: Start even where a device plugin advertises what our DeviceClasses map to our devices.
    allow_device_plugin_overlap: bool = False
    #: The node's MPS control daemon's pipe directory (``agent.prepare.effects.mps``).
    mps_pipe_dir: Path | None = None


class NoAPIClaimSource:
    """Claim source of an agent without an API server (kubelet standalone).

    A claim can only be checked against its allocation in the API server, so every prepare
    gets a per-claim error that says why; unprepare needs no API and keeps working.
    """

    def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        from agent.claim.model import ClaimFetchError

        raise ClaimFetchError(
            str(ref), "no API server configured (--kubeconfig none): the claim cannot be read"
        )
