"""The composition root: every part of the agent is built here, once, and handed its options
whole. A part receives what it uses through a Protocol, never its neighbour's concrete class.

The host effects are ordered here, and only here (``agent.prepare.effects``): plan and apply
run in this order, release in the reverse. A new kind of host change is one module and one
line below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.checkpoint.store import CheckpointStore, read_boot_id
from agent.common.config import Config
from agent.common.failpoints import FailpointConfigError, Failpoints
from agent.common.metrics import Metrics
from agent.daemon import early, machine
from agent.daemon.options import DaemonError, NoAPIClaimSource, RunOptions
from agent.netdev.host import HostNetdev
from agent.netdev.install import read_launch
from agent.plugin import APIClaimSource, PluginOptions, PluginServer
from agent.plugin.driver import ClaimSource
from agent.plugin.serving import ServedSockets
from agent.prepare.cdispecs import CDIClaimSpecs, DeviceEdits
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.claimspec import ClaimBuilder
from agent.prepare.effects.base import Effect
from agent.prepare.effects.metadata import MetadataEffect
from agent.prepare.effects.mig import MigEffect
from agent.prepare.effects.migcontrol import MigPartitions
from agent.prepare.effects.mps import MpsEffect
from agent.prepare.effects.netdev import NetdevEffect
from agent.prepare.effects.passthrough import PassthroughEffect
from agent.prepare.effects.timeslice import TimeSliceEffect
from agent.prepare.effects.vfs import VfEffect
from agent.prepare.gpucontrol import GpuControl
from agent.prepare.metadata import HOST_SUBDIR
from agent.prepare.metadatafiles import HostMetadataFiles
from agent.prepare.mpscontrol import MpsControl
from agent.prepare.options import PrepareOptions
from agent.prepare.preparer import DevicePreparer
from cdi.edits import EditsProvider
from discovery.model import Inventory
from discovery.passthrough import PciDrivers, SysfsPciDrivers
from discovery.sources import Sources
from discovery.vfs import SriovControl, SysfsSriov

if TYPE_CHECKING:  # built by the daemon: the health stream's servicer, when health is on
    from agent.health.stream import HealthServicer
    from agent.kube.transport import KubeHTTP


def claim_metadata(options: PrepareOptions) -> ClaimMetadata:
    """Device metadata files under the plugin directory. Always given the files, also when
    switched off: unprepare removes what a run with the feature on wrote."""
    return ClaimMetadata(options.driver_name,
                         HostMetadataFiles(options.plugin_dir / HOST_SUBDIR),
                         enabled=options.device_metadata)


def netdev_effect(options: PrepareOptions, inventory: Callable[[], Inventory]) -> Effect:
    """The moved interfaces configured in the pod: the hook the chart installs under the
    plugin directory, its records beside it."""
    hook_dir = options.plugin_dir / "netdev-hook"
    return NetdevEffect(options.plugin_dir / "netdev", lambda: read_launch(hook_dir),
                        HostNetdev(), inventory)


def effects(
    inventory: Callable[[], Inventory], *, metadata: ClaimMetadata,
    mps_pipe_dir: Path | None = None, gpu_control: GpuControl | None = None,
    mig: MigPartitions | None = None, sriov: SriovControl | None = None,
    rescan: Callable[[], Inventory] | None = None, failpoints: Failpoints | None = None,
    mps_control: MpsControl | None = None, netdev: Effect | None = None,
    pci_drivers: PciDrivers | None = None,
) -> tuple[Effect, ...]:
    """The host effects of this node, in the order prepare applies them. ``mig``: dynamic
    MIG partitions (``--mig dynamic``); ``sriov`` and ``rescan``: VFs on demand (``--vfs
    dynamic``), made through ``sriov`` and read back by ``rescan``; ``mps_control``: the MPS
    server's limits (``--mps-pipe-dir``); ``pci_drivers``: GPUs bound to vfio-pci for VMs
    (``--gpu-passthrough``)."""
    ordered: list[Effect | None] = [
        MpsEffect(mps_pipe_dir, mps_control, inventory),  # before the metadata's mounts
        MigEffect(mig, inventory, failpoints) if mig is not None else None,
        VfEffect(sriov, rescan or inventory, failpoints, inventory=inventory)
        if sriov is not None else None,
        PassthroughEffect(pci_drivers, rescan or inventory, failpoints, inventory=inventory)
        if pci_drivers is not None else None,  # before the metadata: it names the bound GPU
        MetadataEffect(metadata),  # after the devices exist: the spec's mounts name its files
        netdev,  # the moved interfaces' hooks (docs/netdev.md)
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
    mps_control: MpsControl | None = None, sockets: ServedSockets | None = None,
) -> PluginServer:
    """The kubelet plugin around this node's preparer: what ``dra-agent run`` serves;
    ``sockets``: served already, opened by the plugin's start."""
    metrics = metrics or Metrics()
    ordered = effects(inventory, metadata=claim_metadata(prepare),
                      mps_pipe_dir=prepare.mps_pipe_dir, gpu_control=gpu_control, mig=mig,
                      sriov=sriov, rescan=rescan, failpoints=failpoints,
                      mps_control=mps_control, netdev=netdev_effect(prepare, inventory))
    return PluginServer(plugin, preparer(prepare, inventory, edits, ordered, metrics=metrics,
                                         failpoints=failpoints),
                        claims, metrics, health_servicer=health_servicer, failpoints=failpoints,
                        sockets=sockets)


