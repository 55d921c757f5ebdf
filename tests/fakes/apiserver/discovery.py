"""API discovery answers: /api, /api/v1, /apis, /apis/resource.k8s.io[/<version>], /version."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from .resources import RESOURCE_GROUP, RESOURCE_VERSIONS, ResourceType

DISCOVERY_V1 = (
    Path(__file__).resolve().parents[2]
    / "data"
    / "k8s-openapi"
    / "discovery"
    / "apis__resource.k8s.io__v1.json"
)
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]

Obj = dict[str, Any]


@functools.cache
def _resource_v1_list() -> Obj:
    with DISCOVERY_V1.open(encoding="utf-8") as fh:
        data: Obj = json.load(fh)
    return data


def version_info() -> Obj:
    return {
        "major": "1",
        "minor": "36",
        "emulationMajor": "1",
        "emulationMinor": "36",
        "gitVersion": "v1.36.3-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(host: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
    }


def _entry(rt: ResourceType, sub: str | None = None) -> Obj:
    if sub:
        return {
            "name": f"{rt.plural}/{sub}",
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": ["get", "patch", "update"],
        }
    out: Obj = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(VERBS),
    }
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    return out


def resource_list(group: str, version: str, resources: dict[str, ResourceType]) -> Obj:
    if group == RESOURCE_GROUP and version == "v1":
        return copy.deepcopy(_resource_v1_list())
    entries: list[Obj] = []
    for rt in sorted(resources.values(), key=lambda r: r.plural):
        if rt.group != group or version not in rt.versions():
            continue
        entries.append(_entry(rt))
        if rt.status_subresource:
            entries.append(_entry(rt, "status"))
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}


def _group(served: tuple[str, ...]) -> Obj:
    ordered = [v for v in RESOURCE_VERSIONS if v in served]
    versions = [{"groupVersion": f"{RESOURCE_GROUP}/{v}", "version": v} for v in ordered]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": RESOURCE_GROUP,
        "versions": versions,
        "preferredVersion": versions[0] if versions else None,
    }


def api_group(served: tuple[str, ...]) -> Obj:
    return _group(served)


def api_group_list(served: tuple[str, ...]) -> Obj:
    groups = [_group(served)] if served else []
    for g in groups:
        g.pop("kind")
        g.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
