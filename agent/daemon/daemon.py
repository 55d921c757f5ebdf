"""``dra-agent run``: wires discovery -> controller and the kubelet plugin, plus health/metrics.

Start order is chosen so every promise made to the outside is already true when it is made:
discovery first (what to publish and prepare), then the ResourceSlice controller, then the
plugin (the DRA socket serves before the registration socket exists), then the HTTP endpoint,
and READY=1 to systemd only once the registration socket answers.

/readyz waits for more: the kubelet's confirmation of the registration. A DaemonSet's rolling
update stops the old Pod as soon as the new one is Ready, and the kubelet drops the old
instance when its socket goes; a new one that is Ready before the kubelet has registered it
leaves the node without the driver for a moment (pods failing to prepare). READY=1 does not
wait for the kubelet: systemd's start timeout would fail the unit, and hold up what is ordered
after it, whenever the kubelet is slow or down (it registers plugins only once its runtime is
up); the STATUS= line says when the kubelet has confirmed instead.

Stop order is the reverse. ResourceSlices are kept on purpose: the kubelet wipes them after
30 s if the agent does not come back, and a restart within that window costs no write.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.common.config import Config
from agent.common.metrics import Metrics
from agent.daemon.options import DaemonError, NoAPIClaimSource, RunOptions
from agent.inventory import discovery_options
from agent.sdnotify import Notifier
from discovery.model import Inventory
from discovery.sources import Sources

if TYPE_CHECKING:  # the plugin's modules are imported when it starts, not with the daemon
    from agent.kube.transport import KubeHTTP
    from agent.prepare.gpucontrol import GpuControl
    from cdi.simnodes import SimulatedNodes

log = logging.getLogger("agent.daemon")


#: ``--simulate`` with ``--mig dynamic``: where the simulated GPUs keep their MIG instances.
SIMULATED_MIG_STATE = "simulated-mig-instances.json"
#: ``--simulate``: where the simulated GPUs keep the time slices shares set.
SIMULATED_GPU_STATE = "simulated-time-slices.json"


class Daemon:
    """One running agent. ``run()`` blocks until ``request_stop()`` or a fatal error."""

    def __init__(
        self,
        cfg: Config,
        options: RunOptions | None = None,
        *,
        notifier: Notifier | None = None,
        metrics: Metrics | None = None,
        environ: Mapping[str, str] | None = None,
        sources: Sources | None = None,
    ) -> None:
        """``sources`` replaces what ``cfg`` would pick (the host, or ``--simulate``): the seam
        for tests and benchmarks that change a machine's tree while the agent runs."""
        self.cfg = cfg
        self.options = options or RunOptions()
        self.notifier = notifier or Notifier.from_env(environ)
        self.metrics = metrics or Metrics()
        self.environ = dict(os.environ if environ is None else environ)
        self.stop_event = threading.Event()
        self._fatal: str | None = None
        self._stop_reason: str | None = None
        self._inventory_lock = threading.Lock()
        self._inventory = Inventory(devices=())
        self._threads: dict[str, threading.Thread] = {}
        self._cleanups: list[Callable[[], None]] = []
        # Whether "agent ready" / "not ready until" were logged (start, then the run loop).
        self._said_ready = False
        self._said_waiting = False
        # The kubelet's confirmation as the last STATUS= line told systemd (run loop).
        self._status_registered = False
        self.controller: Any = None
        self.plugin: Any = None
        self.http: Any = None
        self.health: Any = None
        #: Where discovery reads the machine (a generated tree with --simulate).
        self.sources: Sources | None = sources

    # -- inventory -----------------------------------------------------------------------

    @property
    def inventory(self) -> Inventory:
        with self._inventory_lock:
            return self._inventory

    def _publish(self, inventory: Inventory) -> None:
        """New inventory: remember it for the plugin and hand it to the controller."""
        from discovery.pools import build_resources

        with self._inventory_lock:
            self._inventory = inventory
        self._record_devices(inventory)
        if self.controller is not None:
            published = self.health.apply_taints(inventory) if self.health else inventory
            self.controller.update(build_resources(published, self.cfg.node_name))

    def _record_devices(self, inventory: Inventory) -> None:
        """dra_agent_devices{type, health}: health is healthy, unhealthy or unmonitored."""
        states = {n: str(h.state) for n, h in self.health.snapshot().items()} \
            if self.health is not None else {}
        counts: dict[tuple[str, str], int] = {}
        for device in inventory.devices:
            key = (str(device.type), states.get(device.name, "healthy"))
            counts[key] = counts.get(key, 0) + 1
        self.metrics.devices.clear()
        for (kind, health), n in counts.items():
            self.metrics.devices.labels(type=kind, health=health).set(n)

    # -- start ---------------------------------------------------------------------------

    def _sources(self) -> Sources:
        from discovery.host import host_sources
        from discovery.simulate import scratch_dir, simulated_sources

        if self.sources is not None:
            return self.sources
        if self.cfg.simulate:
            tmp = scratch_dir()
            self._cleanups.append(tmp.cleanup)
            # The simulated GPUs' MIG instances live beside the checkpoint, as a real GPU's
            # outlive the agent: a restarted agent meets the instances it made.
            state = self.cfg.plugin_dir / SIMULATED_MIG_STATE if self.cfg.mig == "dynamic" \
                else None
            if state is not None:
                state.parent.mkdir(parents=True, exist_ok=True)
            return simulated_sources(self.cfg.simulate, Path(tmp.name), mig_state=state)
        wants_nvml = bool({"gpu", "mig"} & set(self.cfg.device_types))
        return host_sources(sysfs_root=self.cfg.sysfs_root, nvml=wants_nvml)

    def _api_client(self) -> Any:
        from agent.kube.client import KubeConfigError, api_client, resolve_source

        source = resolve_source(self.cfg.kubeconfig, self.environ)
        if source.kind == "none":
            return None  # the controller and each prepare say so
        explicit = bool(self.cfg.kubeconfig.strip()) or bool(self.environ.get("KUBECONFIG"))
        if source.kind == "kubeconfig" and not explicit and source.path is not None \
                and not source.path.is_file():
            log.warning("no kube credentials found (not in a pod, no KUBECONFIG, no "
                        "~/.kube/config): controller inactive", extra={"tried": str(source.path)})
            return None
        try:
            client = api_client(self.cfg, self.environ)
        except KubeConfigError as err:
            raise DaemonError(str(err)) from err
        log.info("kube client", extra={"source": source.describe()})
        return client

    def start(self) -> None:
        """Bring every part up; raises DaemonError (after undoing what started) on failure."""
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> None:
        from agent import slices
        from discovery.scan import discover

        cfg = self.cfg
        # The kubeconfig first: a wrong one is one line and exit 1 before any monitor starts.
        api_client = self._api_client()
        self.notifier.status("discovering devices")
        sources = self.sources = self._sources()
        discovery_options = self.discovery_options()
        started = time.perf_counter()
        inventory = discover(sources, discovery_options)
        self.metrics.discovery_duration.observe(time.perf_counter() - started)
        for warning in inventory.warnings:
            log.warning("discovery", extra={"warning": warning})
        log.info("devices discovered", extra={
            "devices": len(inventory.devices), "reserved": len(inventory.reserved),
            "source": sources.label,
        })
        with self._inventory_lock:
            self._inventory = inventory
        self._check_device_plugins(api_client, inventory)

        self.health = self._start_health(sources)
        self.controller = slices.start(
            api_client, cfg.driver_name, slices.Owner(kind="Node", name=cfg.node_name), None,
            metrics=self.metrics, resync_period_s=self.options.resync_period_s,
            stop_event=self.stop_event, on_error=self._background_error,
            list_attributes={"list": True, "scalar": False}.get(cfg.numa_node_attribute),
        )
        self._publish(inventory)
        self._start_plugin(api_client)
        self._start_hotplug(sources, discovery_options, inventory)
        self._start_simulated_faults(sources)
        self._start_http()
        watchdog = self.notifier.run_watchdog(self.stop_event, self.healthy, self.environ)
        if watchdog is not None:
            self._threads["sd-watchdog"] = watchdog
        # The sockets answer: the kubelet can register the plugin. Not waiting for it to have
        # done so is deliberate (the module's docstring says why); STATUS= follows it.
        self._status_registered = bool(self.plugin.registered)
        self.notifier.ready(self._status_text())
        self._log_ready()

    def _status_text(self) -> str:
        """systemd's STATUS= line: the kubelet's registration, devices, slices."""
        registered = self.plugin is not None and self.plugin.registered
        slices = "published" if self.controller is not None and self.controller.active \
            else "not published (no API)"
        return (f"{'registered with the kubelet' if registered else 'waiting for the kubelet'}; "
                f"serving {len(self.inventory.devices)} devices; slices {slices}")

    def _update_status(self) -> None:
        """A new STATUS= line when the kubelet's confirmation came or went (run loop)."""
        registered = self.plugin is not None and self.plugin.registered
        if registered != self._status_registered:
            self._status_registered = registered
            self.notifier.status(self._status_text())

    def _log_ready(self) -> None:
        """"agent ready" once /readyz would say so (the kubelet has confirmed the registration,
        slices in sync); until then, one line saying what it waits for. Called again from the
        run loop until it has been said."""
        if self._said_ready:
            return
        checks = ((self._check_slices, "ResourceSlices are in sync"),
                  (self._check_registered, "the kubelet confirms the registration"))
        waiting = [(until, why) for check, until in checks for ok, why in [check()] if not ok]
        if waiting:
            if not self._said_waiting:
                log.info(f"agent serving; not ready until {' and '.join(u for u, _ in waiting)}",
                         extra={"node": self.cfg.node_name,
                                "waiting_for": "; ".join(why for _, why in waiting)})
                self._said_waiting = True
            return
        self._said_ready = True
        log.info("agent ready", extra={"node": self.cfg.node_name, "driver": self.cfg.driver_name,
                                       "devices": len(self.inventory.devices)})

    def _check_device_plugins(self, api_client: Any, inventory: Inventory) -> None:
        """Refuse to start where a device plugin already serves what our classes offer as an
        extended resource (agent/deviceplugins.py says why); before anything is published."""
        from agent import deviceplugins as dp

        if self.options.allow_device_plugin_overlap:
            return
        advertised = dp.advertised_in_checkpoint(self.cfg.kubelet_dir)
        if api_client is not None:
            advertised = {**advertised, **dp.node_capacity(api_client, self.cfg.node_name)}
        if not advertised:
            return  # the usual node: no device plugin, nothing more to read
        classes = dp.cluster_classes(api_client, _shipped) if api_client is not None \
            else _shipped()
        if not dp.mapped_classes(classes).keys() & advertised.keys():
            return
        # Lazy: only a node where a device plugin advertises a name one of the classes maps
        # gets here; explain's allocator and its CEL engine are a quarter of a second.
        from agent.explain.probe import selects_a_device
        from agent.slices import Owner
        from agent.slices.render import render_slices
        from discovery.pools import build_resources

        slices = render_slices(self.cfg.driver_name, Owner(name=self.cfg.node_name),
                               build_resources(inventory, self.cfg.node_name))
        overlaps = dp.find_overlaps(classes, advertised, dp.class_selects(
            slices, self.cfg.node_name, selects_a_device))
        for overlap in overlaps[1:]:
            log.error("device-plugin overlap", extra={"resource": overlap.resource,
                                                      "device_class": overlap.device_class})
        if overlaps:
            raise DaemonError(overlaps[0].message())

    def _start_health(self, sources: Any) -> Any:
        from agent.health import HealthMonitor

        if self.options.health is None:
            log.info("device health monitoring off")
            return None
        monitor = HealthMonitor(
            sources, self.cfg.driver_name, self.options.health, self._health_changed,
            metrics=self.metrics, stop_event=self.stop_event,
        )
        self._cleanups.append(monitor.stop)
        monitor.start(lambda: self.inventory)
        return monitor

    def _health_changed(self, _health: Mapping[str, Any]) -> None:
        self._publish(self.inventory)

    def discovery_options(self) -> Any:
        """Every scan's options: the config's, the node's addresses, our MIG instances."""
        return discovery_options(self.cfg, node_addresses=self.options.node_addresses,
                                 mig_owned=self._mig_owned)

    def _mig_owned(self) -> frozenset[tuple[str, int, int]]:
        """The MIG instances our checkpoint names (--mig dynamic): the plugin's records once it
        runs; before, a look at the checkpoint file, so the first publish already knows."""
        from agent.checkpoint.store import CheckpointStore
        from agent.prepare.effects.miginstance import owned_instances

        if self.plugin is not None:
            return owned_instances(self.plugin.preparer.checkpoint.claims())
        if not self.cfg.checkpoint_path.is_file():
            return frozenset()
        return owned_instances(CheckpointStore(self.cfg.checkpoint_path).claims())

    def _rescan(self) -> Inventory:
        """A scan of the node, published (--vfs dynamic reads the VFs it made back so)."""
        from discovery.scan import discover

        assert self.sources is not None
        # The same options as every other scan: this rescan's inventory is published.
        inventory = discover(self.sources, self.discovery_options())
        self._publish(inventory)
        return inventory

    def _start_plugin(self, api_client: KubeHTTP | None) -> None:
        from agent.common.failpoints import FailpointConfigError, Failpoints
        from agent.daemon import wiring
        from agent.plugin import AlreadyRunningError, APIClaimSource, PluginOptions, SocketError
        from agent.prepare.effects.migcontrol import MigPartitions
        from agent.prepare.options import PrepareOptions
        from cdi.edits import EditsProvider
        from discovery.vfs import SysfsSriov

        cfg, run = self.cfg, self.options
        health_servicer = None
        if self.health is not None:
            from agent.health import HealthServicer

            health_servicer = HealthServicer(self.health, cfg.node_name)
        edits = EditsProvider(
            driver_root=run.driver_root, host_driver_root=run.host_driver_root,
            simulated=bool(cfg.simulate),
            sysfs_root=cfg.sysfs_root,
            simulated_nodes=self._simulated_nodes(),
        )
        try:
            # Crash tests only: DRA_AGENT_FAILPOINTS makes the agent die at chosen steps.
            failpoints = Failpoints.from_env(self.environ)
        except FailpointConfigError as err:
            raise DaemonError(str(err)) from err
        sources = self.sources
        assert sources is not None
        prepare = PrepareOptions(
            driver_name=cfg.driver_name, node_name=cfg.node_name, plugin_dir=cfg.plugin_dir,
            cdi_dir=cfg.cdi_dir, boot_id_path=run.boot_id_path,
            device_metadata=run.device_metadata, mps_pipe_dir=run.mps_pipe_dir,
        )
        mig = None
        if cfg.mig == "dynamic" and sources.gpu is not None:
            mig = MigPartitions(sources.gpu, failpoints)
        sriov = (sources.sriov or SysfsSriov(sources.sysfs_root)) if cfg.vfs == "dynamic" \
            else None
        self.plugin = wiring.plugin_server(
            PluginOptions(driver_name=cfg.driver_name, kubelet_dir=cfg.kubelet_dir,
                          pod_uid=run.pod_uid, rolling_update=run.rolling_update,
                          registration_timeout_s=run.registration_timeout_s),
            prepare, lambda: self.inventory, edits,
            APIClaimSource(api_client) if api_client is not None else NoAPIClaimSource(),
            metrics=self.metrics, health_servicer=health_servicer, failpoints=failpoints,
            gpu_control=self._gpu_control(), mig=mig, sriov=sriov, rescan=self._rescan,
        )
        try:
            self.plugin.start()
        except (AlreadyRunningError, SocketError) as err:
            self.plugin = None
            raise DaemonError(str(err)) from err

    def _simulated_nodes(self) -> SimulatedNodes | None:
        """--simulate-device-nodes: the stand-in device nodes' maker, in the plugin dir."""
        from cdi.simnodes import SimulatedNodes

        if not self.cfg.simulate_device_nodes:
            return None
        directory = self.cfg.simulated_dev_dir
        log.info("simulated devices get stand-in device nodes (1:3) at prepare",
                 extra={"directory": str(directory)})
        return SimulatedNodes(directory)

    def _gpu_control(self) -> GpuControl | None:
        """What sets GPU-wide share settings: a recording stand-in on a simulated node,
        nvidia-smi on a real one (None without it: a share asking for a time slice fails)."""
        from agent.prepare.gpucontrol import NvidiaSmi, RecordingGpuControl, find_nvidia_smi

        if self.cfg.simulate:  # beside the checkpoint: the GPUs outlive the agent
            return RecordingGpuControl(self.cfg.plugin_dir / SIMULATED_GPU_STATE)
        binary = find_nvidia_smi(self.options.driver_root)
        return NvidiaSmi(binary) if binary is not None else None

    def _start_simulated_faults(self, sources: Sources) -> None:
        """--simulate: the inbox 'dra-agent simulate fault' writes to, beside the checkpoint
        (agent/simfaults/); after the health monitor, whose event sets the faults reach."""
        if not self.cfg.simulate:
            return
        from agent.simfaults.inbox import FaultInbox

        inbox = FaultInbox(self.cfg.simulated_faults_dir, sources.gpu, lambda: self.inventory,
                           health=self.options.health, stop=self.stop_event)
        thread = inbox.start()
        if thread is not None:
            self._threads["simulated-faults"] = thread

    def _start_hotplug(self, sources: Any, options: Any, inventory: Inventory) -> None:
        from discovery.hotplug import HotplugWatcher, NullEvents, UdevEvents

        events: Any
        if self.cfg.simulate:
            events = NullEvents(self.stop_event)
        else:
            try:
                events = UdevEvents()
            except OSError as err:
                log.warning("udev events unavailable; hotplug falls back to periodic rescans",
                            extra={"error": str(err), "every_s": self.options.slow_rescan_s})
                events = NullEvents(self.stop_event)
        watcher = HotplugWatcher(
            sources, options, self._publish, events,
            debounce_s=self.options.hotplug_debounce_s,
            slow_rescan_s=self.options.slow_rescan_s, stop_event=self.stop_event,
            initial=inventory,
            on_scan=lambda _inv, seconds: self.metrics.discovery_duration.observe(seconds),
        )
        self._threads["discovery-hotplug"] = watcher.start()

    def _start_http(self) -> None:
        from agent.httpserver import HealthServer, HealthServerError

        if not self.cfg.metrics_address or self.cfg.metrics_address == "none":
            return
        self.http = HealthServer(
            self.cfg.metrics_address, self.metrics.registry,
            checks={"plugin": self._check_plugin, "threads": self._check_threads},
            ready_checks={"registered": self._check_registered, "slices": self._check_slices},
            reuse_port=self.options.rolling_update,
        )
        try:
            self.http.start()
        except HealthServerError as err:
            self.http = None
            raise DaemonError(str(err)) from err

    # -- health checks -------------------------------------------------------------------

    def _check_plugin(self) -> tuple[bool, str]:
        ok = self.plugin is not None and self.plugin.serving
        return ok, "DRA socket serving" if ok else "DRA socket not serving"

    def _check_threads(self) -> tuple[bool, str]:
        dead = sorted(n for n, t in self._threads.items() if not t.is_alive())
        if self.controller is not None and not self.controller.alive():
            dead.append("resourceslice-controller")
        if self.health is not None and not self.health.alive():
            dead.append("health-monitor")
        if self.plugin is not None and not self.plugin.registration.alive():
            dead.append("registration-watchdog")
        if dead and not self.stop_event.is_set():
            return False, f"background thread(s) ended: {', '.join(dead)}"
        return True, "background threads alive"

    def _check_registered(self) -> tuple[bool, str]:
        """Readiness only: the kubelet has confirmed the registration of the socket now
        listening. Sockets alone are not enough (a rolling update would stop the old instance
        before the kubelet knows the new one); a kubelet that is down must not fail liveness.
        """
        plugin = self.plugin
        if plugin is None or not plugin.serving or not plugin.paths.registration.is_socket():
            return False, "registration socket not serving"
        status = plugin.registration.status
        if status is None:
            return False, "sockets serving, the kubelet has not confirmed the registration yet"
        if not status.registered:
            return False, (f"sockets serving, the kubelet refused the registration "
                           f"({status.error or 'no reason given'}); the socket is recreated")
        return True, "registered with the kubelet"

    def _check_slices(self) -> tuple[bool, str]:
        if self.controller is None or not self.controller.active:
            return True, "no API server: nothing to publish"
        ok = bool(self.controller.synced(0))
        return ok, "ResourceSlices published" if ok else "ResourceSlices not yet in sync"

    def healthy(self) -> bool:
        return self._check_plugin()[0] and self._check_threads()[0]

    # -- run and stop --------------------------------------------------------------------

    def _background_error(self, err: Exception) -> None:
        log.warning("resourceslice publishing", extra={"error": str(err)})

    def request_stop(self, reason: str) -> None:
        """Ask ``run()`` to stop; the first reason is the one reported.

        Safe in a signal handler: it only records and sets an event. The handler runs in the
        main thread, which may be inside the notifier's lock (sending READY=1, say) when the
        signal lands; notifying from here took that lock again and hung the agent for good.
        The run loop logs and notifies once it sees the event.
        """
        if self._stop_reason is None:
            self._stop_reason = reason
        self.stop_event.set()

    def _announce_stop(self) -> None:
        reason = self._stop_reason or "shutdown"
        log.info("stopping", extra={"reason": reason})
        self.notifier.stopping(f"stopping: {reason}")

    def run(self) -> int:
        """Start, then wait for a stop request or a dead background thread; return exit code."""
        self.start()
        return self.run_until_stopped()

    def run_until_stopped(self) -> int:
        """Wait (after ``start()``) for a stop request or a dead background thread, then shut
        down; 1 when a vital thread died, else 0."""
        try:
            while not self.stop_event.wait(0.5):
                self._log_ready()
                self._update_status()
                ok, why = self._check_threads()
                if not ok:
                    self._fatal = why
                    log.error("fatal: a background thread died", extra={"cause": why})
                    self.request_stop(why)
            self._announce_stop()
        finally:
            self.shutdown()
        return 1 if self._fatal else 0

    def shutdown(self) -> None:
        """Stop everything that started, in reverse order; idempotent."""
        self.stop_event.set()
        if self.plugin is not None:
            # In-flight calls finish within the grace period; sockets are removed.
            self.plugin.stop(self.options.shutdown_grace_s)
            self.plugin = None
        if self.http is not None:
            self.http.stop()
            self.http = None
        if self.controller is not None:
            self.controller.stop()  # slices stay in the cluster on purpose
            self.controller = None
        for name, thread in list(self._threads.items()):
            thread.join(timeout=5)
            if thread.is_alive():
                log.warning("thread did not stop in time", extra={"thread": name})
        self._threads.clear()
        while self._cleanups:
            cleanup = self._cleanups.pop()
            try:
                cleanup()
            except Exception:
                log.exception("cleanup failed")
        self.notifier.close()


def _shipped() -> list[Mapping[str, Any]]:
    """The DeviceClasses in the package (deploy/base's), as plain dicts."""
    from agent.explain.docs import packaged_classes

    return [doc.obj for doc in packaged_classes()]
