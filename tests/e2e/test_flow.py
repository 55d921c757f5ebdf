"""The whole flow with the real agent process: slices published, claim allocated by the scheduler
stand-in, prepared by the kubelet stand-in, CDI spec accepted by a real CDI consumer, unprepared,
nothing left."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import grpc

from protos.dra.v1 import api_pb2, api_pb2_grpc
from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    NODE,
    PCIE_ROOT,
    Cluster,
    NodeDirs,
    allocated_devices,
    assert_answer,
    assert_nothing_left,
    assert_prepared,
    claims_command,
    ref,
    wait_for,
    wait_registered,
)
from tests.fakes.kubelet import ClaimRef, KubeletStandIn


def attribute(cluster: Cluster, device: str, name: str) -> str:
    for s in cluster.node_slices():
        for d in s["spec"]["devices"]:
            if d["name"] == device:
                return str(next(iter(d["attributes"][name].values())))
    raise AssertionError(f"{device} not published")


def test_gpu_and_nic_under_one_pcie_root_from_slices_to_nothing_left(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn,
    cdi_check_bin: Path,
) -> None:
    agent = start_agent()
    wait_registered(kubelet)
    agent.wait_http("/readyz")
    devices = cluster.published_devices()
    assert sum(d.startswith("gpu-") for d in devices) == 8
    assert sum(d.startswith("nic-") for d in devices) >= 8

    claim = cluster.create_claim("pair", [("gpu", GPU_CLASS), ("nic", NIC_CLASS)],
                                 match_attribute=PCIE_ROOT)
    claim = cluster.allocate(claim)
    picked = allocated_devices(claim)
    assert sorted(picked.values()) == ["gpu", "nic"]
    roots = {attribute(cluster, d, PCIE_ROOT) for d in picked}
    assert len(roots) == 1, roots

    result = kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
    assert_answer(claim, result)
    assert_prepared(dirs, claim)

    # A real CDI consumer accepts the spec and injects what the kubelet's answer names.
    valid = subprocess.run([str(cdi_check_bin), "validate", str(dirs.cdi)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert valid.returncode == 0, valid.stdout + valid.stderr
    ids = [i for d in result.devices for i in d.cdi_device_ids]
    injected = subprocess.run([str(cdi_check_bin), "inject", str(dirs.cdi), *ids],
                              capture_output=True, text=True, timeout=60, check=False)
    assert injected.returncode == 0, injected.stderr
    oci = json.loads(injected.stdout)
    env = oci["process"]["env"]
    assert f"DRA_AGENT_CLAIM_UID={claim['metadata']['uid']}" in env
    # Simulated hardware has no device nodes: each device says what it is in the environment,
    # and that must match what the slices published for it.
    for device, request in picked.items():
        key = "DRA_AGENT_DEVICE_" + re.sub(r"[^A-Z0-9]", "_", device.upper())
        assert f"{key}_REQUEST={request}" in env, env
        bus_id = attribute(cluster, device, "resource.kubernetes.io/pciBusID")
        assert f"{key}_PCI_ADDRESS={bus_id}" in env, env

    # What an operator sees.
    (listed,) = claims_command(dirs)
    assert listed["uid"] == claim["metadata"]["uid"] and listed["state"] == "PrepareCompleted"

    done = kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
    assert done.ok, done.error
    assert_nothing_left(dirs)
    assert claims_command(dirs) == []
    assert agent.terminate() == 0


def test_claim_shared_by_several_pods(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    start_agent().wait_http("/readyz")
    wait_registered(kubelet)
    claim = cluster.allocate(cluster.create_claim("shared"), pods=3)
    assert len(claim["status"]["reservedFor"]) == 3
    uid = claim["metadata"]["uid"]

    # The kubelet prepares once per pod; every answer is the same and so is the node's state.
    answers = [kubelet.prepare(DRIVER, [ref(claim)])[uid] for _ in range(3)]
    for answer in answers:
        assert_answer(claim, answer)
    assert answers[0] == answers[1] == answers[2]
    spec = dirs.spec_path(uid).read_bytes()
    assert_prepared(dirs, claim)

    # A second claim on the same node gets another device: the first stays taken.
    other = cluster.allocate(cluster.create_claim("other"))
    assert set(allocated_devices(other)).isdisjoint(allocated_devices(claim))
    assert_answer(other, kubelet.prepare(DRIVER, [ref(other)])[other["metadata"]["uid"]])
    assert_prepared(dirs, claim, other)
    assert dirs.spec_path(uid).read_bytes() == spec

    # Unprepare is idempotent: the kubelet may repeat it (restart, several pods).
    for _ in range(3):
        assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
    assert_prepared(dirs, other)
    assert kubelet.unprepare(DRIVER, [ref(other)])[other["metadata"]["uid"]].ok
    assert_nothing_left(dirs)


def call(endpoint: str, method: str, claim: ClaimRef) -> str:
    """One DRA call straight to an endpoint: the error of the claim ("" on success)."""
    with grpc.insecure_channel(f"unix://{endpoint}") as channel:
        stub = api_pb2_grpc.DRAPluginStub(channel)
        msg = api_pb2.Claim(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        if method == "prepare":
            prep = stub.NodePrepareResources(
                api_pb2.NodePrepareResourcesRequest(claims=[msg]), timeout=30)
            return str(prep.claims[claim.uid].error)
        unprep = stub.NodeUnprepareResources(
            api_pb2.NodeUnprepareResourcesRequest(claims=[msg]), timeout=30)
        return str(unprep.claims[claim.uid].error)


def test_rolling_update_two_agents_at_once(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    old = start_agent("--rolling-update", "--pod-uid", "pod-a", name="old")
    old_reg = wait_registered(kubelet)
    old.wait_http("/readyz")
    since = len(kubelet.registrations)
    new = start_agent("--rolling-update", "--pod-uid", "pod-b", name="new")
    new_reg = wait_registered(kubelet, since)
    new.wait_http("/readyz")
    assert old_reg.endpoint != new_reg.endpoint
    assert old_reg.socket_path != new_reg.socket_path

    # Either instance answers; both see one checkpoint, so the other can undo what one did.
    first = cluster.allocate(cluster.create_claim("first"))
    second = cluster.allocate(cluster.create_claim("second"))
    assert call(old_reg.endpoint, "prepare", ref(first)) == ""
    assert call(new_reg.endpoint, "prepare", ref(second)) == ""
    assert call(new_reg.endpoint, "prepare", ref(first)) == ""  # idempotent across instances
    assert_prepared(dirs, first, second)
    assert call(new_reg.endpoint, "unprepare", ref(first)) == ""
    assert_prepared(dirs, second)

    # The old one stops: the new one stays registered and serving, with its slices untouched.
    before = cluster.published_devices()
    assert old.terminate() == 0
    assert not old_reg.socket_path.exists()
    assert new_reg.socket_path.exists()
    kubelet.wait_deregistered(DRIVER, timeout=10)
    current = wait_for("new instance current", lambda: kubelet.registered(DRIVER))
    assert current.endpoint == new_reg.endpoint
    assert kubelet.unprepare(DRIVER, [ref(second)])[second["metadata"]["uid"]].ok
    assert_nothing_left(dirs)
    third = cluster.allocate(cluster.create_claim("third"))
    assert_answer(third, kubelet.prepare(DRIVER, [ref(third)])[third["metadata"]["uid"]])
    assert cluster.published_devices() == before
    assert new.url("/readyz")[0] == 200
    assert new.terminate() == 0
    assert all(s["spec"]["nodeName"] == NODE for s in cluster.node_slices())