def node_plugin(
    cfg: Config, run: RunOptions, sources: Sources, inventory: Callable[[], Inventory], *,
    rescan: Callable[[], Inventory], client: KubeHTTP | None, metrics: Metrics,
    health_servicer: HealthServicer | None, environ: Mapping[str, str],
    sockets: ServedSockets | None = None,
) -> tuple[PluginServer, DevicePreparer]:
    """The plugin ``dra-agent run`` serves, and its preparer: every option of ``cfg`` and
    ``run`` turned into the parts above, once. ``rescan`` reads the node again and publishes
    what it found (VFs on demand read the VFs they made so). ``sockets``: the sockets served
    already (``agent.daemon.early``), which the plugin opens once it has recovered."""
    try:
        # Crash tests only: DRA_AGENT_FAILPOINTS makes the agent die at chosen steps.
        failpoints = Failpoints.from_env(environ)
    except FailpointConfigError as err:
        raise DaemonError(str(err)) from err
    edits = EditsProvider(
        driver_root=run.driver_root, host_driver_root=run.host_driver_root,
        simulated=bool(cfg.simulate), sysfs_root=cfg.sysfs_root,
        simulated_nodes=machine.simulated_nodes(cfg),
    )
    prepare = PrepareOptions(
        driver_name=cfg.driver_name, node_name=cfg.node_name, plugin_dir=cfg.plugin_dir,
        cdi_dir=cfg.cdi_dir, boot_id_path=run.boot_id_path,
        device_metadata=run.device_metadata, mps_pipe_dir=run.mps_pipe_dir,
    )
    mig = MigPartitions(sources.gpu, failpoints) \
        if cfg.mig == "dynamic" and sources.gpu is not None else None
    sriov = (sources.sriov or SysfsSriov(sources.sysfs_root)) if cfg.vfs == "dynamic" else None
    pci_drivers = (sources.pci_drivers or SysfsPciDrivers(sources.sysfs_root)) \
        if cfg.gpu_passthrough else None
    plugin = sockets.options if sockets is not None else early.plugin_options(cfg, run)
    claims = APIClaimSource(client) if client is not None else NoAPIClaimSource()
    ordered = effects(inventory, metadata=claim_metadata(prepare),
                      mps_pipe_dir=prepare.mps_pipe_dir, gpu_control=machine.gpu_control(cfg, run),
                      mig=mig, sriov=sriov, rescan=rescan, failpoints=failpoints,
                      mps_control=machine.mps_control(cfg, run),
                      netdev=netdev_effect(prepare, inventory), pci_drivers=pci_drivers)
    made = preparer(prepare, inventory, edits, ordered, metrics=metrics, failpoints=failpoints)
    return PluginServer(plugin, made, claims, metrics, health_servicer=health_servicer,
                        failpoints=failpoints, sockets=sockets), made
