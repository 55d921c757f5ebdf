"""Conversion between the stored form (resource.k8s.io/v1) and the served versions.

v1beta2 has the v1 shape. v1beta1 differs in two places that matter: a ResourceSlice device nests
everything but its name under `basic`, and a claim request carries the exact-request fields
inline instead of under `exactly`. Functions never mutate their input: stored objects and
logged events are shared between requests and watchers.
"""

from __future__ import annotations

import copy
from typing import Any

from .resources import RESOURCE_GROUP, STORAGE_VERSION, ResourceType

Obj = dict[str, Any]


def _devices_to_beta1(spec: Obj) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return
    out = []
    for dev in devices:
        if not isinstance(dev, dict):
            out.append(dev)
            continue
        basic = {k: v for k, v in dev.items() if k != "name"}
        nested: Obj = {"name": dev["name"]} if "name" in dev else {}
        nested["basic"] = basic
        out.append(nested)
    spec["devices"] = out


def _devices_from_beta1(spec: Obj) -> None:
    devices = spec.get("devices")
    if not isinstance(devices, list):
        return
    out = []
    for dev in devices:
        if not isinstance(dev, dict):
            out.append(dev)
            continue
        flat: Obj = {"name": dev["name"]} if "name" in dev else {}
        basic = dev.get("basic")
        if isinstance(basic, dict):
            flat.update(basic)
        out.append(flat)
    spec["devices"] = out


def _requests(claim_spec: Any) -> list[Any]:
    if not isinstance(claim_spec, dict):
        return []
    devices = claim_spec.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return []
    requests: list[Any] = devices["requests"]
    return requests


def _requests_to_beta1(claim_spec: Any) -> None:
    reqs = _requests(claim_spec)
    for i, req in enumerate(reqs):
        if isinstance(req, dict) and isinstance(req.get("exactly"), dict):
            flat = {k: v for k, v in req.items() if k != "exactly"}
            flat.update(req["exactly"])
            reqs[i] = flat


def _requests_from_beta1(claim_spec: Any) -> None:
    reqs = _requests(claim_spec)
    for i, req in enumerate(reqs):
        if not isinstance(req, dict) or "firstAvailable" in req:
            continue
        exact = {k: v for k, v in req.items() if k != "name"}
        reqs[i] = {"name": req["name"]} if "name" in req else {}
        if exact:
            reqs[i]["exactly"] = exact


def _claim_spec(rtype: ResourceType, obj: Obj) -> Any:
    if rtype.plural == "resourceclaims":
        return obj.get("spec")
    if rtype.plural == "resourceclaimtemplates":
        spec = obj.get("spec")
        return spec.get("spec") if isinstance(spec, dict) else None
    return None


def to_version(rtype: ResourceType, obj: Obj, version: str) -> Obj:
    """Stored (v1) object -> the shape of `version`."""
    out = copy.deepcopy(obj)
    if rtype.group != RESOURCE_GROUP:
        return out
    if "apiVersion" in out:
        out["apiVersion"] = rtype.api_version(version)
    if version == "v1beta1":
        if rtype.plural == "resourceslices" and isinstance(out.get("spec"), dict):
            _devices_to_beta1(out["spec"])
        _requests_to_beta1(_claim_spec(rtype, out))
    return out


def from_version(rtype: ResourceType, obj: Obj, version: str) -> Obj:
    """Object in the shape of `version` -> stored (v1) shape."""
    out = copy.deepcopy(obj)
    if rtype.group != RESOURCE_GROUP:
        return out
    if "apiVersion" in out:
        out["apiVersion"] = rtype.api_version(STORAGE_VERSION)
    if version == "v1beta1":
        if rtype.plural == "resourceslices" and isinstance(out.get("spec"), dict):
            _devices_from_beta1(out["spec"])
        _requests_from_beta1(_claim_spec(rtype, out))
    return out
