"""The resource.k8s.io/v1 fields explain reads, to reject unknown fields and wrong types.

A hand-kept table rather than the OpenAPI document, because the package must work without the
test data; tests/explain checks every entry against the Kubernetes 1.36 and 1.37 swagger. A
field 1.37 renamed is known by both names, so 1.36 files stay readable.
Specs: ``str``, ``int``, ``bool``, ``qty`` (string or number), ``any`` (not checked),
``T:<Type>`` (object), ``L:<spec>`` (list), ``M:<spec>`` (map with string keys).
"""

from __future__ import annotations

from typing import Any

from agent.explain.docs import Doc, Path_

SCHEMA: dict[str, dict[str, str]] = {
    "ResourceClaim": {
        "apiVersion": "str", "kind": "str", "metadata": "any",
        "spec": "T:ResourceClaimSpec", "status": "any",
    },
    "ResourceClaimTemplate": {
        "apiVersion": "str", "kind": "str", "metadata": "any",
        "spec": "T:ResourceClaimTemplateSpec",
    },
    "ResourceClaimTemplateSpec": {"metadata": "any", "spec": "T:ResourceClaimSpec"},
    "ResourceClaimSpec": {"devices": "T:DeviceClaim"},
    "DeviceClaim": {
        "requests": "L:T:DeviceRequest", "constraints": "L:T:DeviceConstraint",
        "config": "L:T:DeviceClaimConfiguration",
    },
    "DeviceRequest": {
        "name": "str", "exactly": "T:ExactDeviceRequest", "firstAvailable": "L:T:DeviceSubRequest",
    },
    "ExactDeviceRequest": {
        "deviceClassName": "str", "selectors": "L:T:DeviceSelector", "allocationMode": "str",
        "count": "int", "adminAccess": "bool", "tolerations": "L:T:DeviceToleration",
        "capacity": "T:CapacityRequirements",
    },
    "DeviceSubRequest": {
        "name": "str", "deviceClassName": "str", "selectors": "L:T:DeviceSelector",
        "allocationMode": "str", "count": "int", "tolerations": "L:T:DeviceToleration",
        "capacity": "T:CapacityRequirements",
    },
    "DeviceSelector": {"cel": "T:CELDeviceSelector"},
    "CELDeviceSelector": {"expression": "str"},
    "DeviceToleration": {
        "key": "str", "operator": "str", "value": "str", "effect": "str",
        "tolerationSeconds": "int",
    },
    "CapacityRequirements": {"requests": "M:qty"},
    "DeviceConstraint": {
        "requests": "L:str", "matchAttribute": "str", "distinctAttribute": "str",
    },
    "DeviceClaimConfiguration": {"requests": "L:str", "opaque": "T:OpaqueDeviceConfiguration"},
    "OpaqueDeviceConfiguration": {"driver": "str", "parameters": "any"},
    "DeviceClass": {
        "apiVersion": "str", "kind": "str", "metadata": "any", "spec": "T:DeviceClassSpec",
    },
    "DeviceClassSpec": {
        "selectors": "L:T:DeviceSelector", "config": "L:T:DeviceClassConfiguration",
        "extendedResourceName": "str",
    },
    "DeviceClassConfiguration": {"opaque": "T:OpaqueDeviceConfiguration"},
    "ResourceSlice": {
        "apiVersion": "str", "kind": "str", "metadata": "any", "spec": "T:ResourceSliceSpec",
    },
    "ResourceSliceSpec": {
        "driver": "str", "pool": "T:ResourcePool", "nodeName": "str", "nodeSelector": "any",
        "allNodes": "bool", "perDeviceNodeSelection": "bool", "devices": "L:T:Device",
        "sharedCounters": "L:T:CounterSet",
    },
    "ResourcePool": {"name": "str", "generation": "int", "resourceSliceCount": "int"},
    "Device": {
        "name": "str", "attributes": "M:T:DeviceAttribute", "capacity": "M:T:DeviceCapacity",
        "consumesCounters": "L:T:DeviceCounterConsumption", "nodeName": "str",
        "nodeSelector": "any", "allNodes": "bool", "taints": "L:T:DeviceTaint",
        "bindsToNode": "bool", "bindingConditions": "L:str", "bindingFailureConditions": "L:str",
        "allowMultipleAllocations": "bool", "nodeAllocatableResources": "any",
        "nodeAllocatableResourceMappings": "any",  # 1.36's name of nodeAllocatableResources
    },
    "DeviceAttribute": {
        "int": "int", "bool": "bool", "string": "str", "version": "str",
        "ints": "L:int", "bools": "L:bool", "strings": "L:str", "versions": "L:str",
    },
    "DeviceCapacity": {"value": "qty", "requestPolicy": "T:CapacityRequestPolicy"},
    "CapacityRequestPolicy": {
        "default": "qty", "validValues": "L:qty", "validRange": "T:CapacityRequestPolicyRange",
    },
    "CapacityRequestPolicyRange": {"min": "qty", "max": "qty", "step": "qty"},
    "CounterSet": {"name": "str", "counters": "M:T:Counter"},
    "Counter": {"value": "qty"},
    "DeviceCounterConsumption": {"counterSet": "str", "counters": "M:T:Counter"},
    "DeviceTaint": {"key": "str", "value": "str", "effect": "str", "timeAdded": "str"},
}  # fmt: skip

