"""LIST: revision, paging with continue tokens, field and label selectors, deletecollection."""

from __future__ import annotations

import base64
import json

from kubernetes import client

from tests.apiserver.conftest import fails, make_slice, raw, server_minor
from tests.fakes.apiserver import FakeAPIServer


def _names(listing: dict) -> list[str]:
    return [i["metadata"]["name"] for i in listing["items"]]


def test_list_carries_current_revision_and_bare_items(
    srv: FakeAPIServer, rapi: client.ResourceV1Api
) -> None:
    for n in ("b", "a", "c"):
        rapi.create_resource_slice(make_slice(n))
    srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}})
    out = raw(rapi.list_resource_slice)
    assert out["kind"] == "ResourceSliceList" and out["apiVersion"] == "resource.k8s.io/v1"
    assert out["metadata"]["resourceVersion"] == str(srv.resource_version)
    assert _names(out) == ["a", "b", "c"]  # key order
    assert "apiVersion" not in out["items"][0] and "kind" not in out["items"][0]


def test_paging_with_continue_is_a_consistent_snapshot(rapi: client.ResourceV1Api) -> None:
    for i in range(5):
        rapi.create_resource_slice(make_slice(f"s{i}"))
    page = raw(rapi.list_resource_slice, limit=2)
    assert _names(page) == ["s0", "s1"] and page["metadata"]["continue"]
    assert page["metadata"]["remainingItemCount"] == 3
    token = page["metadata"]["continue"]
    decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert decoded["rv"] == int(page["metadata"]["resourceVersion"])
    rapi.delete_resource_slice("s2")  # later changes do not show in the snapshot
    rapi.create_resource_slice(make_slice("s10"))
    page2 = raw(rapi.list_resource_slice, limit=2, _continue=token)
    assert _names(page2) == ["s2", "s3"]
    assert page2["metadata"]["resourceVersion"] == page["metadata"]["resourceVersion"]
    page3 = raw(rapi.list_resource_slice, limit=2, _continue=page2["metadata"]["continue"])
    assert _names(page3) == ["s4"] and "continue" not in page3["metadata"]


def test_bad_continue_token_is_400(rapi: client.ResourceV1Api) -> None:
    code, body = fails(rapi.list_resource_slice, _continue="!!notatoken")
    assert code == 400 and body["message"].startswith("invalid continue token")


def test_continue_with_resource_version_is_400(rapi: client.ResourceV1Api) -> None:
    for i in range(3):
        rapi.create_resource_slice(make_slice(f"s{i}"))
    token = raw(rapi.list_resource_slice, limit=1)["metadata"]["continue"]
    code, body = fails(rapi.list_resource_slice, _continue=token, resource_version="3")
    assert code == 400
    assert body["message"] == "specifying resource version is not allowed when using continue"


def test_continue_after_compaction_is_410() -> None:
    with FakeAPIServer(event_log_size=2) as srv:
        rapi = client.ResourceV1Api(srv.api_client())
        for i in range(3):
            rapi.create_resource_slice(make_slice(f"s{i}"))
        token = raw(rapi.list_resource_slice, limit=1)["metadata"]["continue"]
        for i in range(3):
            rapi.create_resource_slice(make_slice(f"t{i}"))
        code, body = fails(rapi.list_resource_slice, _continue=token)
        assert code == 410 and body["reason"] == "Expired"


def test_list_exact_resource_version_rebuilds_the_past(rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("old"))
    at = raw(rapi.list_resource_slice)["metadata"]["resourceVersion"]
    rapi.create_resource_slice(make_slice("new"))
    past = raw(rapi.list_resource_slice, resource_version=at, resource_version_match="Exact")
    assert _names(past) == ["old"] and past["metadata"]["resourceVersion"] == at


def test_list_option_errors_are_422(rapi: client.ResourceV1Api) -> None:
    code, body = fails(rapi.list_resource_slice, resource_version_match="Exact")
    assert code == 422 and body["details"]["kind"] == "ListOptions"
    assert body["details"]["group"] == "meta.k8s.io"
    code, _ = fails(rapi.list_resource_slice, resource_version="0",
                    resource_version_match="Exact")
    assert code == 422
    code, _ = fails(rapi.list_resource_slice, send_initial_events=True)
    assert code == 422


def test_slice_field_selectors(rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("a1", node="a"))
    rapi.create_resource_slice(make_slice("b1", node="b", driver="other.io"))
    shared = make_slice("shared")
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    rapi.create_resource_slice(shared)
    assert _names(raw(rapi.list_resource_slice, field_selector="spec.nodeName=a")) == ["a1"]
    assert _names(raw(rapi.list_resource_slice,
                      field_selector="spec.driver=dra-agent.io,spec.nodeName=")) == ["shared"]
    assert _names(raw(rapi.list_resource_slice, field_selector="spec.driver!=dra-agent.io")) \
        == ["b1"]
    assert _names(raw(rapi.list_resource_slice, field_selector="metadata.name==b1")) == ["b1"]


