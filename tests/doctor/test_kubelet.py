"""kubelet checks: feature gates from its config file, its version from the Node, its dir and
the agent's registration socket."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from agent.doctor import kubelet
from agent.doctor.context import Options
from agent.doctor.model import Status
from tests.doctor.conftest import FakeHttp, Tree, assert_check, context

CONFIG = "/var/lib/kubelet/config.yaml"
HEAD = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def _node(version: str) -> Any:
    return {("GET", "/api/v1/nodes/n1"): (200, {"metadata": {"name": "n1"}, "status": {
        "nodeInfo": {"kubeletVersion": version}, "capacity": {"cpu": "8"}}})}


def test_gates_listed_and_dra_off_fails(tree: Tree) -> None:
    tree.write(CONFIG, HEAD + "featureGates:\n  DRADeviceTaints: true\n  Other: false\n")
    assert_check(kubelet.check_gates(context(tree)), Status.OK,
                 f"{CONFIG}: DRADeviceTaints=true")
    tree.write(CONFIG, HEAD + "featureGates:\n  DynamicResourceAllocation: false\n")
    assert_check(kubelet.check_gates(context(tree)), Status.FAIL,
                 "DynamicResourceAllocation=false", fix="DynamicResourceAllocation: true")


def test_gates_from_etc_kubernetes_skipping_the_kubeconfig(tree: Tree) -> None:
    # kubeadm's /etc/kubernetes/kubelet.conf is a kubeconfig, not the kubelet's config.
    tree.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\nkind: Config\nclusters: []\n")
    tree.write("/etc/kubernetes/kubelet-config.yaml", HEAD + "featureGates: {}\n")
    assert_check(kubelet.check_gates(context(tree)), Status.OK,
                 "/etc/kubernetes/kubelet-config.yaml: no DRA gate set")


def test_no_kubelet_config_is_skipped_with_the_places_looked(tree: Tree) -> None:
    assert_check(kubelet.check_gates(context(tree)), Status.SKIPPED, "no kubelet config file",
                 "/var/lib/kubelet/config.yaml")


@pytest.mark.parametrize(("body", "found"), [
    ("featureGates: [unclosed\n", "not valid YAML"),
    ("featureGates: [a, b]\n", "not a mapping"),
    ("- a\n", "top level is not a mapping"),
])
def test_malformed_kubelet_config_warns(tree: Tree, body: str, found: str) -> None:
    tree.write(CONFIG, body if body.startswith("-") else HEAD + body)
    assert_check(kubelet.check_gates(context(tree)), Status.WARN, found,
                 fix="fix the kubelet config")


def test_a_gate_that_is_not_a_boolean(tree: Tree) -> None:
    tree.write(CONFIG, HEAD + "featureGates:\n  DynamicResourceAllocation: maybe\n")
    assert_check(kubelet.check_gates(context(tree)), Status.WARN,
                 "DynamicResourceAllocation='maybe'", fix="true or false")


def test_version_needs_the_api(tree: Tree) -> None:
    check = kubelet.check_version(context(tree, api_skip="--kubeconfig none: no API server"))
    assert_check(check, Status.SKIPPED, "status.nodeInfo", "--kubeconfig none")


@pytest.mark.parametrize(("version", "gates", "status", "found"), [
    ("v1.35.0", "", Status.OK, "kubelet v1.35.0"),
    ("v1.31.4", "", Status.FAIL, "need 1.32 or later"),
    ("v1.33.2", "", Status.FAIL, "off by default"),
    ("v1.33.2", "featureGates: {DynamicResourceAllocation: true}\n", Status.OK,
     "with DynamicResourceAllocation=true"),
    ("garbage", "", Status.WARN, "'garbage'"),
])
def test_version_from_the_node(tree: Tree, version: str, gates: str, status: Status,
                               found: str) -> None:
    tree.write(CONFIG, HEAD + gates)
    check = kubelet.check_version(context(tree, api=FakeHttp(_node(version))))
    assert_check(check, status, found, fix="")


def test_version_when_the_node_is_missing(tree: Tree) -> None:
    check = kubelet.check_version(context(tree, api=FakeHttp({})))
    assert_check(check, Status.SKIPPED, "Node 'n1' not found")


def test_kubelet_dir(tree: Tree) -> None:
    ctx = context(tree)
    assert_check(kubelet.check_kubelet_dir(ctx), Status.FAIL, "/var/lib/kubelet does not exist",
                 fix="--kubelet-dir")
    tree.dir("/var/lib/kubelet")
    assert_check(kubelet.check_kubelet_dir(ctx), Status.WARN, "no plugins_registry, plugins",
                 fix="--root-dir")
    tree.dir("/var/lib/kubelet/plugins_registry").dir("/var/lib/kubelet/plugins")
    assert_check(kubelet.check_kubelet_dir(ctx), Status.OK, "plugins_registry/ and plugins/")


def test_registration_socket(tree: Tree) -> None:
    registry = "/var/lib/kubelet/plugins_registry"
    assert_check(kubelet.check_registration(context(tree)), Status.SKIPPED, "does not exist")
    tree.dir(registry)
    assert_check(kubelet.check_registration(context(tree)), Status.FAIL,
                 "no dra-agent.io-reg.sock", fix="start the agent")
    tree.write(f"{registry}/dra-agent.io-reg.sock", "not a socket")
    assert_check(kubelet.check_registration(context(tree)), Status.FAIL, "is not a socket",
                 fix="start the agent")
    tree.local(f"{registry}/dra-agent.io-reg.sock").unlink()
    tree.socket(f"{registry}/dra-agent.io-0f1e-reg.sock")  # rolling-update mode's name
    assert_check(kubelet.check_registration(context(tree)), Status.OK,
                 "dra-agent.io-0f1e-reg.sock")


def test_a_custom_kubelet_dir_is_read_first(tree: Tree) -> None:
    tree.write("/data/kubelet/config.yaml", HEAD + "featureGates: {DRAAdminAccess: true}\n")
    tree.write(CONFIG, HEAD + "featureGates: {DynamicResourceAllocation: false}\n")
    ctx = context(tree, options=Options(kubelet_dir=PurePosixPath("/data/kubelet")))
    assert_check(kubelet.check_gates(ctx), Status.OK, "/data/kubelet/config.yaml",
                 "DRAAdminAccess=true")


@pytest.mark.parametrize(("raw", "found"), [
    (b"[" * 50000 + b"]" * 50000, "nested too deeply"),
    (bytes(range(256)), "not UTF-8"),
    (b"# " + b"x" * (2 << 20), "over the 1048576-byte cap"),
])
def test_hostile_kubelet_config_is_one_warning(tree: Tree, raw: bytes, found: str) -> None:
    tree.write(CONFIG, raw)
    check = kubelet.check_gates(context(tree))
    assert_check(check, Status.WARN, found, fix="fix the kubelet config")
    assert len(check.found) < 400
