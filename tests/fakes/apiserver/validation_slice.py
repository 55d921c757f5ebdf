"""ResourceSlice rules of the 1.36 validation code: the slice level (devices: validation_device)."""

from __future__ import annotations

from typing import Any

from .errors import FieldError
from .validation_device import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    MAX_POOL_NAME_LENGTH,
    NODE_FIELDS,
    validate_counters,
    validate_device,
    validate_driver_name,
)
from .validation_names import (
    dns_label_errors,
    dns_subdomain_errors,
)

Obj = dict[str, Any]


def _node_selection(spec: Obj) -> list[FieldError]:
    present = []
    if spec.get("nodeName"):
        present.append("nodeName")
    for f in NODE_FIELDS[1:]:
        if spec.get(f) is not None:
            present.append(f)
    need = (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
        "is required"
    )
    if not present:
        return [FieldError("Required", "spec", None, need)]
    if len(present) > 1:
        value = "{" + ", ".join(f"`{p}`" for p in present) + "}"
        return [FieldError("Invalid", "spec", value, need + ", but multiple fields are set")]
    errs: list[FieldError] = []
    if "nodeName" in present:
        errs += [
            FieldError("Invalid", "spec.nodeName", spec["nodeName"], m)
            for m in dns_subdomain_errors(spec["nodeName"])
        ]
    if "nodeSelector" in present:
        terms = (spec["nodeSelector"] or {}).get("nodeSelectorTerms") or []
        if len(terms) != 1:
            errs.append(
                FieldError(
                    "Invalid",
                    "spec.nodeSelector.nodeSelectorTerms",
                    terms,
                    "must have exactly one node selector term",
                )
            )
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in present and spec[flag] is not True:
            errs.append(FieldError("Invalid", f"spec.{flag}", spec[flag], "must be true"))
    return errs


def validate_slice_spec(spec: Obj) -> list[FieldError]:
    errs = validate_driver_name(spec.get("driver", ""), "spec.driver")
    pool = spec.get("pool") or {}
    pname = pool.get("name", "")
    if not pname:
        errs.append(FieldError("Required", "spec.pool.name"))
    else:
        if len(pname) > MAX_POOL_NAME_LENGTH:
            errs.append(
                FieldError(
                    "TooLong",
                    "spec.pool.name",
                    pname,
                    f"may not be more than {MAX_POOL_NAME_LENGTH} bytes",
                )
            )
        for part in pname.split("/"):
            errs += [
                FieldError("Invalid", "spec.pool.name", pname, m)
                for m in dns_subdomain_errors(part)
            ]
    if pool.get("generation", 0) < 0:
        errs.append(
            FieldError(
                "Invalid",
                "spec.pool.generation",
                pool["generation"],
                "must be greater than or equal to zero",
            )
        )
    if pool.get("resourceSliceCount", 0) <= 0:
        errs.append(
            FieldError(
                "Invalid",
                "spec.pool.resourceSliceCount",
                pool.get("resourceSliceCount", 0),
                "must be greater than zero",
            )
        )
    errs += _node_selection(spec)
    if "devices" in spec and "sharedCounters" in spec:
        errs.append(
            FieldError(
                "Forbidden", "spec", None, "only one of `sharedCounters` or `devices` is allowed"
            )
        )
    counter_sets = spec.get("sharedCounters") or []
    if len(counter_sets) > MAX_COUNTER_SETS:
        errs.append(
            FieldError(
                "TooMany",
                "spec.sharedCounters",
                len(counter_sets),
                f"must have at most {MAX_COUNTER_SETS} items",
            )
        )
    names: set[str] = set()
    for i, cs in enumerate(counter_sets):
        p = f"spec.sharedCounters[{i}]"
        name = cs.get("name", "")
        if not name:
            errs.append(FieldError("Required", f"{p}.name"))
        else:
            errs += [FieldError("Invalid", f"{p}.name", name, m) for m in dns_label_errors(name)]
            if name in names:
                errs.append(FieldError("Duplicate", f"{p}.name", name))
            names.add(name)
        errs += validate_counters(cs.get("counters"), f"{p}.counters")
    devices = spec.get("devices") or []
    heavy = any(
        d.get("taints")
        or d.get("consumesCounters")
        or any(
            any(k in (a or {}) for k in ("ints", "bools", "strings", "versions"))
            for a in (d.get("attributes") or {}).values()
        )
        for d in devices
    )
    limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if heavy else MAX_DEVICES
    if len(devices) > limit:
        # Upstream stops here: one TooMany, no per-device errors.
        errs.append(
            FieldError("TooMany", "spec.devices", len(devices), f"must have at most {limit} items")
        )
        return errs
    per_device = spec.get("perDeviceNodeSelection") is True
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        errs += validate_device(dev, f"spec.devices[{i}]", per_device)
        name = dev.get("name", "")
        if name and name in seen:
            errs.append(FieldError("Duplicate", f"spec.devices[{i}].name", name))
        seen.add(name)
    return errs


def validate_slice_update(new: Obj, old: Obj) -> list[FieldError]:
    errs: list[FieldError] = []
    for path in (("driver",), ("pool", "name"), ("nodeName",)):
        a: Any = old
        b: Any = new
        for part in path:
            a = (a or {}).get(part)
            b = (b or {}).get(part)
        if (a or "") != (b or ""):
            errs.append(FieldError("Invalid", "spec." + ".".join(path), b, "field is immutable"))
    return errs
