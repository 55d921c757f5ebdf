"""Devices and slices as the allocator sees them, and other claims' allocation results,
parsed from resource.k8s.io/v1 (and v1beta1) dicts with line-pointing errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agent.explain import schema
from agent.explain.docs import Doc, Path_
from agent.explain.model import DeviceID, get_path, quantity_at
from agent.explain.records import record
from agent.explain.values import ValueParseError, parse_semver
from discovery.model import Taint


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Fraction
    raw: str
    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    range_min: Fraction | None = None
    range_max: Fraction | None = None
    range_step: Fraction | None = None
    has_policy: bool = False


@record
class Device:
    name: str
    driver: str
    pool: str
    attributes: Mapping[str, tuple[str, Any]]  # qualified name -> (kind, value)
    capacity: Mapping[str, Capacity]
    taints: tuple[Taint, ...] = ()
    consumes: tuple[tuple[str, Mapping[str, Fraction]], ...] = ()
    allow_multiple: bool = False
    binds_to_node: bool = False
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    node_name: str = ""
    all_nodes: bool = False
    node_selector: Mapping[str, Any] | None = None

    @property
    def id(self) -> DeviceID:
        return (self.driver, self.pool, self.name)

    def attribute(self, qualified: str) -> tuple[str, Any] | None:
        """Look up a fully qualified name; unqualified keys belong to the driver's domain."""
        found = self.attributes.get(qualified)
        if found is not None:
            return found
        domain, _, ident = qualified.partition("/")
        if ident and domain == self.driver:
            return self.attributes.get(ident)
        return None


@dataclass(frozen=True, slots=True)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[Device, ...] = ()
    shared_counters: Mapping[str, Mapping[str, Fraction]] = field(default_factory=dict)
    node_name: str = ""
    all_nodes: bool = False
    node_selector: Mapping[str, Any] | None = None
    per_device: bool = False


def _attribute(doc: Doc, path: Path_, raw: Mapping[str, Any]) -> tuple[str, Any]:
    if len(raw) != 1:
        raise doc.error(path, "an attribute needs exactly one of int, bool, string, version")
    kind, value = next(iter(raw.items()))
    if kind == "version":
        try:
            parse_semver(value)
        except ValueParseError as err:
            raise doc.error((*path, kind), str(err)) from None
    return kind, value


def _capacity(doc: Doc, path: Path_, raw: Mapping[str, Any]) -> Capacity:
    policy = raw.get("requestPolicy") or {}
    rng = policy.get("validRange") or {}
    ppath = (*path, "requestPolicy")

    def opt(v: Any, p: Path_) -> Fraction | None:
        return None if v is None else quantity_at(doc, p, v)

    return Capacity(
        value=quantity_at(doc, (*path, "value"), raw.get("value")),
        raw=str(raw.get("value")),
        default=opt(policy.get("default"), (*ppath, "default")),
        valid_values=tuple(quantity_at(doc, (*ppath, "validValues", i), v)
                           for i, v in enumerate(policy.get("validValues") or [])),
        range_min=opt(rng.get("min"), (*ppath, "validRange", "min")),
        range_max=opt(rng.get("max"), (*ppath, "validRange", "max")),
        range_step=opt(rng.get("step"), (*ppath, "validRange", "step")),
        has_policy=bool(policy),
    )


def _counters(doc: Doc, path: Path_, raw: Mapping[str, Any]) -> dict[str, Fraction]:
    return {k: quantity_at(doc, (*path, k, "value"), get_path(v, "value")) for k, v in raw.items()}


#: A device's fields that the one-walk check below knows; any other field present (taints,
#: counters, binding, node selection) sends that device through the full schema walk first.
_PLAIN_DEVICE = frozenset({"name", "attributes", "capacity"})
#: An attribute's kind -> the one JSON type its value has on the fast path (exact: bool is not
#: an int here; a subclass of str takes the full check, which says what it thinks of it).
_ATTRIBUTE_TYPES: dict[str, type] = {"string": str, "int": int, "bool": bool, "version": str}


