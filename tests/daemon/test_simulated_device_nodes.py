"""``dra-agent run --simulate dgx-h100 --simulate-device-nodes`` as a real process: prepare and
the start-up spec rebuild give simulated devices stand-in device nodes (1:3) in the plugin
directory, with the env entries they had without the flag; without CAP_MKNOD a prepare fails
for that claim in one line naming the node, and the agent carries on."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    AgentProcess,
    Cluster,
    NodeDirs,
    assert_answer,
    reap,
    ref,
    temporary_node_dirs,
    wait_registered,
)
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn

FLAG = "--simulate-device-nodes"
needs_mknod = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs CAP_MKNOD (root)")


@pytest.fixture
def node() -> Iterator[tuple[NodeDirs, Cluster, KubeletStandIn, list[AgentProcess]]]:
    from tests.e2e.harness import NODE

    started: list[AgentProcess] = []
    with temporary_node_dirs("s") as dirs, FakeAPIServer() as server:
        cluster = Cluster(server, dirs.root)
        with KubeletStandIn(dirs.registry, api_client=server.api_client(), node_name=NODE,
                            retry_initial=0.05) as kubelet:
            try:
                yield dirs, cluster, kubelet, started
            finally:
                reap(started)


def spec(dirs: NodeDirs, claim: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(dirs.spec_path(claim["metadata"]["uid"]).read_text())
    return doc


def devices_by_name(doc: dict[str, Any], claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Inventory device name -> the CDI device's edits (CDI names are ``<uid>-<device>``)."""
    prefix = claim["metadata"]["uid"] + "-"
    return {d["name"].removeprefix(prefix): d["containerEdits"] for d in doc["devices"]}


def stand_in(dirs: NodeDirs, path: str) -> dict[str, Any]:
    host = dirs.plugin / "simulated-dev" / path.removeprefix("/dev/")
    return {"path": path, "hostPath": str(host), "type": "c", "major": 1, "minor": 3,
            "permissions": "rw"}


def assert_null_node(path: Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), path
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3), path


@needs_mknod
def test_prepare_and_the_rebuilt_spec_carry_stand_in_nodes(
    node: tuple[NodeDirs, Cluster, KubeletStandIn, list[AgentProcess]],
) -> None:
    dirs, cluster, kubelet, started = node
    started.append(agent := AgentProcess(dirs, cluster.kubeconfig))
    wait_registered(kubelet)
    first = cluster.allocate(cluster.create_claim("before", [("gpu", GPU_CLASS),
                                                             ("nic", NIC_CLASS)]))
    assert_answer(first, kubelet.prepare(DRIVER, [ref(first)])[first["metadata"]["uid"]])
    without = devices_by_name(spec(dirs, first), first)
    assert all("deviceNodes" not in e for e in without.values())
    assert not (dirs.plugin / "simulated-dev").exists()
    assert agent.terminate() == 0

    # A reboot takes the spec; the agent, now with the flag, rebuilds it before it prepares
    # anything (the sockets answer earlier; /readyz passes after).
    dirs.spec_path(first["metadata"]["uid"]).unlink()
    dirs.set_boot_id("boot-2")
    since = len(kubelet.registrations)
    started.append(agent := AgentProcess(dirs, cluster.kubeconfig, FLAG, name="with-nodes"))
    wait_registered(kubelet, since)
    agent.wait_http("/readyz")
    rebuilt = spec(dirs, first)
    with_nodes = devices_by_name(rebuilt, first)
    assert sorted(with_nodes) == sorted(without)
    gpu, nic = sorted(with_nodes, key=lambda n: not n.startswith("gpu-"))
    assert with_nodes[gpu]["env"] == without[gpu]["env"]  # the env entries unchanged
    assert with_nodes[nic]["env"] == without[nic]["env"]
    minor = gpu.removeprefix("gpu-")
    assert with_nodes[gpu]["deviceNodes"] == [stand_in(dirs, f"/dev/nvidia{minor}")]
    (uverbs,) = with_nodes[nic]["deviceNodes"]
    assert uverbs["path"].startswith("/dev/infiniband/uverbs")
    assert uverbs == stand_in(dirs, uverbs["path"])
    assert rebuilt["containerEdits"]["deviceNodes"] == [
        stand_in(dirs, p) for p in ("/dev/nvidiactl", "/dev/nvidia-uvm",
                                    "/dev/nvidia-uvm-tools", "/dev/infiniband/rdma_cm")]
    for entry in (*with_nodes[gpu]["deviceNodes"], uverbs,
                  *rebuilt["containerEdits"]["deviceNodes"]):
        assert_null_node(Path(entry["hostPath"]))

    # A new claim: made at prepare (a wrong file in the way of one is replaced).
    second = cluster.allocate(cluster.create_claim("after"))
    (device,) = [r["device"] for r in second["status"]["allocation"]["devices"]["results"]]
    host = dirs.plugin / "simulated-dev" / f"nvidia{device.removeprefix('gpu-')}"
    host.write_text("in the way")
    assert_answer(second, kubelet.prepare(DRIVER, [ref(second)])[second["metadata"]["uid"]])
    (edits,) = devices_by_name(spec(dirs, second), second).values()
    assert edits["deviceNodes"] == [stand_in(dirs, f"/dev/nvidia{device.removeprefix('gpu-')}")]
    assert_null_node(host)
    assert "made a simulated device node" in agent.logs()
    assert "replaced a file in the way of a simulated device node" in agent.logs()
    assert agent.terminate() == 0


@needs_mknod
def test_without_cap_mknod_the_claim_fails_in_one_line(
    node: tuple[NodeDirs, Cluster, KubeletStandIn, list[AgentProcess]],
) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv to drop CAP_MKNOD with")
    dirs, cluster, kubelet, started = node
    started.append(agent := AgentProcess(dirs, cluster.kubeconfig, FLAG,
                                         wrap=("setpriv", "--bounding-set", "-mknod", "--")))
    wait_registered(kubelet)
    claim = cluster.allocate(cluster.create_claim("nocap"))
    result = kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
    print("prepare error:", result.error)
    assert not result.ok
    (device,) = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
    path = dirs.plugin / "simulated-dev"
    assert "\n" not in result.error
    assert f"cannot make the simulated device node {path}/" in result.error, result.error
    assert "Operation not permitted; the agent needs CAP_MKNOD" in result.error
    assert device in result.error
    assert dirs.cdi_files() == []  # nothing written for the claim
    assert "Traceback" not in agent.logs()
    # The agent carries on: an unprepare of the failed claim is fine.
    assert kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]].error == ""
    assert agent.alive()
