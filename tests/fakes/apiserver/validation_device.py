"""Per-device rules of ResourceSlice validation, and the 1.36 limits (resource/v1 types.go)."""

from __future__ import annotations

from typing import Any

from .errors import FieldError
from .validation_names import (
    dns_label_errors,
    dns_subdomain_errors,
    is_c_identifier,
    is_label_value,
    is_semver,
    qualified_name_errors,
)

Obj = dict[str, Any]

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_ATTRIBUTES_AND_CAPACITY = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_ID_LENGTH = 32
MAX_STRING_LENGTH = 64
MAX_DRIVER_LENGTH = 63
MAX_POOL_NAME_LENGTH = 253
MAX_TAINTS = 16
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMED_COUNTER_SETS = 2
MAX_BINDING_CONDITIONS = 4
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")
NODE_FIELDS = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")


def validate_driver_name(value: str, path: str) -> list[FieldError]:
    if not value:
        return [FieldError("Required", path)]
    errs = []
    if len(value) > MAX_DRIVER_LENGTH:
        errs.append(
            FieldError("TooLong", path, value, f"may not be more than {MAX_DRIVER_LENGTH} bytes")
        )
    # The CSI driver-name rule: a DNS subdomain once lower-cased.
    errs += [FieldError("Invalid", path, value, m) for m in dns_subdomain_errors(value.lower())]
    return errs


C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', followed by a string "
    "of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex "
    "used for validation is '[A-Za-z_][A-Za-z0-9_]*')"
)


def _c_identifier(ident: str, path: str) -> list[FieldError]:
    errs = []
    if len(ident) > MAX_ID_LENGTH:
        errs.append(
            FieldError("TooLong", path, ident, f"may not be more than {MAX_ID_LENGTH} bytes")
        )
    if not is_c_identifier(ident):
        errs.append(FieldError("Invalid", path, ident, C_IDENTIFIER_MSG))
    return errs


def validate_qualified_name(key: str, path: str) -> list[FieldError]:
    """Attribute and capacity names: `<C identifier>` or `<domain>/<C identifier>`.

    As upstream, a name with more than one `/` passes (a known gap in validateQualifiedName)."""
    parts = key.split("/")
    if len(parts) == 1:
        return _c_identifier(key, path)
    if len(parts) != 2:
        return []
    domain, ident = parts
    errs: list[FieldError] = []
    if not domain:
        errs.append(FieldError("Invalid", path, "", "the domain must not be empty"))
    else:
        errs += validate_driver_name(domain, path)
    if not ident:
        errs.append(FieldError("Invalid", path, "", "the name must not be empty"))
    else:
        errs += _c_identifier(ident, path)
    return errs


ATTRIBUTE_FIELDS = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
_ONE_OF = ", ".join(f"`{f}`" for f in ATTRIBUTE_FIELDS)


def _one_value(attr: Obj, path: str) -> list[FieldError]:
    # The union check is declarative since 1.36, with its own wording (1.35 said "exactly one
    # value must be specified").
    set_fields = [k for k in ATTRIBUTE_FIELDS if k in attr]
    if not set_fields:
        return [FieldError("Invalid", path, "", f"must specify one of: {_ONE_OF}")]
    if len(set_fields) > 1:
        value = "{" + ", ".join(set_fields) + "}"
        return [FieldError("Invalid", path, value, f"must specify exactly one of: {_ONE_OF}")]
    errs: list[FieldError] = []
    field = set_fields[0]
    value = attr[field]
    values = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        errs.append(FieldError("Invalid", f"{path}.{field}", [], "must not be empty if specified"))
    for v in values:
        if field.startswith("string") and len(v) > MAX_STRING_LENGTH:
            errs.append(
                FieldError(
                    "TooLong",
                    f"{path}.{field}",
                    v,
                    f"may not be more than {MAX_STRING_LENGTH} bytes",
                )
            )
        if field.startswith("version"):
            if not is_semver(v):
                errs.append(
                    FieldError(
                        "Invalid",
                        f"{path}.{field}",
                        v,
                        "must be a string compatible with semver.org spec 2.0.0",
                    )
                )
            if len(v) > MAX_STRING_LENGTH:
                errs.append(
                    FieldError(
                        "TooLong",
                        f"{path}.{field}",
                        v,
                        f"may not be more than {MAX_STRING_LENGTH} bytes",
                    )
                )
    return errs


def validate_counters(counters: Any, path: str) -> list[FieldError]:
    counters = counters or {}
    errs: list[FieldError] = []
    if not counters:
        errs.append(FieldError("Required", path))
    if len(counters) > MAX_COUNTERS:
        errs.append(
            FieldError("TooMany", path, len(counters), f"must have at most {MAX_COUNTERS} items")
        )
    for key, counter in counters.items():
        errs += [FieldError("Invalid", f"{path}[{key}]", key, m) for m in dns_label_errors(key)]
        if "value" not in (counter or {}):
            errs.append(FieldError("Required", f"{path}[{key}].value"))
    return errs


