"""The kubelet's registration is answered before what it does not need is loaded: the plugin
serves (its registration socket answers) before prometheus_client, urllib3 and the slice
controller are imported, and /readyz still waits for the published slices."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import NODE, AgentProcess, NodeDirs
from tests.fakes.apiserver import FakeAPIServer


@pytest.fixture
def node() -> Iterator[tuple[NodeDirs, str, FakeAPIServer]]:
    root = Path(tempfile.mkdtemp(prefix="so", dir="/tmp"))  # short: socket paths
    try:
        with FakeAPIServer() as server:
            server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            yield NodeDirs(root), str(server.write_kubeconfig(root / "kubeconfig")), server
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_plugin_serves_before_metrics_api_pool_and_slices_load(
        node: tuple[NodeDirs, str, FakeAPIServer]) -> None:
    dirs, kubeconfig, server = node
    agent = AgentProcess(dirs, kubeconfig, "--no-health", env={"PYTHONPROFILEIMPORTTIME": "1"})
    try:
        agent.wait_http("/readyz/slices", timeout=60)
        logs = agent.logs()
    finally:
        agent.terminate()
    lines = logs.splitlines()
    serving = next(i for i, ln in enumerate(lines) if "kubelet plugin serving" in ln)

    def first_import(module: str) -> int:
        """The line where ``module`` was first imported; past the end if it was not yet
        (urllib3 loads at the slices' first watch, which may start after /readyz answers:
        requests go over agent.kube.keepalive)."""
        pattern = re.compile(rf"^import time:.*\|\s*{re.escape(module)}$")
        return next((i for i, ln in enumerate(lines) if pattern.match(ln)), len(lines))

    for module in ("prometheus_client", "urllib3", "agent.slices.controller"):
        assert first_import(module) > serving, module
    assert first_import("agent.slices.controller") < len(lines)  # it did load, after serving
    assert first_import("grpc") < serving  # what the plugin needs comes first
    assert server.list_objects("resourceslices")  # published, then ready
