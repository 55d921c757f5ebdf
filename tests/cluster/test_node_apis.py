"""What the real kubelet tells others about the agent's devices: its PodResources API (List and
Get, the socket monitoring agents read) names each Pod's DRA devices and their CDI IDs."""

from __future__ import annotations

import json
from typing import Any

from tests.cluster.conftest import DRIVER, apply_example
from tests.cluster.node import Node
from tests.cluster.test_pods import allocated, claims_on_node, pod_claim


def podresources(node: Node, *args: str) -> Any:
    return json.loads(node.run("podresources", *args).stdout)


def test_pod_resources_list_and_get_report_the_dra_devices(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "one-gpu.yaml")
    agent.wait_running(ns, "one-gpu")
    claim = pod_claim(agent, ns, "one-gpu", "gpu")
    (gpu,) = allocated(claim)
    record = next(r for r in claims_on_node(agent) if r["uid"] == claim["metadata"]["uid"])
    cdi_ids = {i for d in record["devices"] for i in d["cdiDeviceIDs"]}

    got = podresources(agent, "get", ns, "one-gpu")["pod_resources"]
    listed = [p for p in podresources(agent, "list")["pod_resources"]
              if (p["namespace"], p["name"]) == (ns, "one-gpu")]
    for pod in (got, *listed):
        (container,) = pod["containers"]
        (dynamic,) = container["dynamic_resources"]
        assert (dynamic["claim_namespace"], dynamic["claim_name"]) == (
            ns, claim["metadata"]["name"])
        (resource,) = dynamic["claim_resources"]
        assert (resource["driver_name"], resource["pool_name"], resource["device_name"]) == (
            DRIVER, agent.name, gpu)
        assert {c["name"] for c in resource["cdi_devices"]} == cdi_ids
    assert len(listed) == 1