_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "qty": (str, int, float),
}


def check(doc: Doc, type_name: str, value: Any = None, path: Path_ = ()) -> None:
    """Raise InputError (with the line) at the first unknown field or wrongly typed value."""
    _check_spec(doc, f"T:{type_name}", doc.obj if value is None else value, path)


def _check_spec(doc: Doc, spec: str, value: Any, path: Path_) -> None:
    if spec == "any" or value is None:
        return
    kind, _, rest = spec.partition(":")
    if kind == "T":
        if not isinstance(value, dict):
            raise doc.error(path, f"expected an object ({rest}), got {_type(value)}")
        fields = SCHEMA[rest]
        if not fields.keys() >= value.keys():
            key = next(str(k) for k in value if k not in fields)
            known = ", ".join(sorted(fields))
            raise doc.error((*path, key), f"unknown field in {rest} (known: {known})")
        for key, item in value.items():
            sub = fields[key]
            allowed = _SCALARS.get(sub)
            # Leaves are most of a slice: check them here instead of one call each.
            if allowed is not None and item is not None and (
                    isinstance(item, allowed) and (bool in allowed or not isinstance(item, bool))):
                continue
            _check_spec(doc, sub, item, (*path, key))
    elif kind == "L":
        if not isinstance(value, list):
            raise doc.error(path, f"expected a list, got {_type(value)}")
        for i, item in enumerate(value):
            if not _flat_ok(rest, item):
                _check_spec(doc, rest, item, (*path, i))
    elif kind == "M":
        if not isinstance(value, dict):
            raise doc.error(path, f"expected a map, got {_type(value)}")
        for key, item in value.items():
            if not _flat_ok(rest, item):
                _check_spec(doc, rest, item, (*path, str(key)))
    else:
        allowed = _SCALARS[spec]
        bad_bool = isinstance(value, bool) and bool not in allowed
        if bad_bool or not isinstance(value, allowed):
            raise doc.error(path, f"expected {spec}, got {_type(value)} {value!r}")


def _flat_ok(spec: str, item: Any) -> bool:
    """Fast path for objects whose fields are all scalars (attributes, counters, taints): True
    when the item is certainly valid; False sends it through the full check (and its error)."""
    if not spec.startswith("T:") or not isinstance(item, dict):
        return False
    fields = SCHEMA[spec[2:]]
    if not fields.keys() >= item.keys():
        return False
    for key, v in item.items():
        allowed = _SCALARS.get(fields[key])
        if allowed is None or not isinstance(v, allowed) or (
                isinstance(v, bool) and bool not in allowed):
            return False
    return True


def _type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "bool", int: "int"}.get(
        type(value), type(value).__name__
    )
