"""--mig dynamic and --vfs dynamic against the real kube-apiserver and the scheduler's own
allocator: the server stores the counter slices and every consumesCounters as sent, and the
allocator (k8s.io/dynamic-resource-allocation/structured) and ``dra-agent explain`` agree on
what partitions fit (two 3g of one GPU, no 4g beside them) and which VFs-to-be they pick.

DRAPartitionableDevices is beta (on) from 1.36; the 1.35 server and allocator get the gate.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.e2e.harness import DRIVER
from tests.realk8s.agent import wait_settled
from tests.realk8s.cluster import RESOURCE, RealCluster, bin_dir
from tests.realk8s.conftest import StartAgent, StartCluster

# Versioned: DRAPartitionableDevices: on since 1.36, a gate of its own cluster on 1.35.
pytestmark = pytest.mark.versioned

GATE = "DRAPartitionableDevices=true"
MIG_CLASS = f"mig.{DRIVER}"


def mig_claim(cluster: RealCluster, name: str, profile: str, count: int) -> dict[str, Any]:
    expr = (f"device.attributes['{DRIVER}'].profile == '{profile}' && "
            f"device.attributes['{DRIVER}'].parentMinor == 0")
    return cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": MIG_CLASS, "count": count,
            "selectors": [{"cel": {"expression": expr}}]}}]}},
    })


def vfs_of_one_pf(cluster: RealCluster, name: str, count: int) -> dict[str, Any]:
    """A claim for ``count`` VFs of PF 0000:3b:00.1, created on ``cluster``."""
    return cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "vf", "exactly": {
            "deviceClassName": f"vf.{DRIVER}", "count": count,
            "selectors": [{"cel": {"expression":
                           f"device.attributes['{DRIVER}'].parentPF == '0000:3b:00.1'"}}]}}]}},
    })


def agent_on(minor: str, cluster: RealCluster, start_cluster: StartCluster,
             start_agent: StartAgent, node: str, profile: str, *args: str
             ) -> tuple[RealCluster, list[dict[str, Any]]]:
    """The agent on ``node`` with ``args``, against a server with partitionable devices on
    (1.35: a cluster of its own with the gate); that server and the node's settled slices."""
    real = cluster if minor >= "1.36" else start_cluster("--feature-gates", GATE)
    if real is not cluster:
        real.apply_deploy("base")
    real.ensure_node(node)
    agent = start_agent(real.agent_kubeconfig(node), node, *args, profile=profile)
    wait_settled(real, node, agent)
    assert "dropped" not in agent.logs() and "DRAPartitionableDevices" not in agent.logs()
    return real, real.slices(node)


def allocate(minor: str, doc: dict[str, Any]) -> dict[str, Any]:
    gates = [] if minor >= "1.36" else [f"-feature-gates={GATE}"]
    out = subprocess.run([str(bin_dir(minor) / "allocate"), *gates], input=json.dumps(doc),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def test_partition_slices_are_stored_and_allocator_and_explain_agree(
    minor: str, cluster: RealCluster, start_cluster: StartCluster, start_agent: StartAgent,
) -> None:
    from agent.explain import explain

    node = "node-mig"
    real, slices = agent_on(minor, cluster, start_cluster, start_agent, node, "dgx-h100-mig",
                            "--mig", "dynamic")
    sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters") or ()]
    assert sorted(sets) == sorted(f"gpu-{i}-mig" for i in range(6))
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}
    consumed = devices["gpu-0-mig-3g40gb-4"]["consumesCounters"]
    assert consumed[0]["counterSet"] == "gpu-0-mig"
    assert set(consumed[0]["counters"]) >= {f"memory-slice-{i}" for i in range(4, 8)}

    classes = real.admin.request("GET", f"{RESOURCE}/v1/deviceclasses").json()["items"]
    two = mig_claim(real, "two-3g", "3g.40gb", 2)
    answer = allocate(minor, {"node": node, "claims": [two], "deviceClasses": classes,
                              "resourceSlices": slices})
    assert answer.get("unschedulable") is not True, answer
    theirs = sorted(r["device"] for r in
                    answer["allocations"][two["metadata"]["uid"]]["devices"]["results"])
    assert theirs == ["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"]
    kwargs: dict[str, Any] = {"kubernetes_version": minor, "feature_gates": GATE}
    ours = explain(two, classes, slices, node, **kwargs)
    assert ours.fits and ours.allocation is not None
    assert sorted(r["device"] for r in ours.allocation["devices"]["results"]) == theirs

    # With both 3g held, a 4g on that GPU overlaps them: neither places it.
    held = [{"driver": DRIVER, "pool": node, "device": d} for d in theirs]
    four = mig_claim(real, "one-4g", "4g.40gb", 1)
    answer = allocate(minor, {"node": node, "claims": [four], "deviceClasses": classes,
                              "resourceSlices": slices, "allocatedDevices": held})
    assert answer.get("unschedulable") is True, answer
    allocated = dict(two, status={"allocation": ours.allocation})
    assert not explain(four, classes, slices, node, allocated=[allocated], **kwargs).fits


