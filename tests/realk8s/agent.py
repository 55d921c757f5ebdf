"""What the real-cluster tests read from a running agent, and the scheduler's part: its own
allocator (hack/realk8s/tools/allocate) placing claims on what the API server holds."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tests.e2e.harness import DRIVER, AgentProcess, device_classes
from tests.realk8s.cluster import RESOURCE, RealCluster, bin_dir

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


class Serving(Protocol):
    """What ``wait_settled`` needs of an agent: an agent process, or one run in process."""

    def wait_http(self, path: str = "/readyz", timeout: float = 20.0) -> str: ...
    def logs(self) -> str: ...


def wait_settled(cluster: RealCluster, node: str, agent: Serving,
                 quiet: float = 2.0, timeout: float = 40.0) -> dict[str, str]:
    """Wait until the agent is ready and its slices stop changing for ``quiet`` seconds."""
    # Slices in sync: the kubelet that would confirm the registration may not be started yet.
    agent.wait_http("/readyz/slices", timeout=timeout)
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
               config: Sequence[Mapping[str, Any]] = (),
               constraints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": req, "exactly": {"deviceClassName": cls}} for req, cls in requests]}}
    if config:
        spec["devices"]["config"] = [dict(c) for c in config]
    if constraints:
        spec["devices"]["constraints"] = [dict(c) for c in constraints]
    return cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def scheduler_allocate(cluster: RealCluster, claims: Sequence[Mapping[str, Any]], node: str,
                       ) -> dict[str, Any]:
    """The scheduler's own allocator (``bin/<minor>/allocate``, k8s.io/dynamic-resource-
    allocation/structured with kube-scheduler's gates) on what the API server holds: the
    claims as stored (defaulted), every DeviceClass and ResourceSlice, and the devices other
    claims already hold. Returns claim UID -> AllocationResult; fails when they do not fit."""
    listed = cluster.admin.request("GET", f"{RESOURCE}/v1/resourceclaims")
    listed.raise_for_status()
    uids = {c["metadata"]["uid"] for c in claims}
    # A share also names its shareID and consumedCapacity, as the scheduler's claim tracker
    # keeps them: the device stays allocatable for more shares until its capacity is used.
    held = [{k: r[k] for k in ("driver", "pool", "device", "shareID", "consumedCapacity")
             if k in r}
            for c in listed.json()["items"] if c["metadata"]["uid"] not in uids
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {})
            .get("results") or []]
    classes = cluster.admin.request("GET", f"{RESOURCE}/v1/deviceclasses")
    classes.raise_for_status()
    doc = {"node": cluster.get(f"/api/v1/nodes/{node}"), "claims": list(claims),
           "deviceClasses": classes.json()["items"] or device_classes(),
           "resourceSlices": cluster.slices(), "allocatedDevices": held}
    out = subprocess.run([str(bin_dir(cluster.minor) / "allocate")], input=json.dumps(doc),
                         capture_output=True, text=True, timeout=60, check=False)
    answer = json.loads(out.stdout or "{}")
    saved = Path(tempfile.gettempdir()) / "allocate-input.json"
    if out.returncode != 0 or answer.get("unschedulable"):
        saved.write_text(json.dumps(doc))  # what the allocator saw, for whoever debugs this
    assert out.returncode == 0 and not answer.get("unschedulable"), (
        f"{out.stdout}{out.stderr} (input kept in {saved})")
    allocations: dict[str, Any] = answer["allocations"]
    return allocations


def allocate(cluster: RealCluster, claim: Mapping[str, Any], node: str,
             pod: Mapping[str, Any] | None = None,
             pods: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """What the scheduler does: allocate with its own allocator against what the API server
    holds, then write allocation and reservedFor through /status, as its PreBind does."""
    meta = claim["metadata"]
    path = (f"{RESOURCE}/v1/namespaces/{meta['namespace']}/resourceclaims/{meta['name']}"
            "/status")
    current = cluster.get(path)
    assert current is not None
    allocation = scheduler_allocate(cluster, [current], node)[meta["uid"]]
    reserved = {"resource": "pods", "name": f"{meta['name']}-pod", "uid": str(uuid.uuid4())}
    users = [*([pod] if pod is not None else []), *pods]
    reserved_for = [{"resource": "pods", "name": p["metadata"]["name"],
                     "uid": p["metadata"]["uid"]} for p in users] or [reserved]
    current["status"] = {"allocation": allocation, "reservedFor": reserved_for}
    resp = cluster.admin.request("PUT", path, body=current)
    resp.raise_for_status()
    allocated: dict[str, Any] = resp.json()
    return allocated
