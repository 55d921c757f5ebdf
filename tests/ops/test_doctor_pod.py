"""deploy/doctor/pod.yaml: the one-shot doctor pod reads the host's / read-only, as the agent's
own ServiceAccount, with the DaemonSet's image, and its arguments are ones `doctor` takes."""

from __future__ import annotations

import json
from typing import Any

import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.conftest import REPO

POD = REPO / "deploy" / "doctor" / "pod.yaml"


def _pod() -> dict[str, Any]:
    (pod,) = list(yaml.safe_load_all(POD.read_text()))
    assert isinstance(pod, dict)
    return pod


def _daemonset() -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "deploy" / "base" / "daemonset.yaml").read_text())
    (ds,) = [d for d in docs if d and d["kind"] == "DaemonSet"]
    assert isinstance(ds, dict)
    return ds


def test_it_reads_the_hosts_root_and_writes_nothing() -> None:
    spec = _pod()["spec"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts.keys() == volumes.keys()
    assert volumes["host"]["hostPath"]["path"] == "/"
    assert mounts["host"] == {"name": "host", "mountPath": "/host", "readOnly": True}
    assert "--host-root=/host" in container["args"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert "privileged" not in security and security["capabilities"]["drop"] == ["ALL"]
    assert spec["restartPolicy"] == "Never"


def test_it_is_the_agents_identity_image_and_namespace() -> None:
    pod, ds = _pod(), _daemonset()
    template = ds["spec"]["template"]["spec"]
    assert pod["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert pod["spec"]["serviceAccountName"] == template["serviceAccountName"]
    (agent,) = template["containers"]
    (doctor,) = pod["spec"]["containers"]
    assert doctor["image"] == agent["image"]
    assert pod["spec"]["hostNetwork"] is True  # the agent's metrics port on the node's IP
    assert pod["spec"]["nodeName"] == "NODE_NAME_HERE"  # the README's sed replaces it


def test_doctor_takes_its_arguments(tmp_path: Any) -> None:
    (container,) = _pod()["spec"]["containers"]
    args = [a.replace("$(HOST_IP)", "127.0.0.1") for a in container["args"]]
    assert args[0] == "doctor"
    host = tmp_path / "host"
    host.mkdir()
    out = CliRunner().invoke(main, [*[a.replace("/host", str(host)) for a in args],
                                    "--kubeconfig", "none", "-o", "json"])
    assert out.exit_code in (0, 1), out.output  # a verdict on an empty root, not bad input
    checks = {c["name"]: c for c in json.loads(out.output)["checks"]}
    # It looked where the pod mounts the host: an empty one finds no container runtime there.
    assert str(host) in checks["container runtime"]["found"]
