"""Device plugins advertising the agent's devices: the kubelet's checkpoint and the Node."""

from __future__ import annotations

from typing import Any

from agent.doctor import conflicts
from agent.doctor.context import Options
from agent.doctor.model import Status
from tests.doctor.conftest import FakeHttp, Tree, assert_check, context

CKPT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def _ckpt(devices: dict[str, list[str]]) -> dict[str, Any]:
    return {"Data": {"PodDeviceEntries": None, "RegisteredDevices": devices}, "Checksum": 1}


def test_nvidia_device_plugin_conflicts(tree: Tree) -> None:
    tree.json(CKPT, _ckpt({"nvidia.com/gpu": ["GPU-1", "GPU-2"], "example.com/foo": ["a"]}))
    assert_check(conflicts.check_device_plugins(context(tree)), Status.FAIL,
                 "nvidia.com/gpu (2 device(s))", fix="--device-types")


def test_rdma_plugin_conflicts_only_when_nics_are_offered(tree: Tree) -> None:
    tree.json(CKPT, _ckpt({"rdma/hca_shared_devices_a": ["mlx5_0"]}))
    assert_check(conflicts.check_device_plugins(context(tree)), Status.FAIL,
                 "rdma/hca_shared_devices_a", fix="remove that device plugin")
    gpus_only = context(tree, options=Options(device_types=("gpu", "mig")))
    assert_check(conflicts.check_device_plugins(gpus_only), Status.OK,
                 "rdma/hca_shared_devices_a; none overlaps gpu,mig")


def test_other_plugins_and_no_checkpoint_are_fine(tree: Tree) -> None:
    assert_check(conflicts.check_device_plugins(context(tree)), Status.SKIPPED,
                 "no /var/lib/kubelet/device-plugins here")
    tree.dir("/var/lib/kubelet/device-plugins")
    assert_check(conflicts.check_device_plugins(context(tree)), Status.OK,
                 "no device plugin checkpoint")
    tree.json(CKPT, _ckpt({"smarter-devices/fuse": ["fuse"]}))
    assert_check(conflicts.check_device_plugins(context(tree)), Status.OK,
                 "smarter-devices/fuse")
    tree.json(CKPT, {"Data": {"PodDeviceEntries": None}})
    assert_check(conflicts.check_device_plugins(context(tree)), Status.OK, "resources: none")


def test_a_malformed_checkpoint_warns(tree: Tree) -> None:
    tree.write(CKPT, "{not json")
    assert_check(conflicts.check_device_plugins(context(tree)), Status.WARN, "not valid JSON",
                 fix="kubectl get pods")
    tree.json(CKPT, {"Data": {"RegisteredDevices": ["nvidia.com/gpu"]}})
    assert_check(conflicts.check_device_plugins(context(tree)), Status.WARN,
                 "RegisteredDevices is not an object", fix="kubectl get pods")


def _node(capacity: dict[str, str]) -> FakeHttp:
    return FakeHttp({("GET", "/api/v1/nodes/n1"): (200, {"status": {"capacity": capacity}})})


def test_node_capacity(tree: Tree) -> None:
    clash = context(tree, api=_node({"cpu": "8", "nvidia.com/gpu": "8", "amd.com/gpu": "0",
                                     "rdma/ib": "0k"}))
    assert_check(conflicts.check_capacity(clash), Status.FAIL, "nvidia.com/gpu=8",
                 fix="remove the device plugin")
    # A stopped device plugin leaves its resource at zero, in any spelling: no clash.
    assert "amd.com/gpu" not in conflicts.check_capacity(clash).found
    assert "rdma/ib" not in conflicts.check_capacity(clash).found
    clean = context(tree, api=_node({"cpu": "8", "memory": "1Gi"}))
    assert_check(conflicts.check_capacity(clean), Status.OK, "no extended resource")
    assert_check(conflicts.check_capacity(context(tree)), Status.SKIPPED, "--kubeconfig none")
