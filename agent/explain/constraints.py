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


def applies(c: Constraint, base: str, sub: str | None) -> bool:
    if not c.requests:
        return True
    return base in c.requests or (sub is not None and f"{base}/{sub}" in c.requests)


#: List-type attribute kinds (DRAListTypeAttributes) and the scalar kind of their elements.
_LIST_KINDS = {"strings": "string", "ints": "int", "bools": "bool", "versions": "version"}
_SCALAR_KINDS = frozenset(_LIST_KINDS.values())

ValueSet = tuple[str, frozenset[Any]]  # element kind, elements


def as_set(value: tuple[str, Any]) -> ValueSet | None:
    """Upstream's attributeAsSet: a scalar is a one-element set; None for unknown kinds."""
    kind, v = value
    base = _LIST_KINDS.get(kind)
    if base is not None:
        return (base, frozenset(v)) if v else None
    if kind in _SCALAR_KINDS:
        return kind, frozenset((v,))
    return None


def value_key(value: tuple[str, Any]) -> tuple[str, Any]:
    """The attribute's value as a dict key (a list as a tuple)."""
    kind, v = value
    return (kind, tuple(v)) if isinstance(v, list) else value


def _show(value: tuple[str, Any] | ValueSet) -> str:
    v = value[1]
    if isinstance(v, (list, tuple, frozenset, set)):
        return "[" + ", ".join(sorted(str(x) for x in v)) + "]"
    return str(v)


@dataclass(slots=True)
class Tracker:
    """One constraint. With ``list_type`` (DRAListTypeAttributes on) values are sets:
    matchAttribute needs a common element across all chosen devices, distinctAttribute
    pairwise-disjoint sets. Without it only scalars compare (upstream refuses a list there)."""

    constraint: Constraint
    list_type: bool = False
    # scalar mode: value -> [count, request, device] of the devices holding it
    held: dict[tuple[str, Any], list[Any]] = field(default_factory=dict)
    # list mode: matchAttribute pushes the running intersection, distinctAttribute each set
    stack: list[tuple[ValueSet, str, str]] = field(default_factory=list)
    count: int = 0
    # The search asks about the same few requests and one attribute thousands of times:
    # (request, subrequest) -> whether the constraint applies, and the attribute's name split.
    _applies: dict[tuple[str, str | None], bool] = field(default_factory=dict)
    _attribute: str = ""
    _domain: str = ""
    _name: str = ""

    def __post_init__(self) -> None:
        self._attribute = self.constraint.attribute
        self._domain, _, self._name = self._attribute.partition("/")

    def applies(self, base: str, sub: str | None) -> bool:
        found = self._applies.get((base, sub))
        if found is None:
            found = self._applies[(base, sub)] = applies(self.constraint, base, sub)
        return found

    def value(self, device: Device) -> tuple[str, Any] | None:
        """``device.attribute(constraint.attribute)``, with the name split once."""
        found = device.attributes.get(self._attribute)
        if found is None and self._name and self._domain == device.driver:
            found = device.attributes.get(self._name)
        return found

    def check(self, base: str, sub: str | None, device: Device) -> Reason | None:
        """None if the device may be added, else why not (nothing is recorded)."""
        if not self.applies(base, sub):
            return None
        c = self.constraint
        value = self.value(device)
        if value is None:
            return Reason(CONSTRAINT, f"{c.kind} {c.attribute}: the device has no such attribute",
                          {"constraint": c.kind, "attribute": c.attribute})
        if self.list_type:
            return self._check_sets(value)
        if self.count == 0:
            return None
        if value[0] in _LIST_KINDS:
            return Reason(CONSTRAINT, f"{c.kind} {c.attribute}: {_show(value)} is a list, which "
                          "only compares with the DRAListTypeAttributes feature gate on",
                          {"constraint": c.kind, "attribute": c.attribute})
        if c.match_attribute:
            first, (_, req, dev) = next(iter(self.held.items()))  # exactly one value held
            if first != value:
                return Reason(
                    CONSTRAINT,
                    # The device's own value is in the detail (and next to its name in the
                    # table): the message is the same for every device it stops, so they group.
                    f"matchAttribute {c.attribute}: not {_show(first)}, the value of {dev} "
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

    def _check_sets(self, value: tuple[str, Any]) -> Reason | None:
        c = self.constraint
        mine = as_set(value)
        if mine is None:
            return Reason(CONSTRAINT, f"{c.kind} {c.attribute}: the value has no known type",
                          {"constraint": c.kind, "attribute": c.attribute})
        if not self.stack:
            return None
        if c.match_attribute:
            common, req, dev = self.stack[-1]
            if common[0] == mine[0] and common[1] & mine[1]:
                return None
            return Reason(
                CONSTRAINT,
                f"matchAttribute {c.attribute}: {_show(mine)} here has nothing in common with "
                f"{_show(common)}, shared by the devices chosen so far (from {dev} for request "
                f"{req})",
                {"constraint": c.kind, "attribute": c.attribute, "value": sorted(mine[1]),
                 "conflictsWith": {"request": req, "device": dev, "value": sorted(common[1])}})
        for other, req, dev in self.stack:
            shared = other[1] & mine[1] if other[0] == mine[0] else frozenset()
            if shared:
                return Reason(
                    CONSTRAINT,
                    f"distinctAttribute {c.attribute}: {_show((mine[0], shared))} is already "
                    f"used by {dev} chosen for request {req}",
                    {"constraint": c.kind, "attribute": c.attribute, "value": sorted(shared),
                     "conflictsWith": {"request": req, "device": dev}})
        return None

    def add(self, base: str, sub: str | None, device: Device) -> None:
        if not self.applies(base, sub):
            return
        value = self.value(device)
        assert value is not None
        name = base if sub is None else f"{base}/{sub}"
        self.count += 1
        if self.list_type:
            mine = as_set(value)
            assert mine is not None
            if self.constraint.match_attribute and self.stack:
                common, req, dev = self.stack[-1]
                mine = (mine[0], common[1] & mine[1])
                self.stack.append((mine, req, dev))
            else:
                self.stack.append((mine, name, device.name))
            return
        holder = self.held.setdefault(value_key(value), [0, name, device.name])
        holder[0] += 1

    def remove(self, base: str, sub: str | None, device: Device) -> None:
        """Undo the latest ``add`` of this device (the search undoes in reverse order)."""
        if not self.applies(base, sub):
            return
        value = self.value(device)
        assert value is not None
        self.count -= 1
        if self.list_type:
            self.stack.pop()
            return
        key = value_key(value)
        holder = self.held[key]
        holder[0] -= 1
        if holder[0] == 0:
            del self.held[key]
