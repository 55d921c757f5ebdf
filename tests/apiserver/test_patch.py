"""PATCH: merge, strategic merge, JSON patch, server-side apply, 415, dry run."""

from __future__ import annotations

from kubernetes import client, dynamic

from tests.apiserver.conftest import fails, make_claim, make_slice, raw
from tests.fakes.apiserver import FakeAPIServer

MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"


def test_merge_patch_replaces_lists_and_null_deletes(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s1", devices=2)
    body["metadata"]["labels"] = {"a": "1", "b": "2"}
    raw(rapi.create_resource_slice, body)
    out = raw(rapi.patch_resource_slice, "s1",
              {"metadata": {"labels": {"a": None}}, "spec": {"devices": [{"name": "only"}]}},
              _content_type=MERGE)
    assert out["metadata"]["labels"] == {"b": "2"}
    assert [d["name"] for d in out["spec"]["devices"]] == ["only"]
    assert out["metadata"]["generation"] == 2


def test_merge_patch_with_stale_resource_version_is_409(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    code, body = fails(rapi.patch_resource_slice, "s1",
                       {"metadata": {"resourceVersion": "2"}, "spec": {"devices": []}},
                       _content_type=MERGE)
    assert code == 409 and body["reason"] == "Conflict"


def test_strategic_merge_is_accepted_and_lists_are_atomic(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1", devices=3))
    out = raw(rapi.patch_resource_slice, "s1", {"spec": {"devices": [{"name": "x"}]}})
    assert [d["name"] for d in out["spec"]["devices"]] == ["x"]


def test_strategic_merge_merges_reserved_for_by_uid(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    result = {"driver": "d.io", "pool": "p", "device": "gpu-0", "request": "gpu"}
    raw(rapi.patch_namespaced_resource_claim_status, "claim", "default", {"status": {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "a", "uid": "ua"}]}})
    out = raw(rapi.patch_namespaced_resource_claim_status, "claim", "default", {"status": {
        "reservedFor": [{"resource": "pods", "name": "b", "uid": "ub"}]}})
    # Upstream's element order puts the patch's items before the server-only ones.
    assert [r["uid"] for r in out["status"]["reservedFor"]] == ["ub", "ua"]
    out = raw(rapi.patch_namespaced_resource_claim_status, "claim", "default", {"status": {
        "reservedFor": [{"uid": "ua", "$patch": "delete"}]}})
    assert [r["uid"] for r in out["status"]["reservedFor"]] == ["ub"]


def test_json_patch_and_failed_test_op(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    out = raw(rapi.patch_resource_slice, "s1", [
        {"op": "test", "path": "/spec/devices/0/name", "value": "gpu-0"},
        {"op": "add", "path": "/spec/devices/-", "value": {"name": "gpu-1"}},
        {"op": "replace", "path": "/spec/pool/generation", "value": 5},
    ])
    assert [d["name"] for d in out["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert out["spec"]["pool"]["generation"] == 5
    code, _ = fails(rapi.patch_resource_slice, "s1",
                    [{"op": "test", "path": "/spec/driver", "value": "other"}])
    assert code == 422
    code, _ = fails(rapi.patch_resource_slice, "s1",
                    [{"op": "remove", "path": "/spec/nothing/here"}])
    assert code == 422


def test_unknown_patch_type_is_415(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    code, body = fails(rapi.patch_resource_slice, "s1", {"spec": {}},
                       _content_type="application/json")
    # The route refuses the type before any handler runs: a bare go-restful message.
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
    assert body["message"] == "415: Unsupported Media Type"


def test_patch_missing_object_is_404(rapi: client.ResourceV1Api) -> None:
    assert fails(rapi.patch_resource_slice, "ghost", {"spec": {}}, _content_type=MERGE)[0] == 404


def test_apply_requires_field_manager(rapi: client.ResourceV1Api) -> None:
    code, body = fails(rapi.patch_resource_slice, "s1", make_slice("s1"), _content_type=APPLY)
    assert code == 422 and body["details"]["kind"] == "PatchOptions"
    assert body["message"] == ('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required '
                               "value: is required for apply patch")


def test_force_on_non_apply_patch_is_422(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    code, _ = fails(rapi.patch_resource_slice, "s1", {"spec": {}}, force=True,
                    _content_type=MERGE)
    assert code == 422


def test_apply_creates_then_updates_and_removes_dropped_fields(
    srv: FakeAPIServer, rapi: client.ResourceV1Api
) -> None:
    body = make_slice("s1")
    body["metadata"]["labels"] = {"mine": "yes"}
    resp = rapi.patch_resource_slice("s1", body, field_manager="dra-agent", _content_type=APPLY,
                                     _preload_content=False)
    assert resp.status == 201
    body["metadata"]["labels"] = {}
    del body["metadata"]["labels"]
    body["spec"]["devices"].append({"name": "gpu-1"})
    out = raw(rapi.patch_resource_slice, "s1", body, field_manager="dra-agent",
              _content_type=APPLY)
    assert "labels" not in out["metadata"]  # no longer applied, so removed
    assert [d["name"] for d in out["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert out["metadata"]["generation"] == 2
    before = srv.resource_version
    raw(rapi.patch_resource_slice, "s1", body, field_manager="dra-agent", _content_type=APPLY)
    assert srv.resource_version == before  # same apply again: no write


def test_apply_conflict_with_other_manager_and_force(rapi: client.ResourceV1Api) -> None:
    raw(rapi.patch_resource_slice, "s1", make_slice("s1"), field_manager="a",
        _content_type=APPLY)
    other = make_slice("s1", devices=2)
    code, body = fails(rapi.patch_resource_slice, "s1", other, field_manager="b",
                       _content_type=APPLY)
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"].startswith("Apply failed with 1 conflict: conflict with \"a\"")
    assert body["details"]["causes"][0]["field"] == ".spec.devices"
    out = raw(rapi.patch_resource_slice, "s1", other, field_manager="b", force=True,
              _content_type=APPLY)
    assert len(out["spec"]["devices"]) == 2


def test_apply_same_values_by_two_managers_do_not_conflict(rapi: client.ResourceV1Api) -> None:
    raw(rapi.patch_resource_slice, "s1", make_slice("s1"), field_manager="a",
        _content_type=APPLY)
    raw(rapi.patch_resource_slice, "s1", make_slice("s1"), field_manager="b",
        _content_type=APPLY)


def test_apply_conflicts_with_an_update_by_another_client(rapi: client.ResourceV1Api) -> None:
    obj = raw(rapi.patch_resource_slice, "s1", make_slice("s1"), field_manager="agent",
              _content_type=APPLY)
    obj["spec"]["devices"] = [{"name": "edited"}]
    raw(rapi.replace_resource_slice, "s1", obj, field_manager="kubectl-edit")
    code, body = fails(rapi.patch_resource_slice, "s1", make_slice("s1"), field_manager="agent",
                       _content_type=APPLY)
    assert code == 409 and '"kubectl-edit"' in body["message"]


def test_apply_through_dynamic_client(api_client: client.ApiClient) -> None:
    dyn = dynamic.DynamicClient(api_client)
    slices = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    out = slices.server_side_apply(body=make_slice("s1"), name="s1", field_manager="dyn")
    assert out.metadata.name == "s1"
    assert [i.metadata.name for i in slices.get().items] == ["s1"]


def test_dry_run_stores_nothing(srv: FakeAPIServer, rapi: client.ResourceV1Api) -> None:
    before = srv.resource_version
    out = raw(rapi.create_resource_slice, make_slice("s1"), dry_run="All")
    assert out["metadata"]["name"] == "s1"
    assert srv.get_object("resourceslices", "s1") is None
    assert srv.resource_version == before


def test_apply_to_claim_status_changes_only_status(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    result = {"driver": "d.io", "pool": "p", "device": "gpu-0", "request": "gpu"}
    raw(rapi.patch_namespaced_resource_claim_status, "claim", "default",
        {"status": {"allocation": {"devices": {"results": [result]}}}}, _content_type=MERGE)
    cfg = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "claim", "namespace": "default", "labels": {"x": "y"}},
           "status": {"devices": [{"driver": "d.io", "pool": "p", "device": "gpu-0",
                                   "conditions": []}]}}
    out = raw(rapi.patch_namespaced_resource_claim_status, "claim", "default", cfg,
              field_manager="d.io", force=True, _content_type=APPLY)
    assert out["status"]["devices"][0]["device"] == "gpu-0"
    assert out["status"]["allocation"]["devices"]["results"] == [result]
    assert "labels" not in out["metadata"]


def test_racing_updates_one_wins_one_gets_409(rapi: client.ResourceV1Api) -> None:
    base = raw(rapi.create_resource_slice, make_slice("s1"))
    a = {**base, "spec": {**base["spec"], "devices": []}}
    b = {**base, "spec": {**base["spec"], "devices": [{"name": "other"}]}}
    raw(rapi.replace_resource_slice, "s1", a)
    assert fails(rapi.replace_resource_slice, "s1", b)[0] == 409
