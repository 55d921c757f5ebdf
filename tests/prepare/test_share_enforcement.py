"""Bounding shares of an NVIDIA GPU (opaque config ``sharing``): the time-slice interval set
through the GPU control seam, one interval per GPU, reset when the last share asking for one
goes; MPS client variables and the pipe directory mount per share; both refused where
nothing would bound them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.prepare.gpucontrol import GpuControlError, NvidiaSmi, RecordingGpuControl
from agent.prepare.mpscontrol import RecordingMpsControl
from discovery.model import Device, HostInfo
from discovery.sharing import parse_sharing, shareable
from tests.plugnode import DRIVER, NODE, Node, build_node, make_claim

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"


def _nvidia(device: Device, mode: str, memory: str | None = None) -> Device:
    host = replace(device.host, vendor="nvidia", uuid=UUID0)
    capacity = {"memory": memory} if memory else {}
    out, why = shareable(replace(device, host=host, capacity=capacity), parse_sharing(mode))
    assert out is not None, why
    return out


def _node(root: Path, mode: str = "gpu=shares:4", memory: str | None = None,
          **options: Any) -> Node:
    n = build_node(root, **options)
    n.gpu_control = RecordingGpuControl()
    n.mps_control = RecordingMpsControl()
    n.inventory[0] = _nvidia(n.inventory[0], mode, memory)
    n.restart()
    return n


@pytest.fixture
def node(short_root: Path) -> Iterator[Node]:
    n = _node(short_root, mps_pipe_dir=Path("/run/nvidia-mps"))
    yield n
    n.kubelet.stop()
    n.server.stop(0)


def config(**sharing: Any) -> list[dict[str, Any]]:
    return [{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig", "sharing": sharing}}}]


def share_claim(node: Node, name: str, index: int, consumed: dict[str, str],
                device: str = "gpu-0", **sharing: Any) -> dict[str, Any]:
    return node.book.put(make_claim(name, results=[{
        "request": "req", "driver": DRIVER, "pool": NODE, "device": device,
        "shareID": f"00000000-0000-4000-8000-{index:012d}", "consumedCapacity": consumed}],
        config=config(**sharing) if sharing else None))


def uid(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def env_of(node: Node, claim: dict[str, Any]) -> dict[str, str]:
    spec = json.loads((node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(claim)}.json").read_text())
    (device,) = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


def test_time_slice_is_set_kept_per_gpu_and_reset_after_the_last(node: Node) -> None:
    control = node.gpu_control
    a = share_claim(node, "a", 1, {"shares": "1"}, timeSlice="Long")
    b = share_claim(node, "b", 2, {"shares": "1"}, timeSlice="Long")
    c = share_claim(node, "c", 3, {"shares": "1"}, timeSlice="Short")
    assert node.prepare(a)[uid(a)].ok and node.prepare(b)[uid(b)].ok
    assert control.time_slices == {UUID0: "Long"}
    refused = node.prepare(c)[uid(c)]
    assert refused.error == (
        f"claim default/c ({uid(c)}): device {NODE}/gpu-0 runs with time slice Long for "
        "claim default/a; this claim asks for Short and a GPU has one interval; ask for Long "
        "or none")
    assert control.time_slices == {UUID0: "Long"}  # the refused claim changed nothing
    records = json.loads(node.checkpoint.read_text())["claims"]
    assert records[uid(a)]["devices"][0]["timeSlice"] == "Long"
    assert node.unprepare(a)[uid(a)].ok
    assert control.time_slices == {UUID0: "Long"}  # b still asks for it
    assert node.unprepare(b)[uid(b)].ok
    assert control.time_slices == {UUID0: "Default"}
    assert node.prepare(c)[uid(c)].ok and control.time_slices == {UUID0: "Short"}


def test_a_gpu_refusing_the_interval_fails_the_claim_and_leaves_nothing(node: Node) -> None:
    node.gpu_control.failures[UUID0] = "Insufficient Permissions"
    claim = share_claim(node, "a", 1, {"shares": "1"}, timeSlice="Medium")
    error = node.prepare(claim)[uid(claim)].error
    assert error.endswith("device gpu-0: setting time slice Medium failed: Insufficient "
                          "Permissions")
    assert json.loads(node.checkpoint.read_text())["claims"] == {}
    assert not (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(claim)}.json").exists()


def test_no_nvidia_smi_is_one_line(short_root: Path) -> None:
    n = build_node(short_root)
    try:
        n.inventory[0] = _nvidia(n.inventory[0], "gpu=shares:4")
        claim = share_claim(n, "a", 1, {"shares": "1"}, timeSlice="Long")
        assert n.prepare(claim)[uid(claim)].error.endswith(
            "device gpu-0: no nvidia-smi on this node to set the time slice with")
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_mps_bounds_a_share_to_its_fraction(node: Node) -> None:
    claim = share_claim(node, "a", 1, {"shares": "3"}, mps=True)
    assert node.prepare(claim)[uid(claim)].ok
    env = env_of(node, claim)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    spec = json.loads((node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(claim)}.json").read_text())
    mounts = spec["devices"][0]["containerEdits"]["mounts"]
    assert {"hostPath": "/run/nvidia-mps", "containerPath": "/run/nvidia-mps",
            "options": ["rbind", "rw"]} in mounts


def test_mps_bounds_memory_shares_in_mib(short_root: Path) -> None:
    n = _node(short_root, "gpu=memory:10Gi", memory="80Gi", mps_pipe_dir=Path("/run/mps"))
    try:
        claim = share_claim(n, "a", 1, {"memory": "20Gi"}, mps=True)
        assert n.prepare(claim)[uid(claim)].ok
        env = env_of(n, claim)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_mps_without_a_daemon_is_one_line(short_root: Path) -> None:
    n = _node(short_root)
    try:
        claim = share_claim(n, "a", 1, {"shares": "1"}, mps=True)
        assert n.prepare(claim)[uid(claim)].error.endswith(
            "opaque config sharing.mps: this node runs no MPS control daemon the agent knows "
            "of (--mps-pipe-dir)")
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_sharing_settings_where_nothing_would_bound_them(node: Node) -> None:
    whole = node.book.put(make_claim("whole", ["gpu-1"], config=config(timeSlice="Long")))
    error = node.prepare(whole)[uid(whole)].error
    assert "sharing: device gpu-1 is not allocated as a share" in error
    amd, _ = shareable(replace(node.inventory[2], host=HostInfo(vendor="amd")),
                       parse_sharing("gpu=shares:2"))
    assert amd is not None
    node.inventory[2] = amd
    claim = share_claim(node, "amd", 1, {"shares": "1"}, device="gpu-2", mps=True)
    assert "device gpu-2 (amd) is shared for scheduling only; timeSlice and mps are NVIDIA's" \
        in node.prepare(claim)[uid(claim)].error


@pytest.mark.parametrize(("sharing", "why"), [
    ({"timeSlice": "Forever"}, "sharing.timeSlice: 'Forever' is not one of Default, Short"),
    ({"mps": "yes"}, "sharing.mps: must be true or false, not 'yes'"),
    ({"quota": 1}, "sharing.quota: unknown field (known: timeSlice, mps)"),
])
def test_bad_sharing_config_is_one_line(node: Node, sharing: dict[str, Any], why: str) -> None:
    claim = share_claim(node, "bad", 1, {"shares": "1"}, **sharing)
    error = node.prepare(claim)[uid(claim)].error
    assert why in error and "\n" not in error


def test_nvidia_smi_is_called_as_compute_policy_wants() -> None:
    calls: list[list[str]] = []

    class Done:
        def __init__(self, rc: int, err: str = "") -> None:
            self.returncode, self.stdout, self.stderr = rc, "", err

    def run(args: list[str], **_: Any) -> Done:
        calls.append(args)
        return Done(0 if len(calls) == 1 else 3, "Unable to set\n  the timeslice")

    smi = NvidiaSmi(Path("/usr/bin/nvidia-smi"), run=run)  # type: ignore[arg-type]
    smi.set_time_slice(UUID0, "Long")
    assert calls == [["/usr/bin/nvidia-smi", "compute-policy", "-i", UUID0,
                      "--set-timeslice=3"]]
    with pytest.raises(GpuControlError, match="nvidia-smi exit 3: Unable to set the timeslice"):
        smi.set_time_slice(UUID0, "Default")
