"""deploy/helm/dra-agent installed by the real helm on the real API server: the server's
schema, strict field validation, the CEL compiler for the admission policy and its own
validation of every object; two releases side by side; uninstall removes what was installed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.ops.conftest import HELM
from tests.ops.test_helm import CHART, NON_DEFAULT
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartCluster

#: NON_DEFAULT without the Namespace object: helm install needs the namespace beforehand.
SECOND = {k: v for k, v in NON_DEFAULT.items() if k != "namespace"}


@pytest.fixture
def helm_on(start_cluster: StartCluster, tmp_path: Path) -> tuple[RealCluster, Path]:
    # A missing build is a failure, never a skip: hack/realk8s/test.sh builds helm first.
    assert HELM.is_file(), f"{HELM} not built: run hack/realk8s/build.sh helm (test.sh does)"
    cluster = start_cluster()
    made = cluster.kubectl("create", "namespace", "dra-agent")
    assert made.returncode == 0, made.stderr
    label = cluster.kubectl("label", "namespace", "dra-agent",
                            "pod-security.kubernetes.io/enforce=privileged")
    assert label.returncode == 0, label.stderr
    return cluster, tmp_path


def helm(cluster: RealCluster, tmp: Path, *args: str,
         values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    extra: list[str] = []
    if values is not None:
        file = tmp / f"values-{len(list(tmp.glob('values-*')))}.yaml"
        file.write_text(json.dumps(values))
        extra = ["--values", str(file)]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp),
           "HELM_CACHE_HOME": str(tmp / "cache"), "HELM_CONFIG_HOME": str(tmp / "config"),
           "HELM_DATA_HOME": str(tmp / "data"), "KUBECONFIG": str(cluster.admin_kubeconfig)}
    return subprocess.run([str(HELM), *args, *extra], capture_output=True, text=True,
                          timeout=180, check=False, env=env)


def test_install_dry_run_on_the_server(helm_on: tuple[RealCluster, Path]) -> None:
    """What operators run first. helm 4.3's --dry-run=server talks to the server (release
    history, lookups) but does not send the objects for validation: a DaemonSet the server
    refuses (maxSurge and maxUnavailable both 0) passes it. The object checks are the two
    tests below."""
    cluster, tmp = helm_on
    for release, values in (("dra-agent", {}), ("gpu-agent", SECOND)):
        out = helm(cluster, tmp, "install", release, str(CHART), "-n", "dra-agent",
                   "--dry-run=server", values=values)
        assert out.returncode == 0, f"{release}: {out.stderr}"
        assert "kind: DaemonSet" in out.stdout
    # A dry run leaves nothing behind.
    ds = cluster.kubectl("get", "-n", "dra-agent", "daemonsets", "-o", "name")
    assert ds.returncode == 0 and ds.stdout.strip() == "", ds.stdout + ds.stderr


@pytest.mark.versioned  # the chart's objects through each minor's schema and validation
def test_rendered_objects_pass_strict_server_validation(
        helm_on: tuple[RealCluster, Path]) -> None:
    cluster, tmp = helm_on
    for values in ({}, SECOND):
        rendered = helm(cluster, tmp, "template", "dra-agent", str(CHART), "-n", "dra-agent",
                        values=values)
        assert rendered.returncode == 0, rendered.stderr
        out = cluster.kubectl("apply", "--server-side", "--dry-run=server",
                              "--validate=strict", "-f", "-", input=rendered.stdout)
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("serverside-applied (server dry run)") == (
            rendered.stdout.count("\nkind: "))


def test_two_releases_install_and_uninstall(helm_on: tuple[RealCluster, Path]) -> None:
    cluster, tmp = helm_on
    first = helm(cluster, tmp, "install", "dra-agent", str(CHART), "-n", "dra-agent")
    assert first.returncode == 0, first.stderr
    # Another driver beside it: its own cluster-scoped names, its own selector.
    second = helm(cluster, tmp, "install", "gpu-agent", str(CHART), "-n", "dra-agent",
                  values=SECOND)
    assert second.returncode == 0, second.stderr
    classes = cluster.kubectl("get", "deviceclasses", "-o", "name")
    # Each gpu and nic class has its shareable twin (<type>-shared.<driver>), and the gpu
    # class its VMs' form (vfio.<driver>, --gpu-passthrough).
    assert sorted(classes.stdout.split()) == sorted(
        [f"deviceclass.resource.k8s.io/{t}.dra-agent.io"
         for t in ("gpu", "mig", "nic", "vf", "gpu-shared", "nic-shared", "vfio")]
        + [f"deviceclass.resource.k8s.io/{t}.gpu.example.com"
           for t in ("gpu", "nic", "gpu-shared", "nic-shared", "vfio")])
    vap = json.loads(cluster.kubectl("get", "validatingadmissionpolicy",
                                     "gpu-agent-own-node-slices", "-o", "json").stdout)
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    assert variables["driverName"] == "'gpu.example.com'"
    ds = json.loads(cluster.kubectl("get", "-n", "dra-agent", "daemonset", "gpu-agent",
                                    "-o", "json").stdout)
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "gpu-agent"}
    for release in ("gpu-agent", "dra-agent"):
        out = helm(cluster, tmp, "uninstall", release, "-n", "dra-agent", "--wait")
        assert out.returncode == 0, out.stderr
    left = cluster.kubectl("get", "deviceclasses,clusterroles,validatingadmissionpolicies",
                           "-l", "app.kubernetes.io/part-of=dra-agent", "-o", "name")
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout + left.stderr


def test_the_server_refuses_what_the_schema_lets_through(
        helm_on: tuple[RealCluster, Path]) -> None:
    """The installs above have teeth: values the chart's schema allows but the API server's
    validation refuses fail the install, with the server's reason."""
    cluster, tmp = helm_on
    both_zero = {"updateStrategy": {"type": "RollingUpdate",
                                    "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}
    out = helm(cluster, tmp, "install", "dra-agent", str(CHART), "-n", "dra-agent",
               values=both_zero)
    assert out.returncode != 0
    assert "maxUnavailable" in out.stderr, out.stderr
