"""GPU health from NVML: one event thread per node.

Every NVIDIA GPU is registered in one NVML event set for critical Xids and double-bit ECC
errors. Per GPU the watcher is in one of four modes:

* ``events``: registered; Xids and ECC errors arrive as events.
* ``polled``: the GPU refused event registration (not supported, or an error); a liveness
  probe every ``gpu_poll_s`` still notices a lost GPU. Xids cannot be seen this way.
* ``lost``: NVML answers GPU_IS_LOST (fell off the bus). Probed every ``gpu_poll_s``; when it
  answers again (after a reset) it is registered again.
* ``unmonitored``: neither events nor the probe work, or NVML itself is unavailable.

MIG devices inherit their parent's mode, and a whole-GPU event applies to all its MIG
devices; an event naming a GPU/compute instance applies to the MIG devices it covers.
The watcher only reports; the monitor owns the state machine and the publishing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol

from agent.health.model import Condition, Kind
from agent.health.options import HealthOptions
from agent.health.xids import describe_xid
from discovery.gpulib import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    WHOLE_GPU,
    DeviceHandle,
    EventSet,
    GpuEvent,
    GpuIsLostError,
    GpuLibrary,
    GpuLibraryError,
    GpuTimeoutError,
    NotSupportedError,
)
from discovery.model import Device, DeviceType, Inventory

log = logging.getLogger("agent.health.gpu")

SOURCE = "gpu"
WANTED_EVENTS = EVENT_XID_CRITICAL | EVENT_DOUBLE_BIT_ECC
_GPU_TYPES = (DeviceType.GPU, DeviceType.MIG)


class HealthSink(Protocol):
    """Where watchers report; the monitor implements it."""

    def event(self, devices: Sequence[str], source: str, condition: Condition) -> None: ...

    def wake(self) -> None:
        """Something a level depends on changed: re-read the watchers' levels now."""
        ...

    def count(self, kind: str) -> None: ...


class Mode(StrEnum):
    EVENTS = "events"
    POLLED = "polled"
    LOST = "lost"
    UNMONITORED = "unmonitored"


def gpu_uuid(device: Device) -> str | None:
    """The physical GPU a device lives on (a MIG device's parent)."""
    return device.host.parent_uuid or device.host.uuid


def devices_for(inventory: Inventory, uuid: str, gi: int = WHOLE_GPU,
                ci: int = WHOLE_GPU) -> list[str]:
    """Devices an event on (GPU ``uuid``, instance ``gi``/``ci``) concerns."""
    out = []
    for d in inventory.devices:
        if d.type not in _GPU_TYPES or gpu_uuid(d) != uuid:
            continue
        # A whole-GPU event covers every MIG device; a GI event every CI inside that GI.
        if gi == WHOLE_GPU or (d.host.mig_gi == gi and ci in (WHOLE_GPU, d.host.mig_ci)):
            out.append(d.name)
    return out


