"""deploy/helm/dra-agent through the real helm (built from its Go module by
hack/realk8s/build.sh): lint, default and non-default values rendered and valid against the
Kubernetes 1.35, 1.36 and 1.37 OpenAPI, the same objects as the kustomize targets for the same
settings, one value renaming the driver everywhere, the agent parsing the arguments the chart
gives it, and bad values refused in one line.

The fast suite builds helm itself (``build.sh helm``: a no-op once built, a few minutes cold),
because CI runs this suite before hack/realk8s/test.sh builds anything; the later build of
the real-Kubernetes binaries then finds helm current. Without Go there is nothing to build
helm with, and these tests skip, saying so.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from agent import __version__
from agent.commands.run import command as run_command
from agent.common.config import ALL_DEVICE_TYPES, Config
from agent.httpserver import parse_address
from tests.conftest import REPO
from tests.ops.kustomize import render
from tests.ops.openapi import KUBE_VERSIONS, OpenAPI, swagger
from tests.ops.runconfig import run_config

CHART = REPO / "deploy" / "helm" / "dra-agent"
Obj = dict[str, Any]
#: The labels the chart adds to deploy/base's on every object's metadata.
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
               "app.kubernetes.io/version", "helm.sh/chart")

# The first test may build helm (a few minutes cold on 2 cores), inside its own setup.
pytestmark = pytest.mark.timeout(1800)

#: Every value changed from its default at once.
NON_DEFAULT: dict[str, Any] = {
    "driverName": "gpu.example.com",
    "image": {"repository": "registry.example.com/dra-agent", "tag": "0.1.0-rc1",
              "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "deviceTypes": ["gpu", "nic"],
    "sharing": ["gpu=shares:4", "nic=bandwidth:10G"],
    "mig": "dynamic",
    "vfs": "dynamic",
    "vfBandwidth": "25G",
    "simulate": "dgx-h100",
    "simulateDeviceNodes": True,
    "kubeletDir": "/var/lib/k0s/kubelet",
    "cdiDir": "/etc/cdi",
    "driverRoot": "/run/nvidia/driver",
    "metrics": {"port": 9500, "annotations": False},
    "health": {"enabled": True, "ignoreXids": "13,31", "quietPeriod": 30,
               "taintEffects": "xid=NoExecute"},
    "probes": {"startup": {"periodSeconds": 5, "failureThreshold": 30}},
    "extraArgs": ["--log-format=json", "-v"],
    "extraEnv": [{"name": "DRA_AGENT_RESCAN_INTERVAL", "value": "30"}],
    "extraVolumes": [{"name": "mps", "hostPath": {"path": "/tmp/nvidia-mps",
                                                  "type": "DirectoryOrCreate"}}],
    "extraVolumeMounts": [{"name": "mps", "mountPath": "/tmp/nvidia-mps"}],
    "updateStrategy": {"type": "RollingUpdate",
                       "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    "priorityClassName": "gpu-critical",
    "terminationGracePeriodSeconds": 90,
    "podAnnotations": {"example.com/team": "ml"},
    "podLabels": {"example.com/tier": "node"},
    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                  "limits": {"memory": "768Mi"}},
    "serviceAccount": {"create": True, "name": "gpu-agent",
                       "annotations": {"example.com/owner": "platform"}},
    "namespace": {"create": True},
    "fullnameOverride": "gpu-agent",
}

#: deploy/ kustomize target -> the chart values that mean the same deployment.
SAME_AS: dict[str, dict[str, Any]] = {
    "base": {"namespace": {"create": True}},
    "overlays/simulated": {"namespace": {"create": True}, "simulate": "dgx-h100"},
    "overlays/gpu-node": {"namespace": {"create": True}, "driverRoot": "/",
                          "nodeSelector": {"nvidia.com/gpu.present": "true"},
                          "resources": {"limits": {"memory": "768Mi"}}},
}


def run_helm(helm: Path, *args: str, values: dict[str, Any] | None = None,
             tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra: list[str] = []
    if values is not None:
        assert tmp is not None
        file = tmp / f"values-{len(list(tmp.iterdir()))}.yaml"
        file.write_text(json.dumps(values))
        extra = ["--values", str(file)]
    # No kubeconfig, no repositories, no cache outside the test's directory.
    home = tmp or Path("/nonexistent")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"), "KUBECONFIG": str(home / "no-kubeconfig")}
    return subprocess.run([str(helm), *args, *extra], capture_output=True, text=True,
                          timeout=120, check=False, env=env)


def template(helm: Path, tmp: Path, values: dict[str, Any] | None = None,
             *args: str) -> list[Obj]:
    out = run_helm(helm, "template", "dra-agent", str(CHART), "--namespace", "dra-agent",
                   *args, values=values or {}, tmp=tmp)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _ident(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _one(objects: list[Obj], kind: str) -> Obj:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def _container(objects: list[Obj]) -> Obj:
    (container,) = _one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _without_helm_labels(obj: Obj) -> Obj:
    """The object as kustomize would make it: Helm's own labels checked, then removed."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["app.kubernetes.io/instance"] == "dra-agent"
    for key in HELM_LABELS:
        del labels[key]
    return obj