def test_candidate_vf_slices_are_stored_and_allocator_and_explain_agree(
    minor: str, cluster: RealCluster, start_cluster: StartCluster, start_agent: StartAgent,
) -> None:
    from agent.explain import explain

    node = "node-vfs"
    real, slices = agent_on(minor, cluster, start_cluster, start_agent, node, "sriov-novfs",
                            "--vfs", "dynamic")
    candidates = [d for s in slices for d in s["spec"].get("devices") or ()
                  if d.get("consumesCounters") and d["name"].startswith("vf-")]
    assert len(candidates) == 128  # and the two PFs, each consuming all of its set
    assert all(len(s["spec"].get("devices") or ()) <= 64 for s in slices)
    classes = real.admin.request("GET", f"{RESOURCE}/v1/deviceclasses").json()["items"]
    claim = vfs_of_one_pf(real, "three-vfs", 3)
    answer = allocate(minor, {"node": node, "claims": [claim], "deviceClasses": classes,
                              "resourceSlices": slices})
    theirs = sorted(r["device"] for r in
                    answer["allocations"][claim["metadata"]["uid"]]["devices"]["results"])
    ours = explain(claim, classes, slices, node, kubernetes_version=minor, feature_gates=GATE)
    assert ours.fits and ours.allocation is not None
    assert sorted(r["device"] for r in ours.allocation["devices"]["results"]) == theirs
    assert len(theirs) == 3


def test_vf_bandwidth_slices_are_stored_and_allocator_and_explain_agree(
    minor: str, cluster: RealCluster, start_cluster: StartCluster, start_agent: StartAgent,
) -> None:
    """--vf-bandwidth 25G on 100G links: the server stores the two-counter sets as sent, and
    both allocators hand out four VFs of a PF and refuse a fifth (the link is full)."""
    from agent.explain import explain

    node = "node-vf-bw"
    real, slices = agent_on(minor, cluster, start_cluster, start_agent, node, "sriov-novfs",
                            "--vfs", "dynamic", "--vf-bandwidth", "25G")
    sets = {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters")
            or ()}
    assert sets["nic-0000-3b-00-1-vfs"] == {"vfs": {"value": "64"},
                                            "bandwidth": {"value": "100G"}}
    classes = real.admin.request("GET", f"{RESOURCE}/v1/deviceclasses").json()["items"]
    kwargs: dict[str, Any] = {"kubernetes_version": minor, "feature_gates": GATE}

    four = vfs_of_one_pf(real, "four-vfs", 4)
    answer = allocate(minor, {"node": node, "claims": [four], "deviceClasses": classes,
                              "resourceSlices": slices})
    assert answer.get("unschedulable") is not True, answer
    theirs = sorted(r["device"] for r in
                    answer["allocations"][four["metadata"]["uid"]]["devices"]["results"])
    ours = explain(four, classes, slices, node, **kwargs)
    assert ours.fits and ours.allocation is not None
    assert sorted(r["device"] for r in ours.allocation["devices"]["results"]) == theirs

    five = vfs_of_one_pf(real, "five-vfs", 5)
    answer = allocate(minor, {"node": node, "claims": [five], "deviceClasses": classes,
                              "resourceSlices": slices})
    assert answer.get("unschedulable") is True, answer
    refused = explain(five, classes, slices, node, **kwargs)
    assert not refused.fits


def test_a_pf_and_its_vfs_are_never_allocated_together_by_either_allocator(
    minor: str, cluster: RealCluster, start_cluster: StartCluster, start_agent: StartAgent,
) -> None:
    """#28, finding 4: the PF consumes the whole of its counter set (every VF to be and its
    whole link), so with the PF allocated neither allocator places one of its VFs, and with
    a VF allocated neither places the PF; the other PF's VF still fits."""
    from agent.explain import explain

    node = "node-pf-vf"
    real, slices = agent_on(minor, cluster, start_cluster, start_agent, node, "sriov-novfs",
                            "--vfs", "dynamic", "--vf-bandwidth", "25G")
    classes = real.admin.request("GET", f"{RESOURCE}/v1/deviceclasses").json()["items"]
    kwargs: dict[str, Any] = {"kubernetes_version": minor, "feature_gates": GATE}
    pf = real.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "the-pf", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "pf", "exactly": {
            "deviceClassName": f"nic.{DRIVER}", "selectors": [{"cel": {"expression":
                "device.attributes['resource.kubernetes.io'].pciBusID == '0000:3b:00.1'"}}]}}]}},
    })
    vf = vfs_of_one_pf(real, "one-vf", 1)
    for first, second in ((pf, vf), (vf, pf)):
        answer = allocate(minor, {"node": node, "claims": [first], "deviceClasses": classes,
                                  "resourceSlices": slices})
        theirs = [r["device"] for r in
                  answer["allocations"][first["metadata"]["uid"]]["devices"]["results"]]
        ours = explain(first, classes, slices, node, **kwargs)
        assert ours.fits and ours.allocation is not None
        assert [r["device"] for r in ours.allocation["devices"]["results"]] == theirs
        held = [{"driver": DRIVER, "pool": node, "device": d} for d in theirs]
        answer = allocate(minor, {"node": node, "claims": [second], "deviceClasses": classes,
                                  "resourceSlices": slices, "allocatedDevices": held})
        assert answer.get("unschedulable") is True, (theirs, answer)
        allocated = dict(first, status={"allocation": ours.allocation})
        assert not explain(second, classes, slices, node, allocated=[allocated], **kwargs).fits
