"""What the real-cluster tests read from a running agent and do as the scheduler."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tests.e2e.harness import DRIVER, AgentProcess, device_classes
from tests.realk8s.cluster import RESOURCE, RealCluster

_SAMPLE = re.compile(r'^dra_agent_resourceslice_writes_total\{([^}]*)\} ([0-9.e+]+)$', re.M)


def slice_writes(agent: AgentProcess) -> dict[str, float]:
    """``dra_agent_resourceslice_writes_total`` by verb (results added up)."""
    status, text = agent.url("/metrics")
    assert status == 200, text
    out: dict[str, float] = {}
    for labels, value in _SAMPLE.findall(text):
        verb = dict(re.findall(r'(\w+)="([^"]*)"', labels))["verb"]
        out[verb] = out.get(verb, 0.0) + float(value)
    return out


def revisions(cluster: RealCluster, node: str) -> dict[str, str]:
    """slice name -> resourceVersion of the node's slices of our driver."""
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
            for s in cluster.slices(node) if s["spec"]["driver"] == DRIVER}


def wait_settled(cluster: RealCluster, node: str, agent: AgentProcess,
                 quiet: float = 2.0, timeout: float = 40.0) -> dict[str, str]:
    """Wait until the agent is ready and its slices stop changing for ``quiet`` seconds."""
    agent.wait_http("/readyz", timeout=timeout)
    deadline = time.monotonic() + timeout
    last = revisions(cluster, node)
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = revisions(cluster, node)
        if now != last or not now:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"slices of {node} never settled: {last}\n{agent.logs()[-4000:]}")


def published(cluster: RealCluster, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in cluster.slices(node) if s["spec"]["driver"] == DRIVER
            for d in s["spec"]["devices"]}


def make_claim(cluster: RealCluster, name: str, requests: Sequence[tuple[str, str]],
               namespace: str = "default",
               config: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": req, "exactly": {"deviceClassName": cls}} for req, cls in requests]}}
    if config:
        spec["devices"]["config"] = [dict(c) for c in config]
    return cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def allocate(cluster: RealCluster, claim: Mapping[str, Any], node: str,
             pod: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the scheduler does: allocate with our allocator against what the node published
    (the scheduler only sees the API server), then write allocation and reservedFor through
    /status, as its PreBind does."""
    from agent.explain import explain

    slices = [s for s in cluster.slices(node) if s["spec"]["driver"] == DRIVER]
    listed = cluster.admin.request("GET", f"{RESOURCE}/v1/resourceclaims")
    listed.raise_for_status()
    others = [c for c in listed.json()["items"] if (c.get("status") or {}).get("allocation")
              and c["metadata"]["uid"] != claim["metadata"]["uid"]]
    result = explain(dict(claim), device_classes(), slices, node, allocated=others)
    assert result.fits and result.allocation, result.to_dict()
    meta = claim["metadata"]
    reserved = {"resource": "pods", "name": f"{meta['name']}-pod", "uid": str(uuid.uuid4())}
    if pod is not None:
        reserved = {"resource": "pods", "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"]}
    path = (f"{RESOURCE}/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
            "/status")
    current = cluster.get(path)
    assert current is not None
    current["status"] = {"allocation": result.allocation, "reservedFor": [reserved]}
    resp = cluster.admin.request("PUT", path, body=current)
    resp.raise_for_status()
    allocated: dict[str, Any] = resp.json()
    return allocated
