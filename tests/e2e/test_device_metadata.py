"""Device metadata files through the real agent process on a simulated DGX: kill -9, a reboot
that takes the CDI specs and the metadata file with it, and a start-up that writes both back,
from the checkpoint alone, before the kubelet asks again."""

from __future__ import annotations

import json

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    Cluster,
    NodeDirs,
    assert_answer,
    assert_nothing_left,
    assert_prepared,
    ref,
    wait_registered,
)
from tests.fakes.kubelet import KubeletStandIn


def test_kill_9_and_reboot_rebuild_the_lost_file_with_the_spec(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    dirs.set_boot_id("boot-before")
    agent = start_agent()
    wait_registered(kubelet)
    claim = cluster.allocate(cluster.create_claim("pair", [("gpu", GPU_CLASS),
                                                           ("nic", NIC_CLASS)]))
    uid = claim["metadata"]["uid"]
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert_prepared(dirs, claim)
    files = {r: dirs.plugin / "dra-device-metadata" / "default_pair" / r / "metadata.json"
             for r in ("gpu", "nic")}
    before = {r: f.read_bytes() for r, f in files.items()}
    gpu_doc = json.loads(before["gpu"])
    published = {d["name"]: d for s in cluster.node_slices() for d in s["spec"]["devices"]}
    (device,) = gpu_doc["requests"][0]["devices"]
    assert device["attributes"] == published[device["name"]]["attributes"]
    assert "resource.kubernetes.io/pciBusID" in device["attributes"]
    nic_device = json.loads(before["nic"])["requests"][0]["devices"][0]
    assert nic_device["networkData"]["hardwareAddress"] == (
        published[nic_device["name"]]["attributes"]["macAddress"]["string"])
    spec_before = dirs.spec_path(uid).read_text()

    agent.kill()  # the power goes: no clean stop
    for path in dirs.cdi.iterdir():
        path.unlink()
    files["gpu"].unlink()  # and this one was lost too
    dirs.set_boot_id("boot-after")
    since = len(kubelet.registrations)
    agent = start_agent(name="after-boot")
    wait_registered(kubelet, since)
    # The plugin lets calls in once recovered, and is ready after: both are back before any
    # prepare runs (the sockets answer earlier, tests/daemon/test_early_sockets.py).
    agent.wait_http("/readyz")
    assert {r: f.read_bytes() for r, f in files.items()} == before
    assert dirs.spec_path(uid).read_text() == spec_before
    assert dirs.records()[uid]["bootID"] == "boot-after"

    assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_nothing_left(dirs)
    assert agent.terminate() == 0
