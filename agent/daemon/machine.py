"""What this machine and its cluster give the agent's parts: where discovery reads the
hardware, the API client, the tools that set GPU time slices and the MPS server's limits,
stand-in device nodes, and the refusal to start beside a device plugin. Part of the
composition root (``wiring`` assembles the parts from these); each is built once, by
``Daemon.start``.

The imports below the module level are lazy for start-up: ``dra-agent run`` pays for each
only when its option asks for it (NVML, the simulator, the kube client, explain's allocator).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.common.config import Config
from agent.daemon.options import DaemonError, RunOptions
from discovery.model import Inventory
from discovery.sources import Sources

if TYPE_CHECKING:
    from agent.common.metrics import Metrics
    from agent.kube.transport import KubeHTTP
    from agent.prepare import DevicePreparer
    from agent.prepare.gpucontrol import GpuControl
    from agent.prepare.mpscontrol import MpsControl
    from cdi.simnodes import SimulatedNodes
    from discovery.hotplug import DeviceEvents
    from discovery.scan import DiscoveryOptions

log = logging.getLogger("agent.daemon")

#: ``--simulate`` with ``--mig dynamic``: where the simulated GPUs keep their MIG instances.
SIMULATED_MIG_STATE = "simulated-mig-instances.json"
#: ``--simulate``: where the simulated GPUs keep the time slices shares set.
SIMULATED_GPU_STATE = "simulated-time-slices.json"
#: ``--simulate`` with ``--mps-pipe-dir``: where the simulated MPS daemon keeps its limits.
SIMULATED_MPS_STATE = "simulated-mps-limits.json"


def sources(cfg: Config, cleanups: list[Callable[[], None]]) -> Sources:
    """The host's sysfs and NVML, or with ``--simulate`` a generated tree (removed by a
    cleanup ``cleanups`` gains)."""
    if cfg.simulate:
        from discovery.simulate import scratch_dir, simulated_sources  # --simulate only
        from discovery.simulate.profiles import PROFILES

        if cfg.simulate not in PROFILES:  # bad input: one line, not "a bug"
            raise DaemonError(f"--simulate: unknown profile {cfg.simulate!r}; known: "
                              f"{', '.join(sorted(PROFILES))}")

        tmp = scratch_dir()
        cleanups.append(tmp.cleanup)
        # The simulated GPUs' MIG instances live beside the checkpoint, as a real GPU's
        # outlive the agent: a restarted agent meets the instances it made.
        state = cfg.plugin_dir / SIMULATED_MIG_STATE if cfg.mig == "dynamic" else None
        if state is not None:
            state.parent.mkdir(parents=True, exist_ok=True)
        return simulated_sources(cfg.simulate, Path(tmp.name), mig_state=state)
    from discovery.host import host_sources  # a real node only: NVML's loader

    wants_nvml = bool({"gpu", "mig"} & set(cfg.device_types))
    return host_sources(sysfs_root=cfg.sysfs_root, nvml=wants_nvml)


def api_client(cfg: Config, environ: Mapping[str, str]) -> KubeHTTP | None:
    """The one API client every part shares; None without credentials (each part says what
    it cannot do then). A kubeconfig that cannot be loaded is a ``DaemonError``."""
    # Lazy: the kubeconfig loaders are read only by a node that has one.
    from agent.kube.client import KubeConfigError, resolve_source
    from agent.kube.client import api_client as load

    source = resolve_source(cfg.kubeconfig, environ)
    if source.kind == "none":
        return None  # the controller and each prepare say so
    explicit = bool(cfg.kubeconfig.strip()) or bool(environ.get("KUBECONFIG"))
    if source.kind == "kubeconfig" and not explicit and source.path is not None \
            and not source.path.is_file():
        log.warning("no kube credentials found (not in a pod, no KUBECONFIG, no "
                    "~/.kube/config): controller inactive", extra={"tried": str(source.path)})
        return None
    try:
        # The pool (urllib3, ssl, a client certificate) waits for ``connect``.
        client = load(cfg, environ, connect=False)
    except KubeConfigError as err:
        raise DaemonError(str(err)) from err
    log.info("kube client", extra={"source": source.describe()})
    return client


def connect(cfg: Config, client: KubeHTTP, environ: Mapping[str, str]) -> None:
    """The API client's connection pool, which ``api_client`` leaves for after the kubelet's
    registration: a client certificate that cannot be loaded is still one line and exit 1
    before anything is published."""
    from agent.kube.client import KubeConfigError, connect_or_raise, resolve_source

    try:
        connect_or_raise(client, resolve_source(cfg.kubeconfig, environ))
    except KubeConfigError as err:
        raise DaemonError(str(err)) from err


def gpu_control(cfg: Config, run: RunOptions) -> GpuControl | None:
    """What sets GPU-wide share settings: a recording stand-in on a simulated node,
    nvidia-smi on a real one (None without it: a share asking for a time slice fails)."""
    from agent.prepare.gpucontrol import NvidiaSmi, RecordingGpuControl, find_nvidia_smi

    if cfg.simulate:  # beside the checkpoint: the GPUs outlive the agent
        return RecordingGpuControl(cfg.plugin_dir / SIMULATED_GPU_STATE)
    binary = find_nvidia_smi(run.driver_root)
    return NvidiaSmi(binary) if binary is not None else None


def mps_control(cfg: Config, run: RunOptions) -> MpsControl | None:
    """What sets the MPS server's limits (``--mps-pipe-dir``): a recording stand-in on a
    simulated node, the daemon's nvidia-cuda-mps-control on a real one (None without it: a
    share asking for MPS fails)."""
    if run.mps_pipe_dir is None:
        return None
    from agent.prepare.mpscontrol import NvidiaMpsControl, RecordingMpsControl, find_mps_control

    if cfg.simulate:  # beside the checkpoint: the daemon outlives the agent
        return RecordingMpsControl(cfg.plugin_dir / SIMULATED_MPS_STATE)
    binary = find_mps_control(run.driver_root)
    return NvidiaMpsControl(binary, run.mps_pipe_dir) if binary is not None else None


def simulated_nodes(cfg: Config) -> SimulatedNodes | None:
    """--simulate-device-nodes: the stand-in device nodes' maker, in the plugin dir."""
    if not cfg.simulate_device_nodes:
        return None
    from cdi.simnodes import SimulatedNodes

    directory = cfg.simulated_dev_dir
    log.info("simulated devices get stand-in device nodes (1:3) at prepare",
             extra={"directory": str(directory)})
    return SimulatedNodes(directory)


