"""The composition root: every part of the agent is built here, once, and handed its options
whole. A part receives what it uses through a Protocol, never its neighbour's concrete class.

The host effects are ordered here, and only here (``agent.prepare.effects``): plan and apply
run in this order, release in the reverse. A new kind of host change is one module and one
line below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.checkpoint.store import CheckpointStore, read_boot_id
from agent.common.failpoints import Failpoints
from agent.common.metrics import Metrics
from agent.plugin import PluginOptions, PluginServer
from agent.plugin.driver import ClaimSource
from agent.prepare.cdispecs import CDIClaimSpecs, DeviceEdits
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.claimspec import ClaimBuilder
from agent.prepare.effects.base import Effect
from agent.prepare.effects.metadata import MetadataEffect
from agent.prepare.effects.mig import MigEffect
from agent.prepare.effects.migcontrol import MigPartitions
from agent.prepare.effects.mps import MpsEffect
from agent.prepare.effects.timeslice import TimeSliceEffect
from agent.prepare.effects.vfs import VfEffect
from agent.prepare.gpucontrol import GpuControl
from agent.prepare.metadata import HOST_SUBDIR
from agent.prepare.metadatafiles import HostMetadataFiles
from agent.prepare.options import PrepareOptions
from agent.prepare.preparer import DevicePreparer
from discovery.model import Inventory
from discovery.vfs import SriovControl

if TYPE_CHECKING:  # the health stream's servicer is built by the daemon, when health is on
    from agent.health.stream import HealthServicer


def claim_metadata(options: PrepareOptions) -> ClaimMetadata:
    """Device metadata files under the plugin directory. Always given the files, also when
    switched off: unprepare removes what a run with the feature on wrote."""
    return ClaimMetadata(options.driver_name,
                         HostMetadataFiles(options.plugin_dir / HOST_SUBDIR),
                         enabled=options.device_metadata)


def effects(
    inventory: Callable[[], Inventory], *, metadata: ClaimMetadata,
    mps_pipe_dir: Path | None = None, gpu_control: GpuControl | None = None,
    mig: MigPartitions | None = None, sriov: SriovControl | None = None,
    rescan: Callable[[], Inventory] | None = None, failpoints: Failpoints | None = None,
) -> tuple[Effect, ...]:
    """The host effects of this node, in the order prepare applies them. ``mig``: dynamic
    MIG partitions (``--mig dynamic``); ``sriov`` and ``rescan``: VFs on demand (``--vfs
    dynamic``), made through ``sriov`` and read back by ``rescan``."""
    ordered: list[Effect | None] = [
        MpsEffect(mps_pipe_dir),  # env and mounts: before the metadata plans its own
        MigEffect(mig, failpoints) if mig is not None else None,
        VfEffect(sriov, rescan or inventory, failpoints) if sriov is not None else None,
        MetadataEffect(metadata),  # after the devices exist: the spec's mounts name its files
        TimeSliceEffect(gpu_control, inventory, failpoints),
    ]
    return tuple(e for e in ordered if e is not None)


def preparer(
    options: PrepareOptions, inventory: Callable[[], Inventory], edits: DeviceEdits,
    effects: Sequence[Effect], *, metrics: Metrics | None = None,
    failpoints: Failpoints | None = None,
) -> DevicePreparer:
    """The preparer of this node's claims, over its checkpoint and CDI specs."""
    metrics = metrics or Metrics()
    builder = ClaimBuilder(
        driver=options.driver_name, pool=options.pool, node_name=options.node_name,
        specs=CDIClaimSpecs(options.cdi_dir, options.driver_name, edits),
        boot_id=read_boot_id(options.boot_id_path), effects=effects,
    )
    return DevicePreparer(builder=builder,
                          checkpoint=CheckpointStore(options.checkpoint_path, metrics),
                          inventory=inventory, metrics=metrics, failpoints=failpoints)


def plugin_server(
    plugin: PluginOptions, prepare: PrepareOptions, inventory: Callable[[], Inventory],
    edits: DeviceEdits, claims: ClaimSource, *, metrics: Metrics | None = None,
    health_servicer: HealthServicer | None = None, failpoints: Failpoints | None = None,
    gpu_control: GpuControl | None = None, mig: MigPartitions | None = None,
    sriov: SriovControl | None = None, rescan: Callable[[], Inventory] | None = None,
) -> PluginServer:
    """The kubelet plugin around this node's preparer: what ``dra-agent run`` serves."""
    metrics = metrics or Metrics()
    ordered = effects(inventory, metadata=claim_metadata(prepare),
                      mps_pipe_dir=prepare.mps_pipe_dir, gpu_control=gpu_control, mig=mig,
                      sriov=sriov, rescan=rescan, failpoints=failpoints)
    return PluginServer(plugin, preparer(prepare, inventory, edits, ordered, metrics=metrics,
                                         failpoints=failpoints),
                        claims, metrics, health_servicer=health_servicer, failpoints=failpoints)
