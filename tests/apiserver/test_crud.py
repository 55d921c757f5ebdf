"""Create, read, update, delete as a 1.36 kube-apiserver answers them."""

from __future__ import annotations

import re
import uuid

import pytest
from kubernetes import client

from tests.apiserver.conftest import fails, make_claim, make_node, make_slice, raw
from tests.fakes.apiserver import FakeAPIServer


def test_create_fills_server_metadata(rapi: client.ResourceV1Api) -> None:
    body = make_slice(generate="node-a-dra-agent.io-")
    body["metadata"]["uid"] = "client-chosen"
    out = raw(rapi.create_resource_slice, body)
    meta = out["metadata"]
    assert out["apiVersion"] == "resource.k8s.io/v1" and out["kind"] == "ResourceSlice"
    assert re.fullmatch(r"node-a-dra-agent\.io-[bcdfghjklmnpqrstvwxz2456789]{5}", meta["name"])
    assert meta["uid"] != "client-chosen" and uuid.UUID(meta["uid"]).version == 4
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0


def test_generate_name_prefix_is_cut_to_58(rapi: client.ResourceV1Api) -> None:
    prefix = "a" * 70
    out = rapi.create_resource_slice(make_slice(generate=prefix))
    assert len(out.metadata.name) == 63 and out.metadata.name.startswith("a" * 58)


def test_one_revision_counter_for_all_kinds(
    srv: FakeAPIServer, rapi: client.ResourceV1Api, core: client.CoreV1Api
) -> None:
    node = core.create_node(make_node())
    s = rapi.create_resource_slice(make_slice())
    claim = rapi.create_namespaced_resource_claim("default", make_claim())
    rvs = [int(o.metadata.resource_version) for o in (node, s, claim)]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3
    assert rvs[-1] == srv.resource_version


def test_get_missing_is_404_status(rapi: client.ResourceV1Api) -> None:
    code, body = fails(rapi.read_resource_slice, "nope")
    assert code == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404
    assert body["message"] == 'resourceslices.resource.k8s.io "nope" not found'
    assert body["details"] == {"name": "nope", "group": "resource.k8s.io",
                               "kind": "resourceslices"}


def test_create_existing_name_is_409_already_exists(rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("s1"))
    code, body = fails(rapi.create_resource_slice, make_slice("s1"))
    assert code == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'resourceslices.resource.k8s.io "s1" already exists'


def test_create_with_resource_version_is_500(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s1")
    body["metadata"]["resourceVersion"] = "5"
    code, status = fails(rapi.create_resource_slice, body)
    assert code == 500
    assert status["message"] == "resourceVersion should not be set on objects to be created"


def test_update_with_stale_resource_version_is_409_conflict(rapi: client.ResourceV1Api) -> None:
    first = raw(rapi.create_resource_slice, make_slice("s1"))
    second = dict(first)
    first["spec"]["pool"]["generation"] = 2
    raw(rapi.replace_resource_slice, "s1", first)
    second["spec"] = {**second["spec"], "pool": {"name": "node-a", "generation": 3,
                                                 "resourceSliceCount": 1}}
    code, body = fails(rapi.replace_resource_slice, "s1", second)
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has '
        "been modified; please apply your changes to the latest version and try again")