def device_events(cfg: Config, run: RunOptions, stop: threading.Event) -> DeviceEvents:
    """udev's events, for hotplug; none on a simulated tree (no uevent describes it) or
    where netlink is not available (a sandbox without AF_NETLINK): the periodic rescan
    then finds every change."""
    from discovery.hotplug import NullEvents, UdevEvents  # pyudev: after the plugin serves

    if cfg.simulate:
        return NullEvents(stop)
    try:
        return UdevEvents()
    except OSError as err:
        log.warning("udev events unavailable; hotplug falls back to periodic rescans",
                    extra={"error": str(err), "every_s": run.slow_rescan_s})
        return NullEvents(stop)


def simulated_faults(cfg: Config, run: RunOptions, sources: Sources,
                     inventory: Callable[[], Inventory],
                     stop: threading.Event) -> threading.Thread | None:
    """--simulate: the inbox 'dra-agent simulate fault' writes to, beside the checkpoint
    (agent/simfaults/), its thread started; after the health monitor, whose event sets the
    faults reach. None on a real node."""
    if not cfg.simulate:
        return None
    from agent.simfaults.inbox import FaultInbox  # --simulate only

    inbox = FaultInbox(cfg.simulated_faults_dir, sources.gpu, inventory, health=run.health,
                       stop=stop)
    return inbox.start()


