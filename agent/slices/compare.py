"""Semantic equality of ResourceSlice specs, as the API server sees them.

What is written and what is read back differ in ways that mean nothing: quantities come back
canonical ("1024Mi" -> "1Gi"), empty lists and maps are omitted, the server fills in a taint's
``timeAdded`` (second precision). Comparing raw dicts would turn each of these into an update,
and the update into the same difference again: a write loop. Everything here compares the
meaning instead, the way the upstream controller's semantic DeepEqual does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.common.quantity import QuantityError, parse_quantity

#: A server-set timeAdded may differ from ours by the rounding to whole seconds.
TIME_ADDED_TOLERANCE_S = 1.0


def _prune(value: Any) -> Any:
    """Drop None, empty maps and empty lists from maps (Go's omitempty), recursively."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            pruned = _prune(item)
            if pruned is None or pruned in ({}, []):
                continue
            out[key] = pruned
        return out
    if isinstance(value, (list, tuple)):
        return [_prune(v) for v in value]
    return value


def _quantity(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except (QuantityError, TypeError):
        return value  # left as is; validation reports it


def _counters(counters: Any) -> Any:
    if not isinstance(counters, Mapping):
        return counters
    return {k: {**c, "value": _quantity(c.get("value"))} if isinstance(c, Mapping) else c
            for k, c in counters.items()}


def _request_policy(policy: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(policy)
    if "default" in out:
        out["default"] = _quantity(out["default"])
    if isinstance(out.get("validValues"), list):
        out["validValues"] = [_quantity(v) for v in out["validValues"]]
    if isinstance(out.get("validRange"), Mapping):
        out["validRange"] = {k: _quantity(v) for k, v in out["validRange"].items()}
    return out


def normalize_device(device: Mapping[str, Any]) -> dict[str, Any]:
    """A device in comparable form; taints lose ``timeAdded`` (compared separately)."""
    out: dict[str, Any] = _prune(device)
    caps = out.get("capacity")
    if isinstance(caps, Mapping):
        norm_caps = {}
        for key, cap in caps.items():
            if not isinstance(cap, Mapping):
                norm_caps[key] = cap
                continue
            norm = dict(cap)
            norm["value"] = _quantity(cap.get("value"))
            if isinstance(cap.get("requestPolicy"), Mapping):
                norm["requestPolicy"] = _request_policy(cap["requestPolicy"])
            norm_caps[key] = norm
        out["capacity"] = norm_caps
    if isinstance(out.get("consumesCounters"), list):
        out["consumesCounters"] = [
            {**c, "counters": _counters(c.get("counters"))} if isinstance(c, Mapping) else c
            for c in out["consumesCounters"]
        ]
    if isinstance(out.get("taints"), list):
        out["taints"] = [
            {k: v for k, v in t.items() if k != "timeAdded"} if isinstance(t, Mapping) else t
            for t in out["taints"]
        ]
    return out


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _taint_times_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Both taint lists' timeAdded agree where both are set (unset matches anything)."""
    for ta, tb in zip(a, b, strict=False):
        if not isinstance(ta, Mapping) or not isinstance(tb, Mapping):
            continue
        xa, xb = ta.get("timeAdded"), tb.get("timeAdded")
        if xa is None or xb is None:
            continue
        pa, pb = _parse_time(xa), _parse_time(xb)
        if pa is None or pb is None:
            if xa != xb:
                return False
        elif abs((pa - pb).total_seconds()) > TIME_ADDED_TOLERANCE_S:
            return False
    return True


def devices_equal(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    """Order-sensitive: the order of devices is the allocation preference."""
    if len(a) != len(b):
        return False
    if all(da == db for da, db in zip(a, b, strict=True)):
        return True  # the common case, at C speed
    for da, db in zip(a, b, strict=True):
        if normalize_device(da) != normalize_device(db):
            return False
        if not _taint_times_equal(da.get("taints") or [], db.get("taints") or []):
            return False
    return True


def counter_sets_equal(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]) -> bool:
    def norm(sets: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [{**_prune(s), "counters": _counters(s.get("counters"))} for s in sets]

    return norm(a) == norm(b)


def specs_equal(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether a stored slice spec already says what ``desired`` says.

    ``driver`` and ``nodeName`` are immutable and the watch selects on them, so they are not
    compared here; the planner treats a nodeName mismatch as "replace the slice".
    """
    if _prune(existing.get("pool")) != _prune(desired.get("pool")):
        return False
    if _prune(existing.get("nodeSelector")) != _prune(desired.get("nodeSelector")):
        return False
    if bool(existing.get("allNodes")) != bool(desired.get("allNodes")):
        return False
    if bool(existing.get("perDeviceNodeSelection")) != bool(desired.get("perDeviceNodeSelection")):
        return False
    if not devices_equal(existing.get("devices") or [], desired.get("devices") or []):
        return False
    return counter_sets_equal(existing.get("sharedCounters") or [],
                              desired.get("sharedCounters") or [])


def copy_taint_times(
    existing: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``desired`` devices with each unset taint ``timeAdded`` taken from the stored taint.

    Without this an update would let the server stamp a new time on every unchanged taint.
    """
    by_name = {d.get("name"): d for d in existing}
    out: list[dict[str, Any]] = []
    for device in desired:
        copied = dict(device)
        old = by_name.get(device.get("name"))
        taints = device.get("taints")
        if old is not None and isinstance(taints, list) and taints:
            old_taints = [t for t in old.get("taints") or [] if isinstance(t, Mapping)]
            new_taints = []
            for raw in taints:
                taint = dict(raw)
                if not taint.get("timeAdded"):
                    for prev in old_taints:
                        same = all(prev.get(k) == taint.get(k) for k in ("key", "value", "effect"))
                        if same and prev.get("timeAdded"):
                            taint["timeAdded"] = prev["timeAdded"]
                            break
                new_taints.append(taint)
            copied["taints"] = new_taints
        out.append(copied)
    return out


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    """Paths of spec fields that were sent but did not come back (a feature gate is off).

    Only absences count: values the server changed (canonical quantities, timeAdded) or
    added are not "dropped".
    """
    if sent == stored:
        return []
    paths: list[str] = []
    _collect_dropped("spec", sent, stored, paths)
    return paths


def _collect_dropped(path: str, sent: Any, stored: Any, out: list[str]) -> None:
    if isinstance(sent, Mapping):
        stored_map = stored if isinstance(stored, Mapping) else {}
        for key, value in sent.items():
            if value is None or value is False or value in ({}, []):
                continue
            if key not in stored_map:
                out.append(f"{path}.{key}")
            else:
                _collect_dropped(f"{path}.{key}", value, stored_map[key], out)
    elif isinstance(sent, (list, tuple)):
        stored_list = stored if isinstance(stored, (list, tuple)) else []
        if len(stored_list) < len(sent):
            out.append(f"{path}[{len(stored_list)}:]")
        for i, (a, b) in enumerate(zip(sent, stored_list, strict=False)):
            _collect_dropped(f"{path}[{i}]", a, b, out)


#: Where a dropped field points to a disabled feature gate (for the operator's message).
FEATURE_GATES = (
    ("taints", "DRADeviceTaints"),
    ("sharedCounters", "DRAPartitionableDevices"),
    ("consumesCounters", "DRAPartitionableDevices"),
    ("perDeviceNodeSelection", "DRAPartitionableDevices"),
    ("bindingConditions", "DRADeviceBindingConditions"),
    ("bindingFailureConditions", "DRADeviceBindingConditions"),
    ("bindsToNode", "DRADeviceBindingConditions"),
    ("allowMultipleAllocations", "DRAConsumableCapacity"),
    ("requestPolicy", "DRAConsumableCapacity"),
    ("ints", "DRAListTypeAttributes"),
    ("bools", "DRAListTypeAttributes"),
    ("strings", "DRAListTypeAttributes"),
    ("versions", "DRAListTypeAttributes"),
    ("nodeAllocatableResources", "DRANodeAllocatableResources"),  # 1.37's name
    ("nodeAllocatableResourceMappings", "DRANodeAllocatableResources"),  # 1.36's
)


def likely_gates(paths: Sequence[str]) -> list[str]:
    gates: list[str] = []
    for path in paths:
        for field, gate in FEATURE_GATES:
            if f".{field}" in path and gate not in gates:
                gates.append(gate)
    return gates