class GpuWatcher:
    def __init__(self, lib: GpuLibrary, options: HealthOptions, sink: HealthSink, *,
                 inventory: Callable[[], Inventory], stop: threading.Event,
                 clock: Callable[[], float]) -> None:
        self.lib = lib
        self.options = options
        self.sink = sink
        self.inventory = inventory
        self.stop_event = stop
        self.clock = clock
        self._lock = threading.Lock()  # guards _modes, _reasons, _init_error
        self._modes: dict[str, Mode] = {}
        self._reasons: dict[str, str] = {}
        self._handles: dict[str, DeviceHandle] = {}
        self._events: EventSet | None = None
        self._init_error: str | None = "NVML not initialised yet"
        self._next_tick = 0.0
        self._next_init = 0.0
        self._unattributed = False  # the last lost-GPU report named no GPU

    # -- levels (read by the monitor thread) -------------------------------------------------

    def modes(self) -> dict[str, Mode]:
        with self._lock:
            return dict(self._modes)

    def levels(self, inventory: Inventory) -> dict[str, list[Condition]]:
        """Device name -> level conditions (gpu-lost, unmonitored) of every GPU/MIG device."""
        with self._lock:
            modes, reasons, init_error = dict(self._modes), dict(self._reasons), self._init_error
        out: dict[str, list[Condition]] = {}
        for d in inventory.devices:
            if d.type not in _GPU_TYPES:
                continue
            uuid = gpu_uuid(d)
            if uuid is None:
                continue  # not an NVIDIA GPU: the monitor marks it unmonitored
            mode = modes.get(uuid)
            if init_error is not None:
                out[d.name] = [Condition(Kind.UNMONITORED, "", f"NVML unavailable: {init_error}")]
            elif mode is None:
                out[d.name] = [Condition(Kind.UNMONITORED, "", f"GPU {uuid} not found by NVML")]
            elif mode is Mode.LOST:
                out[d.name] = [Condition(Kind.GPU_LOST, "",
                                         f"GPU {uuid} is lost (NVML: GPU_IS_LOST)")]
            elif mode is Mode.UNMONITORED:
                out[d.name] = [Condition(Kind.UNMONITORED, "",
                                         reasons.get(uuid, "no health signal"))]
        return out

    def _set(self, uuid: str, mode: Mode, reason: str = "") -> bool:
        with self._lock:
            old = self._modes.get(uuid)
            self._modes[uuid] = mode
            if reason:
                self._reasons[uuid] = reason
        if old != mode:
            level = logging.INFO if mode in (Mode.EVENTS, Mode.POLLED) else logging.WARNING
            log.log(level, "GPU health monitoring mode", extra={
                "uuid": uuid, "mode": str(mode), "was": str(old) if old else "-",
                "reason": reason or "-"})
        return old != mode

    # -- setup -------------------------------------------------------------------------------

    def setup(self) -> None:
        """Initialise NVML, find the GPUs, register events; synchronous so the first
        published state is already right."""
        try:
            self.lib.init()
        except GpuLibraryError as err:
            with self._lock:
                first = self._init_error == "NVML not initialised yet"
                self._init_error = str(err) or type(err).__name__
            if first:
                # Only worth a warning when discovery found NVIDIA devices to watch; a NIC-only
                # node (no driver at all) is normal.
                has_gpus = any(gpu_uuid(d) for d in self.inventory().devices
                               if d.type in _GPU_TYPES)
                log.log(logging.WARNING if has_gpus else logging.INFO,
                        "NVML unavailable: GPUs are unmonitored", extra={"error": str(err)})
            self._next_init = self.clock() + self.options.gpu_retry_s
            return
        with self._lock:
            self._init_error = None
        self._enumerate()
        self._rebuild()
        self._next_tick = self.clock() + self.options.gpu_poll_s

    def _enumerate(self) -> None:
        handles: dict[str, DeviceHandle] = {}
        try:
            count = self.lib.device_count()
        except GpuLibraryError as err:
            log.warning("NVML device count failed", extra={"error": str(err)})
            count = 0
        for index in range(count):
            try:
                handle = self.lib.device_handle_by_index(index)
                handles[self.lib.device_uuid(handle)] = handle
            except GpuLibraryError as err:
                # Without its UUID we cannot tell which device it is: it stays unmonitored.
                log.warning("cannot identify GPU", extra={"index": index, "error": str(err)})
        self._handles = handles
        with self._lock:
            for uuid in set(self._modes) - set(handles):
                del self._modes[uuid]

    def _free(self) -> None:
        if self._events is not None:
            try:
                self.lib.event_set_free(self._events)
            except GpuLibraryError as err:
                log.debug("event set free failed", extra={"error": str(err)})
            self._events = None

    def _rebuild(self) -> None:
        """A fresh event set with every GPU that is not lost; the others are probed."""
        self._free()
        try:
            self._events = self.lib.event_set_create()
        except GpuLibraryError as err:
            log.warning("NVML event set unavailable: polling GPUs", extra={"error": str(err)})
            for uuid in self._handles:
                if self.modes().get(uuid) is not Mode.LOST:
                    self._set(uuid, Mode.POLLED, f"NVML events unavailable ({err})")
        else:
            for uuid, handle in self._handles.items():
                if self.modes().get(uuid) is Mode.LOST:
                    continue
                self._register(uuid, handle, self._events)
        for uuid in self._handles:
            if self.modes().get(uuid) is Mode.POLLED:
                self._probe(uuid)
        self.sink.wake()

    def _register(self, uuid: str, handle: DeviceHandle, events: EventSet) -> None:
        try:
            mask = self.lib.device_supported_event_types(handle) & WANTED_EVENTS
            if not mask & EVENT_XID_CRITICAL:
                raise NotSupportedError("no Xid events on this GPU",
                                        call="device_supported_event_types")
            self.lib.device_register_events(handle, mask, events)
        except GpuIsLostError:
            self._set(uuid, Mode.LOST)
        except GpuLibraryError as err:
            self._set(uuid, Mode.POLLED, f"NVML events unavailable ({err})")
        else:
            self._set(uuid, Mode.EVENTS)

    def _probe(self, uuid: str) -> Mode:
        """Liveness of one GPU: a call that reaches the driver (memory info)."""
        handle = self._handles[uuid]
        try:
            self.lib.device_memory_total(handle)
        except GpuIsLostError:
            self._set(uuid, Mode.LOST)
            return Mode.LOST
        except GpuLibraryError as err:
            self._set(uuid, Mode.UNMONITORED,
                      f"no NVML events and the liveness probe fails ({err})")
            return Mode.UNMONITORED
        mode = self.modes().get(uuid)
        if mode in (Mode.LOST, Mode.UNMONITORED):
            # Alive again: polled until the caller re-registers it for events.
            self._set(uuid, Mode.POLLED, "answers again")
            return Mode.EVENTS
        return Mode.POLLED if mode is Mode.POLLED else Mode.EVENTS

    # -- the thread --------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.step()
        except Exception:
            log.exception("GPU health watcher failed; GPUs are unmonitored")
            with self._lock:
                self._init_error = "health watcher crashed (see the log)"
            self.sink.wake()
        finally:
            self._free()
            if self._init_error is None:
                try:
                    self.lib.shutdown()
                except GpuLibraryError as err:
                    log.debug("NVML shutdown failed", extra={"error": str(err)})

    def step(self) -> None:
        """One iteration of the thread: retry init, probe on schedule, wait for one event."""
        now = self.clock()
        if self._init_error is not None:
            if now >= self._next_init:
                self.setup()
                self.sink.wake()
            self.stop_event.wait(min(self.options.gpu_wait_ms / 1000, self.options.gpu_retry_s))
            return
        if now >= self._next_tick:
            self._tick()
            self._next_tick = self.clock() + self.options.gpu_poll_s
        registered = any(m is Mode.EVENTS for m in self.modes().values())
        if self._events is None or not registered:
            self.stop_event.wait(min(self.options.gpu_wait_ms / 1000,
                                     max(self._next_tick - self.clock(), 0.001)))
            return
        try:
            event = self.lib.event_set_wait(self._events, self.options.gpu_wait_ms)
        except GpuTimeoutError:
            return
        except GpuIsLostError:
            self._lost_during_wait()
            return
        except GpuLibraryError as err:
            log.warning("NVML event wait failed; re-registering", extra={"error": str(err)})
            self.sink.count("nvml-error")
            self.stop_event.wait(self.options.gpu_wait_ms / 1000)
            self._rebuild()
            return
        if event is not None:
            self._handle(event)

    def _tick(self) -> None:
        """Probe GPUs without events; re-enumerate when the inventory knows GPUs we do not."""
        known = set(self._handles)
        wanted = {u for d in self.inventory().devices
                  if d.type in _GPU_TYPES and (u := gpu_uuid(d)) is not None}
        rebuild = False
        if wanted - known:
            self._enumerate()
            rebuild = bool(set(self._handles) - known)
        for uuid, mode in self.modes().items():
            if mode is not Mode.EVENTS and self._probe(uuid) is Mode.EVENTS:
                log.info("GPU answers again", extra={"uuid": uuid, "was": str(mode)})
                rebuild = True
        if rebuild:
            self._rebuild()
        self.sink.wake()

    def _lost_during_wait(self) -> None:
        """The wait said a GPU is lost but not which: probe every registered GPU."""
        lost = [u for u, m in self.modes().items()
                if m is Mode.EVENTS and self._probe(u) is Mode.LOST]
        if not lost:
            # Said once per streak: a driver that keeps saying so would flood the log.
            level = logging.DEBUG if self._unattributed else logging.WARNING
            log.log(level, "NVML event wait reports a lost GPU, but every GPU answers")
            self._unattributed = True
            self.stop_event.wait(self.options.gpu_wait_ms / 1000)
        else:
            self._unattributed = False
        self._rebuild()

    def _handle(self, event: GpuEvent) -> None:
        if event.event_type & EVENT_XID_CRITICAL:
            xid = event.data
            if xid in self.options.ignored_xids:
                self.sink.count("xid-ignored")
                log.info("ignored Xid", extra={"uuid": event.uuid, "xid": xid,
                                               "meaning": describe_xid(xid)})
                return
            cond = Condition(Kind.XID, str(xid), describe_xid(xid))
            if xid == 79:
                self._next_tick = 0.0  # fell off the bus: probe at once
        elif event.event_type & EVENT_DOUBLE_BIT_ECC:
            cond = Condition(Kind.ECC, "double-bit", "double-bit ECC error (uncorrectable)")
        else:
            return
        devices = devices_for(self.inventory(), event.uuid, event.gpu_instance,
                              event.compute_instance)
        log.warning("GPU error event", extra={
            "uuid": event.uuid, "kind": str(cond.kind), "value": cond.value,
            "reason": cond.message, "devices": ",".join(devices) or "-"})
        self.sink.count(str(cond.kind))
        self.sink.event(devices, SOURCE, cond)
