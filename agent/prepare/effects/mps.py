"""MPS shares of an NVIDIA GPU (opaque config ``sharing.mps: true``) as an effect.

The containers become clients of the node's MPS control daemon (the operator runs
``nvidia-cuda-mps-control -d`` with ``--mps-pipe-dir``), bounded to the share's fraction in
two layers:

* **The clients' variables** (the spec): ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = consumed
  shares / all shares of the GPU (``gpu=shares:N``), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` =
  the consumed memory (``gpu=memory``), per device ordinal in PCI order
  (``CUDA_DEVICE_ORDER=PCI_BUS_ID``) among the claim's GPUs: the container is assumed to see
  this claim's GPUs only. Exact, but the container's own to lower or raise.
* **The server's limits** (``agent.prepare.mpscontrol``, where the MPS facts are): what no
  client rises above. MPS has them per server, not per client, and every share is a client
  of the same server, so they are the largest bound among the prepared MPS shares: the
  thread percentage node-wide, the pinned memory per GPU. Each share's bound is in its
  record (``PreparedDevice.extra["mpsLimit"]``) durably before the daemon gets a new
  ceiling; the ceiling goes down when the share holding it is unprepared, and back to MPS's
  defaults (100 %, the GPU's whole memory) with the last share that set one. A restarted
  agent sets them again from the completed records; a record salvaged from a corrupt
  checkpoint, or a limit that does not read back as one, never reaches the daemon: such a
  share counts as unbounded, so no ceiling holds it below what it may have been given.

The pipe directory is mounted into the containers of MPS shares only (it holds the
daemon's control socket too; cdi's driver edits never name it).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from agent.checkpoint.model import ClaimRecord, PreparedDevice
from agent.claim.model import ClaimError, ClaimRef
from agent.common.quantity import QuantityError, parse_quantity
from agent.prepare.devices import SpecDevice
from agent.prepare.effects.base import BaseEffect, Reconciled, Release, Step
from agent.prepare.errors import BadConfigError
from agent.prepare.mpscontrol import MpsControl, MpsControlError
from cdi.spec import Mount
from discovery.model import Device, Inventory
from discovery.sharing import MEMORY, SHARES, SHARING_ATTRIBUTE

log = logging.getLogger(__name__)

#: PreparedDevice.extra: the bound an MPS share holds the server to (``Bound.to_json``).
LIMIT = "mpsLimit"
_THREADS, _MEMORY = "activeThreadPercentage", "pinnedMemoryMiB"
#: Above any GPU's memory: a larger recorded limit is not one the agent wrote.
_MAX_MIB = 2**30
DEFAULT_THREADS = 100


class MpsLimitError(ClaimError):
    reason = "mps_limit"


@dataclass(frozen=True, slots=True)
class Bound:
    """One MPS share's bound: a thread percentage (``shares``) or pinned MiB (``memory``)."""

    threads: int | None = None
    memory_mib: int | None = None

    def to_json(self) -> dict[str, int]:
        out = {}
        if self.threads is not None:
            out[_THREADS] = self.threads
        if self.memory_mib is not None:
            out[_MEMORY] = self.memory_mib
        return out

    @classmethod
    def read(cls, raw: Any) -> Bound | None:
        """The bound a record names, or None when it is not one this agent writes."""
        if not isinstance(raw, dict) or not raw or set(raw) - {_THREADS, _MEMORY}:
            return None
        threads, memory = raw.get(_THREADS), raw.get(_MEMORY)
        for value, top in ((threads, DEFAULT_THREADS), (memory, _MAX_MIB)):
            if value is not None and (type(value) is not int or not 1 <= value <= top):
                return None
        return cls(threads=threads, memory_mib=memory)


@dataclass(frozen=True, slots=True)
class Want:
    """What one prepared MPS share needs of the server: its GPU (from discovery, never from
    the record) and its bound (None: unbounded, as far as the agent can tell)."""

    gpu: str | None
    bound: Bound | None

    @property
    def threads(self) -> int:
        return self.bound.threads if self.bound and self.bound.threads else DEFAULT_THREADS

    @property
    def memory_mib(self) -> int | None:
        return self.bound.memory_mib if self.bound else None


