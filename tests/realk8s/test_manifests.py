"""deploy/ applied to a real server by the real kubectl, as an operator does: the real schema
(strict field validation), the real CEL compiler for the ValidatingAdmissionPolicy, RBAC
accepted; and the real kustomize agreeing with the renderer the fast tests use."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.ops.kustomize import render
from tests.realk8s.cluster import REPO, RealCluster
from tests.realk8s.conftest import StartCluster

TARGETS = ["base", "overlays/simulated", "overlays/gpu-node"]


@pytest.mark.versioned  # deploy/ through each minor's schema and CEL
def test_every_target_applies_server_side(start_cluster: StartCluster) -> None:
    cluster = start_cluster()
    for target in TARGETS:
        out = cluster.kubectl("apply", "--server-side", "--force-conflicts",
                              "-k", str(REPO / "deploy" / target))
        assert out.returncode == 0, f"{target}: {out.stderr}"
        assert "serverside-applied" in out.stdout
    # What was applied last is what the server holds: the gpu-node overlay's DaemonSet.
    ds = json.loads(cluster.kubectl("get", "-n", "dra-agent", "daemonset", "dra-agent",
                                    "-o", "json").stdout)
    rendered = next(o for o in render(REPO / "deploy" / "overlays" / "gpu-node")
                    if o["kind"] == "DaemonSet")
    selector = rendered["spec"]["template"]["spec"]["nodeSelector"]
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == selector
    vap = json.loads(cluster.kubectl("get", "validatingadmissionpolicy",
                                     "dra-agent-own-node-slices", "-o", "json").stdout)
    assert vap["spec"]["failurePolicy"] == "Fail"


@pytest.mark.versioned  # each minor's CEL compiler (the check above's teeth)
def test_the_server_compiles_the_policy_cel(start_cluster: StartCluster) -> None:
    """The check above has teeth: a policy whose CEL does not compile is refused."""
    cluster = start_cluster()
    docs = list(yaml.safe_load_all((REPO / "deploy/base/admission-policy.yaml").read_text()))
    vap = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    vap["spec"]["validations"][0]["expression"] = "variables.userNodeName.nosuchmethod()"
    out = cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(vap))
    assert out.returncode != 0
    assert "compilation failed" in out.stderr or "undeclared reference" in out.stderr, out.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_real_kustomize_agrees_with_the_test_renderer(cluster: RealCluster,
                                                      target: str) -> None:
    out = cluster.kubectl("kustomize", str(REPO / "deploy" / target))
    assert out.returncode == 0, out.stderr
    real = [d for d in yaml.safe_load_all(out.stdout) if d]
    ours = render(REPO / "deploy" / target)
    assert sorted(real, key=ident) == sorted(ours, key=ident)


def ident(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


@pytest.mark.versioned  # deploy/ through each minor's strict validation
def test_dry_run_of_every_rendered_object(start_cluster: StartCluster) -> None:
    cluster = start_cluster()
    for target in TARGETS:
        docs = render(REPO / "deploy" / target)
        text = "\n---\n".join(yaml.safe_dump(d) for d in docs)
        out = cluster.kubectl("apply", "--server-side", "--dry-run=server",
                              "--validate=strict", "-f", "-", input=text)
        # Namespaced objects need their namespace to exist first; apply it for real once.
        if out.returncode != 0 and "namespaces \"dra-agent\" not found" in out.stderr:
            ns = next(d for d in docs if d["kind"] == "Namespace")
            made = cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(ns))
            assert made.returncode == 0, made.stderr
            out = cluster.kubectl("apply", "--server-side", "--dry-run=server",
                                  "--validate=strict", "-f", "-", input=text)
        assert out.returncode == 0, f"{target}: {out.stderr}"


@pytest.mark.versioned  # the doctor pod through each minor's validation
def test_the_doctor_pod_is_accepted_next_to_the_base(cluster: RealCluster) -> None:
    """deploy/doctor/pod.yaml, with its node filled in as the README says, passes the real
    server's strict validation (and the namespace's privileged Pod Security level)."""
    cluster.apply_deploy("base")
    node = "node-doctor"
    cluster.ensure_node(node)
    text = (REPO / "deploy" / "doctor" / "pod.yaml").read_text().replace("NODE_NAME_HERE", node)
    out = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict",
                          "-f", "-", input=text)
    assert out.returncode == 0, out.stderr
    assert "pod/dra-agent-doctor serverside-applied (server dry run)" in out.stdout, out.stdout
