"""MPS shares of an NVIDIA GPU (opaque config ``sharing.mps: true``) as an effect.

The containers become clients of the node's MPS control daemon (the operator runs
``nvidia-cuda-mps-control -d`` with ``--mps-pipe-dir``), bounded to the share's fraction:
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = consumed shares / all shares of the GPU
(``gpu=shares:N``), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = the consumed memory
(``gpu=memory``), per device ordinal in PCI order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``) among the
claim's GPUs: the container is assumed to see this claim's GPUs only.

The agent's own variables and edits, applied after any config's: a plan only, nothing on the
host changes, so there is nothing to release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

from agent.claim.model import ClaimRef
from agent.common.quantity import QuantityError, parse_quantity
from agent.prepare.devices import SpecDevice
from agent.prepare.effects.base import BaseEffect, Step
from agent.prepare.errors import BadConfigError
from cdi.spec import Mount
from discovery.sharing import MEMORY, SHARES, SHARING_ATTRIBUTE


class MpsEffect(BaseEffect):
    name = "mps"

    def __init__(self, pipe_dir: Path | None) -> None:
        self.pipe_dir = pipe_dir

    def plan(self, step: Step) -> None:
        step.devices = mps_edits(step.ref, step.devices, self.pipe_dir)


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