class MpsEffect(BaseEffect):
    """``control`` None with a pipe directory: a share asking for MPS with a bound gets a
    per-claim error (its bound would be advisory only)."""

    name = "mps"
    manual_fix = ("set the MPS control daemon's limits back (echo "
                  "set_default_active_thread_percentage 100 | nvidia-cuda-mps-control; and "
                  "set_default_device_pinned_mem_limit <GPU> <its memory>M)")

    def __init__(self, pipe_dir: Path | None, control: MpsControl | None = None,
                 inventory: Callable[[], Inventory] | None = None) -> None:
        self.pipe_dir = pipe_dir
        self.control = control
        self.inventory = inventory or (lambda: Inventory(devices=()))
        # Claim UID -> what its MPS shares need of the server: the prepared claims as this
        # process knows them (start-up's completed records, each prepare's check), so a
        # prepare sets a ceiling that covers every other share. Only a release removes one.
        self._held: dict[str, tuple[Want, ...]] = {}
        self._held_lock = threading.Lock()  # short: check takes it under the checkpoint's
        # One change of the daemon at a time, each from the latest ``_held``: the last one
        # set covers every claim held when it was set.
        self._set_lock = threading.Lock()

    def touches(self, record: ClaimRecord) -> bool:
        return any(LIMIT in d.extra for d in record.devices)

    def plan(self, step: Step) -> None:
        bounds = {(d.device.name, d.share_id): b for d in step.devices if d.sharing.mps
                  if (b := _bound(d)) is not None}
        if bounds and self.pipe_dir is not None and self.control is None:
            raise BadConfigError(str(step.ref), "opaque config sharing.mps: no "
                                 "nvidia-cuda-mps-control on this node to set the MPS server's "
                                 "limits with, so the share's bound would be its containers' "
                                 "to change")
        step.devices = mps_edits(step.ref, step.devices, self.pipe_dir)
        step.record = replace(step.record, devices=tuple(
            _with_limit(h, bounds.get((h.device, h.share_id))) for h in step.record.devices))

    def check(self, step: Step, claims: Mapping[str, ClaimRecord]) -> None:
        # Under the checkpoint's lock: every other prepared claim, also one that came back
        # after a release that failed, is covered by the ceilings from now on.
        with self._held_lock:
            unknown = [r for u, r in claims.items()
                       if u != step.ref.uid and u not in self._held and self.touches(r)]
        if not unknown:
            return
        devices = self.inventory().by_name()
        with self._held_lock:
            for record in unknown:
                self._held.setdefault(record.uid, _wants(record, devices))

    def apply(self, step: Step) -> None:
        if not self.touches(step.record):
            return
        # On disk before the daemon changes: the PrepareStarted record names each bound, for
        # the rollback or start-up after a kill -9 to lower the ceiling again.
        step.save(step.record, True)
        self._enforce(step)

    def reapply(self, step: Step) -> None:
        if self.touches(step.record):
            self._enforce(step)  # a restarted daemon forgot them

    def release(self, how: Release) -> None:
        # While the record is there and again once it is gone (``released``), as the time
        # slices: a crash after it is gone would leave a ceiling nothing names.
        if how.record is not None and self.touches(how.record):
            self._lower(how.record, how.remaining())

    def released(self, record: ClaimRecord,
                 remaining: Callable[[], Mapping[str, ClaimRecord]]) -> None:
        if self.touches(record):
            self._lower(record, remaining())

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        held = {u: r for u, r in claims.items() if r.completed and self.touches(r)}
        if not held or self.control is None:
            return Reconciled()
        devices = self.inventory().by_name()
        with self._set_lock:
            with self._held_lock:
                for uid, record in held.items():
                    self._held[uid] = _wants(record, devices)
                everything = self._snapshot()
            try:
                self._set(self.control, everything, everything, devices)
            except MpsControlError as err:  # start-up goes on; the next prepare sets them
                log.error(f"cannot set the MPS server's limits at start-up; {self.manual_fix}",
                          extra={"error": str(err)})
        return Reconciled()

    # -- the server's ceilings ------------------------------------------------------------

    def _enforce(self, step: Step) -> None:
        """The ceilings covering this claim's shares and every other held one; a refusal is
        a per-claim error naming the claim's device."""
        name = next((h.device for h in step.record.devices if LIMIT in h.extra), "")
        if self.control is None:  # plan refuses a bound without one; a rewrite plans too
            raise MpsLimitError(str(step.ref), f"device {name}: no nvidia-cuda-mps-control "
                                               "on this node to set the MPS server's limits")
        devices = {**self.inventory().by_name(), **{d.device.name: d.device
                                                    for d in step.devices}}
        mine = _wants(step.record, devices)
        with self._set_lock:
            with self._held_lock:
                self._held[step.ref.uid] = mine
                held = self._snapshot()
            try:
                self._set(self.control, held, mine, devices)
            except MpsControlError as err:
                raise MpsLimitError(str(step.ref), f"device {name}: {err}") from err

    def _lower(self, record: ClaimRecord, remaining: Mapping[str, ClaimRecord]) -> None:
        """The ceilings without ``record``'s shares. Best effort: unprepare must succeed."""
        devices = self.inventory().by_name()
        gone = _wants(record, devices)
        others = {u: _wants(r, devices) for u, r in remaining.items()
                  if u != record.uid and self.touches(r)}
        with self._set_lock:
            with self._held_lock:
                self._held.pop(record.uid, None)
                for uid, wants in others.items():
                    self._held.setdefault(uid, wants)
                held = self._snapshot()
            try:
                if self.control is None:
                    raise MpsControlError("no nvidia-cuda-mps-control on this node")
                self._set(self.control, held, gone, devices)
            except MpsControlError as err:
                log.warning(f"MPS server's limits not lowered; {self.manual_fix}",
                            extra={"claim": record.uid, "error": str(err)})

    def _snapshot(self) -> list[Want]:
        return [w for wants in self._held.values() for w in wants]

    @staticmethod
    def _set(control: MpsControl, held: Sequence[Want], touched: Iterable[Want],
             devices: Mapping[str, Device]) -> None:
        """Set what ``touched`` names (the thread percentage if one of them bounds threads,
        each GPU one of them bounds in memory) to the ceiling ``held`` needs."""
        touched = list(touched)
        if any(w.bound and w.bound.threads for w in touched):
            percent = max((w.threads for w in held), default=DEFAULT_THREADS)
            try:
                control.set_active_thread_percentage(percent)
            except MpsControlError as err:
                raise MpsControlError(f"the MPS control daemon refused active thread "
                                      f"percentage {percent}: {err}") from err
        for gpu in sorted({w.gpu for w in touched if w.gpu and w.memory_mib}):
            on = [w.memory_mib for w in held if w.gpu == gpu]
            mib = max(m for m in on if m) if on and all(on) else _whole(gpu, devices)
            if mib is None:
                log.warning("MPS pinned memory limit not lifted: the GPU's memory is unknown; "
                            f"{MpsEffect.manual_fix}", extra={"gpu": gpu})
                continue
            try:
                control.set_pinned_memory_limit(gpu, mib)
            except MpsControlError as err:
                raise MpsControlError(f"the MPS control daemon refused pinned memory limit "
                                      f"{mib}M on {gpu}: {err}") from err