def _taints(taints: list[Obj], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    if len(taints) > MAX_TAINTS:
        errs.append(
            FieldError("TooMany", path, len(taints), f"must have at most {MAX_TAINTS} items")
        )
    for i, taint in enumerate(taints):
        p = f"{path}[{i}]"
        key = taint.get("key", "")
        if not key:
            errs.append(FieldError("Required", f"{p}.key"))
        errs += (
            [FieldError("Invalid", f"{p}.key", key, m) for m in qualified_name_errors(key)]
            if key
            else []
        )
        if "value" in taint and not is_label_value(taint["value"]):
            errs.append(
                FieldError(
                    "Invalid",
                    f"{p}.value",
                    taint["value"],
                    "a valid label must be an empty string or consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an "
                    "alphanumeric character",
                )
            )
        effect = taint.get("effect", "")
        if not effect:
            errs.append(FieldError("Required", f"{p}.effect"))
        elif effect not in TAINT_EFFECTS:
            errs.append(
                FieldError(
                    "NotSupported",
                    f"{p}.effect",
                    effect,
                    "supported values: " + ", ".join(f'"{e}"' for e in TAINT_EFFECTS),
                )
            )
    return errs


def _entry_counts(attrs: Obj, caps: Obj, path: str) -> list[FieldError]:
    """The two per-device totals, both reported on the device itself as Invalid."""
    errs = []
    total = len(attrs) + len(caps)
    if total > MAX_ATTRIBUTES_AND_CAPACITY:
        errs.append(
            FieldError(
                "Invalid",
                path,
                total,
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITY}",
            )
        )
    # A scalar counts one; a list value counts its items (numEntriesDeviceAttribute).
    values = 0
    for attr in attrs.values():
        items = sum(len((attr or {}).get(k) or []) for k in ATTRIBUTE_FIELDS[4:])
        values += items or 1
    if values > MAX_ATTRIBUTE_VALUES:
        errs.append(
            FieldError(
                "Invalid",
                path,
                values,
                f"the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}",
            )
        )
    return errs


def validate_device(dev: Obj, path: str, per_device_nodes: bool) -> list[FieldError]:
    errs: list[FieldError] = []
    name = dev.get("name", "")
    if not name:
        errs.append(FieldError("Required", f"{path}.name"))
    else:
        errs += [FieldError("Invalid", f"{path}.name", name, m) for m in dns_label_errors(name)]
    attrs: Obj = dev.get("attributes") or {}
    caps: Obj = dev.get("capacity") or {}
    errs += _entry_counts(attrs, caps, path)
    # Key errors land on the map itself (validateMap passes the map's path to validateKey).
    for key, attr in attrs.items():
        errs += validate_qualified_name(key, f"{path}.attributes")
        errs += _one_value(attr or {}, f"{path}.attributes[{key}]")
    multi = dev.get("allowMultipleAllocations") is True
    for key, cap in caps.items():
        p = f"{path}.capacity[{key}]"
        errs += validate_qualified_name(key, f"{path}.capacity")
        if "value" not in (cap or {}):
            errs.append(FieldError("Required", f"{p}.value"))
        if (cap or {}).get("requestPolicy") is not None and not multi:
            errs.append(
                FieldError(
                    "Forbidden", f"{p}.requestPolicy", None, "allowMultipleAllocations must be true"
                )
            )
    errs += _taints(dev.get("taints") or [], f"{path}.taints")
    consumes = dev.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMED_COUNTER_SETS:
        errs.append(
            FieldError(
                "TooMany",
                f"{path}.consumesCounters",
                len(consumes),
                f"must have at most {MAX_CONSUMED_COUNTER_SETS} items",
            )
        )
    seen: set[str] = set()
    for i, use in enumerate(consumes):
        p = f"{path}.consumesCounters[{i}]"
        cs = use.get("counterSet", "")
        if not cs:
            errs.append(FieldError("Required", f"{p}.counterSet"))
        elif cs in seen:
            errs.append(FieldError("Duplicate", f"{p}.counterSet", cs))
        seen.add(cs)
        errs += validate_counters(use.get("counters"), f"{p}.counters")
    node_set = [f for f in NODE_FIELDS[:3] if dev.get(f) not in (None, "")]
    if per_device_nodes:
        if len(node_set) != 1:
            errs.append(
                FieldError(
                    "Invalid",
                    path,
                    None,
                    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is "
                    "required when `perDeviceNodeSelection` is set to true in the "
                    "ResourceSlice spec",
                )
            )
    else:
        for f in node_set:
            errs.append(
                FieldError(
                    "Forbidden",
                    f"{path}.{f}",
                    None,
                    "`perDeviceNodeSelection` must be set to true in the ResourceSlice spec",
                )
            )
    for cond in ("bindingConditions", "bindingFailureConditions"):
        items = dev.get(cond) or []
        if len(items) > MAX_BINDING_CONDITIONS:
            errs.append(
                FieldError(
                    "TooMany",
                    f"{path}.{cond}",
                    len(items),
                    f"must have at most {MAX_BINDING_CONDITIONS} items",
                )
            )
    if bool(dev.get("bindingConditions")) != bool(dev.get("bindingFailureConditions")):
        errs.append(
            FieldError(
                "Invalid",
                f"{path}.bindingConditions",
                None,
                "bindingConditions and bindingFailureConditions must be set together",
            )
        )
    return errs
