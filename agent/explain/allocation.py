"""The ``status.allocation`` the scheduler would write for a claim that fits: its device
results, the opaque configs they get (from the classes and the claim) and the node
selector that ties the claim to this node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.explain.allocator import Search
from agent.explain.model import DeviceClass
from agent.explain.values import format_quantity


def allocation_of(search: Search, classes: Mapping[str, DeviceClass]) -> dict[str, Any]:
    """The allocation of the solution ``search`` found."""
    results = []
    for r in search.results:
        d = r.entry.device
        item: dict[str, Any] = {"request": r.req.name, "driver": d.driver, "pool": d.pool,
                                "device": d.name}
        if r.req.admin_access:
            item["adminAccess"] = True
        if r.req.tolerations_raw:
            item["tolerations"] = [dict(t) for t in r.req.tolerations_raw]
        if d.binding_conditions:
            item["bindingConditions"] = list(d.binding_conditions)
            item["bindingFailureConditions"] = list(d.binding_failure_conditions)
        if r.share_id:
            item["shareID"] = r.share_id
        if r.consumed:
            item["consumedCapacity"] = {k: format_quantity(v) for k, v in r.consumed.items()}
        results.append(item)
    out: dict[str, Any] = {"devices": {"results": results}}
    config = _config(search, classes)
    if config:
        out["devices"]["config"] = config
    selector = _node_selector(search)
    if selector is not None:
        out["nodeSelector"] = selector
    return out


def _config(search: Search, classes: Mapping[str, DeviceClass]) -> list[dict[str, Any]]:
    claim = search.claim
    chosen = [creq.alternatives[search.selected.get(ri, 0)]
              for ri, creq in enumerate(claim.requests)]
    config: list[dict[str, Any]] = []
    by_class: dict[str, list[dict[str, Any]]] = {}
    for req in chosen:
        if req.device_class in by_class:
            for entry in by_class[req.device_class]:
                entry["requests"].append(req.name)
            continue
        entries = [{"source": "FromClass", "requests": [req.name], "opaque": dict(o)}
                   for o in classes[req.device_class].config]
        by_class[req.device_class] = entries
        config.extend(entries)
    release = search.release
    for refs, opaque in claim.config:
        # once, or (1.35) once per chosen request or subrequest it names
        times = 1 if not refs else sum(req.base in refs or req.name in refs for req in chosen)
        if refs and release.claim_config_once:
            times = min(times, 1)
        config.extend({"source": "FromClaim", "requests": list(refs), "opaque": dict(opaque)}
                      for _ in range(times))
    if not release.clears_config_for_all:
        # 1.35 keeps the names a config gave; none given stays none (omitempty on the wire).
        for entry in config:
            if not entry["requests"]:
                entry.pop("requests")
        return config
    for entry in config:
        refs = entry["requests"]
        if not refs or all(req.base in refs or req.name in refs for req in chosen):
            entry.pop("requests")  # empty means "all requests"
    return config


def _node_selector(search: Search) -> dict[str, Any] | None:
    term: dict[str, list[Any]] = {"matchFields": [], "matchExpressions": []}
    for r in search.results:
        e = r.entry
        name = e.device.node_name if e.per_device else e.slice_node_name
        selector = e.device.node_selector if e.per_device else e.slice_node_selector
        if name or e.device.binds_to_node:
            return {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [search.node.name]}]}]}
        for t in (selector or {}).get("nodeSelectorTerms", [])[:1]:
            for kind in ("matchFields", "matchExpressions"):
                for req in t.get(kind) or []:
                    if req not in term[kind]:
                        term[kind].append(req)
    clean = {k: v for k, v in term.items() if v}
    return {"nodeSelectorTerms": [clean]} if clean else None