def _plain_attributes(raw: Any, versions: set[str]) -> dict[str, tuple[str, Any]] | None:
    """A device's attributes checked and parsed in one walk, when every one is a scalar of a
    known kind (a version: one of ``versions``, already parsed in this slice); None for
    anything else (the caller runs the full check, and its error)."""
    if type(raw) is not dict:
        return None
    attrs: dict[str, tuple[str, Any]] = {}
    for k, v in raw.items():
        if type(v) is not dict or len(v) != 1:
            return None
        for item in v.items():  # the one (kind, value) pair, kept as the parsed attribute
            kind, value = item
            if type(value) is not _ATTRIBUTE_TYPES.get(kind) or (
                    kind == "version" and value not in versions):
                return None
            attrs[k] = item
    return attrs


def parse_slice(doc: Doc) -> Slice:
    """Check (``schema``) and parse one slice in one walk of its devices.

    The slice around the devices is checked by the schema walk; a device is checked there only
    when it has a field beyond name, attributes and capacity, or one of those is not plain.
    The common device, whose every attribute is one scalar of a known kind and every capacity
    a plain value, is checked by the same loop that parses it: most of a slice's check was
    walking 2,048 such devices a second time.
    """
    obj = doc.obj
    if (obj.get("kind") or "ResourceSlice") != "ResourceSlice":
        raise doc.error(("kind",), f"expected a ResourceSlice, got {obj.get('kind')}")
    if str(obj.get("apiVersion", "")).endswith("/v1beta1"):
        obj = _flatten_v1beta1(obj)
        doc = Doc(obj, doc.source, doc.lines, doc.base)
    spec = obj.get("spec")
    raw_devices = spec.get("devices") if isinstance(spec, dict) else None
    if isinstance(spec, dict) and isinstance(raw_devices, list):  # devices: one by one, below
        schema.check(doc, "ResourceSlice", {**obj, "spec": {**spec, "devices": []}})
    else:
        schema.check(doc, "ResourceSlice")
    spec = spec or {}
    driver, pool = spec.get("driver"), spec.get("pool") or {}
    if not driver or not pool.get("name"):
        raise doc.error(("spec",), "a ResourceSlice needs spec.driver and spec.pool.name")
    devices = []
    plain_caps: dict[Any, Capacity] = {}
    versions: set[str] = set()
    pool_name = pool["name"]
    for i, d in enumerate(raw_devices or []):
        # The common device: a name, plain attributes and capacities, nothing else. Checked by
        # the loop that parses it, and built with the other fields at their defaults.
        if type(d) is dict and d.keys() <= _PLAIN_DEVICE and type(d.get("name")) is str \
                and d["name"]:
            attrs = _plain_attributes(d.get("attributes") or {}, versions)
            caps = _plain_capacity(d.get("capacity") or {}, plain_caps) \
                if attrs is not None else None
            if attrs is not None and caps is not None:
                devices.append(Device(d["name"], driver, pool_name, attrs, caps))
                continue
        devices.append(_full_device(doc, i, d, driver, pool_name, plain_caps=plain_caps,
                                    versions=versions))
    counters = {str(c.get("name")): _counters(doc, ("spec", "sharedCounters", i, "counters"),
                                              c.get("counters") or {})
                for i, c in enumerate(spec.get("sharedCounters") or [])}
    return Slice(
        name=str(get_path(obj, "metadata", "name") or get_path(obj, "metadata", "generateName")
                 or f"{driver}-{pool['name']}"),
        driver=driver, pool=pool_name, generation=int(pool.get("generation") or 0),
        slice_count=int(pool.get("resourceSliceCount") or 1), devices=tuple(devices),
        shared_counters=counters, node_name=spec.get("nodeName") or "",
        all_nodes=bool(spec.get("allNodes")), node_selector=spec.get("nodeSelector"),
        per_device=bool(spec.get("perDeviceNodeSelection")),
    )


