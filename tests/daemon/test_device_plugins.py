"""A device plugin serving what our DeviceClasses map to extended resources (KEP-5004): the
agent refuses to start there, with one line naming the resource and where it was seen, unless
told the overlap is meant; everything the check reads that is broken is one log line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agent import deviceplugins as dp
from agent.explain.docs import packaged_classes
from agent.explain.probe import selects_a_device
from agent.slices import Owner
from agent.slices.render import render_slices
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import simulated_sources
from tests.daemon.test_run import NODE, Agent, workdir
from tests.fakes.apiserver import FakeAPIServer

__all__ = ["workdir"]


def _shipped() -> list[dict[str, Any]]:
    return [doc.obj for doc in packaged_classes()]


def _checkpoint(kubelet_dir: Path, registered: Any) -> Path:
    path = kubelet_dir / dp.CHECKPOINT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": None,
                                         "RegisteredDevices": registered}, "Checksum": 1}))
    return path


def _slices(tmp_path: Path, types: tuple[str, ...] = ("gpu", "mig", "nic", "vf")) -> list[Any]:
    inventory = discover(simulated_sources("dgx-h100", tmp_path / "sim"),
                         DiscoveryOptions(device_types=types))
    return render_slices("dra-agent.io", Owner(name=NODE), build_resources(inventory, NODE))


def test_the_shipped_classes_name_one_extended_resource_each() -> None:
    assert dp.mapped_classes(_shipped()) == {
        f"dra-agent.io/{t}": [f"{t}.dra-agent.io"] for t in ("gpu", "mig", "nic", "vf")}


@pytest.mark.parametrize(("name", "extended"), [
    ("nvidia.com/gpu", True), ("example/foo", True), ("cpu", False), ("memory", False),
    ("hugepages-2Mi", False), ("kubernetes.io/foo", False), ("node.kubernetes.io/x", False),
    ("requests.nvidia.com/gpu", False),
])
def test_extended_resource_names_as_apimachinery_reads_them(name: str, extended: bool) -> None:
    assert dp.is_extended_resource(name) is extended


def test_capacity_counts_only_non_zero_extended_resources() -> None:
    node = {"metadata": {"name": "n1"}, "status": {"capacity": {
        "cpu": "96", "nvidia.com/gpu": "8", "amd.com/gpu": "0", "rdma/hca": "1k",
        "example.com/broken": "lots", "memory": "1Ti"}}}
    assert dp.advertised_in_capacity(node) == {
        "nvidia.com/gpu": "Node n1 status.capacity", "rdma/hca": "Node n1 status.capacity"}
    assert dp.advertised_in_capacity({"status": {"capacity": ["not", "a", "map"]}}) == {}
    assert dp.advertised_in_capacity({}) == {}


def test_the_kubelet_checkpoint_names_plugins_with_devices(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, {"nvidia.com/gpu": ["GPU-1", "GPU-2"], "example.com/none": [],
                                  "cpu": ["0"]})
    assert dp.advertised_in_checkpoint(tmp_path) == {"nvidia.com/gpu": str(path)}
    assert dp.advertised_in_checkpoint(tmp_path / "elsewhere") == {}


@pytest.mark.parametrize("content", [
    "{not json", '{"Data": {}}', '{"Data": {"RegisteredDevices": [1, 2]}}', "[]", '"x"',
])
def test_a_checkpoint_not_understood_is_one_warning_and_names_nothing(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / dp.CHECKPOINT
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="agent.deviceplugins"):
        assert dp.advertised_in_checkpoint(tmp_path) == {}
    assert [r.getMessage() for r in caplog.records] == ["device-plugin checkpoint not understood"]


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "huge"])
def test_a_hostile_checkpoint_is_not_followed_or_read_whole(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / dp.CHECKPOINT
    path.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(path)  # would block a plain open() for ever
    elif kind == "symlink":
        target = _checkpoint(tmp_path / "real", {"nvidia.com/gpu": ["GPU-1"]})
        path.symlink_to(target)
    elif kind == "directory":
        path.mkdir()
    else:
        with path.open("wb") as f:
            f.truncate(dp.MAX_CHECKPOINT_BYTES + 1)
    with caplog.at_level(logging.WARNING, logger="agent.deviceplugins"):
        assert dp.advertised_in_checkpoint(tmp_path) == {}
    assert [r.getMessage() for r in caplog.records] == ["device-plugin checkpoint not read"]


def test_an_overlap_needs_the_name_advertised_and_our_devices_selected(tmp_path: Path) -> None:
    classes = _shipped()
    for cls in classes:
        if cls["metadata"]["name"] == "gpu.dra-agent.io":
            cls["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    advertised = {"nvidia.com/gpu": "Node n1 status.capacity", "rdma/hca": "Node n1 status."}
    overlaps = dp.find_overlaps(classes, advertised,
                                dp.class_selects(_slices(tmp_path), NODE, selects_a_device))
    assert overlaps == [dp.Overlap("nvidia.com/gpu", "gpu.dra-agent.io",
                                   "Node n1 status.capacity")]
    message = overlaps[0].message()
    assert "nvidia.com/gpu" in message and "gpu.dra-agent.io" in message
    assert "--allow-device-plugin-overlap" in message and "\n" not in message
    # The same class on a node publishing only NICs selects nothing of ours: no overlap.
    nics_only = dp.class_selects(_slices(tmp_path / "n", ("nic", "vf")), NODE, selects_a_device)
    assert dp.find_overlaps(classes, advertised, nics_only) == []


def test_selectors_are_only_evaluated_for_advertised_names() -> None:
    asked: list[str] = []

    def selects(cls: Any) -> bool:
        asked.append(cls["metadata"]["name"])
        return True

    assert dp.find_overlaps(_shipped(), {"nvidia.com/gpu": "x"}, selects) == []
    assert asked == []


def test_a_class_of_another_driver_or_with_bad_cel_selects_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    selects = dp.class_selects(_slices(tmp_path), NODE, selects_a_device)
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
             "metadata": {"name": "gpu.nvidia.com"},
             "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [
                 {"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
    assert selects(other) is False
    broken = {**other, "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}}
    with caplog.at_level(logging.WARNING, logger="agent.deviceplugins"):
        assert selects(broken) is False
    assert "DeviceClass not evaluated for device-plugin overlap" in caplog.text


def test_run_refuses_a_node_whose_device_plugin_serves_our_gpus(workdir: Path) -> None:
    # No API server: the kubelet's checkpoint and the shipped classes tell.
    _checkpoint(workdir / "kubelet", {"dra-agent.io/gpu": ["GPU-1"]})
    agent = Agent(workdir, "none", "--no-health")
    assert agent.proc.wait(30) == 1
    errors = [ln for ln in agent.logs().splitlines() if "level=error" in ln or "error:" in ln]
    assert any("a device plugin already advertises dra-agent.io/gpu" in ln
               and "gpu.dra-agent.io" in ln for ln in errors), agent.logs()
    assert "Traceback" not in agent.logs()
    assert not (workdir / "kubelet" / "plugins_registry").exists() or not any(
        (workdir / "kubelet" / "plugins_registry").iterdir())


def test_run_starts_when_the_overlap_is_allowed(workdir: Path) -> None:
    _checkpoint(workdir / "kubelet", {"dra-agent.io/gpu": ["GPU-1"]})
    agent = Agent(workdir, "none", "--no-health", "--allow-device-plugin-overlap")
    try:
        agent.wait_http("/healthz")
    finally:
        assert agent.terminate() == 0


def test_run_reads_the_node_and_the_cluster_classes(workdir: Path) -> None:
    with FakeAPIServer() as srv:
        srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                        "status": {"capacity": {"nvidia.com/gpu": "8", "cpu": "224"}}})
        for cls in _shipped():
            if cls["metadata"]["name"] == "gpu.dra-agent.io":
                cls["spec"]["extendedResourceName"] = "nvidia.com/gpu"  # migrating
            srv.put_object(cls)
        agent = Agent(workdir, str(srv.write_kubeconfig(workdir / "kubeconfig")), "--no-health")
        assert agent.proc.wait(30) == 1
        logs = agent.logs()
        assert f"a device plugin already advertises nvidia.com/gpu on this node (Node {NODE} " \
               "status.capacity)" in logs, logs
        assert srv.list_objects("resourceslices") == []  # refused before publishing


def test_run_starts_where_the_device_plugin_serves_other_names(workdir: Path) -> None:
    with FakeAPIServer() as srv:
        srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                        "status": {"capacity": {"nvidia.com/gpu": "8"}}})
        for cls in _shipped():  # dra-agent.io/* names: the device plugin's is not among them
            srv.put_object(cls)
        agent = Agent(workdir, str(srv.write_kubeconfig(workdir / "kubeconfig")), "--no-health")
        try:
            agent.wait_http("/healthz")
        finally:
            assert agent.terminate() == 0


def test_the_usual_node_reads_no_device_classes(workdir: Path) -> None:
    """No device plugin advertised anywhere: one Node GET, no DeviceClass list (the kubelet's
    own credentials, which bare-metal installs use, may not list them)."""
    with FakeAPIServer() as srv:
        srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        agent = Agent(workdir, str(srv.write_kubeconfig(workdir / "kubeconfig")), "--no-health")
        try:
            agent.wait_http("/healthz")
        finally:
            assert agent.terminate() == 0
        assert not [r for r in srv.requests if "deviceclasses" in r.path]
        assert "device-plugin overlap" not in agent.logs()
