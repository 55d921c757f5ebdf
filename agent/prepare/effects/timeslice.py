"""GPU time slices of shares (opaque config ``sharing.timeSlice``) as an effect.

``sharing.timeSlice`` (Default, Short, Medium, Long) is how long the GPU runs one process's
work before switching to another's, set for the whole GPU as ``nvidia-smi compute-policy
--set-timeslice`` does (``agent.prepare.gpucontrol``). One GPU has one interval, so a share
asking for another interval than a prepared share of the same GPU is refused (a per-claim
error naming the holder); the interval goes back to Default when the last share asking for
one is unprepared, and is set again when a spec is rebuilt after a reboot (the driver forgets
it). The checkpoint names it before it is set and until it is reset, so a rollback or start-up
after a crash resets it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from agent.checkpoint.model import ClaimRecord, PreparedDevice, holders
from agent.claim.model import ClaimError, ClaimRef
from agent.claim.opaque import TIME_SLICES
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.devices import SpecDevice
from agent.prepare.effects.base import BaseEffect, Release, Step, refused
from agent.prepare.gpucontrol import GpuControl, GpuControlError
from discovery.model import Device, Inventory

log = logging.getLogger(__name__)

DEFAULT_TIME_SLICE = "Default"


class TimeSliceError(ClaimError):
    reason = "time_slice"


class TimeSliceEffect(BaseEffect):
    """Always in the effects: a claim asking for an interval on a node without nvidia-smi
    (``control`` None) gets a per-claim error that says so."""

    name = "time-slice"
    manual_fix = "reset the GPU's time slice (nvidia-smi compute-policy --set-timeslice=0)"

    def __init__(self, control: GpuControl | None, inventory: Callable[[], Inventory],
                 failpoints: Failpoints | None = None) -> None:
        self.control = control
        self.inventory = inventory
        self.failpoints = failpoints

    def touches(self, record: ClaimRecord) -> bool:
        return any(d.time_slice for d in record.devices)

    def check(self, step: Step, claims: Mapping[str, ClaimRecord]) -> None:
        check_time_slices(step.ref, step.record.devices, claims)

    def apply(self, step: Step) -> None:
        if not any(d.sharing.time_slice for d in step.devices):
            return
        # On disk before the GPU changes: the PrepareStarted record names each interval,
        # for the rollback or start-up after a kill -9 to reset.
        step.save(step.record, True)
        if apply_time_slices(step.ref, step.devices, self.control):
            hit(self.failpoints, Point.TIME_SLICE_AFTER_SET, step.ref.uid)

    def reapply(self, step: Step) -> None:
        apply_time_slices(step.ref, step.devices, self.control)  # a reboot reset them

    def release(self, how: Release) -> None:
        # While the record is there: a crash after it is gone would leave the interval set
        # with nothing naming it. Again once it is gone (``released``): two shares of one GPU
        # unprepared at once each see the other here.
        if how.record is not None and self.touches(how.record):
            release_time_slices(how.record, how.remaining(), self.inventory().by_name(),
                                self.control)

    def released(self, record: ClaimRecord,
                 remaining: Callable[[], Mapping[str, ClaimRecord]]) -> None:
        if self.touches(record):
            release_time_slices(record, remaining(), self.inventory().by_name(), self.control)


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
        # Only what the agent sets: an interval it knows, for a share (a whole GPU's config
        # may not ask for one, ``agent.prepare.shares.check_config``), of a published GPU.
        device = inventory.get(held.device)
        why = ("not an interval" if held.time_slice not in TIME_SLICES
               else "the record's device is not a share" if not held.share_id
               else "the device is held with admin access, which sets no interval"
               if held.admin_access
               else f"{held.device} is not a GPU this node publishes"
               if device is None or device.host.uuid is None else None)
        if why is not None:
            refused(record.uid, held.device, "timeSlice", why)
            continue
        still = any(d.time_slice is not None for _, d in
                    holders(remaining, held.pool, held.device, besides=record.uid))
        if still or control is None or device is None or device.host.uuid is None:
            continue
        try:
            control.set_time_slice(device.host.uuid, DEFAULT_TIME_SLICE)
        except GpuControlError as err:
            log.warning("GPU time slice not reset", extra={
                "claim": record.uid, "device": held.device, "error": str(err)})
