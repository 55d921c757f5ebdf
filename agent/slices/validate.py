"""Local check of a pool against the limits the API server enforces (Kubernetes 1.36).

A slice the server would reject with 422 is caught here instead, with the pool, the slice
index and the exact field, so an over-full device is reported before any write and the pool's
current slices stay published. Cross-slice rules the server does not check (device names
unique in the pool, counter references) are checked too, like the upstream controller does:
the scheduler silently ignores such pools.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from agent.common.k8snames import dns_label_problem, dns_subdomain_problem
from agent.common.quantity import is_quantity
from discovery.model import Pool

MAX_DEVICES = 128
MAX_DEVICES_RESTRICTED = 64  # with taints, consumesCounters or list-valued attributes
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_STRING = 64
MAX_TAINTS = 16
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMPTIONS = 2
MAX_BINDING_CONDITIONS = 4
MAX_DRIVER = 63
MAX_POOL_NAME = 253
MAX_C_IDENTIFIER = 32

_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
# Semantic Versioning 2.0.0, the grammar from semver.org. Every pattern here is used with
# fullmatch: re.match with "$" would also accept the string followed by one "\n".
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
    re.ASCII,  # \d: ASCII digits only, as the API server's semver parser reads them
)
_SCALAR_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")
_LIST_KIND_SET = frozenset(_LIST_KINDS)
_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class Problem:
    """One violated limit: where (pool, slice index, field path) and why."""

    pool: str
    slice_index: int | None  # None: about the pool as a whole
    field: str
    message: str

    def __str__(self) -> str:
        where = f"pool {self.pool!r}"
        if self.slice_index is not None:
            where += f" slice #{self.slice_index}"
        return f"{where}: {self.field}: {self.message}"


class PoolValidationError(ValueError):
    """A desired pool breaks API limits; it is not published until the driver fixes it."""

    def __init__(self, pool: str, problems: Sequence[Problem]) -> None:
        shown = "; ".join(str(p) for p in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"pool {pool!r} is not publishable: {shown}{more}")
        self.pool = pool
        self.problems = tuple(problems)


def driver_problem(driver: str) -> str | None:
    """The API lowercases the driver before checking it, so capitals pass (with a warning)."""
    return dns_subdomain_problem(driver.lower(), MAX_DRIVER)


def pool_name_problem(name: str) -> str | None:
    if not name:
        return "must not be empty"
    if len(name) > MAX_POOL_NAME:
        return f"must be at most {MAX_POOL_NAME} characters, is {len(name)}"
    for part in name.split("/"):
        problem = dns_subdomain_problem(part)
        if problem:
            return f"part {part!r}: {problem}"
    return None


# Pure, and memoised: every device of a node repeats the same few attribute names.
@lru_cache(maxsize=4096)
def qualified_name_problem(name: str) -> str | None:
    """``<C identifier>`` or ``<domain>/<C identifier>``, identifier at most 32 characters."""
    domain, _, ident = name.rpartition("/")
    if "/" in name:
        problem = dns_subdomain_problem(domain, MAX_DRIVER)
        if problem:
            return f"domain {domain!r}: {problem}"
    if not _C_IDENTIFIER.fullmatch(ident):
        return f"{ident!r} must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
    if len(ident) > MAX_C_IDENTIFIER:
        return f"{ident!r} must be at most {MAX_C_IDENTIFIER} characters, is {len(ident)}"
    return None


def label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and (problem := dns_subdomain_problem(prefix)):
        return f"prefix {prefix!r}: {problem}"
    if not name or len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        return "must be a label name (at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends)"
    return None


def validate_pool(driver: str, pool_name: str, pool: Pool) -> list[Problem]:
    """Every limit ``pool`` breaks; empty when the server would accept all its slices."""
    problems: list[Problem] = []

    def add(index: int | None, field: str, message: str) -> None:
        problems.append(Problem(pool_name, index, field, message))

    if problem := driver_problem(driver):
        add(None, "spec.driver", problem)
    if problem := pool_name_problem(pool_name):
        add(None, "spec.pool.name", problem)
    if pool.generation < 0:
        add(None, "spec.pool.generation", f"must be >= 0, is {pool.generation}")
    if pool.node_selector is not None:
        terms = pool.node_selector.get("nodeSelectorTerms")
        if not isinstance(terms, list) or len(terms) != 1:
            count = len(terms) if isinstance(terms, list) else 0
            field = "spec.nodeSelector.nodeSelectorTerms"
            add(None, field, f"must have exactly 1 term, has {count}")

    counter_sets: dict[str, set[str]] = {}
    for index, slc in enumerate(pool.slices):
        for i, cs in enumerate(slc.shared_counters):
            name = cs.get("name")
            if isinstance(name, str) and name in counter_sets:
                add(
                    index, f"spec.sharedCounters[{i}].name",
                    f"{name!r} is already used in the pool",
                )
            elif isinstance(name, str):
                counters = cs.get("counters")
                counter_sets[name] = set(counters) if isinstance(counters, Mapping) else set()

    device_names: dict[str, int] = {}
    for index, slc in enumerate(pool.slices):
        for field, message in _slice_problems(slc.devices, slc.shared_counters, counter_sets):
            add(index, field, message)
        for i, device in enumerate(slc.devices):
            name = device.get("name")
            if not isinstance(name, str):
                continue
            if name in device_names:
                add(
                    index, f"spec.devices[{i}].name",
                    f"{name!r} is already used by slice #{device_names[name]} of the pool",
                )
            else:
                device_names[name] = index
    return problems


def check_pool(driver: str, pool_name: str, pool: Pool) -> None:
    """Raise PoolValidationError listing every problem of ``pool``."""
    problems = validate_pool(driver, pool_name, pool)
    if problems:
        raise PoolValidationError(pool_name, problems)


def _slice_problems(
    devices: Sequence[Mapping[str, Any]],
    shared_counters: Sequence[Mapping[str, Any]],
    counter_sets: Mapping[str, set[str]],
) -> Iterator[tuple[str, str]]:
    if devices and shared_counters:
        yield "spec", "only one of sharedCounters or devices may be set in a slice"
    restricted = any(is_restricted(d) for d in devices)
    limit = MAX_DEVICES_RESTRICTED if restricted else MAX_DEVICES
    if len(devices) > limit:
        why = " (some devices use taints, counters or list attributes)" if restricted else ""
        yield "spec.devices", f"must have at most {limit} items{why}, has {len(devices)}"
    if len(shared_counters) > MAX_COUNTER_SETS:
        yield "spec.sharedCounters", (
            f"must have at most {MAX_COUNTER_SETS} items, has {len(shared_counters)}"
        )
    for i, cs in enumerate(shared_counters):
        yield from _counter_set_problems(f"spec.sharedCounters[{i}]", cs)
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = device.get("name")
        if isinstance(name, str):
            if name in seen:
                yield f"spec.devices[{i}].name", f"duplicate device name {name!r} in the slice"
            seen.add(name)
        yield from _device_problems(f"spec.devices[{i}]", device, counter_sets)


def is_restricted(device: Mapping[str, Any]) -> bool:
    """Whether the device has taints, counter consumption or a list-valued attribute."""
    if device.get("taints") or device.get("consumesCounters"):
        return True
    attrs = device.get("attributes")
    if not isinstance(attrs, Mapping):
        return False
    # Runs twice per device on every publish (chunking, validation): ``type() is dict``
    # spares the ABC isinstance for the common case, isdisjoint looks up the four keys in C.
    for value in attrs.values():
        if (type(value) is dict or isinstance(value, Mapping)) \
                and not _LIST_KIND_SET.isdisjoint(value.keys()):
            return True
    return False


def _counter_set_problems(path: str, cs: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    if problem := dns_label_problem(cs.get("name")):
        yield f"{path}.name", problem
    yield from _counters_problems(f"{path}.counters", cs.get("counters"))


def _counters_problems(path: str, counters: object) -> Iterator[tuple[str, str]]:
    if not isinstance(counters, Mapping) or not counters:
        yield path, "must have at least 1 counter"
        return
    if len(counters) > MAX_COUNTERS:
        yield path, f"must have at most {MAX_COUNTERS} counters, has {len(counters)}"
    for key, counter in counters.items():
        if problem := dns_label_problem(key):
            yield f"{path}[{key!r}]", problem
        value = counter.get("value") if isinstance(counter, Mapping) else None
        if not is_quantity(value):
            yield f"{path}[{key!r}].value", f"must be a quantity, is {value!r}"


def _device_problems(
    path: str, device: Mapping[str, Any], counter_sets: Mapping[str, set[str]]
) -> Iterator[tuple[str, str]]:
    if problem := dns_label_problem(device.get("name")):
        yield f"{path}.name", problem
    attrs = device.get("attributes") or {}
    caps = device.get("capacity") or {}
    if not isinstance(attrs, Mapping) or not isinstance(caps, Mapping):
        yield path, "attributes and capacity must be maps"
        return
    total = len(attrs) + len(caps)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        yield path, (
            f"attributes and capacity together must have at most "
            f"{MAX_ATTRIBUTES_AND_CAPACITIES} entries, have {total} "
            f"({len(attrs)} attributes, {len(caps)} capacities)"
        )
    values = 0
    for key, attr in attrs.items():
        # A plain string key with a valid scalar value is all but every attribute: counted
        # without building its path or a problem list.
        if type(key) is str and qualified_name_problem(key) is None and _plain_scalar(attr):
            values += 1
            continue
        apath = f"{path}.attributes[{key!r}]"
        if problem := qualified_name_problem(key):
            yield apath, problem
        count, attr_problems = _attribute_problems(attr)
        values += count
        for problem in attr_problems:
            yield apath, problem
    if values > MAX_ATTRIBUTE_VALUES:
        yield f"{path}.attributes", (
            f"must have at most {MAX_ATTRIBUTE_VALUES} values in total, has {values}"
        )
    for key, cap in caps.items():
        cpath = f"{path}.capacity[{key!r}]"
        if problem := qualified_name_problem(key):
            yield cpath, problem
        value = cap.get("value") if isinstance(cap, Mapping) else None
        if not is_quantity(value):
            yield f"{cpath}.value", f"must be a quantity such as 80Gi, is {value!r}"
    yield from _taint_problems(path, device.get("taints") or [])
    yield from _consumption_problems(path, device.get("consumesCounters") or [], counter_sets)
    for field in ("bindingConditions", "bindingFailureConditions"):
        conditions = device.get(field) or []
        if len(conditions) > MAX_BINDING_CONDITIONS:
            yield f"{path}.{field}", (
                f"must have at most {MAX_BINDING_CONDITIONS} items, has {len(conditions)}"
            )


def _plain_scalar(attr: object) -> bool:
    """Whether ``attr`` is a dict of one valid scalar int, bool or string: the shape nearly
    every attribute has, for which ``_attribute_problems`` would say (1, [])."""
    if type(attr) is not dict or len(attr) != 1:
        return False
    ((kind, value),) = attr.items()
    if kind == "string":
        return type(value) is str and len(value) <= MAX_STRING
    if kind == "int":
        return type(value) is int
    if kind == "bool":
        return type(value) is bool
    return False


def _attribute_problems(attr: object) -> tuple[int, list[str]]:
    """(number of values, problems) for one attribute's one-of value."""
    if not isinstance(attr, Mapping):
        return 0, ["must be a map with exactly one of int, bool, string, version"]
    kinds = [k for k in (*_SCALAR_KINDS, *_LIST_KINDS) if k in attr and attr[k] is not None]
    if len(kinds) != 1:
        shown = ", ".join(kinds) or "none"
        return 0, [f"must have exactly one of int, bool, string, version (has {shown})"]
    kind = kinds[0]
    raw = attr[kind]
    items = list(raw) if kind in _LIST_KINDS and isinstance(raw, (list, tuple)) else [raw]
    if kind in _LIST_KINDS and not items:
        return 0, [f"{kind} must not be empty"]
    problems: list[str] = []
    base = kind.rstrip("s") if kind in _LIST_KINDS else kind
    for item in items:
        if base == "int" and (isinstance(item, bool) or not isinstance(item, int)):
            problems.append(f"{kind}: {item!r} is not an integer")
        elif base == "bool" and not isinstance(item, bool):
            problems.append(f"{kind}: {item!r} is not a boolean")
        elif base in ("string", "version"):
            if not isinstance(item, str):
                problems.append(f"{kind}: {item!r} is not a string")
            elif len(item) > MAX_STRING:
                problems.append(
                    f"{kind}: must be at most {MAX_STRING} characters, is {len(item)}"
                    f" ({item[:20]!r}...)"
                )
            elif base == "version" and not _SEMVER.fullmatch(item):
                problems.append(f"{kind}: {item!r} is not a semantic version (e.g. 1.2.3)")
    return len(items), problems


