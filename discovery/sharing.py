"""Sharing through consumable capacity (KEP-5075, ``DRAConsumableCapacity``): ``--sharing``.

The operator picks a mode per device type; discovery then publishes each device of that type
in its shareable form: ``allowMultipleAllocations: true``, a ``sharing`` attribute naming the
mode (what the shipped ``*-shared.dra-agent.io`` DeviceClasses select, and what the exclusive
classes exclude), and capacities with a ``requestPolicy`` the scheduler hands out in parts:

* ``gpu=shares:N`` / ``nic=shares:N``: a ``shares`` capacity of N; a request consumes 1 unless
  it asks for more (``capacity.requests: {shares: 3}``), any whole number up to N;
* ``gpu=memory[:STEP]``: the GPU's ``memory`` in STEP parts (default 1Gi); a request consumes
  one STEP unless it asks for more, rounded up to a multiple of STEP;
* ``nic=bandwidth[:STEP]``: a ``bandwidth`` capacity of the link speed in bit/s, in STEP parts
  (default 1G = 1 Gbit/s).

The API server treats *every* capacity of a shareable device as consumable, and one without a
policy is consumed whole by a request that names no amount. So the capacities a mode does not
hand out (a GPU's ``memory`` under ``shares``) get a policy whose only valid amount is 0: still
published, selectable by CEL, never consumed.

MIG devices and VFs cannot be shared (they are already the partition a pod gets); a device
that lacks what its mode divides (an Intel GPU's memory size, a NIC's link speed while the link
is down) stays exclusive, with a discovery warning naming it.

What enforces a share is said per device by ``enforcement`` (``discover -o wide``): the NVIDIA
driver time-slices a GPU between its processes and MPS can bound each one; AMD and Intel GPUs
and NICs are shared for scheduling only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from discovery.model import Device, DeviceType, RequestPolicy

SHARES = "shares"
MEMORY = "memory"
BANDWIDTH = "bandwidth"
#: The driver-domain attribute naming a shareable device's mode.
SHARING_ATTRIBUTE = "sharing"
#: A share split finer than this is no longer a useful unit of a device.
MAX_SHARES = 1024
DEFAULT_STEP = {MEMORY: "1Gi", BANDWIDTH: "1G"}

#: Device type -> the modes it may be shared in.
MODES: Mapping[str, tuple[str, ...]] = {
    str(DeviceType.GPU): (SHARES, MEMORY),
    str(DeviceType.NIC): (SHARES, BANDWIDTH),
}
#: Why the other device types cannot be shared.
NOT_SHAREABLE: Mapping[str, str] = {
    str(DeviceType.MIG): "a MIG device is already a partition of a GPU with its own memory and "
                         "SMs; share whole GPUs (gpu=...) or give each pod its own MIG device",
    str(DeviceType.VF): "an SR-IOV VF is the part of a NIC that one pod gets; share its "
                        "physical function (nic=...) or give each pod its own VF",
}

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_AMOUNT = re.compile(r"^([1-9][0-9]{0,17})(Ki|Mi|Gi|Ti|k|M|G|T)?$")


class SharingError(ValueError):
    """A ``--sharing`` value that cannot be used; the message is the one line to show."""


@dataclass(frozen=True, slots=True)
class SharingMode:
    """One ``TYPE=MODE`` choice: ``shares`` N, or a capacity divided in ``step`` parts."""

    device_type: str
    kind: str
    shares: int = 0
    step: str = ""

    def __str__(self) -> str:
        if self.kind == SHARES:
            return f"{self.device_type}={SHARES}:{self.shares}"
        return f"{self.device_type}={self.kind}:{self.step}"


def _amount(text: str, binary: bool) -> tuple[int, str]:
    """(number, suffix) of a positive whole quantity; binary suffixes only where allowed."""
    match = _AMOUNT.match(text)
    if match is None or (match.group(2) in _BINARY and not binary):
        units = "Ki, Mi, Gi, Ti, k, M, G or T" if binary else "k, M, G or T (bit/s)"
        raise SharingError(f"step {text!r} is not a positive whole quantity with {units}")
    return int(match.group(1)), match.group(2) or ""


def _scale(suffix: str) -> int:
    return _BINARY.get(suffix) or _DECIMAL[suffix]


def parse_sharing(text: str) -> SharingMode:
    """One ``--sharing`` value: ``gpu=shares:N``, ``gpu=memory[:STEP]``, ``nic=shares:N``,
    ``nic=bandwidth[:STEP]``."""
    if not isinstance(text, str) or "=" not in text:
        raise SharingError(f"expected TYPE=MODE such as gpu=shares:4, got {text!r:.60}")
    dtype, _, spec = text.partition("=")
    dtype, spec = dtype.strip(), spec.strip()
    if dtype in NOT_SHAREABLE:
        raise SharingError(f"{dtype} devices cannot be shared: {NOT_SHAREABLE[dtype]}")
    if dtype not in MODES:
        raise SharingError(f"unknown device type {dtype!r:.30}; sharing applies to "
                           f"{' and '.join(MODES)}")
    kind, _, arg = spec.partition(":")
    modes = MODES[dtype]
    if kind not in modes:
        forms = [f"{dtype}={SHARES}:N"] + [f"{dtype}={m}[:STEP]" for m in modes if m != SHARES]
        raise SharingError(f"unknown mode {kind!r:.30} for {dtype}; use {' or '.join(forms)}")
    if kind == SHARES:
        try:
            count = int(arg, 10)
        except ValueError:
            raise SharingError(f"{dtype}={SHARES}:N needs a whole number N, got {arg!r:.30}")\
                from None
        if not 1 <= count <= MAX_SHARES:
            raise SharingError(f"{dtype}={SHARES}:{count}: N must be 1 to {MAX_SHARES}")
        return SharingMode(dtype, SHARES, shares=count)
    step = arg or DEFAULT_STEP[kind]
    _amount(step, binary=kind == MEMORY)
    return SharingMode(dtype, kind, step=step)


def parse_sharing_list(values: Iterable[str]) -> tuple[SharingMode, ...]:
    """Every value parsed; a device type given twice is refused (which one would win?)."""
    out: list[SharingMode] = []
    for value in values:
        mode = parse_sharing(value)
        if any(m.device_type == mode.device_type for m in out):
            raise SharingError(f"{mode.device_type} is given twice in --sharing; give one "
                               "mode per device type")
        out.append(mode)
    return tuple(out)


def _nothing() -> RequestPolicy:
    return RequestPolicy(default="0", valid_values=("0",))


def _divided(total_text: str, step: str, binary: bool) -> RequestPolicy | None:
    """A policy handing out ``total_text`` in ``step`` parts; None when not one step fits."""
    total = _bytes_or_bits(total_text)
    number, suffix = _amount(step, binary)
    unit = number * _scale(suffix)
    if total is None or total < unit:
        return None
    parts = total // unit
    return RequestPolicy(default=step, min=step, max=f"{parts * number}{suffix}", step=step)


def _bytes_or_bits(text: str) -> int | None:
    """A capacity as discovery writes it ("81559Mi", "400G", "132") as a whole number."""
    match = _AMOUNT.match(text)
    return int(match.group(1)) * _scale(match.group(2) or "") if match else None


def link_bandwidth(device: Device) -> str | None:
    """A NIC's negotiated link speed as a bit/s quantity; None while down or unknown."""
    speed = device.host.extra.get("speedMbps", "")
    if not speed.isdigit() or int(speed) <= 0:
        return None
    mbps = int(speed)
    return f"{mbps // 1000}G" if mbps % 1000 == 0 else f"{mbps}M"