def hotplug(cfg: Config, run: RunOptions, sources: Sources, options: DiscoveryOptions, *,
            initial: Inventory, publish: Callable[[Inventory], None], stop: threading.Event,
            metrics: Metrics) -> threading.Thread:
    """The hotplug watcher's thread, started: udev's events and the periodic rescan, each
    new inventory handed to ``publish``, each scan's duration to ``metrics``."""
    from discovery.hotplug import HotplugWatcher  # after the plugin: pyudev

    watcher = HotplugWatcher(
        sources, options, publish, device_events(cfg, run, stop),
        debounce_s=run.hotplug_debounce_s, slow_rescan_s=run.slow_rescan_s, stop_event=stop,
        initial=initial,
        on_scan=lambda _inventory, seconds: metrics.discovery_duration.observe(seconds),
    )
    return watcher.start()


def refuse_device_plugin_overlap(cfg: Config, client: KubeHTTP | None,
                                 inventory: Inventory) -> bool:
    """Refuse to start where a device plugin already serves what our classes offer as an
    extended resource (agent/deviceplugins.py says why), as far as the node itself tells: the
    kubelet's device-plugin checkpoint, a file, read before the plugin opens. Where it names
    a resource the Node's capacity and the cluster's classes are read now too; where it names
    none (the usual node) the capacity waits for ``refuse_capacity_overlap``, after the
    kubelet can register us and before anything is published: the refusal guards the
    slices, and a request (urllib3, TLS) is a third of a start. Returns whether it waits."""
    from agent import deviceplugins as dp

    advertised = dp.advertised_in_checkpoint(cfg.kubelet_dir)
    if not advertised:
        return client is not None
    if client is not None:
        advertised = {**advertised, **dp.node_capacity(client, cfg.node_name)}
    _refuse_advertised(cfg, client, inventory, advertised)
    return False


def refuse_capacity_overlap(cfg: Config, client: KubeHTTP, inventory: Inventory) -> str | None:
    """The rest of ``refuse_device_plugin_overlap``: the Node's ``status.capacity``, before
    the first ResourceSlice is published. Returns the Node's UID as read (None when it could
    not be): the slices' owner reference needs it, and a second GET of the same Node a moment
    later was one request in seven of a start."""
    from agent import deviceplugins as dp

    node = dp.read_node(client, cfg.node_name)
    if node is None:
        return None
    advertised = dp.advertised_in_capacity(node)
    if advertised:
        _refuse_advertised(cfg, client, inventory, advertised)
    meta = node.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    return uid if isinstance(uid, str) and uid else None


def _refuse_advertised(cfg: Config, client: KubeHTTP | None, inventory: Inventory,
                       advertised: Mapping[str, str]) -> None:
    from agent import deviceplugins as dp

    classes = dp.cluster_classes(client, _shipped) if client is not None else _shipped()
    if not dp.mapped_classes(classes).keys() & advertised.keys():
        return
    # Lazy: only a node where a device plugin advertises a name one of the classes maps
    # gets here; explain's allocator and its CEL engine are a quarter of a second.
    from agent.explain.probe import selects_a_device
    from agent.slices import Owner
    from agent.slices.render import render_slices
    from discovery.pools import build_resources

    slices = render_slices(cfg.driver_name, Owner(name=cfg.node_name),
                           build_resources(inventory, cfg.node_name))
    overlaps = dp.find_overlaps(classes, advertised, dp.class_selects(
        slices, cfg.node_name, selects_a_device))
    for overlap in overlaps[1:]:
        log.error("device-plugin overlap", extra={"resource": overlap.resource,
                                                  "device_class": overlap.device_class})
    if overlaps:
        raise DaemonError(overlaps[0].message())


def _shipped() -> list[Mapping[str, Any]]:
    """The DeviceClasses in the package (deploy/base's), as plain dicts."""
    from agent.explain.docs import packaged_classes  # the documents only, not the allocator

    return [doc.obj for doc in packaged_classes()]


def mig_owned(preparer: DevicePreparer | None,
              checkpoint_path: Path) -> frozenset[tuple[str, int, int]]:
    """The MIG instances our checkpoint names (--mig dynamic): the plugin's records once it
    runs; before, a look at the checkpoint file, so the first publish already knows."""
    from agent.prepare.effects.miginstance import owned_instances

    if preparer is not None:
        return owned_instances(preparer.checkpoint.claims())
    if not checkpoint_path.is_file():
        return frozenset()
    from agent.checkpoint.store import CheckpointStore

    return owned_instances(CheckpointStore(checkpoint_path).claims())