def _full_device(doc: Doc, i: int, d: Any, driver: str, pool: str, *,
                 plain_caps: dict[Any, Capacity], versions: set[str]) -> Device:
    """A device off the fast path: the schema walk (the first bad field's error, if any),
    then every field; what it parsed serves the next devices' fast path."""
    path: Path_ = ("spec", "devices", i)
    schema.check(doc, "Device", d, path)
    attrs = {k: _attribute(doc, (*path, "attributes", k), v)
             for k, v in (d.get("attributes") or {}).items()}
    caps = {k: _capacity(doc, (*path, "capacity", k), v)
            for k, v in (d.get("capacity") or {}).items()}
    versions.update(v for kind, v in attrs.values() if kind == "version")
    for k, v in (d.get("capacity") or {}).items():
        if len(v) == 1 and type(v.get("value")) in (str, int):
            plain_caps.setdefault(v["value"], caps[k])
    if not d.get("name"):
        raise doc.error(path, "a device needs a name")
    taints = tuple(Taint(key=t["key"], effect=t.get("effect", ""), value=t.get("value", ""))
                   for t in d.get("taints") or ())
    consumes = tuple(
        (str(c.get("counterSet")),
         _counters(doc, (*path, "consumesCounters", j, "counters"), c.get("counters") or {}))
        for j, c in enumerate(d.get("consumesCounters") or ()))
    return Device(
        name=d["name"], driver=driver, pool=pool, attributes=attrs, capacity=caps,
        taints=taints, consumes=consumes,
        allow_multiple=bool(d.get("allowMultipleAllocations")),
        binds_to_node=bool(d.get("bindsToNode")),
        binding_conditions=tuple(d.get("bindingConditions") or ()),
        binding_failure_conditions=tuple(d.get("bindingFailureConditions") or ()),
        node_name=d.get("nodeName") or "", all_nodes=bool(d.get("allNodes")),
        node_selector=d.get("nodeSelector"),
    )


def _plain_capacity(raw: Any, seen: dict[Any, Capacity]) -> dict[str, Capacity] | None:
    """A device's capacities when each is a plain ``{value: <quantity>}`` already checked
    and parsed in this slice (frozen, so devices with the same one share it); None when one
    is not plain or new: the caller checks and parses that device in full."""
    if not isinstance(raw, dict):
        return None
    caps: dict[str, Capacity] = {}
    for k, v in raw.items():
        found = seen.get(v.get("value")) if type(v) is dict and len(v) == 1 else None
        if found is None:
            return None
        caps[k] = found
    return caps


def _flatten_v1beta1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """v1beta1 nests device fields under ``basic``; the rest of the slice is the same."""
    out = dict(obj)
    spec = dict(out.get("spec") or {})
    spec["devices"] = [{"name": d.get("name"), **(d.get("basic") or {})}
                       for d in spec.get("devices") or []]
    out["spec"] = spec
    return out



@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One result of another claim's ``status.allocation`` (what the scheduler counts as used)."""

    claim: str  # namespace/name
    device: DeviceID
    admin_access: bool
    share_id: str | None
    consumed: Mapping[str, Fraction]


def parse_allocated(doc: Doc) -> list[AllocatedDevice]:
    """The allocation results of a ResourceClaim; an unallocated claim yields nothing."""
    obj = doc.obj
    if (obj.get("kind") or "ResourceClaim") != "ResourceClaim":
        raise doc.error(("kind",), f"expected a ResourceClaim, got {obj.get('kind')}")
    meta = obj.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise doc.error(("metadata",), "expected an object")
    claim = f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
    for step in range(1, 4):  # status, status.allocation, ...devices: objects if present
        part = ("status", "allocation", "devices")[:step]
        if not isinstance(get_path(obj, *part) or {}, Mapping):
            raise doc.error(part, "expected an object")
    results = get_path(obj, "status", "allocation", "devices", "results") or []
    if not isinstance(results, list):
        raise doc.error(("status", "allocation", "devices", "results"), "expected a list")
    out = []
    for i, r in enumerate(results):
        path: Path_ = ("status", "allocation", "devices", "results", i)
        if not isinstance(r, Mapping) or not all(
                isinstance(r.get(k), str) and r.get(k) for k in ("driver", "pool", "device")):
            raise doc.error(path, "a result needs driver, pool and device (strings)")
        raw_consumed = r.get("consumedCapacity") or {}
        if not isinstance(raw_consumed, Mapping):
            raise doc.error((*path, "consumedCapacity"), "expected an object")
        if not isinstance(r.get("shareID") or "", str):
            raise doc.error((*path, "shareID"), "expected a string")
        consumed = {k: quantity_at(doc, (*path, "consumedCapacity", k), v)
                    for k, v in raw_consumed.items()}
        out.append(AllocatedDevice(claim, (r["driver"], r["pool"], r["device"]),
                                   bool(r.get("adminAccess")), r.get("shareID"), consumed))
    return out
