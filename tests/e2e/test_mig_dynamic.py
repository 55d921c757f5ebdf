"""--mig dynamic end to end: the real agent on simulated dgx-h100-mig publishes counter slices
and partitions, the scheduler stand-in (explain) allocates two 3g slices of one GPU and
refuses a third partition that would overlap them, the kubelet's prepare makes the MIG devices
and unprepare removes them, with the published slices unchanged throughout."""

from __future__ import annotations

import json
import time
from typing import Any

from agent.explain import explain
from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    NODE,
    Cluster,
    NodeDirs,
    allocated_devices,
    assert_answer,
    ref,
    wait_for,
    wait_registered,
)
from tests.fakes.kubelet import KubeletStandIn

MIG_CLASS = f"mig.{DRIVER}"


def mig_claim(cluster: Cluster, name: str, profile: str, count: int) -> dict[str, Any]:
    expr = (f"device.attributes['{DRIVER}'].profile == '{profile}' && "
            f"device.attributes['{DRIVER}'].parentMinor == 0")
    return cluster.server.put_object({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": MIG_CLASS, "count": count,
            "selectors": [{"cel": {"expression": expr}}]}}]}},
    })


def specs(cluster: Cluster) -> list[dict[str, Any]]:
    return sorted((s["spec"] for s in cluster.node_slices()),
                  key=lambda s: json.dumps(s, sort_keys=True))


def test_partitions_from_slices_to_mig_devices_and_back(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn,
) -> None:
    start_agent("--mig", "dynamic", profile="dgx-h100-mig")
    wait_registered(kubelet)

    def complete() -> list[dict[str, Any]] | None:
        got = specs(cluster)
        sets = [c for s in got for c in s.get("sharedCounters") or ()]
        count = got[0]["pool"]["resourceSliceCount"] if got else 0
        return got if len(got) == count and len(sets) == 6 else None

    published = wait_for("counter and partition slices", complete, timeout=30)
    devices = {d["name"]: d for s in published for d in s.get("devices") or ()}
    assert "gpu-0-mig-3g40gb-4" in devices and "gpu-4-mig-4g40gb-0" not in devices
    assert all(len(s.get("devices") or ()) <= 64 for s in published)

    claim = cluster.allocate(mig_claim(cluster, "two-3g", "3g.40gb", 2))
    assert sorted(allocated_devices(claim)) == ["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"]
    # A 4g on the same GPU would overlap both: the scheduler's counters refuse it.
    other = mig_claim(cluster, "one-4g", "4g.40gb", 1)
    refused = explain(other, cluster.classes, cluster.node_slices(), NODE, allocated=[claim])
    assert not refused.fits
    assert "(taken by gpu-0-mig-3g40gb-0, gpu-0-mig-3g40gb-4)" in json.dumps(refused.to_dict())

    uid = claim["metadata"]["uid"]
    result = kubelet.prepare(DRIVER, [ref(claim)])[uid]
    assert_answer(claim, result)
    spec = json.loads(next(dirs.cdi.glob(f"*{uid}*.json")).read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    wanted = {f"DRA_AGENT_DEVICE_GPU_0_MIG_3G40GB_{start}_UUID" for start in (0, 4)}
    uuids = [v for k, _, v in (e.partition("=") for e in env) if k in wanted]
    assert len(uuids) == 2 and all(u.startswith("MIG-") for u in uuids)
    record = json.loads(dirs.checkpoint.read_text())
    text = json.dumps(record)
    assert text.count("migPartition") == 2 and all(u in text for u in uuids)

    time.sleep(0.5)  # a MIG config change event may trigger a rescan: nothing may change
    assert specs(cluster) == published

    kubelet.unprepare(DRIVER, [ref(claim)])
    assert not list(dirs.cdi.glob(f"*{uid}*.json"))
    assert "migPartition" not in dirs.checkpoint.read_text()
    assert specs(cluster) == published


def test_after_kill_9_the_restarted_agent_keeps_its_partitions_and_the_slices(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn,
) -> None:
    agent = start_agent("--mig", "dynamic", profile="dgx-h100-mig")
    wait_registered(kubelet)
    agent.wait_http("/readyz")
    claim = cluster.allocate(mig_claim(cluster, "one-3g", "3g.40gb", 1))
    uid = claim["metadata"]["uid"]
    assert kubelet.prepare(DRIVER, [ref(claim)])[uid].ok
    published = specs(cluster)
    state = json.loads((dirs.plugin / "simulated-mig-instances.json").read_text())
    assert sum(m["ci"] >= 0 for g in state.values() for m in g["migs"]) == 4  # 3 foreign + ours

    agent.kill()  # kill -9: no cleanup
    since = len(kubelet.registrations)
    again = start_agent("--mig", "dynamic", profile="dgx-h100-mig", name="restarted")
    wait_registered(kubelet, since)
    again.wait_http("/readyz")
    logs = again.logs()
    assert "MIG partition created" not in logs  # found as it was, not made again
    assert "MIG partition destroyed" not in logs
    assert specs(cluster) == published  # still ours: the same partitions, no foreign device
    assert kubelet.prepare(DRIVER, [ref(claim)])[uid].ok  # the kubelet's repeat
    kubelet.unprepare(DRIVER, [ref(claim)])
    state = json.loads((dirs.plugin / "simulated-mig-instances.json").read_text())
    assert sum(m["ci"] >= 0 for g in state.values() for m in g["migs"]) == 3  # foreign only
