"""Shares through the real agent process on a simulated DGX H100 with ``--sharing
gpu=shares:4``: allocated by explain (the scheduler's allocator, consumable capacity on),
prepared, killed with -9 in the middle of a share's prepare, rebooted, unprepared one by one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    CDI_VENDOR,
    DRIVER,
    NODE,
    Cluster,
    NodeDirs,
    assert_nothing_left,
    ref,
    wait_registered,
)
from tests.fakes.kubelet import KubeletStandIn, PluginCallError
from tests.fakes.kubelet.types import PrepareResult

SHARED_CLASS = f"gpu-shared.{DRIVER}"
SHARING = ("--sharing", "gpu=shares:4")


def share_claim(cluster: Cluster, name: str, shares: int) -> dict[str, Any]:
    claim = cluster.server.put_object({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": SHARED_CLASS,
            "capacity": {"requests": {"shares": str(shares)}}}}]}},
    })
    return cluster.allocate(claim)


def the_share(claim: Mapping[str, Any]) -> dict[str, Any]:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def cdi_id(claim: Mapping[str, Any]) -> str:
    share = the_share(claim)
    return f"{CDI_VENDOR}/claim={claim['metadata']['uid']}-{share['device']}_{share['shareID']}"


def assert_share_answer(claim: Mapping[str, Any], result: PrepareResult) -> None:
    assert result.ok, result.error
    (device,) = result.devices
    share = the_share(claim)
    assert (device.pool_name, device.device_name, device.share_id) == (
        NODE, share["device"], share["shareID"])
    assert device.cdi_device_ids == (cdi_id(claim),)


def assert_shares_prepared(dirs: NodeDirs, *claims: Mapping[str, Any]) -> None:
    records = dirs.records()
    assert sorted(records) == sorted(c["metadata"]["uid"] for c in claims)
    for claim in claims:
        uid, share = claim["metadata"]["uid"], the_share(claim)
        (device,) = records[uid]["devices"]
        assert records[uid]["state"] == "PrepareCompleted"
        assert (device["device"], device["shareID"]) == (share["device"], share["shareID"])
        assert device["consumedCapacity"] == share["consumedCapacity"]
        spec = json.loads(dirs.spec_path(uid).read_text())
        assert [d["name"] for d in spec["devices"]] == [cdi_id(claim).split("=", 1)[1]]


def test_shares_of_one_gpu_survive_kill_9_and_a_reboot(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    dirs.set_boot_id("boot-before")
    agent = start_agent(*SHARING, env={"DRA_AGENT_FAILPOINTS": "prepare-after-spec-written=kill"},
                        name="doomed")
    wait_registered(kubelet)
    slices = cluster.wait_published()
    gpus = [d for s in slices for d in s["spec"]["devices"] if d["name"].startswith("gpu-")]
    assert gpus and all(d.get("allowMultipleAllocations") for d in gpus)

    # The allocator packs the three shares onto one GPU (2 + 1 + 1 of its 4).
    claims = [share_claim(cluster, name, n) for name, n in (("a", 2), ("b", 1), ("c", 1))]
    assert len({the_share(c)["device"] for c in claims}) == 1
    assert [the_share(c)["consumedCapacity"]["shares"] for c in claims] == ["2", "1", "1"]

    # The first share's prepare kills the agent after its spec is written.
    first = claims[0]
    try:
        kubelet.prepare(DRIVER, [ref(first)])
        raise AssertionError("the agent answered past its failpoint")
    except PluginCallError:
        pass
    assert agent.wait_exit() == -9
    since = len(kubelet.registrations)
    agent = start_agent(*SHARING, name="restarted")
    wait_registered(kubelet, since)
    for claim in claims:  # the kubelet retries the first and goes on with the others
        assert_share_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]])
    assert_shares_prepared(dirs, *claims)

    # A fourth share finds the GPU full on this node too if the scheduler was wrong.
    stale = cluster.server.put_object({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "stale", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": SHARED_CLASS}}]}},
        "status": {"allocation": {"devices": {"results": [{
            **the_share(claims[1]), "shareID": "11111111-2222-4333-8444-555555555555"}]}},
            "reservedFor": [{"resource": "pods", "name": "stale-pod",
                             "uid": "aaaaaaaa-0000-4000-8000-000000000001"}]},
    })
    refused = kubelet.prepare(DRIVER, [ref(stale)])[stale["metadata"]["uid"]]
    assert not refused.ok and "has 0 of 4 shares left (3 other claim(s) hold 4)" in refused.error

    # Power loss: the CDI dir (tmpfs) is empty at boot, the boot ID changes.
    agent.kill()
    for path in dirs.cdi.iterdir():
        path.unlink()
    dirs.set_boot_id("boot-after")
    since = len(kubelet.registrations)
    agent = start_agent(*SHARING, name="after-boot")
    wait_registered(kubelet, since)
    for claim in claims:
        assert_share_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]])
    assert_shares_prepared(dirs, *claims)

    # Unprepare one share at a time: the others keep their spec and record.
    for i, claim in enumerate(claims):
        assert kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].ok
        assert_shares_prepared(dirs, *claims[i + 1:])
    assert_nothing_left(dirs)
    assert agent.terminate() == 0
