"""Claims, device classes and slices as the allocator sees them, parsed from v1 dicts.

Parsing checks what the API server would have refused (unknown fields, wrong types, bad
quantities, missing names) and reports it with the file and line; the allocator then works on
these frozen objects only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from agent.explain import schema
from agent.explain.docs import Doc, Path_
from agent.explain.values import ValueParseError, parse_quantity
from discovery.model import Taint

ALL = "All"
EXACT_COUNT = "ExactCount"
#: At most this many devices in one allocation result (resource.k8s.io/v1).
MAX_RESULTS = 32
#: Longest CEL selector the API server accepts, in bytes.
MAX_EXPRESSION_LENGTH = 10 * 1024

DeviceID = tuple[str, str, str]  # driver, pool, device


def device_id_str(did: DeviceID) -> str:
    return "/".join(did)


@dataclass(frozen=True, slots=True)
class Selector:
    expression: str
    owner: str  # "class gpu.dra-agent.io" or "request gpu"
    index: int
    where: str  # file:line of the expression


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclass(frozen=True, slots=True)
class Request:
    """An exact request or one subrequest of a ``firstAvailable`` list."""

    name: str  # "gpu" or "gpu/h100" for a subrequest
    base: str  # the claim request's name
    sub: str | None
    device_class: str
    mode: str = EXACT_COUNT
    count: int = 1
    selectors: tuple[Selector, ...] = ()
    admin_access: bool | None = None
    tolerations: tuple[Toleration, ...] = ()
    tolerations_raw: tuple[Mapping[str, Any], ...] = ()
    capacity: Mapping[str, Fraction] | None = None
    capacity_raw: Mapping[str, str] = field(default_factory=dict)
    where: str = ""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    name: str
    alternatives: tuple[Request, ...]  # one for ``exactly``, several for ``firstAvailable``
    prioritized: bool


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...]
    match_attribute: str | None
    distinct_attribute: str | None
    where: str

    @property
    def attribute(self) -> str:
        return self.match_attribute or self.distinct_attribute or ""

    @property
    def kind(self) -> str:
        return "matchAttribute" if self.match_attribute else "distinctAttribute"


@dataclass(frozen=True, slots=True)
class Claim:
    namespace: str
    name: str
    uid: str
    requests: tuple[ClaimRequest, ...]
    constraints: tuple[Constraint, ...] = ()
    config: tuple[tuple[tuple[str, ...], Mapping[str, Any]], ...] = ()  # (requests, opaque)


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[Selector, ...] = ()
    config: tuple[Mapping[str, Any], ...] = ()  # opaque configurations


def get_path(obj: Mapping[str, Any], *keys: str | int) -> Any:
    cur: Any = obj
    for key in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def quantity_at(doc: Doc, path: Path_, value: Any) -> Fraction:
    try:
        return parse_quantity(value)
    except ValueParseError as err:
        raise doc.error(path, str(err)) from None


def _selectors(doc: Doc, path: Path_, raw: list[Any] | None, owner: str) -> tuple[Selector, ...]:
    out = []
    for i, sel in enumerate(raw or []):
        expr = get_path(sel, "cel", "expression")
        if not isinstance(expr, str) or not expr.strip():
            raise doc.error((*path, i), "selector needs cel.expression")
        if len(expr.encode()) > MAX_EXPRESSION_LENGTH:
            raise doc.error((*path, i, "cel", "expression"),
                            f"CEL expression longer than {MAX_EXPRESSION_LENGTH} bytes")
        out.append(Selector(expr, owner, i, doc.where((*path, i, "cel", "expression"))))
    return tuple(out)


def _request(doc: Doc, path: Path_, raw: Mapping[str, Any], base: str, sub: str | None) -> Request:
    name = base if sub is None else f"{base}/{sub}"
    cls = raw.get("deviceClassName")
    if not cls:
        raise doc.error(path, f"request {name}: deviceClassName is required")
    mode = raw.get("allocationMode") or EXACT_COUNT
    if mode not in (EXACT_COUNT, ALL):
        raise doc.error((*path, "allocationMode"), f"must be ExactCount or All, not {mode!r}")
    count = raw.get("count", 1 if mode == EXACT_COUNT else 0)
    if mode == EXACT_COUNT and count < 1:
        raise doc.error((*path, "count"), "must be at least 1")
    if mode == ALL and raw.get("count"):
        raise doc.error((*path, "count"), "must not be set with allocationMode All")
    tolerations = []
    for i, t in enumerate(raw.get("tolerations") or []):
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise doc.error((*path, "tolerations", i, "operator"), "must be Equal or Exists")
        if not t.get("key") and op != "Exists":
            raise doc.error((*path, "tolerations", i), "an empty key needs operator Exists")
        tolerations.append(Toleration(t.get("key", ""), op, t.get("value", ""),
                                      t.get("effect", "")))
    cap_raw = get_path(raw, "capacity", "requests")
    capacity = None
    if cap_raw is not None:
        capacity = {k: quantity_at(doc, (*path, "capacity", "requests", k), v)
                    for k, v in cap_raw.items()}
    owner = f"request {name}"
    return Request(
        name=name, base=base, sub=sub, device_class=cls, mode=mode, count=int(count),
        selectors=_selectors(doc, (*path, "selectors"), raw.get("selectors"), owner),
        admin_access=raw.get("adminAccess"), tolerations=tuple(tolerations),
        tolerations_raw=tuple(raw.get("tolerations") or ()), capacity=capacity,
        capacity_raw={k: str(v) for k, v in (cap_raw or {}).items()}, where=doc.where(path),
    )


def parse_claim(doc: Doc) -> Claim:
    """A ResourceClaim (or ResourceClaimTemplate) v1 object."""
    obj = doc.obj
    kind = obj.get("kind") or "ResourceClaim"
    if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        raise doc.error(("kind",), f"expected a ResourceClaim, got {kind}")
    schema.check(doc, kind)
    spec_path: Path_ = ("spec",) if kind == "ResourceClaim" else ("spec", "spec")
    devices = get_path(obj, *spec_path, "devices") or {}
    dpath: Path_ = (*spec_path, "devices")
    requests: list[ClaimRequest] = []
    seen: set[str] = set()
    for i, r in enumerate(devices.get("requests") or []):
        path: Path_ = (*dpath, "requests", i)
        name = r.get("name")
        if not name:
            raise doc.error(path, "request needs a name")
        if name in seen:
            raise doc.error((*path, "name"), f"duplicate request name {name}")
        seen.add(name)
        exactly, first = r.get("exactly"), r.get("firstAvailable")
        if bool(exactly) == bool(first):
            raise doc.error(path, f"request {name}: set exactly one of exactly, firstAvailable")
        if exactly:
            alts: tuple[Request, ...] = (_request(doc, (*path, "exactly"), exactly, name, None),)
        else:
            alts = tuple(_request(doc, (*path, "firstAvailable", j), s, name, s.get("name") or "")
                         for j, s in enumerate(first))
            if any(not a.sub for a in alts):
                raise doc.error((*path, "firstAvailable"), "every subrequest needs a name")
        requests.append(ClaimRequest(name, alts, bool(first)))
    if not requests:
        raise doc.error(dpath, "the claim has no device requests")
    known = seen | {a.name for r in requests for a in r.alternatives}
    constraints = []
    for i, c in enumerate(devices.get("constraints") or []):
        path = (*dpath, "constraints", i)
        match, distinct = c.get("matchAttribute"), c.get("distinctAttribute")
        if bool(match) == bool(distinct):
            raise doc.error(path, "set exactly one of matchAttribute, distinctAttribute")
        attr = match or distinct
        if "/" not in attr:
            raise doc.error(path, f"{attr!r} must be fully qualified (domain/name)")
        for j, ref in enumerate(c.get("requests") or []):
            if ref not in known:
                raise doc.error((*path, "requests", j), f"no request named {ref}")
        constraints.append(Constraint(tuple(c.get("requests") or ()), match, distinct,
                                      doc.where(path)))
    config = []
    for i, c in enumerate(devices.get("config") or []):
        for j, ref in enumerate(c.get("requests") or []):
            if ref not in known:
                raise doc.error((*dpath, "config", i, "requests", j), f"no request named {ref}")
        if c.get("opaque") is not None:
            config.append((tuple(c.get("requests") or ()), c["opaque"]))
    meta = obj.get("metadata") or {}
    return Claim(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or meta.get("generateName") or "claim"),
        uid=str(meta.get("uid") or ""),
        requests=tuple(requests), constraints=tuple(constraints), config=tuple(config),
    )


def parse_class(doc: Doc) -> DeviceClass:
    obj = doc.obj
    if (obj.get("kind") or "DeviceClass") != "DeviceClass":
        raise doc.error(("kind",), f"expected a DeviceClass, got {obj.get('kind')}")
    schema.check(doc, "DeviceClass")
    name = get_path(obj, "metadata", "name")
    if not name:
        raise doc.error(("metadata",), "a DeviceClass needs metadata.name")
    spec = obj.get("spec") or {}
    selectors = _selectors(doc, ("spec", "selectors"), spec.get("selectors"), f"class {name}")
    config = tuple(c["opaque"] for c in spec.get("config") or () if c.get("opaque") is not None)
    return DeviceClass(str(name), selectors, config)
