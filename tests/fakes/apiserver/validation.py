"""Per-kind strategy: feature-gate drops, defaulting, and validation of metadata and specs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import FieldError
from .resources import ResourceType
from .validation_names import (
    dns_label_errors,
    dns_subdomain_errors,
    is_label_value,
    qualified_name_errors,
)
from .validation_slice import validate_slice_spec, validate_slice_update

Obj = dict[str, Any]

# 1.36 defaults (research §9): alpha gates off, beta gates on.
DEFAULT_FEATURE_GATES: dict[str, bool] = {
    "DRADeviceTaints": True,
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRADeviceBindingConditions": True,
    "DRAListTypeAttributes": False,
    "DRANodeAllocatableResources": False,
    # Not a DRA gate: watch-list (sendInitialEvents), beta and on by default since 1.34.
    "WatchList": True,
}
#: The gate's Device field: 1.36 named it nodeAllocatableResourceMappings, 1.37
#: nodeAllocatableResources.
NODE_ALLOCATABLE_FIELDS = ("nodeAllocatableResourceMappings", "nodeAllocatableResources")
MAX_RESERVED_FOR = 256
MAX_REQUESTS = 32
MAX_SELECTORS = 32
MAX_CONFIGS = 32


def _device_uses(spec: Obj | None, gate: str) -> bool:
    """Does a stored slice spec already use the fields behind `gate` (then they are kept)?"""
    if not spec:
        return False
    devices = spec.get("devices") or []
    if gate == "DRADeviceTaints":
        return any(d.get("taints") for d in devices)
    if gate == "DRAPartitionableDevices":
        return bool(
            spec.get("sharedCounters")
            or spec.get("perDeviceNodeSelection")
            or any(
                d.get("consumesCounters")
                or d.get("nodeName")
                or d.get("nodeSelector")
                or d.get("allNodes") is not None
                for d in devices
            )
        )
    if gate == "DRAConsumableCapacity":
        return any(
            d.get("allowMultipleAllocations") is not None
            or any((c or {}).get("requestPolicy") for c in (d.get("capacity") or {}).values())
            for d in devices
        )
    if gate == "DRADeviceBindingConditions":
        return any(
            d.get("bindsToNode") is not None
            or d.get("bindingConditions")
            or d.get("bindingFailureConditions")
            for d in devices
        )
    if gate == "DRAListTypeAttributes":
        return any(
            any(k in (a or {}) for k in ("ints", "bools", "strings", "versions"))
            for d in devices
            for a in (d.get("attributes") or {}).values()
        )
    if gate == "DRANodeAllocatableResources":
        return any(d.get(f) for d in devices for f in NODE_ALLOCATABLE_FIELDS)
    return False


def drop_disabled_slice_fields(spec: Obj, old: Obj | None, gates: Mapping[str, bool]) -> None:
    """Silently drop fields whose gate is off unless the old object used them (dropDisabled*)."""

    def off(gate: str) -> bool:
        return not gates.get(gate, DEFAULT_FEATURE_GATES[gate]) and not _device_uses(old, gate)

    devices = spec.get("devices") or []
    if off("DRAPartitionableDevices"):
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
    for dev in devices:
        if off("DRADeviceTaints"):
            dev.pop("taints", None)
        if off("DRAPartitionableDevices"):
            for f in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
                dev.pop(f, None)
        if off("DRAConsumableCapacity"):
            dev.pop("allowMultipleAllocations", None)
            for cap in (dev.get("capacity") or {}).values():
                (cap or {}).pop("requestPolicy", None)
        if off("DRADeviceBindingConditions"):
            for f in ("bindsToNode", "bindingConditions", "bindingFailureConditions"):
                dev.pop(f, None)
        if off("DRANodeAllocatableResources"):
            for f in NODE_ALLOCATABLE_FIELDS:
                dev.pop(f, None)
        if off("DRAListTypeAttributes"):
            for attr in (dev.get("attributes") or {}).values():
                for f in ("ints", "bools", "strings", "versions"):
                    (attr or {}).pop(f, None)


def default_slice(spec: Obj, now: str) -> None:
    for dev in spec.get("devices") or []:
        for taint in dev.get("taints") or []:
            taint.setdefault("timeAdded", now)


def _default_exact(req: Obj) -> None:
    req.setdefault("allocationMode", "ExactCount")
    if req["allocationMode"] == "ExactCount":
        req.setdefault("count", 1)
    for tol in req.get("tolerations") or []:
        tol.setdefault("operator", "Equal")


def drop_deallocated_devices(status: Obj, old_status: Obj) -> None:
    """Deallocating a claim also drops the device status its drivers wrote."""
    if old_status.get("allocation") and not status.get("allocation"):
        status.pop("devices", None)


def default_claim_spec(spec: Obj) -> None:
    """Defaults a claim spec gets on the way in (allocationMode, count, toleration operator)."""
    for req in ((spec.get("devices") or {}).get("requests")) or []:
        if isinstance(req.get("exactly"), dict):
            _default_exact(req["exactly"])
        for sub in req.get("firstAvailable") or []:
            _default_exact(sub)


def _name_errors(rtype: ResourceType, name: str, path: str) -> list[FieldError]:
    check = dns_label_errors if rtype.plural == "namespaces" else dns_subdomain_errors
    return [FieldError("Invalid", path, name, m) for m in check(name)]


def validate_metadata(rtype: ResourceType, meta: Obj, old: Obj | None) -> list[FieldError]:
    errs: list[FieldError] = []
    name = meta.get("name", "")
    if not name:
        errs.append(
            FieldError("Required", "metadata.name", None, "name or generateName is required")
        )
    else:
        errs += _name_errors(rtype, name, "metadata.name")
    if rtype.namespaced and not meta.get("namespace"):
        errs.append(FieldError("Required", "metadata.namespace"))
    for key, value in (meta.get("labels") or {}).items():
        errs += [
            FieldError("Invalid", "metadata.labels", key, m) for m in qualified_name_errors(key)
        ]
        if not isinstance(value, str) or not is_label_value(value):
            errs.append(
                FieldError(
                    "Invalid",
                    "metadata.labels",
                    value,
                    "a valid label must be an empty string or consist of "
                    "alphanumeric characters, '-', '_' or '.', and must start and "
                    "end with an alphanumeric character",
                )
            )
    for key in meta.get("annotations") or {}:
        errs += [
            FieldError("Invalid", "metadata.annotations", key, m)
            for m in qualified_name_errors(key.lower())
        ]
    for i, fin in enumerate(meta.get("finalizers") or []):
        errs += [
            FieldError("Invalid", f"metadata.finalizers[{i}]", fin, m)
            for m in qualified_name_errors(fin)
        ]
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        p = f"metadata.ownerReferences[{i}]"
        for f in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(f):
                errs.append(
                    FieldError("Invalid", f"{p}.{f}", ref.get(f, ""), f"{f} must not be empty")
                )
        if ref.get("controller") is True:
            controllers += 1
    if controllers > 1:
        errs.append(
            FieldError(
                "Invalid",
                "metadata.ownerReferences",
                meta.get("ownerReferences"),
                'Only one reference can have Controller set to true. Found "true" '
                f"in references for {controllers} owners",
            )
        )
    if old is not None:
        old_meta = old.get("metadata") or {}
        if meta.get("uid") != old_meta.get("uid"):
            errs.append(
                FieldError("Invalid", "metadata.uid", meta.get("uid"), "field is immutable")
            )
    return errs


def _claim_spec_errors(spec: Obj, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    requests = ((spec.get("devices") or {}).get("requests")) or []
    if len(requests) > MAX_REQUESTS:
        errs.append(
            FieldError(
                "TooMany",
                f"{path}.devices.requests",
                len(requests),
                f"must have at most {MAX_REQUESTS} items",
            )
        )
    seen: set[str] = set()
    for i, req in enumerate(requests):
        p = f"{path}.devices.requests[{i}]"
        name = req.get("name", "")
        if not name:
            errs.append(FieldError("Required", f"{p}.name"))
        else:
            errs += [FieldError("Invalid", f"{p}.name", name, m) for m in dns_label_errors(name)]
            if name in seen:
                errs.append(FieldError("Duplicate", f"{p}.name", name))
            seen.add(name)
        exact, first = req.get("exactly"), req.get("firstAvailable")
        if (exact is None) == (not first):
            errs.append(
                FieldError(
                    "Required", p, None, "exactly one of `exactly` or `firstAvailable` is required"
                )
            )
        subs = [(f"{p}.exactly", exact)] if exact is not None else []
        subs += [(f"{p}.firstAvailable[{j}]", s) for j, s in enumerate(first or [])]
        for sp, sub in subs:
            cls = sub.get("deviceClassName", "")
            if not cls:
                errs.append(FieldError("Required", f"{sp}.deviceClassName"))
            else:
                errs += [
                    FieldError("Invalid", f"{sp}.deviceClassName", cls, m)
                    for m in dns_subdomain_errors(cls)
                ]
            mode = sub.get("allocationMode")
            if mode not in ("ExactCount", "All"):
                errs.append(
                    FieldError(
                        "NotSupported",
                        f"{sp}.allocationMode",
                        mode,
                        'supported values: "All", "ExactCount"',
                    )
                )
            elif mode == "ExactCount" and sub.get("count", 0) <= 0:
                errs.append(
                    FieldError(
                        "Invalid", f"{sp}.count", sub.get("count"), "must be greater than zero"
                    )
                )
    return errs


def _allocated(status: Obj) -> set[tuple[str, str, str, str]]:
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    return {
        (r.get("driver", ""), r.get("pool", ""), r.get("device", ""), r.get("shareID", ""))
        for r in results
    }


def validate_claim_status(new: Obj, old: Obj | None) -> list[FieldError]:
    errs: list[FieldError] = []
    status = new.get("status") or {}
    old_status = (old or {}).get("status") or {}
    if (
        old_status.get("allocation")
        and status.get("allocation")
        and status["allocation"] != old_status["allocation"]
    ):
        errs.append(FieldError("Invalid", "status.allocation", None, "field is immutable"))
    reserved = status.get("reservedFor") or []
    if ((old or {}).get("metadata") or {}).get("deletionTimestamp"):
        before = {r.get("uid") for r in old_status.get("reservedFor") or []}
        if any(r.get("uid") not in before for r in reserved):
            errs.append(
                FieldError(
                    "Forbidden",
                    "status.reservedFor",
                    None,
                    "new entries may not be added while `deallocationRequested` or "
                    "`deletionTimestamp` are set",
                )
            )
    if reserved and not status.get("allocation"):
        errs.append(
            FieldError(
                "Forbidden",
                "status.reservedFor",
                None,
                "may not be specified when `allocated` is not set",
            )
        )
    if len(reserved) > MAX_RESERVED_FOR:
        errs.append(
            FieldError(
                "TooMany",
                "status.reservedFor",
                len(reserved),
                f"must have at most {MAX_RESERVED_FOR} items",
            )
        )
    uids: set[str] = set()
    for i, ref in enumerate(reserved):
        for f in ("resource", "name", "uid"):
            if not ref.get(f):
                errs.append(FieldError("Required", f"status.reservedFor[{i}].{f}"))
        if ref.get("uid") in uids:
            errs.append(FieldError("Duplicate", f"status.reservedFor[{i}]", ref))
        uids.add(ref.get("uid", ""))
    allocated = _allocated(status)
    for i, dev in enumerate(status.get("devices") or []):
        key = (
            dev.get("driver", ""),
            dev.get("pool", ""),
            dev.get("device", ""),
            dev.get("shareID", ""),
        )
        if key not in allocated:
            errs.append(
                FieldError(
                    "Invalid",
                    f"status.devices[{i}]",
                    dict(dev),
                    "must be an allocated device in the claim",
                )
            )
    return errs


def validate_object(
    rtype: ResourceType, new: Obj, old: Obj | None, subresource: str | None
) -> list[FieldError]:
    errs = validate_metadata(rtype, new.get("metadata") or {}, old)
    spec = new.get("spec") or {}
    old_spec = (old or {}).get("spec")
    if rtype.plural == "resourceslices":
        errs += validate_slice_spec(spec)
        if old is not None:
            errs += validate_slice_update(spec, old_spec or {})
    elif rtype.plural == "resourceclaims":
        if subresource == "status":
            errs += validate_claim_status(new, old)
        else:
            errs += _claim_spec_errors(spec, "spec")
            if old is not None and spec != (old_spec or {}):
                errs.append(FieldError("Invalid", "spec", None, "field is immutable"))
    elif rtype.plural == "resourceclaimtemplates":
        errs += _claim_spec_errors(spec.get("spec") or {}, "spec.spec")
    elif rtype.plural == "deviceclasses":
        selectors = spec.get("selectors") or []
        if len(selectors) > MAX_SELECTORS:
            errs.append(
                FieldError(
                    "TooMany",
                    "spec.selectors",
                    len(selectors),
                    f"must have at most {MAX_SELECTORS} items",
                )
            )
        for i, sel in enumerate(selectors):
            if not ((sel or {}).get("cel") or {}).get("expression"):
                errs.append(FieldError("Required", f"spec.selectors[{i}].cel.expression"))
        if len(spec.get("config") or []) > MAX_CONFIGS:
            errs.append(
                FieldError(
                    "TooMany",
                    "spec.config",
                    len(spec["config"]),
                    f"must have at most {MAX_CONFIGS} items",
                )
            )
    return errs
