"""Bounding a share of an NVIDIA GPU where the hardware allows it (opaque config ``sharing``).

A share (KEP-5075) is a scheduling promise; two knobs make the GPU keep part of it:

* ``sharing.timeSlice`` (Default, Short, Medium, Long): how long the GPU runs one process's
  work before switching to another's, set for the whole GPU as ``nvidia-smi compute-policy
  --set-timeslice`` does. One GPU has one interval, so a share asking for another interval
  than a prepared share of the same GPU is refused (a per-claim error naming the holder); the
  interval goes back to Default when the last share asking for one is unprepared, and is set
  again when a spec is rebuilt after a reboot (the driver forgets it). The checkpoint names it
  before it is set and until it is reset, so a rollback or start-up after a crash resets it.
* ``sharing.mps: true``: the containers become clients of the node's MPS control daemon (the
  operator runs ``nvidia-cuda-mps-control -d`` with ``--mps-pipe-dir``), bounded to the
  share's fraction: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = consumed shares / all shares of
  the GPU (``gpu=shares:N``), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = the consumed memory
  (``gpu=memory``), per device ordinal in PCI order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``) among
  the claim's GPUs: the container is assumed to see this claim's GPUs only.

Both are the agent's own variables and edits, applied after any config's. On a GPU of another
vendor, a NIC or an exclusive device either knob is a per-claim error: nothing would bound it.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Protocol

from agent.checkpoint.model import ClaimRecord, PreparedDevice, holders
from agent.claim.model import ClaimError, ClaimRef
from agent.claim.opaque import TIME_SLICES
from agent.common.quantity import QuantityError, parse_quantity
from agent.prepare.devices import SpecDevice
from agent.prepare.errors import BadConfigError
from cdi.spec import Mount
from discovery.model import Device, DeviceType
from discovery.sharing import MEMORY, SHARES, SHARING_ATTRIBUTE

log = logging.getLogger(__name__)

DEFAULT_TIME_SLICE = "Default"


class GpuControlError(Exception):
    """The GPU refused a setting; the message names the GPU and the cause."""


class TimeSliceError(ClaimError):
    reason = "time_slice"


class GpuControl(Protocol):
    """GPU-wide settings the agent changes for shares (the seam tests and --simulate fill)."""

    def set_time_slice(self, uuid: str, level: str) -> None:
        """Set the GPU's time-slice interval (a ``TIME_SLICES`` name); GpuControlError."""
        ...


class NvidiaSmi:
    """``GpuControl`` through ``nvidia-smi compute-policy`` (NVML has no call for it)."""

    def __init__(self, binary: Path, run: Callable[..., subprocess.CompletedProcess[str]]
                 = subprocess.run, timeout_s: float = 20.0) -> None:
        self.binary = binary
        self._run = run
        self.timeout_s = timeout_s

    def set_time_slice(self, uuid: str, level: str) -> None:
        args = [str(self.binary), "compute-policy", "-i", uuid,
                f"--set-timeslice={TIME_SLICES[level]}"]
        try:
            done = self._run(args, capture_output=True, text=True, timeout=self.timeout_s,
                             check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise GpuControlError(f"{self.binary} did not run: {err}") from err
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout or "no output").split())[:200]
            raise GpuControlError(f"nvidia-smi exit {done.returncode}: {said}")


class RecordingGpuControl:
    """``GpuControl`` of a simulated node: remembers each GPU's interval, changes nothing.

    With ``state`` the intervals are kept in that JSON file, as a GPU keeps its interval when
    the agent dies: a restarted agent (or a crash test's next process) meets what the dead
    one set. An unreadable file is an empty GPU state, as after a reboot.
    """

    def __init__(self, state: Path | None = None) -> None:
        self._lock = threading.Lock()
        self.state = state
        self.time_slices: dict[str, str] = {}
        if state is not None:
            try:
                loaded = json.loads(state.read_text())
            except (OSError, ValueError):
                loaded = {}
            if isinstance(loaded, dict):
                self.time_slices = {k: v for k, v in loaded.items()
                                    if isinstance(k, str) and isinstance(v, str)}
        self.calls: list[tuple[str, str]] = []
        #: uuid -> error to raise (a test's stand-in for a GPU that refuses).
        self.failures: dict[str, str] = {}

    def set_time_slice(self, uuid: str, level: str) -> None:
        with self._lock:
            self.calls.append((uuid, level))
            if uuid in self.failures:
                raise GpuControlError(self.failures[uuid])
            self.time_slices[uuid] = level
            if self.state is not None:
                tmp = self.state.with_name(self.state.name + ".tmp")
                tmp.write_text(json.dumps(self.time_slices, sort_keys=True))
                tmp.replace(self.state)


def find_nvidia_smi(driver_root: Path) -> Path | None:
    """nvidia-smi of the driver the node runs: under ``driver_root`` first (a containerised
    driver), else on PATH."""
    for candidate in (driver_root / "usr" / "bin" / "nvidia-smi",
                      driver_root / "bin" / "nvidia-smi"):
        if candidate.is_file():
            return candidate
    found = shutil.which("nvidia-smi")
    return Path(found) if found else None


def _bounded(device: Device) -> bool:
    return (device.type == DeviceType.GPU and device.host.vendor == "nvidia"
            and device.allow_multiple_allocations)


