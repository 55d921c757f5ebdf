"""The running agent's /metrics joins a prepared GPU and NIC to their claim with the identity
the ResourceSlices published for them (simulated dgx-h100)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    NODE,
    PCIE_ROOT,
    Cluster,
    allocated_devices,
    ref,
    wait_registered,
)
from tests.e2e.test_flow import attribute
from tests.fakes.kubelet import KubeletStandIn


def info_series(text: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in text_string_to_metric_families(text)
            if f.name == "dra_agent_claim_device_info" for s in f.samples]


def test_metrics_name_the_claim_of_each_prepared_device_until_unprepared(
    cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn,
) -> None:
    agent = start_agent()
    wait_registered(kubelet)
    agent.wait_http("/readyz")
    claim = cluster.allocate(cluster.create_claim(
        "pair", [("gpu", GPU_CLASS), ("nic", NIC_CLASS)], match_attribute=PCIE_ROOT,
        namespace="ml"))
    gpu, nic = sorted(allocated_devices(claim), key=lambda d: not d.startswith("gpu-"))
    assert kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok

    status, text = agent.url("/metrics")
    assert status == 200
    base = {"namespace": "ml", "claim": "pair", "pool": NODE}
    bus = "resource.kubernetes.io/pciBusID"
    assert sorted(info_series(text), key=lambda s: s["device"]) == sorted([
        {**base, "device": gpu, "UUID": attribute(cluster, gpu, "uuid"),
         "pci_bus_id": attribute(cluster, gpu, bus), "ifname": ""},
        {**base, "device": nic, "UUID": "", "pci_bus_id": attribute(cluster, nic, bus),
         "ifname": attribute(cluster, nic, "ifName")},
    ], key=lambda s: s["device"])

    assert kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok
    assert info_series(agent.url("/metrics")[1]) == []
    assert agent.terminate() == 0
