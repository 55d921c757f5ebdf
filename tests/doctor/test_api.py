"""API server checks against a fake ``KubeHTTP``: discovery, slices, classes, RBAC."""

from __future__ import annotations

from typing import Any

import yaml

from agent.doctor import api
from agent.doctor.model import Status
from agent.kube.errors import KubeAPIError
from discovery.model import Device, DeviceType, Inventory
from tests.conftest import REPO
from tests.doctor.conftest import FakeHttp, Tree, assert_check, context

GROUP = ("GET", "/apis/resource.k8s.io")
SLICES = ("GET", "/apis/resource.k8s.io/v1/resourceslices")


def _served(*versions: str) -> dict[tuple[str, str], Any]:
    return {GROUP: (200, {"versions": [{"version": v} for v in versions]})}


def _inventory(n: int) -> Inventory:
    return Inventory(tuple(Device(f"gpu-{i}", DeviceType.GPU, {}, {}) for i in range(n)))


def _slice(devices: int, generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": f"s{generation}"}, "spec": {
        "driver": "dra-agent.io", "nodeName": "n1",
        "pool": {"name": "n1", "generation": generation, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}"} for i in range(devices)]}}


def test_without_a_client_everything_is_skipped_with_the_reason(tree: Tree) -> None:
    ctx = context(tree, api_skip="--kubeconfig none: no API server")
    for func in (api.check_reachable, api.check_versions, api.check_slices, api.check_classes,
                 api.check_rbac):
        assert_check(func(ctx), Status.SKIPPED, "--kubeconfig none")


def test_unusable_credentials_warn_once(tree: Tree) -> None:
    ctx = context(tree, api_skip="no client (see API server)",
                  api_error="cannot build a Kubernetes client from kubeconfig /k: bad token")
    assert_check(api.check_reachable(ctx), Status.WARN, "bad token", fix="fix the kubeconfig")
    assert_check(api.check_slices(ctx), Status.SKIPPED, "see API server")


def test_reachable_and_not(tree: Tree) -> None:
    http = FakeHttp({("GET", "/version"): (200, {"gitVersion": "v1.35.1"})})
    assert_check(api.check_reachable(context(tree, api=http)), Status.OK, "Kubernetes v1.35.1")
    down = FakeHttp({("GET", "/version"): KubeAPIError("GET", "/version", 0, "",
                                                        "connection refused")})
    ctx = context(tree, api=down)
    assert_check(api.check_reachable(ctx), Status.WARN,
                 "https://10.0.0.1:6443", "connection refused", fix="network")
    assert_check(api.check_slices(ctx), Status.SKIPPED, "did not answer")
    assert_check(api.check_rbac(ctx), Status.SKIPPED, "did not answer")
    assert [r[1] for r in down.requests] == ["/version"]  # asked once, for every check


def test_versions(tree: Tree) -> None:
    ok = context(tree, api=FakeHttp(_served("v1", "v1beta2")))
    assert_check(api.check_versions(ok), Status.OK, "served: v1, v1beta2; the agent uses v1")
    old = context(tree, api=FakeHttp(_served("v1alpha3")))
    assert_check(api.check_versions(old), Status.FAIL, "served: v1alpha3", fix="1.34")
    none = context(tree, api=FakeHttp({}))  # the group is not served at all: 404
    assert_check(api.check_versions(none), Status.FAIL, "served: none", fix="1.34")


def test_slices_match_discovery(tree: Tree) -> None:
    http = FakeHttp({**_served("v1"), SLICES: (200, {"items": [_slice(8)], "metadata": {}})})
    ctx = context(tree, api=http, discover=lambda: _inventory(8))
    assert_check(api.check_slices(ctx), Status.OK, "1 slice(s) with 8 device(s)")
    query = dict(http.requests[-1][2])
    assert query["fieldSelector"] == "spec.driver=dra-agent.io,spec.nodeName=n1"


def test_slices_count_only_the_newest_generation(tree: Tree) -> None:
    items = [_slice(8, 1), _slice(6, 2)]
    http = FakeHttp({**_served("v1"), SLICES: (200, {"items": items, "metadata": {}})})
    ctx = context(tree, api=http, discover=lambda: _inventory(6))
    assert_check(api.check_slices(ctx), Status.OK, "2 slice(s) with 6 device(s)")


def test_no_slices_or_a_different_count_fails(tree: Tree) -> None:
    empty = FakeHttp({**_served("v1"), SLICES: (200, {"items": []})})
    ctx = context(tree, api=empty, discover=lambda: _inventory(8))
    assert_check(api.check_slices(ctx), Status.FAIL, "no ResourceSlice", "finds 8 device(s)",
                 fix="agent's log")
    short = FakeHttp({**_served("v1"), SLICES: (200, {"items": [_slice(7)]})})
    ctx = context(tree, api=short, discover=lambda: _inventory(8))
    assert_check(api.check_slices(ctx), Status.FAIL, "publish 7 device(s); discovery finds 8",
                 fix="agent's log")


def test_slices_in_v1beta1_are_read_in_their_shape(tree: Tree) -> None:
    old = _slice(2)
    old["spec"]["devices"] = [{"name": "a", "basic": {}}, {"name": "b", "basic": {}}]
    http = FakeHttp({**_served("v1beta1"),
                     ("GET", "/apis/resource.k8s.io/v1beta1/resourceslices"): (200, {
                         "items": [old]})})
    ctx = context(tree, api=http, discover=lambda: _inventory(2))
    assert_check(api.check_slices(ctx), Status.OK, "2 device(s)")


def test_forbidden_slices_list_warns(tree: Tree) -> None:
    http = FakeHttp({**_served("v1"), SLICES: (403, {"kind": "Status", "code": 403,
                                                     "reason": "Forbidden",
                                                     "message": "no list for you"})})
    check = api.check_slices(context(tree, api=http, discover=lambda: _inventory(1)))
    assert_check(check, Status.WARN, "403", "no list for you", fix="RBAC")


def test_device_classes(tree: Tree) -> None:
    names = api.shipped_classes(("gpu", "mig", "nic", "vf"))
    assert names == ["gpu.dra-agent.io", "mig.dra-agent.io", "nic.dra-agent.io",
                     "vf.dra-agent.io"]
    present = {("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{n}"): (200, {}) for n in names}
    ctx = context(tree, api=FakeHttp({**_served("v1"), **present}))
    assert_check(api.check_classes(ctx), Status.OK, "installed: gpu.dra-agent.io")
    del present[("GET", "/apis/resource.k8s.io/v1/deviceclasses/nic.dra-agent.io")]
    ctx = context(tree, api=FakeHttp({**_served("v1"), **present}))
    assert_check(api.check_classes(ctx), Status.FAIL, "not installed: nic.dra-agent.io",
                 fix="kubectl apply -f deploy/base/deviceclasses.yaml")


def test_rbac_allowed_denied_and_optional(tree: Tree) -> None:
    assert_check(api.check_rbac(context(tree, api=FakeHttp())), Status.OK,
                 "may do all 10 things")
    denied = FakeHttp(reviews=lambda a: not (a["resource"] == "resourceslices"
                                             and a["verb"] == "delete"))
    assert_check(api.check_rbac(context(tree, api=denied)), Status.FAIL,
                 "may not: delete resourceslices", fix="deploy/base/rbac.yaml")
    status = FakeHttp(reviews=lambda a: a.get("subresource") != "status")
    assert_check(api.check_rbac(context(tree, api=status)), Status.WARN,
                 "may not: patch resourceclaims/status", fix="rbac.yaml")


def test_rbac_asks_for_its_own_node_and_skips_node_credentials(tree: Tree) -> None:
    http = FakeHttp()
    api.check_rbac(context(tree, api=http))
    assert len([r for r in http.requests if r[1].endswith("accessreviews")]) == 10
    node = FakeHttp(user="system:node:n1")
    assert_check(api.check_rbac(context(tree, api=node)), Status.SKIPPED,
                 "system:node:n1: the Node authorizer decides per object")


def test_permissions_are_what_the_cluster_role_grants() -> None:
    doc = next(yaml.safe_load_all((REPO / "deploy/base/rbac.yaml").read_text()))
    granted = set()
    for rule in doc["rules"]:
        if rule.get("resourceNames"):
            continue  # per-driver synthetic subresources: not something a review can ask
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                name, _, sub = resource.partition("/")
                granted |= {(group, name, sub, verb) for verb in rule["verbs"]}
    assert {p[:4] for p in api.PERMISSIONS} == granted


def test_the_group_is_the_slice_controllers() -> None:
    from agent.slices.versions import GROUP as SLICES_GROUP

    assert api.GROUP == SLICES_GROUP


def test_slices_of_a_strange_shape_count_nothing() -> None:
    odd: list[dict[str, Any]] = [{"spec": {"pool": {"name": "p", "generation": "x"},
                                           "devices": "abc"}}, {"spec": None}, {}]
    assert api.published_devices(odd) == 0


def test_rbac_without_listing_device_classes_warns_with_what_is_lost(tree: Tree) -> None:
    http = FakeHttp(reviews=lambda a: a["resource"] != "deviceclasses")
    assert_check(api.check_rbac(context(tree, api=http)), Status.WARN,
                 "may not: list deviceclasses", "the shipped ones stand in", fix="rbac.yaml")
