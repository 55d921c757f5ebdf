"""``dra-agent run``: wires discovery -> controller and the kubelet plugin, plus health/metrics.

The kubelet's two sockets first (``agent.daemon.early``: ``GetInfo`` answered while the rest
loads), then the kubeconfig read, discovery, the device-plugin refusal as far as the node's
files tell, the health monitor (the plugin serves its stream), the plugin (recovery: the
checkpoint read, lost CDI specs rewritten; then the DRA calls waiting at the socket run), the
metrics (prometheus_client loads at ``Metrics.bind``), the Node's capacity for the refusal
(the first request), the slices' controller and first publish, hotplug, HTTP, READY=1.

Registering before discovery is honest: the kubelet calls a DRA driver only to prepare a claim
the scheduler allocated on devices of that driver's ResourceSlices, and ours are published
after discovery, as before; registration promises only that the sockets answer. What reaches
the DRA socket before the plugin is ready waits for it, a few seconds at most
(``agent.plugin.serving``), then is answered UNAVAILABLE, which the kubelet retries: nothing is
prepared before the checkpoint is recovered. A start that fails later (a bad kubeconfig,
discovery, a refusal) is one line and exit 1, and removes both sockets, as a stopping agent
does. The upstream helper (``kubeletplugin.Start``) registers at start too, before its driver
has published anything. /readyz cannot pass early: it starts last, and waits for the slices.

/readyz also waits for the kubelet's confirmation of the registration: a rolling update stops
the old Pod once the new one is Ready, and a new one Ready before the kubelet registered it
leaves the node without the driver for a moment. READY=1 does not wait for the kubelet
(systemd's start timeout would fail the unit whenever the kubelet is slow or down; it
registers plugins only once its runtime is up); the STATUS= line says when it has confirmed.

Stop order is the reverse. ResourceSlices are kept: the kubelet wipes them after 30 s if the
agent does not come back, and a restart within that window costs no write."""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from agent.common import memory
from agent.common.config import Config
from agent.common.metrics import Metrics
from agent.daemon import early, machine, probes, wiring
from agent.daemon.options import DaemonError, RunOptions, StoppedWhileStarting
from agent.health.model import DeviceHealth
from agent.inventory import discovery_options
from agent.kube.transport import KubeHTTP
from agent.plugin import AlreadyRunningError, PluginServer, SocketError
from agent.plugin.serving import ServedSockets
from agent.prepare import DevicePreparer
from agent.sdnotify import Notifier
from discovery.model import Inventory
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.sources import Sources

if TYPE_CHECKING:  # the slices and the HTTP endpoint load after registration
    from agent.health import HealthMonitor
    from agent.httpserver import HealthServer
    from agent.slices import Controller

log = logging.getLogger("agent.daemon")

