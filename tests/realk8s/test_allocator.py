"""The scheduler's own allocator (bin/<minor>/allocate) on the agent's real slices, and
``dra-agent explain`` beside it on the same input (the fit verdicts must agree)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.e2e.harness import DRIVER, GPU_CLASS, NIC_CLASS, PCIE_ROOT
from tests.realk8s.agent import make_claim, published, scheduler_allocate, wait_settled
from tests.realk8s.cluster import RESOURCE, RealCluster, bin_dir
from tests.realk8s.conftest import StartAgent


def stored(cluster: RealCluster, claim: dict[str, Any]) -> dict[str, Any]:
    meta = claim["metadata"]
    current = cluster.get(f"{RESOURCE}/v1/namespaces/{meta['namespace']}/resourceclaims/"
                          f"{meta['name']}")
    assert current is not None
    return current


def run_allocate(minor: str, doc: Any) -> tuple[int, dict[str, Any]]:
    out = subprocess.run([str(bin_dir(minor) / "allocate")], input=doc, capture_output=True,
                         text=True, timeout=60, check=False)
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout + out.stderr
    return out.returncode, json.loads(lines[0])


@pytest.mark.versioned  # the scheduler's allocator of the minor under test
def test_allocator_and_explain_agree_on_the_agents_slices(
    cluster: RealCluster, node: str, start_agent: StartAgent
) -> None:
    from agent.explain import explain

    agent = start_agent(cluster.agent_kubeconfig(node), node)
    wait_settled(cluster, node, agent)
    devices = published(cluster, node)
    classes = cluster.admin.request("GET", f"{RESOURCE}/v1/deviceclasses").json()["items"]

    pair = stored(cluster, make_claim(cluster, f"pair-{node}", [("gpu", GPU_CLASS),
                                                                 ("nic", NIC_CLASS)]))
    pair["spec"]["devices"]["constraints"] = [{"requests": ["gpu", "nic"],
                                               "matchAttribute": PCIE_ROOT}]
    allocation = scheduler_allocate(cluster, [pair], node)[pair["metadata"]["uid"]]
    results = allocation["devices"]["results"]
    assert {r["driver"] for r in results} == {DRIVER}
    roots = {devices[r["device"]]["attributes"][PCIE_ROOT]["string"] for r in results}
    assert len(roots) == 1, results
    ours = explain(pair, classes, cluster.slices(node), node)
    assert ours.fits

    # Nine GPUs on an eight-GPU node: neither places it.
    greedy = stored(cluster, make_claim(cluster, f"nine-{node}", [("gpu", GPU_CLASS)]))
    greedy["spec"]["devices"]["requests"][0]["exactly"]["count"] = 9
    doc = {"node": node, "claims": [greedy], "deviceClasses": classes,
           "resourceSlices": cluster.slices(node)}
    code, answer = run_allocate(cluster.minor, json.dumps(doc))
    assert code == 0 and answer["unschedulable"] is True, answer
    assert not explain(greedy, classes, cluster.slices(node), node).fits


def test_bad_input_is_one_line(minor: str) -> None:
    code, answer = run_allocate(minor, "{not json")
    assert code == 1 and answer["error"].startswith("input: "), answer
    code, answer = run_allocate(minor, json.dumps({"node": "n", "claims": [],
                                                   "unknownField": 1}))
    assert code == 1 and "unknown field" in answer["error"], answer
    code, answer = run_allocate(minor, json.dumps({"node": "", "claims": []}))
    assert code == 1 and answer["error"] == "input: empty node name", answer
