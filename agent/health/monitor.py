"""``HealthMonitor``: runs the watchers, feeds the state machine, publishes changes.

Threads (DESIGN.md: threads, one stop event): ``health-worker`` polls NIC link state, reads
the GPU watcher's levels, evaluates the state machine and calls ``on_change``; ``health-gpu``
blocks in the NVML event wait; one ``health-events`` thread per event source (udev, and
rtnetlink link messages on a real host) only wakes the worker early. ``on_change`` is called
from the worker thread, one call at a time, with the complete published mapping (device
name -> DeviceHealth).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.common.metrics import Metrics
from agent.health.gpu import SOURCE as GPU_SOURCE
from agent.health.gpu import GpuWatcher, gpu_uuid
from agent.health.model import ChangeFeed, Condition, DeviceHealth, HealthState, Kind
from agent.health.netlink import open_link_events
from agent.health.nic import SOURCE as NIC_SOURCE
from agent.health.nic import NicProbe
from agent.health.options import HealthOptions
from agent.health.taints import apply_taints
from agent.health.tracker import Tracker, Transition
from discovery.hotplug import DeviceEvents
from discovery.model import DeviceType, Inventory
from discovery.sources import Sources

log = logging.getLogger("agent.health")

_GPU_TYPES = (DeviceType.GPU, DeviceType.MIG)
_WAKING_SUBSYSTEMS = frozenset({"net", "infiniband", "pci"})


class HealthMonitor:
    """Device health for one node. See the package docstring for the public contract."""

    def __init__(  # noqa: PLR0917 (the daemon's call shape is fixed)
        self,
        sources: Sources,
        driver_name: str,
        options: HealthOptions,
        on_change: Callable[[Mapping[str, DeviceHealth]], None],
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        events: Sequence[DeviceEvents] = (),
        stop_event: threading.Event | None = None,
        open_links: Callable[[], DeviceEvents | None] | None = None,
    ) -> None:
        self.sources = sources
        self.driver_name = driver_name
        self.options = options
        self.on_change = on_change
        self.metrics = metrics or Metrics()
        self.clock = clock
        #: Bumped on every published change (additions and removals included); the kubelet
        #: stream waits on it.
        self.changes = ChangeFeed()
        self._events: tuple[DeviceEvents, ...] = tuple(events)
        #: Opens the source of link messages (None: rtnetlink, on the host's own sysfs only).
        self._open_links = open_links
        self._stop = stop_event or threading.Event()
        self._lock = threading.Lock()  # guards the tracker
        self._tracker = Tracker(options.quiet_period_s, options.min_publish_interval_s)
        self._wake = threading.Event()
        self._nic_now = False
        self._nic = NicProbe(sources.sysfs_root)
        self._gpu: GpuWatcher | None = None
        self._provider: Callable[[], Inventory] = lambda: Inventory(devices=())
        self._threads: list[threading.Thread] = []
        self._deadline: float | None = None
        self._next_nic = 0.0
        #: The link-state poll period: ``nic_poll_s``, or the backstop with link messages.
        self._nic_period = options.nic_poll_s
        #: Number of on_change calls, for tests and benchmarks.
        self.publishes = 0

    # -- public API --------------------------------------------------------------------------

    def start(self, inventory_provider: Callable[[], Inventory]) -> None:
        """Compute the first state synchronously (GPUs registered, links read), then start
        the threads. ``on_change`` is called now only if some device is already unhealthy;
        ``snapshot()``/``apply_taints()`` are valid as soon as this returns."""
        if self._threads or self._stop.is_set():
            raise RuntimeError("health monitor already started (or stopped: build a new one)")
        self._provider = inventory_provider
        if self.sources.gpu is not None:
            self._gpu = GpuWatcher(self.sources.gpu, self.options, self,
                                   inventory=self._inventory, stop=self._stop, clock=self.clock)
            self._gpu.setup()
        opener = self._open_links
        if opener is None and self.sources.sysfs_root == Path("/sys"):
            opener = open_link_events  # only the host's sysfs changes with its netlink messages
        if self.options.link_events and opener is not None:
            link = opener()
            if link is not None:
                self._events += (link,)
                self._nic_period = max(self.options.nic_poll_s, self.options.nic_backstop_s)
        self._cycle(poll_nics=True)
        self._spawn(self._run, "health-worker")
        if self._gpu is not None:
            self._spawn(self._gpu.run, "health-gpu")
        for i, source in enumerate(self._events):
            self._spawn(functools.partial(self._follow, source), f"health-events-{i}")

    def alive(self) -> bool:
        """Whether every monitoring thread still runs (before stop()); the daemon treats
        ``False`` as fatal, since a dead watcher would leave faults unreported."""
        return self._stop.is_set() or all(t.is_alive() for t in self._threads)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every thread; returns when they have ended (or ``timeout`` passed)."""
        self._stop.set()
        self._wake.set()
        for source in self._events:
            try:
                source.close()
            except Exception as err:  # closing is best effort
                log.debug("event source close failed", extra={"error": str(err)})
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))
        self._threads = []
        self.changes.close()

    def snapshot(self) -> Mapping[str, DeviceHealth]:
        with self._lock:
            return self._tracker.snapshot()

    def apply_taints(self, inventory: Inventory) -> Inventory:
        """``inventory`` with a taint per unhealthy/unmonitored condition (none on healthy)."""
        return apply_taints(inventory, self.snapshot(), self.driver_name, self.options)

    # -- HealthSink (called by the GPU watcher thread) ----------------------------------------

    def event(self, devices: Sequence[str], source: str, condition: Condition) -> None:
        with self._lock:
            self._tracker.event(devices, source, condition, self.clock())
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def count(self, kind: str) -> None:
        self.metrics.health_events.labels(kind).inc()

    # -- internals ---------------------------------------------------------------------------

    def _inventory(self) -> Inventory:
        return self._provider()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _follow(self, source: DeviceEvents) -> None:
        while not self._stop.is_set():
            try:
                event = source.poll(0.5)
            except Exception:
                if not self._stop.is_set():
                    log.exception("device event source failed; relying on polling")
                return
            if event is not None and event.subsystem in _WAKING_SUBSYSTEMS:
                self._nic_now = True
                self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.clock()
            wait = self._next_nic - now
            if self._deadline is not None:
                wait = min(wait, self._deadline - now)
            self._wake.wait(max(wait, 0.0))
            self._wake.clear()
            if self._stop.is_set():
                return
            poll = self._nic_now or self.clock() >= self._next_nic
            try:
                self._cycle(poll_nics=poll)
            except Exception:
                log.exception("health evaluation failed")
                self._stop.wait(self.options.nic_poll_s)

    def _static_levels(self, inventory: Inventory) -> dict[str, list[Condition]]:
        """GPUs no watcher can see: other vendors, or no NVML at all."""
        out: dict[str, list[Condition]] = {}
        for d in inventory.devices:
            if d.type not in _GPU_TYPES:
                continue
            if gpu_uuid(d) is None:
                why = f"no health source for {d.host.vendor or 'this'} GPUs"
            elif self._gpu is None:
                why = "NVML is not available"
            else:
                continue
            out[d.name] = [Condition(Kind.UNMONITORED, "", why)]
        return out

    def _cycle(self, poll_nics: bool) -> None:
        inventory = self._inventory()
        nic_levels = None
        if poll_nics:
            self._nic_now = False
            nic_levels = self._nic.poll(inventory)
            self._next_nic = self.clock() + self._nic_period
        gpu_levels = self._static_levels(inventory)
        if self._gpu is not None:
            gpu_levels.update(self._gpu.levels(inventory))
        with self._lock:
            t = self._tracker
            t.set_devices(d.name for d in inventory.devices)
            now = self.clock()
            raised = t.levels(GPU_SOURCE, gpu_levels, now)
            if nic_levels is not None:
                raised += t.levels(NIC_SOURCE, nic_levels, now)
            transitions, self._deadline = t.evaluate(now)
            snapshot = t.snapshot()
        for _, cond in raised:
            self.count(str(cond.kind))
        if transitions:
            self._published(transitions, snapshot)

    def _published(self, transitions: list[Transition],
                   snapshot: Mapping[str, DeviceHealth]) -> None:
        for tr in transitions:
            _log_transition(tr)
            if (tr.before is not None and tr.before.state is HealthState.UNHEALTHY
                    and tr.after is not None and tr.after.state is HealthState.HEALTHY):
                self.count("recovered")
        self.changes.bump()
        if any(_matters(tr) for tr in transitions):
            self.publishes += 1
            try:
                self.on_change(snapshot)
            except Exception:
                log.exception("health change handler failed")


def _matters(tr: Transition) -> bool:
    """Whether taints may differ: anything but a healthy device arriving or leaving."""
    before = tr.before.state if tr.before is not None else HealthState.HEALTHY
    after = tr.after.state if tr.after is not None else HealthState.HEALTHY
    return not (before is after is HealthState.HEALTHY)


def _log_transition(tr: Transition) -> None:
    after, before = tr.after, tr.before
    if after is None or (before is None and after.state is HealthState.HEALTHY):
        return
    fields = {
        "device": after.device,
        "health": str(after.state),
        "was": str(before.state) if before is not None else "-",
        "conditions": ",".join(f"{c.kind}={c.value}" if c.value else str(c.kind)
                               for c in after.conditions) or "-",
        "reason": after.message or "-",
    }
    if after.state is HealthState.HEALTHY:
        log.info("device healthy", extra=fields)
    elif after.recovering:
        log.info("device recovering", extra=fields)
    else:
        log.warning(f"device {after.state}", extra=fields)