def test_unsupported_field_label_is_400(rapi: client.ResourceV1Api,
                                        core: client.CoreV1Api) -> None:
    code, body = fails(rapi.list_resource_slice, field_selector="spec.pool.generation=1")
    assert code == 400 and body["reason"] == "BadRequest"
    assert body["message"] == ("field label not supported for resource.k8s.io/v1, "
                               "Kind=ResourceSlice: spec.pool.generation")
    # spec.pool.name became selectable in 1.36.
    if server_minor(rapi.api_client) >= 36:
        assert raw(rapi.list_resource_slice, field_selector="spec.pool.name=x")["items"] == []
    else:
        assert fails(rapi.list_resource_slice, field_selector="spec.pool.name=x")[0] == 400
    # A kind without a field-label conversion of its own answers with the default one's words.
    code, body = fails(rapi.list_resource_claim_for_all_namespaces,
                       field_selector="status.allocation=x")
    assert code == 400 and body["message"] == (
        '"status.allocation" is not a known field selector: only "metadata.name", '
        '"metadata.namespace"')
    assert fails(core.list_node, field_selector="spec.providerID=x")[0] == 400
    assert core.list_node(field_selector="spec.unschedulable=false").items == []
    assert fails(rapi.list_resource_slice, field_selector="nonsense")[0] == 400


def test_label_selectors(rapi: client.ResourceV1Api) -> None:
    for name, labels in (("x", {"tier": "gpu", "zone": "a"}), ("y", {"tier": "nic"}),
                         ("z", {})):
        body = make_slice(name)
        body["metadata"]["labels"] = labels
        rapi.create_resource_slice(body)

    def sel(expr: str) -> list[str]:
        return _names(raw(rapi.list_resource_slice, label_selector=expr))

    assert sel("tier=gpu") == ["x"]
    assert sel("tier==gpu") == ["x"]
    assert sel("tier!=gpu") == ["y", "z"]
    assert sel("tier in (gpu,nic)") == ["x", "y"]
    assert sel("tier notin (gpu)") == ["y", "z"]
    assert sel("zone") == ["x"]
    assert sel("!zone") == ["y", "z"]
    assert sel("tier,!zone") == ["y"]
    assert fails(rapi.list_resource_slice, label_selector="tier in (")[0] == 400
    assert fails(rapi.list_resource_slice, label_selector="bad key!=x")[0] == 400


def test_deletecollection_with_node_field_selector(
    srv: FakeAPIServer, rapi: client.ResourceV1Api
) -> None:
    rapi.create_resource_slice(make_slice("a1", node="node-a"))
    rapi.create_resource_slice(make_slice("a2", node="node-a", driver="other.io"))
    rapi.create_resource_slice(make_slice("b1", node="node-b"))
    out = raw(rapi.delete_collection_resource_slice,
              field_selector="spec.nodeName=node-a,spec.driver=dra-agent.io")
    assert out["kind"] == "ResourceSliceList" and _names(out) == ["a1"]
    assert [o["metadata"]["name"] for o in srv.list_objects("resourceslices")] == ["a2", "b1"]
    out = raw(rapi.delete_collection_resource_slice, field_selector="spec.nodeName=node-a")
    assert _names(out) == ["a2"]
    code, _ = fails(rapi.delete_collection_resource_slice, field_selector="spec.pool.generation=1")
    assert code == 400


def test_claims_listed_per_namespace_and_across(rapi: client.ResourceV1Api,
                                                srv: FakeAPIServer) -> None:
    from tests.apiserver.conftest import make_claim

    srv.put_object(make_claim("c1", "ns1"))
    srv.put_object(make_claim("c2", "ns2"))
    assert [c.metadata.name for c in rapi.list_namespaced_resource_claim("ns1").items] == ["c1"]
    every = rapi.list_resource_claim_for_all_namespaces()
    assert [(c.metadata.namespace, c.metadata.name) for c in every.items] == [
        ("ns1", "c1"), ("ns2", "c2")]
    picked = rapi.list_resource_claim_for_all_namespaces(field_selector="metadata.namespace=ns2")
    assert [c.metadata.name for c in picked.items] == ["c2"]


def test_future_resource_version_waits_then_504() -> None:
    with FakeAPIServer(too_large_wait=0.2) as srv:
        rapi = client.ResourceV1Api(srv.api_client())
        ahead = str(srv.resource_version + 10)
        code, body = fails(rapi.list_resource_slice, resource_version=ahead,
                           resource_version_match="NotOlderThan")
        assert code == 504 and body["reason"] == "Timeout"
        assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


def test_all_namespaces_path_is_list_and_watch_only(api_client: client.ApiClient) -> None:
    from tests.apiserver.conftest import send

    code, _, body = send(api_client, "DELETE", "/apis/resource.k8s.io/v1/resourceclaims")
    assert code == 405 and body["reason"] == "MethodNotAllowed"


def test_claim_templates_are_served(rapi: client.ResourceV1Api) -> None:
    tmpl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t"}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-agent.io"}}]}}}}
    out = raw(rapi.create_namespaced_resource_claim_template, "default", tmpl)
    assert out["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    assert [t.metadata.name for t in
            rapi.list_namespaced_resource_claim_template("default").items] == ["t"]


def test_paging_across_namespaces_visits_each_claim_once(srv: FakeAPIServer,
                                                         rapi: client.ResourceV1Api) -> None:
    from tests.apiserver.conftest import make_claim

    for ns, name in (("a", "x"), ("a-b", "y"), ("a", "z"), ("b", "w")):
        srv.put_object(make_claim(name, ns))
    seen, token = [], None
    while True:
        kwargs = {"limit": 1, "_continue": token} if token else {"limit": 1}
        page = raw(rapi.list_resource_claim_for_all_namespaces, **kwargs)
        seen += [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in page["items"]]
        token = page["metadata"].get("continue")
        if not token:
            break
    # etcd key order: "a-b/..." sorts before "a/..." because '-' < '/'.
    assert seen == [("a-b", "y"), ("a", "x"), ("a", "z"), ("b", "w")]
