"""matchAttribute and distinctAttribute, tracked incrementally while the search adds devices.

Constraints are monotonic: once one refuses a device, adding more devices never helps, so the
search can prune there. Each keeps who set the value so a conflict names the device it clashes
with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.explain.devices import Device
from agent.explain.model import Constraint
from agent.explain.reasons import CONSTRAINT, Reason


def _applies(c: Constraint, base: str, sub: str | None) -> bool:
    if not c.requests:
        return True
    return base in c.requests or (sub is not None and f"{base}/{sub}" in c.requests)


@dataclass(slots=True)
class Tracker:
    constraint: Constraint
    # value -> [count, request, device] of the devices holding it
    held: dict[tuple[str, Any], list[Any]] = field(default_factory=dict)
    count: int = 0

    def check(self, base: str, sub: str | None, device: Device) -> Reason | None:
        """None if the device may be added, else why not (nothing is recorded)."""
        c = self.constraint
        if not _applies(c, base, sub):
            return None
        value = device.attribute(c.attribute)
        if value is None:
            return Reason(CONSTRAINT, f"{c.kind} {c.attribute}: the device has no such attribute",
                          {"constraint": c.kind, "attribute": c.attribute})
        if self.count == 0:
            return None
        if c.match_attribute:
            first, (_, req, dev) = next(iter(self.held.items()))  # exactly one value held
            if first != value:
                return Reason(
                    CONSTRAINT,
                    f"matchAttribute {c.attribute}: {value[1]} here, {first[1]} on {dev} "
                    f"chosen for request {req}",
                    {"constraint": c.kind, "attribute": c.attribute, "value": value[1],
                     "conflictsWith": {"request": req, "device": dev, "value": first[1]}})
            return None
        holder = self.held.get(value)
        if holder:
            return Reason(
                CONSTRAINT,
                f"distinctAttribute {c.attribute}: {value[1]} is already used by {holder[2]} "
                f"chosen for request {holder[1]}",
                {"constraint": c.kind, "attribute": c.attribute, "value": value[1],
                 "conflictsWith": {"request": holder[1], "device": holder[2]}})
        return None

    def add(self, base: str, sub: str | None, device: Device) -> None:
        if not _applies(self.constraint, base, sub):
            return
        value = device.attribute(self.constraint.attribute)
        assert value is not None
        name = base if sub is None else f"{base}/{sub}"
        holder = self.held.setdefault(value, [0, name, device.name])
        holder[0] += 1
        self.count += 1

    def remove(self, base: str, sub: str | None, device: Device) -> None:
        if not _applies(self.constraint, base, sub):
            return
        value = device.attribute(self.constraint.attribute)
        assert value is not None
        holder = self.held[value]
        holder[0] -= 1
        if holder[0] == 0:
            del self.held[value]
        self.count -= 1
