"""The API checks through the agent's real client (agent.kube) against the fake kube-apiserver:
the same requests, timeouts and error paths as on a cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.conftest import REPO
from tests.fakes.apiserver import FakeAPIServer

NODE = "sim-node"


def _doctor(kubeconfig: Path, *args: str) -> tuple[int, dict[str, dict[str, str]]]:
    result = CliRunner().invoke(main, ["doctor", "--simulate", "dgx-h100", "--node-name", NODE,
                                       "--kubeconfig", str(kubeconfig), "-o", "json", *args],
                                catch_exceptions=False)
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    return result.exit_code, checks


def _seed_node(srv: FakeAPIServer, capacity: dict[str, str]) -> None:
    srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
                    "status": {"capacity": capacity,
                               "nodeInfo": {"kubeletVersion": "v1.35.0"}}})


def _seed_slices(srv: FakeAPIServer) -> None:
    """The slices the agent would publish for the simulated node, as discover -o json has."""
    result = CliRunner().invoke(main, ["discover", "--simulate", "dgx-h100", "--node-name",
                                       NODE, "-o", "json"], catch_exceptions=False)
    for i, obj in enumerate(json.loads(result.stdout)["items"]):
        obj["metadata"] = {"name": f"{NODE}-{i}"}
        srv.put_object(obj)


def _seed_classes(srv: FakeAPIServer) -> None:
    for doc in yaml.safe_load_all((REPO / "agent" / "deviceclasses.yaml").read_text()):
        if isinstance(doc, dict):
            srv.put_object(doc)


def test_a_published_node(tmp_path: Path) -> None:
    with FakeAPIServer(served_resource_versions=("v1",)) as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        _seed_node(srv, {"cpu": "224"})
        _seed_slices(srv)
        _seed_classes(srv)
        code, checks = _doctor(kubeconfig)
    assert checks["API server"]["status"] == "ok", checks["API server"]
    assert checks["resource.k8s.io API"]["found"] == "served: v1; the agent uses v1"
    assert checks["ResourceSlices"]["status"] == "ok", checks["ResourceSlices"]
    assert "20 device(s), as discovery finds" in checks["ResourceSlices"]["found"]
    assert checks["DeviceClasses"]["status"] == "ok"
    assert checks["kubelet version"]["found"] == "kubelet v1.35.0"
    assert checks["node capacity"]["status"] == "ok"
    # The fake has no authorization API: the review fails, in one line, as a warning.
    assert checks["RBAC"]["status"] == "warn"
    assert "SelfSubjectAccessReview failed" in checks["RBAC"]["found"]
    assert code == 0


def test_an_unpublished_node_with_a_device_plugin(tmp_path: Path) -> None:
    with FakeAPIServer(served_resource_versions=("v1beta1",)) as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        _seed_node(srv, {"cpu": "224", "nvidia.com/gpu": "8"})
        code, checks = _doctor(kubeconfig)
    assert code == 1
    expected: dict[str, Any] = {"ResourceSlices": "fail", "DeviceClasses": "fail",
                                "node capacity": "fail", "API server": "ok"}
    assert {k: checks[k]["status"] for k in expected} == expected
    assert "nvidia.com/gpu=8" in checks["node capacity"]["found"]
    assert "the agent uses v1beta1" in checks["resource.k8s.io API"]["found"]