# --- lint and schema ------------------------------------------------------------------------


def test_lint_is_clean_with_default_and_non_default_values(helm: Path, tmp_path: Path) -> None:
    for values in ({}, NON_DEFAULT):
        out = run_helm(helm, "lint", "--strict", str(CHART), values=values, tmp=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("case", ["default", "non-default"])
def test_rendered_objects_are_valid(helm: Path, tmp_path: Path, version: str,
                                    case: str) -> None:
    api = OpenAPI(swagger(version))
    values = {} if case == "default" else NON_DEFAULT
    objects = template(helm, tmp_path, values, "--kube-version", version)
    assert [e for obj in objects for e in api.errors(obj)] == []
    idents = [_ident(o) for o in objects]
    assert len(idents) == len(set(idents)), "duplicate objects"
    for obj in objects:
        assert ("namespace" in obj["metadata"]) == api.is_namespaced(obj), _ident(obj)


def test_the_chart_follows_the_agent(helm: Path, tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    assert _container(template(helm, tmp_path))["image"] == f"dra-agent:{__version__}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]) - {"global"} == set(values), "every value has a schema"
    assert values["deviceTypes"] == list(ALL_DEVICE_TYPES)
    assert values["driverName"] == Config().driver_name
    assert values["kubeletDir"] == str(Config().kubelet_dir)
    assert values["cdiDir"] == str(Config().cdi_dir)


# --- the chart and kustomize agree ---------------------------------------------------------


@pytest.mark.parametrize("target", sorted(SAME_AS))
def test_same_objects_as_kustomize(helm: Path, tmp_path: Path, target: str) -> None:
    chart = {_ident(o): _without_helm_labels(o) for o in template(helm, tmp_path, SAME_AS[target])}
    kustomize = {_ident(o): o for o in render(REPO / "deploy" / target)}
    assert sorted(chart) == sorted(kustomize)
    for ident, obj in kustomize.items():
        assert chart[ident] == obj, ident


def test_without_a_namespace_object_by_default(helm: Path, tmp_path: Path) -> None:
    """helm install stores the release in the namespace before creating anything, so the
    chart renders the Namespace only when asked (namespace.create)."""
    kinds = sorted(o["kind"] for o in template(helm, tmp_path))
    assert kinds == sorted(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
                           + ["DeviceClass"] * 7)


def test_optional_objects_can_be_left_out(helm: Path, tmp_path: Path) -> None:
    off = {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"},
           "admissionPolicy": {"create": False}, "deviceClasses": {"create": False}}
    objects = template(helm, tmp_path, off)
    assert [o["kind"] for o in objects] == ["DaemonSet"]
    assert _one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


# --- one value renames the driver everywhere ------------------------------------------------


def test_driver_name_changes_every_place_together(helm: Path, tmp_path: Path) -> None:
    name = "gpu.example.com"
    out = run_helm(helm, "template", "dra-agent", str(CHART), "-n", "dra-agent",
                   values={"driverName": name}, tmp=tmp_path)
    assert out.returncode == 0, out.stderr
    assert Config().driver_name not in out.stdout, "the default driver name is left somewhere"
    objects = [d for d in yaml.safe_load_all(out.stdout) if d]
    (rule,) = [r for r in _one(objects, "ClusterRole")["rules"] if "resourceNames" in r]
    assert rule["resourceNames"] == [name]
    vap = _one(objects, "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    assert variables["driverName"] == f"'{name}'"
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}
    assert sorted(classes) == sorted([f"{t}.{name}" for t in (*ALL_DEVICE_TYPES, "vfio")]
                                     + [f"{t}-shared.{name}" for t in ("gpu", "nic")])
    for t in ALL_DEVICE_TYPES:
        (selector,) = classes[f"{t}.{name}"]["spec"]["selectors"]
        exclusive = f" && !('sharing' in device.attributes['{name}'])" if t in ("gpu", "nic") \
            else ""
        assert selector["cel"]["expression"] == (
            f"device.driver == '{name}' && device.attributes['{name}'].type == '{t}'"
            + exclusive)
    for t in ("gpu", "nic"):
        (selector,) = classes[f"{t}-shared.{name}"]["spec"]["selectors"]
        assert selector["cel"]["expression"] == (
            f"device.driver == '{name}' && device.attributes['{name}'].type == '{t}' && "
            f"'sharing' in device.attributes['{name}']")
    cfg = _agent_config(objects)
    assert cfg.driver_name == name
    _assert_mounted_where_the_agent_looks(objects, cfg)


# --- the agent takes the arguments the chart gives it ----------------------------------------


def _agent_config(objects: list[Obj]) -> Config:
    """The agent's Config from the container's args and plain env, parsed by `run` itself."""
    container = _container(objects)
    assert container["args"][0] == "run"
    fields = {"POD_IP": "10.0.0.7", "HOST_IP": "10.0.0.7"}
    args = [re.sub(r"\$\((\w+)\)", lambda m: fields[m.group(1)], a) for a in container["args"]]
    env = {e["name"]: e["value"] for e in container["env"]
           if e["name"].startswith("DRA_AGENT_") and "value" in e}
    try:
        return run_config(args[1:], env)
    except click.ClickException as err:
        message = err.format_message()
        raise AssertionError(f"the agent refuses the chart's arguments: {message}") from err


def _assert_mounted_where_the_agent_looks(objects: list[Obj], cfg: Config) -> None:
    pod = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    # The kubelet dials the socket path the agent registers: the same path inside and out.
    for path in (cfg.plugin_dir, cfg.registry_dir, cfg.cdi_dir):
        mount = mounts[str(path)]
        assert volumes[mount["name"]]["hostPath"]["path"] == str(path)


def test_non_default_values_reach_the_agent(helm: Path, tmp_path: Path) -> None:
    objects = template(helm, tmp_path, NON_DEFAULT)
    cfg = _agent_config(objects)
    assert cfg.driver_name == "gpu.example.com"
    assert cfg.kubelet_dir == Path("/var/lib/k0s/kubelet")
    assert cfg.cdi_dir == Path("/etc/cdi")
    assert cfg.device_types == ("gpu", "nic")
    assert [str(m) for m in cfg.sharing] == ["gpu=shares:4", "nic=bandwidth:10G"]
    assert (cfg.mig, cfg.vfs, cfg.vf_bandwidth) == ("dynamic", "dynamic", "25G")
    assert cfg.simulate == "dgx-h100"
    assert cfg.simulate_device_nodes is True
    assert cfg.log_format == "json"
    _assert_mounted_where_the_agent_looks(objects, cfg)
    container = _container(objects)
    _, port = parse_address(cfg.metrics_address)
    assert port == 9500
    assert {container[p]["httpGet"]["port"] for p in
            ("startupProbe", "livenessProbe", "readinessProbe")} == {port}
    assert container["startupProbe"]["periodSeconds"] == 5
    args = container["args"]
    assert {"--health-ignore-xids=13,31", "--health-quiet-period=30",
            "--health-taint-effects=xid=NoExecute"} <= set(args)
    assert args[-2:] == ["--log-format=json", "-v"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DRA_AGENT_DRIVER_ROOT"] == "/driver-root"
    assert env["DRA_AGENT_HOST_DRIVER_ROOT"] == "/run/nvidia/driver"
    assert env["DRA_AGENT_RESCAN_INTERVAL"] == "30"
    pod = _one(objects, "DaemonSet")["spec"]["template"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes[mounts["/driver-root"]["name"]]["hostPath"]["path"] == "/run/nvidia/driver"
    assert mounts["/driver-root"]["readOnly"] is True
    assert "annotations" in pod["metadata"]
    assert not any(k.startswith("prometheus.io/") for k in pod["metadata"]["annotations"])
    ds = _one(objects, "DaemonSet")
    assert ds["metadata"]["name"] == "gpu-agent"
    assert ds["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "gpu-agent"}
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    user = "system:serviceaccount:dra-agent:gpu-agent"
    (condition,) = _one(objects, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"


def test_health_off_and_default_config(helm: Path, tmp_path: Path) -> None:
    cfg = _agent_config(template(helm, tmp_path))
    assert cfg == Config(node_name=cfg.node_name, metrics_address="10.0.0.7:9464")
    off = _container(template(helm, tmp_path, {"health": {"enabled": False}}))
    assert "--no-health" in off["args"]
    ctx = run_command.make_context("run", [a for a in off["args"][1:] if "$(" not in a])
    assert ctx.params["health"] is False


def test_simulated_device_nodes_reach_the_agent_in_the_mounted_plugin_dir(
        helm: Path, tmp_path: Path) -> None:
    """The stand-in nodes go under the plugin dir, which the pod mounts at its host path (so
    the runtime finds them where the spec says); the privileged container may mknod."""
    objects = template(helm, tmp_path, {"simulate": "dgx-h100", "simulateDeviceNodes": True})
    container = _container(objects)
    assert container["args"].count("--simulate-device-nodes") == 1
    cfg = _agent_config(objects)
    assert (cfg.simulate, cfg.simulate_device_nodes) == ("dgx-h100", True)
    assert cfg.simulated_dev_dir == cfg.plugin_dir / "simulated-dev"
    _assert_mounted_where_the_agent_looks(objects, cfg)
    assert container["securityContext"]["privileged"] is True  # CAP_MKNOD among the rest
    off = _container(template(helm, tmp_path, {"simulate": "dgx-h100"}))
    assert "--simulate-device-nodes" not in off["args"]


# --- bad values: one line ------------------------------------------------------------------


@pytest.mark.parametrize(("values", "where"), [
    ({"driverName": "Bad_Name"}, "driverName"),
    ({"driverName": "x' || true || '"}, "driverName"),  # no CEL through the policy's quotes
    ({"deviceTypes": ["gpu", "tpu"]}, "deviceTypes"),
    ({"sharing": ["mig=shares:2"]}, "sharing"),
    ({"sharing": ["gpu=shares:0"]}, "sharing"),
    ({"mig": "auto"}, "mig"),
    ({"vfs": "dynamic", "vfBandwidth": "25Gi"}, "vfBandwidth"),
    ({"vfBandwidth": "25G"}, "vfBandwidth needs vfs: dynamic"),
    ({"simulateDeviceNodes": True}, "simulateDeviceNodes needs simulate"),
    ({"simulate": "dgx-h100", "simulateDeviceNodes": "yes"}, "simulateDeviceNodes"),
    ({"metrics": {"port": "9464"}}, "metrics"),
    ({"kubeletDir": "relative/dir"}, "kubeletDir"),
    ({"health": {"ignoreXids": "13;rm"}}, "health"),
    ({"simulte": "dgx-h100"}, "simulte"),
])
def test_bad_values_are_refused_naming_the_value(helm: Path, tmp_path: Path,
                                                 values: dict[str, Any], where: str) -> None:
    out = run_helm(helm, "template", "dra-agent", str(CHART), values=values, tmp=tmp_path)
    assert out.returncode != 0
    assert out.stdout == ""
    assert where in out.stderr, out.stderr
    assert "panic" not in out.stderr and "goroutine" not in out.stderr


def test_kubernetes_older_than_supported_is_refused(helm: Path, tmp_path: Path) -> None:
    out = run_helm(helm, "template", "dra-agent", str(CHART), "--kube-version", "1.34.0",
                   tmp=tmp_path)
    assert out.returncode != 0
    assert "chart requires kubeVersion: >= 1.35.0-0" in out.stderr, out.stderr