#: The run loop's period until "agent ready" is said, then after: a dead vital thread is fatal,
#: and STATUS= follows the kubelet, within it. An idle agent's every wake-up is CPU a Go driver
#: does not spend (docs/benchmarks.md, the fleet); /healthz and /readyz do not wait for it.
_READY_CHECK_S = 0.5
_RUN_CHECK_S = 2.0


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
        sockets: ServedSockets | None = None,
    ) -> None:
        """``sources`` replaces what ``cfg`` would pick (the host, or ``--simulate``): the seam
        for tests and benchmarks that change a machine's tree while the agent runs.
        ``sockets``: the kubelet's sockets ``dra-agent run`` served before loading this
        (``agent.daemon.early``); the daemon serves them first itself otherwise. Its
        ``stop`` or ``run`` removes them, also when the start fails."""
        self.cfg = cfg
        self.sockets = sockets
        self.options = options or RunOptions()
        self.notifier = notifier or Notifier.from_env(environ)
        # Bound once the plugin has started: prometheus_client loads after registration.
        self.metrics = metrics or Metrics(deferred=True)
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
        self.controller: Controller | None = None
        self.plugin: PluginServer | None = None
        #: The plugin's preparer, whose records name the MIG instances the agent made.
        self.preparer: DevicePreparer | None = None
        self.http: HealthServer | None = None
        self.health: HealthMonitor | None = None
        #: Where discovery reads the machine (a generated tree with --simulate).
        self.sources: Sources | None = sources

    # -- inventory -----------------------------------------------------------------------

    @property
    def inventory(self) -> Inventory:
        with self._inventory_lock:
            return self._inventory

    def _publish(self, inventory: Inventory) -> None:
        """New inventory: remember it for the plugin and hand it to the controller."""
        with self._inventory_lock:
            self._inventory = inventory
        self._record_devices(inventory)
        if self.controller is not None:
            published = self.health.apply_taints(inventory) if self.health else inventory
            self.controller.update(build_resources(published, self.cfg.node_name))

    def _record_devices(self, inventory: Inventory) -> None:
        """dra_agent_devices{type, health}: health is healthy, unhealthy or unmonitored."""
        self.metrics.devices.clear()
        for (kind, health), n in probes.device_counts(inventory, self.health).items():
            self.metrics.devices.labels(type=kind, health=health).set(n)

    # -- start ---------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up; raises DaemonError (after undoing what started) on failure."""
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> None:
        cfg = self.cfg
        if self.sockets is None:  # the registration answers from here on
            self.sockets = early.serve(cfg, self.options)
        # The kubeconfig next: a wrong one is one line and exit 1 before any monitor starts.
        # Read, not connected: urllib3 and ssl wait until the kubelet can register us.
        client = machine.api_client(cfg, self.environ)
        self.notifier.status("discovering devices")
        sources = self.sources = self.sources or machine.sources(cfg, self._cleanups)
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
        # The kubelet's own record of its device plugins before we serve; where it names
        # none, the Node's capacity (a request) after, before anything is published.
        capacity_pending = False
        if not self.options.allow_device_plugin_overlap:
            capacity_pending = machine.refuse_device_plugin_overlap(cfg, client, inventory)

        self.health = self._start_health(sources)
        self._start_plugin(client, sources)
        # The DRA calls run from here on: what follows is what they do not need.
        self.metrics.bind()
        if client is not None:
            machine.connect(cfg, client, self.environ)
        node_uid = None  # read with the capacity: the slices' owner
        if capacity_pending and client is not None:
            node_uid = machine.refuse_capacity_overlap(cfg, client, inventory)
        self._start_slices(client, node_uid)
        self._publish(inventory)
        self._start_hotplug(sources, discovery_options, inventory)
        self._start_simulated_faults(sources)
        self._start_http()
        watchdog = self.notifier.run_watchdog(self.stop_event, self.healthy, self.environ)
        if watchdog is not None:
            self._threads["sd-watchdog"] = watchdog
        # The sockets answer: the kubelet can register the plugin. Not waiting for it to have
        # done so is deliberate (the module's docstring says why); STATUS= follows it.
        self._status_registered = self.plugin is not None and self.plugin.registered
        self.notifier.ready(self._status_text())
        self._log_ready()

    def _start_slices(self, client: KubeHTTP | None, node_uid: str | None = None) -> None:
        # Lazy: the controller (and its first request) after the kubelet can register us.
        from agent import slices

        self.controller = slices.start(
            client, self.cfg.driver_name, slices.Owner(kind="Node", name=self.cfg.node_name),
            None, metrics=self.metrics, resync_period_s=self.options.resync_period_s,
            stop_event=self.stop_event, on_error=self._background_error,
            list_attributes={"list": True, "scalar": False}.get(self.cfg.numa_node_attribute),
            node_uid=node_uid,
        )

    def _status_text(self) -> str:
        return probes.status_text(self.plugin, self.controller, len(self.inventory.devices))

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

    def _start_health(self, sources: Sources) -> HealthMonitor | None:
        if self.stop_event.is_set():  # the monitor (and the rest) would only stop at once
            raise StoppedWhileStarting
        if self.options.health is None:
            log.info("device health monitoring off")
            return None
        from agent.health import HealthMonitor  # --no-health never loads it (docs/memory.md)
        monitor = HealthMonitor(
            sources, self.cfg.driver_name, self.options.health, self._health_changed,
            metrics=self.metrics, stop_event=self.stop_event,
        )
        self._cleanups.append(monitor.stop)
        monitor.start(lambda: self.inventory)
        return monitor

    def _health_changed(self, _health: Mapping[str, DeviceHealth]) -> None:
        self._publish(self.inventory)

    def discovery_options(self) -> DiscoveryOptions:
        """Every scan's options: the config's, the node's addresses, our MIG instances."""
        return discovery_options(self.cfg, node_addresses=self.options.node_addresses,
                                 mig_owned=self._mig_owned)

    def _mig_owned(self) -> frozenset[tuple[str, int, int]]:
        return machine.mig_owned(self.preparer, self.cfg.checkpoint_path)

    def _rescan(self) -> Inventory:
        """A scan of the node, published (--vfs dynamic reads the VFs it made back so)."""
        assert self.sources is not None
        # The same options as every other scan: this rescan's inventory is published.
        inventory = discover(self.sources, self.discovery_options())
        self._publish(inventory)
        return inventory

    def _start_plugin(self, client: KubeHTTP | None, sources: Sources) -> None:
        health_servicer = None
        if self.health is not None:
            from agent.health import HealthServicer
            health_servicer = HealthServicer(self.health, self.cfg.node_name)
        self.plugin, self.preparer = wiring.node_plugin(
            self.cfg, self.options, sources, lambda: self.inventory, rescan=self._rescan,
            client=client, metrics=self.metrics, health_servicer=health_servicer,
            environ=self.environ, sockets=self.sockets,
        )
        try:
            self.plugin.start()
        except (AlreadyRunningError, SocketError) as err:
            self.plugin = None
            raise DaemonError(str(err)) from err

    def _start_simulated_faults(self, sources: Sources) -> None:
        thread = machine.simulated_faults(self.cfg, self.options, sources, lambda: self.inventory,
                                          self.stop_event)
        if thread is not None:
            self._threads["simulated-faults"] = thread

    def _start_hotplug(self, sources: Sources, options: DiscoveryOptions,
                       inventory: Inventory) -> None:
        self._threads["discovery-hotplug"] = machine.hotplug(
            self.cfg, self.options, sources, options, initial=inventory, publish=self._publish,
            stop=self.stop_event, metrics=self.metrics)

    def _start_http(self) -> None:
        # Lazy: prometheus_client's HTTP side loads after the kubelet can register us.
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

    # -- health checks (agent.daemon.probes) ----------------------------------------------

    def _check_plugin(self) -> probes.Check:
        return probes.plugin_serving(self.plugin)

    def _check_threads(self) -> probes.Check:
        return probes.threads_alive(self._threads, self.controller, self.health, self.plugin,
                                    self.stop_event.is_set())

    def _check_registered(self) -> probes.Check:
        return probes.registered(self.plugin)

    def _check_slices(self) -> probes.Check:
        return probes.slices_synced(self.controller)

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
        try:
            self.start()
        except StoppedWhileStarting:  # a signal came first: undone by start, a clean stop
            self._announce_stop()
            return 0
        if not gc.isenabled():  # paused for the start (``dra-agent run``): its garbage
            gc.collect()  # freed, and what is left (modules, classes, our parts: there for
            gc.freeze()  # the process's life) out of the generations no later pass walks
            gc.enable()
            memory.trim()  # the start's freed temporaries back to the kernel (docs/memory.md)
        return self.run_until_stopped()

    def run_until_stopped(self) -> int:
        """Wait (after ``start()``) for a stop request or a dead background thread, then shut
        down; 1 when a vital thread died, else 0."""
        try:
            while not self.stop_event.wait(_RUN_CHECK_S if self._said_ready else _READY_CHECK_S):
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
            self.preparer = None
        if self.sockets is not None:  # served, but the start failed before the plugin
            self.sockets.stop(0)
            self.sockets = None
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
