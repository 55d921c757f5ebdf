"""Every kind of slice the agent can publish, checked by the real server's validation
(``dryRun=All`` create as an admin: nothing is stored, every rule runs).

Where a server drops a field because its feature gate is off (1.35: DRADeviceTaints and
DRAPartitionableDevices are alpha), the agent's own dropped-field check must see exactly that
and name the gate, which is how it adapts (it takes the stored form as in sync, warns once,
and never rewrites in a loop).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from agent.common.config import Config
from agent.inventory import run_discovery
from agent.slices import Owner
from agent.slices.compare import dropped_fields, likely_gates
from agent.slices.render import render_slices
from discovery.model import (
    Device,
    DeviceType,
    DriverResources,
    HostInfo,
    Inventory,
    Pool,
    Slice,
    Taint,
)
from discovery.pools import MAX_DEVICES, build_resources
from tests.e2e.harness import DRIVER
from tests.realk8s.cluster import RealCluster, status_text

# Versioned: each minor's slice validation and the fields its default gates drop.
pytestmark = pytest.mark.versioned

#: What each minor's default feature gates drop from a slice (kube_features.go of each).
DROPPED_BY_DEFAULT = {
    "1.37": set(),
    "1.35": {"DRADeviceTaints", "DRAPartitionableDevices"},
}


def check(cluster: RealCluster, node: str, objects: list[dict[str, Any]]) -> list[str]:
    """Create each slice with dryRun=All; every one must be accepted. Returns the gates the
    agent's check names for what the server dropped."""
    gates: list[str] = []
    uid = cluster.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]  # type: ignore[index]
    for obj in objects:
        for owner in obj["metadata"].get("ownerReferences", []):
            owner["uid"] = uid
        resp = cluster.create_response(obj, query={"dryRun": "All"})
        assert resp.status == 201, f"{status_text(resp)}\n{str(obj)[:2000]}"
        paths = dropped_fields(obj["spec"], resp.json()["spec"])
        named = likely_gates(paths)
        assert not paths or named, f"dropped without a known gate: {paths}"
        gates += [g for g in named if g not in gates]
    return gates


def simulated(profile: str, node: str, sharing: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    inventory = run_discovery(Config(simulate=profile, node_name=node,
                                     sharing=sharing))
    return render_slices(DRIVER, Owner(name=node), build_resources(inventory, node))


@pytest.mark.parametrize(("profile", "sharing"), [
    ("dgx-h100", ("gpu=shares:8", "nic=bandwidth:50G")),
    ("dgx-h100", ("gpu=memory:10Gi", "nic=shares:4")),
    ("sriov-nic", ("nic=bandwidth",)),
    ("amd-mi300x", ("gpu=memory:16Gi", "nic=shares:2")),
    ("amd-mi300x", ("gpu=shares:1024",)),
])
def test_every_sharing_mode_is_accepted_or_named(
    cluster: RealCluster, node: str, minor: str, profile: str, sharing: tuple[str, ...]
) -> None:
    """Shareable devices (KEP-5075): 1.37 keeps them whole; on 1.35 DRAConsumableCapacity is
    alpha and off, and the agent's dropped-field check names that gate and only it."""
    objects = simulated(profile, node, sharing)
    assert any(d.get("allowMultipleAllocations") for o in objects for d in o["spec"]["devices"])
    assert set(check(cluster, node, objects)) == (
        set() if minor == "1.37" else {"DRAConsumableCapacity"})


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-a100-mig", "sriov-nic", "amd-mi300x",
                                     "empty"])
def test_every_simulated_profile_is_accepted(
    cluster: RealCluster, node: str, profile: str
) -> None:
    objects = simulated(profile, node)
    assert objects
    assert check(cluster, node, objects) == []


def test_taints_with_every_effect_are_accepted(
    cluster: RealCluster, node: str, minor: str
) -> None:
    inventory = run_discovery(Config(simulate="dgx-h100", node_name=node))
    effects = ["NoSchedule", "NoExecute", "None"]
    devices = tuple(
        replace(d, taints=(Taint(f"{DRIVER}/xid", effects[i % 3], "79"),
                           Taint(f"{DRIVER}/ecc", effects[(i + 1) % 3])))
        for i, d in enumerate(inventory.devices))
    objects = render_slices(DRIVER, Owner(name=node),
                            build_resources(Inventory(devices=devices), node))
    gates = check(cluster, node, objects)
    assert set(gates) == DROPPED_BY_DEFAULT[minor] & {"DRADeviceTaints"}