def shareable(device: Device, mode: SharingMode) -> tuple[Device | None, str | None]:
    """``device`` in its shareable form, or (None, why it stays exclusive)."""
    capacity = dict(device.capacity)
    policies: dict[str, RequestPolicy] = {}
    if mode.kind == SHARES:
        capacity[SHARES] = str(mode.shares)
        policies[SHARES] = RequestPolicy(default="1", min="1", max=str(mode.shares), step="1")
    elif mode.kind == MEMORY:
        memory = capacity.get(MEMORY)
        policy = _divided(memory, mode.step, binary=True) if memory else None
        if policy is None:
            why = ("its memory size is unknown (the driver reports none)" if not memory
                   else f"its memory ({memory}) is smaller than one step of {mode.step}")
            return None, why
        policies[MEMORY] = policy
    else:
        bandwidth = link_bandwidth(device)
        policy = _divided(bandwidth, mode.step, binary=False) if bandwidth else None
        if policy is None:
            why = ("its link is down or its speed unknown" if not bandwidth
                   else f"its link speed ({bandwidth}) is below one step of {mode.step}")
            return None, why
        capacity[BANDWIDTH] = str(bandwidth)
        policies[BANDWIDTH] = policy
    for name in capacity:
        policies.setdefault(name, _nothing())
    attrs = {**device.attributes, SHARING_ATTRIBUTE: mode.kind}
    return replace(device, attributes=attrs, capacity=capacity, request_policies=policies,
                   allow_multiple_allocations=True), None


def apply_sharing(
    devices: Sequence[Device], modes: Sequence[SharingMode], warnings: list[str]
) -> list[Device]:
    """Each device of a type in ``modes`` in its shareable form; the rest as they were."""
    by_type = {m.device_type: m for m in modes}
    if not by_type:
        return list(devices)
    out: list[Device] = []
    for device in devices:
        mode = by_type.get(str(device.type))
        if mode is None:
            out.append(device)
            continue
        shared, why = shareable(device, mode)
        if shared is None:
            warnings.append(f"{device.name}: not shared ({mode}): {why}; published exclusive")
            out.append(device)
        else:
            out.append(shared)
    return out


def enforcement(device: Device) -> str:
    """What limits one share of ``device`` in practice (``discover -o wide``, README)."""
    kind = device.attributes.get(SHARING_ATTRIBUTE)
    if not device.allow_multiple_allocations or not isinstance(kind, str):
        return ""
    if device.type == DeviceType.GPU and device.host.vendor == "nvidia":
        if kind == SHARES:
            return ("time-sliced by the NVIDIA driver (sharing.timeSlice sets the interval); "
                    "compute bounded per share only with sharing.mps")
        return "memory bounded per share only with sharing.mps; otherwise scheduling only"
    return "scheduling only: nothing bounds one share's use"