def test_update_without_resource_version_is_unconditional(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    body = make_slice("s1", devices=2)
    out = raw(rapi.replace_resource_slice, "s1", body)
    assert len(out["spec"]["devices"]) == 2


def test_update_missing_object_is_404(rapi: client.ResourceV1Api) -> None:
    code, _ = fails(rapi.replace_resource_slice, "ghost", make_slice("ghost"))
    assert code == 404


def test_update_name_mismatch_is_400(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    code, body = fails(rapi.replace_resource_slice, "s1", make_slice("s2"))
    assert code == 400 and "does not match the name on the URL" in body["message"]


def test_generation_bumps_on_spec_change_only(rapi: client.ResourceV1Api) -> None:
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    obj["metadata"]["labels"] = {"a": "b"}
    obj = raw(rapi.replace_resource_slice, "s1", obj)
    assert obj["metadata"]["generation"] == 1
    obj["spec"]["devices"].append({"name": "gpu-9"})
    obj["metadata"]["generation"] = 42  # clients cannot set it
    obj = raw(rapi.replace_resource_slice, "s1", obj)
    assert obj["metadata"]["generation"] == 2


def test_noop_update_keeps_revision_and_sends_nothing(
    srv: FakeAPIServer, rapi: client.ResourceV1Api
) -> None:
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    before = srv.resource_version
    again = raw(rapi.replace_resource_slice, "s1", obj)
    assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    assert srv.resource_version == before


def test_creation_timestamp_and_uid_survive_update(rapi: client.ResourceV1Api) -> None:
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    changed = make_slice("s1", devices=3)
    changed["metadata"]["creationTimestamp"] = "2000-01-01T00:00:00Z"
    out = raw(rapi.replace_resource_slice, "s1", changed)
    assert out["metadata"]["uid"] == obj["metadata"]["uid"]
    assert out["metadata"]["creationTimestamp"] == obj["metadata"]["creationTimestamp"]
    # A uid in the body is a storage precondition: a mismatch is a 409, not a 422.
    changed["metadata"]["uid"] = "other"
    code, body = fails(rapi.replace_resource_slice, "s1", changed)
    assert code == 409 and body["reason"] == "Conflict"
    assert body["details"]["kind"] == "resourceslices"
    assert ("Precondition failed: UID in precondition: other, UID in object meta: "
            f"{obj['metadata']['uid']}") in body["message"]


def test_delete_returns_object_with_deletion_revision(
    srv: FakeAPIServer, rapi: client.ResourceV1Api
) -> None:
    raw(rapi.create_resource_slice, make_slice("s1"))
    out = raw(rapi.delete_resource_slice, "s1")
    assert out["kind"] == "ResourceSlice"
    assert out["metadata"]["resourceVersion"] == str(srv.resource_version)
    assert fails(rapi.delete_resource_slice, "s1")[0] == 404


def test_delete_preconditions_mismatch_is_409(rapi: client.ResourceV1Api) -> None:
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    code, body = fails(rapi.delete_resource_slice, "s1", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid="wrong-uid")))
    # rest.BeforeDelete checks first and names the resource by its Kind.
    assert code == 409 and body["reason"] == "Conflict"
    assert body["details"]["kind"] == "ResourceSlice"
    assert body["message"] == (
        'Operation cannot be fulfilled on ResourceSlice.resource.k8s.io "s1": the UID in the '
        f"precondition (wrong-uid) does not match the UID in record ({obj['metadata']['uid']}). "
        "The object might have been deleted and then recreated")
    code, body = fails(rapi.delete_resource_slice, "s1", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=obj["metadata"]["uid"], resource_version="1")))
    assert code == 409
    assert ("the ResourceVersion in the precondition (1) does not match the ResourceVersion in "
            f"record ({obj['metadata']['resourceVersion']}). The object might have been "
            "modified") in body["message"]
    meta = obj["metadata"]
    raw(rapi.delete_resource_slice, "s1", body=client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid=meta["uid"],
                                             resource_version=meta["resourceVersion"])))
    assert fails(rapi.read_resource_slice, "s1")[0] == 404