def _taint_problems(path: str, taints: Sequence[Any]) -> Iterator[tuple[str, str]]:
    if len(taints) > MAX_TAINTS:
        yield f"{path}.taints", f"must have at most {MAX_TAINTS} items, has {len(taints)}"
    for i, taint in enumerate(taints):
        tpath = f"{path}.taints[{i}]"
        if not isinstance(taint, Mapping):
            yield tpath, "must be a map"
            continue
        key = taint.get("key")
        if not isinstance(key, str) or not key:
            yield f"{tpath}.key", "is required"
        elif problem := label_key_problem(key):
            yield f"{tpath}.key", problem
        value = taint.get("value", "")
        if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
            yield f"{tpath}.value", "must be a label value (at most 63 of [A-Za-z0-9-_.])"
        if taint.get("effect") not in _TAINT_EFFECTS:
            yield f"{tpath}.effect", f"must be one of {', '.join(_TAINT_EFFECTS)}"


def _consumption_problems(
    path: str, consumptions: Sequence[Any], counter_sets: Mapping[str, set[str]]
) -> Iterator[tuple[str, str]]:
    if len(consumptions) > MAX_CONSUMPTIONS:
        yield f"{path}.consumesCounters", (
            f"must have at most {MAX_CONSUMPTIONS} items, has {len(consumptions)}"
        )
    seen: set[str] = set()
    for i, consumption in enumerate(consumptions):
        cpath = f"{path}.consumesCounters[{i}]"
        if not isinstance(consumption, Mapping):
            yield cpath, "must be a map"
            continue
        name = consumption.get("counterSet")
        if not isinstance(name, str) or name not in counter_sets:
            yield f"{cpath}.counterSet", f"{name!r} is not a counter set of the pool"
        elif name in seen:
            yield f"{cpath}.counterSet", f"{name!r} is consumed twice"
        else:
            seen.add(name)
            counters = consumption.get("counters")
            unknown = sorted(set(counters or {}) - counter_sets[name])
            if unknown:
                yield f"{cpath}.counters", (
                    f"counter(s) {', '.join(unknown)} are not in counter set {name!r}"
                )
        yield from _counters_problems(f"{cpath}.counters", consumption.get("counters"))
