"""Planning one pool's writes: desired slices versus the stored ones, as a pure function.

``plan_pool`` decides; the controller only executes. Keeping the decision free of I/O makes
the rules testable one by one (tests/slices/test_sync.py) and keeps the controller small.

The rules are those of the upstream controller at 1.37 (k8s.io/dynamic-resource-allocation
resourceslice, ``syncPool``): slices of an older generation, with an index that matches no
desired slice, or extra copies for one index are obsolete and deleted first; the generation
is the highest stored one, raised to the driver's ``Pool.generation`` when that is higher,
and bumped by one whenever a slice has to be created or more than one slice updated (so a new
pool starts at 1, and one lost slice re-created rewrites the whole pool at a new generation).
Deletes alone never bump: a pool shrinking from two slices to one keeps its generation.
There is no implied node selection: a slice carries ``nodeName``, ``nodeSelector`` or
``allNodes`` only when the pool says so (upstream has required ``AllNodes`` to be explicit
since 1.36); a pool with none of them is refused by ``PoolState.check`` before any write.

Deliberate differences, each with its reason and the test that pins it:

* the generation never goes down within a process: ``generation_floor`` carries the last
  generation published, so a pool recreated after a kubelet wipe is newer than what any
  consumer saw before the wipe (upstream starts again at 1).
  test_sync.py::test_wiped_pool_comes_back_with_a_newer_generation_than_published_before
* two stored slices for one index: the copy that already holds the desired devices is kept,
  so the duplicate costs one delete and no update (upstream keeps whichever it saw first).
  test_sync.py::test_duplicate_for_one_index_keeps_the_matching_copy
* a slice without our controller reference (UID included) counts as changed and gets it back:
  garbage collection of the node's slices depends on it (upstream never looks).
  test_sync.py::test_missing_owner_reference_is_restored
* a slice whose ``nodeName`` differs from the pool's is obsolete (nodeName is immutable);
  upstream's informer is filtered by node name, so it never sees such a slice.
  test_sync.py::test_pool_moving_from_node_local_to_selector_replaces_its_slices

The controller's own differences (repair delay, retrying a 422) are in controller.py.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.slices.compare import copy_taint_times, devices_equal, specs_equal
from agent.slices.naming import decode_index, generate_name, index_width


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """The owner written into ``metadata.ownerReferences`` (with ``controller: true``)."""

    api_version: str
    kind: str
    name: str
    uid: str

    def to_api(self) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
        }


@dataclass(frozen=True, slots=True)
class SliceContent:
    """What one desired slice holds: v1 Device dicts and counter sets."""

    devices: tuple[Mapping[str, Any], ...] = ()
    shared_counters: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class DesiredPool:
    """A pool as the planner needs it; exactly one of node_name / node_selector / all_nodes.

    None of them set is not "all nodes": upstream never implies that, and neither do we.
    """

    name: str
    slices: tuple[SliceContent, ...]
    node_name: str | None = None
    node_selector: Mapping[str, Any] | None = None
    generation: int = 0  # the driver's floor (Pool.generation)
    all_nodes: bool = False

    @property
    def has_node_selection(self) -> bool:
        return bool(self.node_name) or self.node_selector is not None or self.all_nodes


@dataclass(frozen=True, slots=True)
class Delete:
    name: str
    uid: str | None
    resource_version: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Update:
    index: int
    obj: dict[str, Any]  # full v1 object, carrying the stored resourceVersion


@dataclass(frozen=True, slots=True)
class Create:
    index: int
    obj: dict[str, Any]  # v1 object with metadata.generateName


@dataclass(frozen=True, slots=True)
class PoolPlan:
    pool: str
    generation: int
    deletes: tuple[Delete, ...] = ()
    updates: tuple[Update, ...] = ()
    creates: tuple[Create, ...] = ()
    bumped: bool = False

    @property
    def writes(self) -> int:
        return len(self.deletes) + len(self.updates) + len(self.creates)

    @property
    def empty(self) -> bool:
        return self.writes == 0


def _generation(obj: Mapping[str, Any]) -> int:
    value = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) else 0


def _delete_of(obj: Mapping[str, Any], reason: str) -> Delete:
    meta = obj.get("metadata", {})
    return Delete(meta.get("name", ""), meta.get("uid"), meta.get("resourceVersion"), reason)


def desired_spec(driver: str, pool: DesiredPool, index: int, generation: int) -> dict[str, Any]:
    """The v1 ``spec`` of slice ``index`` of ``pool``.

    New dicts and lists down to the devices, counter sets and node selector, which are the
    driver's mappings, shared (the controller owns them, and nothing here writes to them):
    copying 2,048 devices took 20 ms before a publish's first request, and the comparison
    runs on every sync. The transport encodes any mapping; ``plain`` makes a JSON-ready copy
    for those who need one (``render_slices``).
    """
    content = pool.slices[index]
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {
            "name": pool.name,
            "generation": generation,
            "resourceSliceCount": len(pool.slices),
        },
    }
    if pool.node_name:
        spec["nodeName"] = pool.node_name
    elif pool.node_selector is not None:
        spec["nodeSelector"] = pool.node_selector
    elif pool.all_nodes:
        spec["allNodes"] = True
    if content.shared_counters:
        # The API forbids devices next to sharedCounters, even an empty list.
        spec["sharedCounters"] = list(content.shared_counters)
    else:
        spec["devices"] = list(content.devices)
    return spec


_SCALARS = frozenset({str, int, bool, float, type(None)})


def plain(value: Any) -> Any:
    """``value`` as JSON-ready dicts and lists (the driver may hand over any Mapping)."""
    kind = type(value)
    if kind is dict:  # the common case first: isinstance against an ABC is slow
        # Scalars are taken as they are without a call: most of a device's values are.
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [plain(v) for v in value]
    if kind in (str, int, bool, float) or value is None:
        return value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def owner_ok(obj: Mapping[str, Any], owner: OwnerRef | None) -> bool:
    """Whether ``obj`` carries ``owner`` as its controller reference (UID included)."""
    if owner is None:
        return True
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(
        isinstance(r, Mapping) and r.get("uid") == owner.uid and r.get("controller") is True
        for r in refs
    )


def _with_owner(refs: Sequence[Any], owner: OwnerRef) -> list[Any]:
    """Our controller reference in place of any other controller reference; others kept."""
    kept = [r for r in refs if isinstance(r, Mapping) and not r.get("controller")]
    return [owner.to_api(), *kept]


def _match(
    existing: Sequence[Mapping[str, Any]],
    pool: DesiredPool,
    width: int,
    max_generation: int,
) -> tuple[dict[int, Mapping[str, Any]], list[Delete]]:
    """Stored slices by the desired index they stand for, and the obsolete rest."""
    candidates: dict[int, list[Mapping[str, Any]]] = {}
    obsolete: list[Delete] = []
    for obj in existing:
        name = obj.get("metadata", {}).get("name", "")
        if _generation(obj) < max_generation:
            obsolete.append(_delete_of(obj, "older generation"))
            continue
        if obj.get("spec", {}).get("nodeName") != pool.node_name:
            # nodeName is immutable: a pool that moved between node-local and node selector
            # needs new slices.
            obsolete.append(_delete_of(obj, "node selection changed"))
            continue
        index = decode_index(name, width)
        if index is None or index >= len(pool.slices):
            obsolete.append(_delete_of(obj, "no desired slice with this index"))
            continue
        candidates.setdefault(index, []).append(obj)
    matched: dict[int, Mapping[str, Any]] = {}
    for index, objs in sorted(candidates.items()):
        # Two slices claiming one index (a create raced a restart): keep the one that already
        # has the right devices, so the duplicate costs one delete and no update.
        want = pool.slices[index].devices
        ordered = sorted(objs, key=functools.partial(_rank, want=want))
        matched[index] = ordered[0]
        obsolete += [_delete_of(o, "duplicate slice for this index") for o in ordered[1:]]
    return matched, obsolete


def _rank(obj: Mapping[str, Any], want: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    same = devices_equal(obj.get("spec", {}).get("devices") or [], want)
    return (0 if same else 1, obj.get("metadata", {}).get("name", ""))


def plan_pool(
    driver: str,
    pool_name: str,
    desired: DesiredPool | None,
    existing: Sequence[Mapping[str, Any]],
    owner: OwnerRef | None,
    *,
    generation_floor: int = 0,
) -> PoolPlan:
    """The writes that make the stored slices of ``pool_name`` equal ``desired``.

    ``existing`` are v1-shaped stored objects of this pool (and only this pool). ``desired``
    None means the pool is gone: all its slices are deleted. Order of execution is the
    order of the fields: deletes, then updates, then creates.
    """
    if desired is None or not desired.slices:
        deletes = tuple(_delete_of(o, "pool no longer published") for o in existing)
        return PoolPlan(pool_name, generation_floor, deletes=deletes)

    max_generation = max((_generation(o) for o in existing), default=0)
    width = index_width(len(desired.slices))
    matched, obsolete = _match(existing, desired, width, max_generation)
    base = max(max_generation, generation_floor)

    changed = {
        index
        for index, obj in matched.items()
        if not specs_equal(
            obj.get("spec", {}), desired_spec(driver, desired, index, base)
        )
        or not owner_ok(obj, owner)
    }
    missing = [i for i in range(len(desired.slices)) if i not in matched]

    bumped = True
    if desired.generation > base:
        generation = desired.generation
    elif not missing and len(changed) <= 1:
        # At most one update call: consumers see the pool either before or after it, never
        # half done. Deleting obsolete slices does not count (upstream's rule).
        generation, bumped = base, False
    else:
        # Consumers only trust a pool whose slices all carry its highest generation; a new
        # generation on every slice makes a multi-write change (or a create) atomic to them.
        generation = base + 1

    updates: list[Update] = []
    for index in sorted(matched):
        if index not in changed and not bumped:
            continue
        current = matched[index]
        # Only metadata is carried over; the spec is rebuilt from the desired state.
        obj = {k: v for k, v in current.items() if k not in ("metadata", "spec", "status")}
        meta = copy.deepcopy(dict(current.get("metadata", {})))
        meta.pop("managedFields", None)
        obj["metadata"] = meta
        if owner is not None:
            meta["ownerReferences"] = _with_owner(meta.get("ownerReferences") or [], owner)
        spec = desired_spec(driver, desired, index, generation)
        if "devices" in spec:
            spec["devices"] = copy_taint_times(
                current.get("spec", {}).get("devices") or [], spec["devices"]
            )
        obj["spec"] = spec
        updates.append(Update(index, obj))

    creates: list[Create] = []
    owner_name = owner.name if owner is not None else None
    for index in missing:
        new_meta: dict[str, Any] = {
            "generateName": generate_name(index, width, driver, owner_name)
        }
        if owner is not None:
            new_meta["ownerReferences"] = [owner.to_api()]
        spec = desired_spec(driver, desired, index, generation)
        creates.append(Create(index, {"metadata": new_meta, "spec": spec}))

    return PoolPlan(
        pool_name,
        generation,
        deletes=tuple(obsolete),
        updates=tuple(updates),
        creates=tuple(creates),
        bumped=bumped and (bool(updates) or bool(creates)),
    )