def test_finalizers_hold_delete_until_removed(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s1")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    raw(rapi.create_resource_slice, body)
    held = raw(rapi.delete_resource_slice, "s1")
    assert held["metadata"]["deletionTimestamp"] and held["metadata"]["generation"] == 2
    assert raw(rapi.read_resource_slice, "s1")["metadata"]["deletionTimestamp"]
    held["metadata"]["finalizers"] = []
    raw(rapi.replace_resource_slice, "s1", held)
    assert fails(rapi.read_resource_slice, "s1")[0] == 404


def test_namespaced_create_needs_existing_namespace(rapi: client.ResourceV1Api) -> None:
    code, body = fails(rapi.create_namespaced_resource_claim, "nowhere",
                       make_claim(namespace="nowhere"))
    assert code == 404 and body["message"] == 'namespaces "nowhere" not found'


def test_namespace_in_body_must_match_url(rapi: client.ResourceV1Api,
                                          core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team"}})
    code, body = fails(rapi.create_namespaced_resource_claim, "team", make_claim(namespace="x"))
    assert code == 400 and "does not match the namespace" in body["message"]


def test_claim_status_only_through_subresource(rapi: client.ResourceV1Api) -> None:
    claim = make_claim()
    claim["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}
    created = raw(rapi.create_namespaced_resource_claim, "default", claim)
    # POST clears status; Go encodes the empty status struct as {} (it is not omitempty-able).
    assert created.get("status", {}) == {}
    created["spec"]["devices"]["requests"][0]["exactly"]["count"] = 1
    result = {"driver": "dra-agent.io", "pool": "node-a", "device": "gpu-0", "request": "gpu"}
    created["status"] = {"allocation": {"devices": {"results": [result]}}}
    main = raw(rapi.replace_namespaced_resource_claim, "claim", "default", created)
    assert main.get("status", {}) == {}  # the main endpoint ignores status
    main["status"] = created["status"]
    main["metadata"]["labels"] = {"ignored": "yes"}
    st = raw(rapi.replace_namespaced_resource_claim_status, "claim", "default", main)
    assert st["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert "labels" not in st["metadata"]  # metadata edits through /status are dropped


def test_claim_spec_is_immutable(rapi: client.ResourceV1Api) -> None:
    created = raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    assert created["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.dra-agent.io", "allocationMode": "ExactCount", "count": 1}
    created["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    code, body = fails(rapi.replace_namespaced_resource_claim, "claim", "default", created)
    assert code == 422
    assert [c["field"] for c in body["details"]["causes"]] == ["spec"]


def test_claim_status_rules(rapi: client.ResourceV1Api) -> None:
    created = raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    created["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}
    code, body = fails(rapi.replace_namespaced_resource_claim_status, "claim", "default", created)
    assert code == 422 and body["details"]["causes"][0]["field"] == "status.reservedFor"
    result = {"driver": "d.io", "pool": "p", "device": "gpu-0", "request": "gpu"}
    created["status"] = {"allocation": {"devices": {"results": [result]}},
                         "devices": [{"driver": "d.io", "pool": "p", "device": "gpu-1"}]}
    code, body = fails(rapi.replace_namespaced_resource_claim_status, "claim", "default", created)
    assert code == 422 and body["details"]["causes"][0]["field"] == "status.devices[0]"
    created["status"]["devices"][0]["device"] = "gpu-0"
    raw(rapi.replace_namespaced_resource_claim_status, "claim", "default", created)
    other = {**result, "device": "gpu-7"}
    created = raw(rapi.read_namespaced_resource_claim_status, "claim", "default")
    created["status"]["allocation"] = {"devices": {"results": [other]}}
    code, body = fails(rapi.replace_namespaced_resource_claim_status, "claim", "default", created)
    assert code == 422 and body["details"]["causes"][0]["field"] == "status.allocation"


def test_stale_status_write_is_409(rapi: client.ResourceV1Api) -> None:
    created = raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    created["metadata"]["resourceVersion"] = "1"
    code, _ = fails(rapi.replace_namespaced_resource_claim_status, "claim", "default", created)
    assert code == 409


def test_nodes_and_node_status(core: client.CoreV1Api) -> None:
    node = core.create_node(make_node())
    assert node.metadata.uid
    got = core.read_node("node-a")
    assert got.metadata.labels["kubernetes.io/hostname"] == "node-a"
    status = core.delete_node("node-a")
    assert status["status"] == "Success"


def test_put_object_seeds_and_get_object_reads(srv: FakeAPIServer,
                                               rapi: client.ResourceV1Api) -> None:
    claim = make_claim(namespace="seeded")
    claim["metadata"]["uid"] = "fixed-uid"
    claim["status"] = {"allocation": {"devices": {"results": []}}}
    stored = srv.put_object(claim)
    assert stored["metadata"]["uid"] == "fixed-uid" and stored["status"]
    got = rapi.read_namespaced_resource_claim("claim", "seeded")
    assert got.metadata.uid == "fixed-uid"
    assert srv.get_object("resourceclaims", "claim", "seeded")["metadata"]["uid"] == "fixed-uid"
    assert srv.get_object("resourceclaims", "claim", "default") is None
    assert [n["metadata"]["name"] for n in srv.list_objects("namespaces")][-1] == "seeded"


def test_put_object_decodes_like_the_server(srv: FakeAPIServer) -> None:
    body = make_slice(generate="seed-")
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": "2048Mi"}}
    stored = srv.put_object(body)
    assert stored["metadata"]["name"].startswith("seed-") and stored["metadata"]["generation"] == 1
    assert stored["spec"]["devices"][0]["capacity"]["memory"]["value"] == "2Gi"
    body["spec"]["typo"] = True
    with pytest.raises(ValueError, match=r"spec\.typo"):
        srv.put_object(body)


def test_claim_update_without_defaults_is_not_a_spec_change(rapi: client.ResourceV1Api) -> None:
    created = raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    body = make_claim()
    body["metadata"]["labels"] = {"new": "label"}
    body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    out = raw(rapi.replace_namespaced_resource_claim, "claim", "default", body)
    assert out["metadata"]["labels"] == {"new": "label"}


def test_deallocation_drops_device_status(rapi: client.ResourceV1Api) -> None:
    raw(rapi.create_namespaced_resource_claim, "default", make_claim())
    result = {"driver": "d.io", "pool": "p", "device": "gpu-0", "request": "gpu"}
    claim = raw(rapi.read_namespaced_resource_claim_status, "claim", "default")
    claim["status"] = {"allocation": {"devices": {"results": [result]}},
                       "devices": [{"driver": "d.io", "pool": "p", "device": "gpu-0"}]}
    claim = raw(rapi.replace_namespaced_resource_claim_status, "claim", "default", claim)
    del claim["status"]["allocation"]
    out = raw(rapi.replace_namespaced_resource_claim_status, "claim", "default", claim)
    assert "devices" not in out.get("status", {})


def test_reserved_for_cannot_grow_while_deleting(rapi: client.ResourceV1Api) -> None:
    body = make_claim()
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    raw(rapi.create_namespaced_resource_claim, "default", body)
    result = {"driver": "d.io", "pool": "p", "device": "gpu-0", "request": "gpu"}
    raw(rapi.patch_namespaced_resource_claim_status, "claim", "default", {"status": {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": "a", "uid": "ua"}]}})
    raw(rapi.delete_namespaced_resource_claim, "claim", "default")
    code, body = fails(rapi.patch_namespaced_resource_claim_status, "claim", "default",
                       {"status": {"reservedFor": [{"resource": "pods", "name": "b",
                                                    "uid": "ub"}]}})
    assert code == 422 and body["details"]["causes"][0]["field"] == "status.reservedFor"
    out = raw(rapi.patch_namespaced_resource_claim_status, "claim", "default",
              {"status": {"reservedFor": [{"uid": "ua", "$patch": "delete"}]}})
    assert out["status"].get("reservedFor", []) == []
