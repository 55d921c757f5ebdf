"""One request against one device, apart from any search state: the capacity it would take
(``requestPolicy``) and whether that fits in what is left, and the taints it does not
tolerate. The search and the report ask the same questions, so they share these answers."""

from __future__ import annotations

from fractions import Fraction

from agent.explain.devices import Capacity, Device
from agent.explain.model import Request
from agent.explain.reasons import CAPACITY, TAINT, Reason
from agent.explain.values import format_quantity


def consumed_capacity(req: Request, cap: Capacity, name: str) -> Fraction:
    """What one allocation takes of one capacity: the request rounded up by the policy."""
    asked = (req.capacity or {}).get(name)
    if asked is None:
        return cap.default if cap.default is not None else cap.value
    if not cap.has_policy:
        return asked
    if cap.range_min is not None:
        if asked < cap.range_min:
            return cap.range_min
        if cap.range_step is None:
            return asked
        steps = -((cap.range_min - asked) // cap.range_step)  # ceil
        return cap.range_min + cap.range_step * steps
    for v in cap.valid_values:
        if asked <= v:
            return v
    return asked


def _violates(value: Fraction, cap: Capacity) -> bool:
    if not cap.has_policy or (cap.default is not None and value == cap.default):
        return False
    if cap.range_min is not None:
        if cap.range_max is not None and value > cap.range_max:
            return True
        step = cap.range_step
        return step is not None and (value - cap.range_min) % step != 0
    if cap.valid_values:
        return value not in cap.valid_values
    return False


def capacity_check(req: Request, device: Device, used: dict[str, Fraction] | None,
                   allocating: dict[str, Fraction] | None) -> Reason | None:
    """CmpRequestOverCapacity: None when the request fits in what is left of every capacity."""
    if not req.capacity and not used and not allocating:
        return None  # takes the default (at most the whole device) of an unused device
    for name in req.capacity or {}:
        if name not in device.capacity:
            return Reason(CAPACITY, f"requests capacity {name}, which the device does not have",
                          {"capacity": name})
    for name, cap in device.capacity.items():
        want = consumed_capacity(req, cap, name)
        if _violates(want, cap):
            return Reason(CAPACITY, f"{name}: {format_quantity(want)} is not allowed by the "
                          "device's requestPolicy", {"capacity": name})
        taken = (used or {}).get(name, Fraction(0)) + (allocating or {}).get(name, Fraction(0))
        if taken + want > cap.value:
            left = cap.value - taken
            return Reason(CAPACITY, f"{name}: needs {format_quantity(want)}, "
                          f"{format_quantity(left)} of {cap.raw} left",
                          {"capacity": name, "needed": format_quantity(want),
                           "left": format_quantity(left)})
    return None


def taint_reason(req: Request, device: Device) -> Reason | None:
    for t in device.taints:
        if t.effect not in ("NoSchedule", "NoExecute"):
            continue  # None and unknown effects never block
        if not any(tol.tolerates(t) for tol in req.tolerations):
            shown = f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}"
            return Reason(TAINT, f"taint {shown} not tolerated",
                          {"key": t.key, "value": t.value, "effect": t.effect})
    return None