def _bound(item: SpecDevice) -> Bound | None:
    """The bound of one MPS share, or None when its mode has none."""
    device, kind = item.device, item.device.attributes.get(SHARING_ATTRIBUTE)
    try:
        if kind == SHARES:
            total = parse_quantity(device.capacity[SHARES])
            used = parse_quantity(item.consumed.get(SHARES, "1"))
            return Bound(threads=min(max(1, int(Fraction(100) * used / total)), 100))
        if kind == MEMORY:
            policy = device.request_policies.get(MEMORY)
            used = parse_quantity(item.consumed.get(MEMORY) or (policy.default if policy else "0"))
            return Bound(memory_mib=max(1, int(used) >> 20))
    except (QuantityError, KeyError, ZeroDivisionError):
        return None
    return None


def _with_limit(held: PreparedDevice, bound: Bound | None) -> PreparedDevice:
    extra = {k: v for k, v in held.extra.items() if k != LIMIT}
    return replace(held, extra={**extra, LIMIT: bound.to_json()} if bound else extra)


def _wants(record: ClaimRecord, devices: Mapping[str, Device]) -> tuple[Want, ...]:
    """What ``record``'s MPS shares need of the server. A salvaged record's numbers and a
    limit that does not read back are nobody's: unbounded (None), never written."""
    out = []
    for held in record.devices:
        if LIMIT not in held.extra:
            continue
        device = devices.get(held.device)
        # Admin access sets no limit (``check_config``): such a record was written by hand.
        bound = None if record.recovered or held.admin_access else Bound.read(held.extra[LIMIT])
        out.append(Want(gpu=device.host.uuid if device else None, bound=bound))
    return tuple(out)


def _whole(gpu: str, devices: Mapping[str, Device]) -> int | None:
    """The memory of GPU ``gpu`` in MiB (rounded up): a limit no client can reach."""
    for device in devices.values():
        if device.host.uuid == gpu and MEMORY in device.capacity:
            try:
                return math.ceil(parse_quantity(device.capacity[MEMORY]) / 2**20)
            except QuantityError:
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
        bound = _bound(item)
        if bound is None:
            continue
        if bound.memory_mib is not None:
            limits.append(f"{ordinal}={bound.memory_mib}M")
        if bound.threads is not None:
            percents.append(bound.threads)
    if percents:  # one value per process: the smallest share bounds them all
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(percents))
    if limits:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    extra = tuple(f"{k}={v}" for k, v in env.items())
    mount = Mount(host_path=str(pipe_dir), container_path=str(pipe_dir),
                  options=("rbind", "rw"))
    return [replace(d, env=(*d.env, *extra), mounts=(*d.mounts, mount)) if d.sharing.mps
            else d for d in devices]