def many_gpus(count: int) -> Inventory:
    return Inventory(devices=tuple(
        Device(f"gpu-{i}", DeviceType.GPU,
               {"type": "gpu", "index": i, "uuid": f"GPU-{i:08x}", "productName": "NVIDIA H100"},
               {"memory": "80Gi"}, HostInfo(pci_address=f"0000:{i // 256:02x}:{i % 256:02x}.0"))
        for i in range(count)))


def test_a_2048_device_pool_is_split_into_valid_slices(cluster: RealCluster, node: str) -> None:
    objects = render_slices(DRIVER, Owner(name=node), build_resources(many_gpus(2048), node))
    assert len(objects) == 2048 // MAX_DEVICES
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objects} == {len(objects)}
    assert check(cluster, node, objects) == []
    # One device more than a slice may hold is refused by the real server: the limit the
    # splitter keeps to is the server's.
    (one,) = render_slices(DRIVER, Owner(name=node), DriverResources(pools={node: Pool(
        slices=(Slice(devices=tuple(d.to_api() for d in many_gpus(MAX_DEVICES + 1).devices)),))}))
    uid = cluster.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]  # type: ignore[index]
    one["metadata"]["ownerReferences"][0]["uid"] = uid
    resp = cluster.create_response(one, query={"dryRun": "All"})
    assert resp.status == 422, status_text(resp)
    assert "spec.devices" in resp.json()["message"]


def test_shared_counters_are_accepted_or_named(
    cluster: RealCluster, node: str, minor: str
) -> None:
    """A partitionable GPU as the model can carry it (DRAPartitionableDevices): counters in
    the slice, devices consuming them."""
    counters = {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"},
                                                        "slices": {"value": "7"}}}
    devices = tuple(
        {"name": f"gpu-0-mig-{i}", "attributes": {"type": {"string": "mig"}},
         "capacity": {"memory": {"value": "10Gi"}},
         "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {
             "memory": {"value": "10Gi"}, "slices": {"value": "1"}}}]}
        for i in range(7))
    resources = DriverResources(pools={node: Pool(slices=(
        Slice(devices=devices, shared_counters=(counters,)),))})
    objects = render_slices(DRIVER, Owner(name=node), resources)
    gates = check(cluster, node, objects)
    assert set(gates) == DROPPED_BY_DEFAULT[minor] & {"DRAPartitionableDevices"}


def test_controller_adapts_to_what_the_server_drops(
    cluster: RealCluster, node: str, minor: str
) -> None:
    """The agent's controller itself, in process, publishing tainted devices: on a server that
    drops taints (1.35) it reports that once, naming the gate, and then writes nothing more;
    on 1.37 nothing is dropped. Either way the pool is complete and stays put."""
    from agent.common.metrics import Metrics
    from agent.slices import Timing, start
    from agent.slices.errors import DroppedFieldsError

    inventory = run_discovery(Config(simulate="dgx-h100", node_name=node))
    devices = tuple(replace(d, taints=(Taint(f"{DRIVER}/xid", "NoSchedule", "79"),))
                    if d.type == DeviceType.GPU else d for d in inventory.devices)
    errors: list[Exception] = []
    metrics = Metrics()
    controller = start(cluster.admin, DRIVER, Owner(name=node),
                       build_resources(Inventory(devices=devices), node), metrics=metrics,
                       on_error=errors.append,
                       timing=Timing(event_delay_s=0.05, backoff_initial_s=0.05,
                                     backoff_max_s=0.5, watch_timeout_s=30))
    try:
        assert controller.synced(20), errors
        assert sum(len(s["spec"]["devices"]) for s in cluster.slices(node)) == len(devices)

        def total() -> float:
            return sum(s.value for m in metrics.registry.collect()
                       if m.name == "dra_agent_resourceslice_writes" for s in m.samples
                       if s.name.endswith("_total") and s.labels["verb"] != "get")

        before = total()
        stored = {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                  for s in cluster.slices(node)}
        time.sleep(3)
        assert total() == before
        assert {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                for s in cluster.slices(node)} == stored
        dropped = [e for e in errors if isinstance(e, DroppedFieldsError)]
        tainted = any(d.get("taints") for s in cluster.slices(node) for d in s["spec"]["devices"])
        if "DRADeviceTaints" in DROPPED_BY_DEFAULT[minor]:
            assert dropped and all("DRADeviceTaints" in str(e) for e in dropped), errors
            assert not tainted
        else:
            assert dropped == [] and tainted
    finally:
        controller.stop()
