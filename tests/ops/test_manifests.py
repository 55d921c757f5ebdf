"""deploy/: every document valid against the Kubernetes 1.35, 1.36 and 1.37 OpenAPI,
strictly; every overlay rendered (by kubectl where present, always by tests/ops/kustomize.py)
and valid; and the objects agree with each other and with the agent's own defaults."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent import __version__
from agent.common.config import Config
from agent.httpserver import parse_address
from tests.conftest import REPO
from tests.ops.kustomize import KustomizeError, render
from tests.ops.openapi import KUBE_VERSIONS, OpenAPI, load_documents, swagger

DEPLOY = REPO / "deploy"
TARGETS = ["base", "overlays/simulated", "overlays/gpu-node"]
Obj = dict[str, Any]


@pytest.fixture(scope="module", params=KUBE_VERSIONS)
def api(request: pytest.FixtureRequest) -> OpenAPI:
    """Each supported minor's schema: the manifests must be valid on all of them."""
    return OpenAPI(swagger(request.param))


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {target: render(DEPLOY / target) for target in TARGETS}


def _ident(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _one(objects: list[Obj], kind: str) -> Obj:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


def _yaml_files() -> list[Path]:
    # deploy/helm holds Helm templates, not manifests: tests/ops/test_helm.py renders them.
    return sorted(p for p in DEPLOY.rglob("*.yaml") if DEPLOY / "helm" not in p.parents)


# --- schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_document_is_valid(api: OpenAPI, path: Path) -> None:
    docs = load_documents(path)
    assert docs, f"{path} is empty"
    for doc in docs:
        if isinstance(doc, list):  # a JSON 6902 patch: checked once applied, below
            assert all({"op", "path"} <= set(op) for op in doc), doc
            continue
        if doc.get("kind") == "Kustomization":
            continue  # checked by rendering
        # Strategic merge patches in overlays are partial objects: types and field names
        # still have to be right, required fields are the base's business.
        partial = "overlays" in path.parts
        assert api.errors(doc, partial=partial) == []


def test_every_base_file_is_used() -> None:
    (kustomization,) = load_documents(DEPLOY / "base" / "kustomization.yaml")
    listed = set(kustomization["resources"]) | {"kustomization.yaml"}
    present = {p.name for p in (DEPLOY / "base").glob("*.yaml")}
    assert present == listed


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_output_is_valid(
    api: OpenAPI, rendered: dict[str, list[Obj]], target: str
) -> None:
    objects = rendered[target]
    errors = [e for obj in objects for e in api.errors(obj)]
    assert errors == []
    idents = [_ident(o) for o in objects]
    assert len(idents) == len(set(idents)), "duplicate objects"
    for obj in objects:
        has_ns = "namespace" in obj["metadata"]
        assert has_ns == api.is_namespaced(obj), f"{_ident(obj)}: namespace set wrongly"


@pytest.mark.parametrize("target", TARGETS)
def test_renderer_agrees_with_kubectl(rendered: dict[str, list[Obj]], target: str) -> None:
    """Cross-checks the test renderer where kubectl exists (it does on dev machines)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("kubectl not installed: rendered by tests/ops/kustomize.py only")
        return
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / target)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    theirs = {_ident(o): o for o in yaml.safe_load_all(out.stdout) if o}
    mine = {_ident(o): o for o in rendered[target]}
    assert mine == theirs


def test_validator_rejects_what_strict_kubectl_rejects(api: OpenAPI) -> None:
    (ds,) = load_documents(DEPLOY / "base" / "daemonset.yaml")
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = 9464
    del ds["spec"]["selector"]
    container = ds["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["requests"]["memory"] = "96MB"
    errors = "\n".join(api.errors(ds))
    assert "'hostNetwrok' was unexpected" in errors
    assert "9464 is not of type 'string'" in errors
    assert "'selector' is a required property" in errors
    assert "'96MB' does not match" in errors
    assert api.errors({"apiVersion": "resource.k8s.io/v9", "kind": "DeviceClass"}) == [
        "unknown kind resource.k8s.io/v9/DeviceClass"
    ]


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "dup.yaml"
    bad.write_text("apiVersion: v1\nkind: Namespace\nkind: Namespace\nmetadata: {name: x}\n")
    with pytest.raises(yaml.YAMLError, match="duplicate key 'kind'"):
        load_documents(bad)


# --- the objects agree with each other ------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_references_resolve(rendered: dict[str, list[Obj]], target: str) -> None:
    objects = rendered[target]
    ds, sa = _one(objects, "DaemonSet"), _one(objects, "ServiceAccount")
    pod = ds["spec"]["template"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert ds["metadata"]["namespace"] == sa["metadata"]["namespace"]
    role, binding = _one(objects, "ClusterRole"), _one(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"],
         "namespace": sa["metadata"]["namespace"]}
    ]
    vap = _one(objects, "ValidatingAdmissionPolicy")
    vapb = _one(objects, "ValidatingAdmissionPolicyBinding")
    assert vapb["spec"]["policyName"] == vap["metadata"]["name"]
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    (condition,) = vap["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    ns = _one(objects, "Namespace")
    assert ns["metadata"]["name"] == sa["metadata"]["namespace"]
    containers = pod["spec"]["containers"]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    mounts = {m["name"] for c in containers for m in c.get("volumeMounts", [])}
    assert mounts == volumes, "every volume mounted, every mount declared"


def test_rbac_is_exactly_what_the_agent_does(rendered: dict[str, list[Obj]]) -> None:
    rules = _one(rendered["base"], "ClusterRole")["rules"]
    granted = {
        (group, resource, verb)
        for r in rules for group in r["apiGroups"] for resource in r["resources"]
        for verb in r["verbs"]
    }
    # Exactly the requests agent/slices/api.py, agent/claim/status.py and agent/deviceplugins.py
    # send; that these are also enough is proven against a real server
    # (tests/realk8s/test_daemonset_identity.py).
    slice_verbs = ["get", "list", "watch", "create", "update", "delete"]
    expected = {("resource.k8s.io", "resourceslices", v) for v in slice_verbs}
    expected |= {("resource.k8s.io", "resourceclaims", "get")}
    expected |= {("resource.k8s.io", "resourceclaims/status", "patch")}
    expected |= {("resource.k8s.io", "resourceclaims/driver", "associated-node:patch")}
    expected |= {("", "nodes", "get"), ("resource.k8s.io", "deviceclasses", "list")}
    assert granted == expected
    assert not any("nonResourceURLs" in r for r in rules)
    # The per-driver rule names our driver, and only it.
    (driver_rule,) = [r for r in rules if "resourceNames" in r]
    assert driver_rule["resources"] == ["resourceclaims/driver"]
    assert driver_rule["resourceNames"] == [Config().driver_name]


# --- the DaemonSet and the agent agree -------------------------------------------------------


@pytest.fixture(scope="module")
def daemonset(rendered: dict[str, list[Obj]]) -> Obj:
    return _one(rendered["base"], "DaemonSet")


def _container(ds: Obj) -> Obj:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def test_rolling_update_surges_without_losing_the_plugin(daemonset: Obj) -> None:
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    container = _container(daemonset)
    assert container["args"][:2] == ["run", "--rolling-update"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # With hostNetwork a declared port becomes a hostPort and blocks the surge pod.
    assert daemonset["spec"]["template"]["spec"]["hostNetwork"] is True
    assert "ports" not in container


def test_probes_hit_the_metrics_address(daemonset: Obj) -> None:
    container = _container(daemonset)
    (flag,) = [a for a in container["args"] if a.startswith("--metrics-address=")]
    address = flag.split("=", 1)[1]
    # Kubernetes expands $(VAR) only for variables defined earlier in env.
    env_names = [e["name"] for e in container["env"]]
    for var in re.findall(r"\$\((\w+)\)", address):
        assert var in env_names
    _, port = parse_address(address.replace("$(POD_IP)", "10.0.0.1"))
    probes = {k: container[k]["httpGet"] for k in
              ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {p["port"] for p in probes.values()} == {port}
    assert probes["livenessProbe"]["path"] == "/healthz"
    assert probes["startupProbe"]["path"] == "/healthz"
    assert probes["readinessProbe"]["path"] == "/readyz"
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)


def test_host_paths_are_the_agents_defaults(daemonset: Obj) -> None:
    cfg = Config()
    pod = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in _container(daemonset)["volumeMounts"]}
    # The kubelet dials the socket path the agent registers: same path inside and out.
    for path in (cfg.plugin_dir, cfg.registry_dir, cfg.cdi_dir):
        mount = mounts[str(path)]
        assert volumes[mount["name"]]["hostPath"]["path"] == str(path)
        assert not mount.get("readOnly")
    assert mounts[str(cfg.sysfs_root)]["readOnly"] is True
    assert volumes[mounts["/dev"]["name"]]["hostPath"]["path"] == "/dev"


def test_container_is_hardened_and_sized(daemonset: Obj) -> None:
    container = _container(daemonset)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    requests = container["resources"]["requests"]
    assert {"cpu", "memory"} <= set(requests)
    assert "memory" in container["resources"]["limits"]


def test_image_tag_is_the_package_version(rendered: dict[str, list[Obj]]) -> None:
    for target in TARGETS:
        image = _container(_one(rendered[target], "DaemonSet"))["image"]
        assert image == f"dra-agent:{__version__}"


def test_overlays_change_only_what_they_are_for(rendered: dict[str, list[Obj]]) -> None:
    base = {_ident(o): o for o in rendered["base"]}
    for target in ("overlays/simulated", "overlays/gpu-node"):
        changed = {_ident(o) for o in rendered[target] if base.get(_ident(o)) != o}
        assert {i[1] for i in changed} == {"DaemonSet"}, target
    sim = _container(_one(rendered["overlays/simulated"], "DaemonSet"))
    assert sim["args"][-1] == "--simulate=dgx-h100"
    gpu = _one(rendered["overlays/gpu-node"], "DaemonSet")["spec"]["template"]["spec"]
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    mounts = {m["mountPath"]: m for m in gpu["containers"][0]["volumeMounts"]}
    driver = {p: m for p, m in mounts.items() if p.startswith("/driver-root/")}
    assert {"/driver-root/usr", "/driver-root/etc/ld.so.cache"} <= set(driver)
    assert all(m["readOnly"] is True for m in driver.values())


def test_no_target_mounts_the_hosts_root(rendered: dict[str, list[Obj]]) -> None:
    # A path-handling bug must not reach the kubelet's or the runtime's credentials: the
    # agent gets the directories it works in, never the host's `/`.
    for target in TARGETS:
        pod = _one(rendered[target], "DaemonSet")["spec"]["template"]["spec"]
        host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        assert "/" not in host_paths, target
        assert not host_paths & {"/etc", "/var", "/var/lib", "/var/lib/kubelet", "/run"}, target


def test_the_nodes_own_address_is_reserved(daemonset: Obj) -> None:
    container = _container(daemonset)
    env = {e["name"]: e for e in container["env"]}
    (flag,) = [a for a in container["args"] if a.startswith("--node-address=")]
    var = flag.removeprefix("--node-address=$(").removesuffix(")")
    assert env[var]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"


# --- the renderer refuses what it does not implement ------------------------------------------


def _kustomization(tmp_path: Path, text: str, **files: str) -> Path:
    (tmp_path / "kustomization.yaml").write_text(text)
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    return tmp_path


NS = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: n}\ndata: {a: b}\n"


def test_renderer_refuses_unsupported_fields(tmp_path: Path) -> None:
    d = _kustomization(tmp_path, "resources: [cm.yaml]\nnamePrefix: x-\n", **{"cm.yaml": NS})
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(d)


def test_renderer_refuses_a_patch_that_matches_nothing(tmp_path: Path) -> None:
    d = _kustomization(
        tmp_path,
        "resources: [cm.yaml]\npatches:\n- path: p.yaml\n",
        **{"cm.yaml": NS, "p.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\n"},
    )
    with pytest.raises(KustomizeError, match="matches no resource"):
        render(d)


def test_renderer_json6902_needs_a_target_and_applies_ops(tmp_path: Path) -> None:
    ops = "- op: replace\n  path: /data/a\n  value: c\n- op: add\n  path: /data/b\n  value: d\n"
    d = _kustomization(
        tmp_path, "resources: [cm.yaml]\npatches:\n- path: p.yaml\n",
        **{"cm.yaml": NS, "p.yaml": ops},
    )
    with pytest.raises(KustomizeError, match="needs a target"):
        render(d)
    (d / "kustomization.yaml").write_text(
        "resources: [cm.yaml]\npatches:\n- path: p.yaml\n  target: {kind: ConfigMap, name: x}\n"
    )
    (obj,) = render(d)
    assert obj["data"] == {"a": "c", "b": "d"}
