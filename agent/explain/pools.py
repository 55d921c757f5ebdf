"""Which slices count for this node: pools, generations, completeness, node selection, and what
other claims already hold (devices, shares, consumed capacity, counters).

Mirrors the scheduler's pool gathering: only the newest generation of a pool among the node's
slices counts; if those are all ``resourceSliceCount`` slices the pool is used as is. Only
otherwise are other nodes' slices consulted: a newer generation there drops the pool, and a
pool whose slices are still not all there is incomplete and never allocated from;
a pool with duplicate device names or dangling counter references is invalid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agent.explain.devices import AllocatedDevice, Device, Slice
from agent.explain.model import DeviceID


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class PoolView:
    driver: str
    name: str
    generation: int
    slices: list[Slice]  # the slices with devices for this node, sorted by name
    incomplete: bool = False
    invalid: str = ""
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict)
    all_devices: list[Device] = field(default_factory=list)  # incl. other nodes' (counters)
    expected_slices: int = 0
    seen_slices: int = 0
    binding_conditions: bool = False

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def usable(self) -> bool:
        return not self.incomplete and not self.invalid


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op, values = req.get("operator"), list(req.get("values") or [])
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def selector_matches(node: Node, selector: Mapping[str, Any]) -> bool:
    """A core/v1 NodeSelector: terms are ORed, requirements inside a term ANDed."""
    for term in selector.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fields_ = term.get("matchFields") or []
        if not exprs and not fields_:
            continue  # an empty term matches nothing
        ok = all(_requirement_matches(r, node.labels.get(str(r.get("key")))) for r in exprs)
        ok = ok and all(_requirement_matches(
            r, node.name if r.get("key") == "metadata.name" else None) for r in fields_)
        if ok:
            return True
    return False


def node_matches(node: Node, node_name: str, all_nodes: bool,
                 selector: Mapping[str, Any] | None) -> bool:
    if node_name:
        return node_name == node.name
    if all_nodes:
        return True
    if selector is not None:
        return selector_matches(node, selector)
    return False


def _relevant(s: Slice, node: Node) -> bool:
    if s.node_name or s.all_nodes or s.node_selector is not None:
        return node_matches(node, s.node_name, s.all_nodes, s.node_selector)
    if s.per_device:
        return any(node_matches(node, d.node_name, d.all_nodes, d.node_selector)
                   for d in s.devices)
    return False  # some future node selection field: not ours to guess


def gather_pools(slices: Sequence[Slice], node: Node, *, partitionable: bool = True
                 ) -> list[PoolView]:
    """``partitionable``: DRAPartitionableDevices; off, the node's slices using it are skipped
    (only those: upstream still counts all slices when it checks an incomplete pool)."""
    newest: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        if not partitionable and (s.per_device or s.shared_counters):
            continue
        if not _relevant(s, node):
            continue
        key = (s.driver, s.pool)
        have = newest.get(key)
        if have is None or s.generation > have[0].generation:
            newest[key] = [s]
        elif s.generation == have[0].generation:
            have.append(s)
    pools: list[PoolView] = []
    for (driver, name), mine in newest.items():
        gen, expected = mine[0].generation, mine[0].slice_count
        if len(mine) == expected:
            # Complete from this node's slices alone: upstream uses it as is and never looks
            # at other nodes' slices, so a newer generation published elsewhere does not count.
            pool = PoolView(driver, name, gen, sorted(mine, key=lambda s: s.name),
                            expected_slices=expected, seen_slices=len(mine))
            _validate(pool, mine)
            pools.append(pool)
            continue
        everything = [s for s in slices if (s.driver, s.pool) == (driver, name)]
        if any(s.generation > gen for s in everything):
            continue  # the driver is replacing this generation: ignore the old data
        same_gen = [s for s in everything if s.generation == gen]
        pool = PoolView(driver, name, gen, sorted(mine, key=lambda s: s.name),
                        expected_slices=expected, seen_slices=len(same_gen))
        if len(same_gen) != expected:
            pool.incomplete = True
            pool.slices = []
            pools.append(pool)
            continue
        _validate(pool, same_gen)
        pools.append(pool)
    pools.sort(key=lambda p: (p.binding_conditions, p.driver, p.name))
    return pools


def _validate(pool: PoolView, same_gen: Sequence[Slice]) -> None:
    devices = [d for s in pool.slices for d in s.devices]
    if len({d.name for d in devices}) != len(devices):  # which one: the first seen twice
        names: set[str] = set()
        for i, d in enumerate(devices):
            if d.name in names:
                pool.binding_conditions = any(e.binding_conditions for e in devices[:i])
                pool.invalid = f"duplicate device name {d.name}"
                return
            names.add(d.name)
    pool.binding_conditions = any(d.binding_conditions for d in devices)
    for s in same_gen:
        for set_name, counters in s.shared_counters.items():
            if set_name in pool.counter_sets:
                pool.invalid = f"duplicate counter set name {set_name}"
                return
            pool.counter_sets[set_name] = dict(counters)
        pool.all_devices.extend(s.devices)
    for d in pool.all_devices:
        for set_name, counters in d.consumes:
            cset = pool.counter_sets.get(set_name)
            if cset is None:
                pool.invalid = f"counter set {set_name} not found"
                return
            missing = sorted(set(counters) - set(cset))
            if missing:
                pool.invalid = f"counter {missing[0]} not found in counter set {set_name}"
                return


@dataclass(slots=True)
class AllocatedState:
    """What other claims hold, as the scheduler counts it (admin-access results hold nothing)."""

    devices: dict[DeviceID, str] = field(default_factory=dict)  # exclusive -> claim
    shared: dict[DeviceID, list[str]] = field(default_factory=dict)  # shared -> claims
    capacity: dict[DeviceID, dict[str, Fraction]] = field(default_factory=dict)

    @classmethod
    def build(cls, results: Iterable[AllocatedDevice]) -> AllocatedState:
        state = cls()
        for r in results:
            if r.admin_access:
                continue
            if r.share_id:
                state.shared.setdefault(r.device, []).append(r.claim)
                if r.consumed:
                    agg = state.capacity.setdefault(r.device, {})
                    for k, v in r.consumed.items():
                        agg[k] = agg.get(k, Fraction(0)) + v
            else:
                state.devices[r.device] = r.claim
        return state

    def holds(self, did: DeviceID) -> bool:
        """Whether the device counts as allocated (for counter accounting)."""
        return did in self.devices or did in self.shared or did in self.capacity


def available_counters(pool: PoolView, state: AllocatedState) -> dict[str, dict[str, Fraction]]:
    """The pool's counters minus what devices allocated to other claims consume."""
    left = {name: dict(counters) for name, counters in pool.counter_sets.items()}
    for d in pool.all_devices:
        if not state.holds(d.id):
            continue
        for set_name, counters in d.consumes:
            for cname, value in counters.items():
                if cname in left.get(set_name, {}):
                    left[set_name][cname] -= value
    return left
