"""ResourceSlice rules of the 1.36 validation code: the slice level (devices: validation_device)."""

from __future__ import annotations

from typing import Any

from .errors import FieldError
from .validation_device import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    MAX_POOL_NAME_LENGTH,
    validate_counters,
    validate_device,
    validate_driver_name,
)
from .validation_names import (
    dns_label_errors,
    dns_subdomain_errors,
)

Obj = dict[str, Any]


_NEED_ONE = (
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
)


def _node_selection(spec: Obj) -> list[FieldError]:
    """validateResourceSliceSpec: a field set to its zero value (`""`, `false`) is an error of
    its own and does not count as set, so it also earns the "exactly one" Required."""
    errs: list[FieldError] = []
    present = []
    if spec.get("nodeName") is not None:
        if spec["nodeName"]:
            present.append("nodeName")
            errs += [
                FieldError("Invalid", "spec.nodeName", spec["nodeName"], m)
                for m in dns_subdomain_errors(spec["nodeName"])
            ]
        else:
            errs.append(
                FieldError(
                    "Invalid",
                    "spec.nodeName",
                    "",
                    "must be either unset or set to a non-empty string",
                )
            )
    if spec.get("nodeSelector") is not None:
        present.append("nodeSelector")
        terms = (spec["nodeSelector"] or {}).get("nodeSelectorTerms") or []
        if not terms:
            errs.append(
                FieldError(
                    "Required",
                    "spec.nodeSelector.nodeSelectorTerms",
                    None,
                    "must have at least one node selector term",
                )
            )
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
        if spec.get(flag) is None:
            continue
        if spec[flag] is True:
            present.append(flag)
        else:
            errs.append(
                FieldError(
                    "Invalid", f"spec.{flag}", spec[flag], "must be either unset or set to true"
                )
            )
    if not present:
        errs.append(FieldError("Required", "spec", None, _NEED_ONE))
    elif len(present) > 1:
        value = "{" + ", ".join(f"`{p}`" for p in present) + "}"
        errs.append(
            FieldError("Invalid", "spec", value, _NEED_ONE + ", but multiple fields are set")
        )
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
                "Invalid", "spec", "", "only one of `sharedCounters` or `devices` is allowed"
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
                errs.append(FieldError("Duplicate", p, name))  # validateSet: the item's path
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
    for i, dev in enumerate(devices):
        errs += validate_device(dev, f"spec.devices[{i}]", per_device)
    # validateSet reports duplicates after every item's own errors, at the item's path.
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        name = dev.get("name", "")
        if name in seen:
            errs.append(FieldError("Duplicate", f"spec.devices[{i}]", name))
        seen.add(name)
    return errs


def validate_slice_update(new: Obj, old: Obj) -> list[FieldError]:
    errs: list[FieldError] = []
    # Upstream's order: pool name, driver, node name.
    for path in (("pool", "name"), ("driver",), ("nodeName",)):
        a: Any = old
        b: Any = new
        for part in path:
            a = (a or {}).get(part)
            b = (b or {}).get(part)
        if (a or "") != (b or ""):
            errs.append(FieldError("Invalid", "spec." + ".".join(path), b, "field is immutable"))
    return errs