def check_config(ref: ClaimRef, item: SpecDevice, request: str) -> None:
    """Refuse ``sharing`` settings on a device that nothing could bound by them."""
    sharing = item.sharing
    if not sharing.is_set:
        return
    device = item.device
    where = f"opaque config for request {request}: sharing"
    if not item.share_id or not device.allow_multiple_allocations:
        raise BadConfigError(str(ref), f"{where}: device {device.name} is not allocated as a "
                                       "share; timeSlice and mps bound shares of a GPU only")
    if not _bounded(device):
        vendor = device.host.vendor or str(device.type)
        raise BadConfigError(str(ref), f"{where}: device {device.name} ({vendor}) is shared "
                                       "for scheduling only; timeSlice and mps are NVIDIA's")
    if sharing.time_slice and not device.host.uuid:
        raise BadConfigError(str(ref), f"{where}.timeSlice: device {device.name} has no UUID "
                                       "to name it to the driver")


def check_time_slices(
    ref: ClaimRef, prepared: Iterable[PreparedDevice], claims: Mapping[str, ClaimRecord]
) -> None:
    """One interval per GPU: refuse this claim's if another prepared share set another."""
    for mine in prepared:
        if mine.time_slice is None:
            continue
        for other, held in holders(claims, mine.pool, mine.device, besides=ref.uid):
            if held.time_slice is not None and held.time_slice != mine.time_slice:
                raise TimeSliceError(
                    str(ref),
                    f"device {mine.pool}/{mine.device} runs with time slice "
                    f"{held.time_slice} for claim {other.namespace}/{other.name}; this "
                    f"claim asks for {mine.time_slice} and a GPU has one interval; ask "
                    f"for {held.time_slice} or none",
                )


def apply_time_slices(ref: ClaimRef, devices: Sequence[SpecDevice],
                      control: GpuControl | None) -> bool:
    """Set each shared GPU's interval this claim asks for; a refusal is a per-claim error.
    True when an interval was set."""
    applied = False
    for item in devices:
        level = item.sharing.time_slice
        if level is None or item.device.host.uuid is None:
            continue
        if control is None:
            raise TimeSliceError(str(ref), f"device {item.device.name}: no nvidia-smi on this "
                                           "node to set the time slice with")
        try:
            control.set_time_slice(item.device.host.uuid, level)
        except GpuControlError as err:
            raise TimeSliceError(str(ref), f"device {item.device.name}: setting time slice "
                                           f"{level} failed: {err}") from err
        applied = True
        log.info("GPU time slice set", extra={"claim": ref.uid, "device": item.device.name,
                                              "time_slice": level})
    return applied


def release_time_slices(
    record: ClaimRecord, remaining: Mapping[str, ClaimRecord], inventory: Mapping[str, Device],
    control: GpuControl | None,
) -> None:
    """Back to Default on each GPU whose last share asking for an interval is ``record``'s.
    Best effort: unprepare must succeed, so a refusal is a log line."""
    for held in record.devices:
        if held.time_slice is None or held.time_slice == DEFAULT_TIME_SLICE:
            continue
        still = any(d.time_slice is not None for _, d in
                    holders(remaining, held.pool, held.device, besides=record.uid))
        device = inventory.get(held.device)
        if still or control is None or device is None or device.host.uuid is None:
            continue
        try:
            control.set_time_slice(device.host.uuid, DEFAULT_TIME_SLICE)
        except GpuControlError as err:
            log.warning("GPU time slice not reset", extra={
                "claim": record.uid, "device": held.device, "error": str(err)})


def _fraction(item: SpecDevice) -> tuple[str, str] | None:
    """(variable, value) bounding one MPS share, or None when its mode has no bound."""
    device, kind = item.device, item.device.attributes.get(SHARING_ATTRIBUTE)
    try:
        if kind == SHARES:
            total = parse_quantity(device.capacity[SHARES])
            used = parse_quantity(item.consumed.get(SHARES, "1"))
            percent = max(1, int(Fraction(100) * used / total))
            return "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(min(percent, 100))
        if kind == MEMORY:
            policy = device.request_policies.get(MEMORY)
            used = parse_quantity(item.consumed.get(MEMORY) or (policy.default if policy else "0"))
            return "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"{max(1, int(used) >> 20)}M"
    except (QuantityError, KeyError, ZeroDivisionError):
        return None
    return None


def mps_edits(ref: ClaimRef, devices: Sequence[SpecDevice],
              pipe_dir: Path | None) -> list[SpecDevice]:
    """``devices`` with the MPS client variables and the pipe directory mount on each share
    asking for ``mps``; a per-claim error when the node has no MPS daemon the agent knows."""
    wanted = [d for d in devices if d.sharing.mps]
    if not wanted:
        return list(devices)
    if pipe_dir is None:
        raise BadConfigError(str(ref), "opaque config sharing.mps: this node runs no MPS "
                                       "control daemon the agent knows of (--mps-pipe-dir)")
    ordered = sorted(wanted, key=lambda d: d.device.host.pci_address or d.device.name)
    env: dict[str, str] = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir),
                           "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    limits, percents = [], []
    for ordinal, item in enumerate(ordered):
        bound = _fraction(item)
        if bound is None:
            continue
        name, value = bound
        if name == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":
            limits.append(f"{ordinal}={value}")
        else:
            percents.append(int(value))
    if percents:  # one value per process: the smallest share bounds them all
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(percents))
    if limits:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    extra = tuple(f"{k}={v}" for k, v in env.items())
    mount = Mount(host_path=str(pipe_dir), container_path=str(pipe_dir),
                  options=("rbind", "rw"))
    return [replace(d, env=(*d.env, *extra), mounts=(*d.mounts, mount)) if d.sharing.mps
            else d for d in devices]
