"""API discovery and the v1 / v1beta2 / v1beta1 views of one stored object."""

from __future__ import annotations

from kubernetes import client, dynamic

from tests.apiserver.conftest import (
    AGAINST_REAL,
    fails,
    make_claim,
    make_slice,
    raw,
    server_minor,
)
from tests.fakes.apiserver import FakeAPIServer


def test_discovery_serves_v1_by_default(v1_only_client: client.ApiClient) -> None:
    api_client = v1_only_client
    group = client.ResourceApi(api_client).get_api_group()
    assert group.name == "resource.k8s.io"
    assert [v.version for v in group.versions] == ["v1"]
    assert group.preferred_version.version == "v1"
    res = client.ResourceV1Api(api_client).get_api_resources()
    names = {r.name for r in res.resources}
    assert {"resourceslices", "deviceclasses", "resourceclaims", "resourceclaims/status"} <= names
    # A real server serves many more groups (apps, ...); the fake only this one.
    groups = {g.name: g for g in client.ApisApi(api_client).get_api_versions().groups}
    assert [v.version for v in groups["resource.k8s.io"].versions] == ["v1"]
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    if AGAINST_REAL:
        from tests.realk8s.cluster import minor_under_test

        assert server_minor(api_client) == int(minor_under_test().split(".")[1])
    else:
        assert server_minor(api_client) == 36  # the fake answers as 1.36
    core = client.CoreV1Api(api_client).get_api_resources()
    assert {"nodes", "nodes/status", "namespaces"} <= {r.name for r in core.resources}


def test_unserved_version_is_404(v1_only_client: client.ApiClient) -> None:
    beta = client.ResourceV1beta1Api(v1_only_client)
    assert fails(beta.list_resource_slice)[0] == 404
    assert fails(beta.get_api_resources)[0] == 404


def test_switching_served_versions_changes_discovery(srv: FakeAPIServer,
                                                     api_client: client.ApiClient) -> None:
    srv.set_served_resource_versions(("v1beta1",))
    group = client.ResourceApi(api_client).get_api_group()
    assert [v.version for v in group.versions] == ["v1beta1"]
    assert fails(client.ResourceV1Api(api_client).list_resource_slice)[0] == 404
    beta = client.ResourceV1beta1Api(api_client).get_api_resources()
    assert beta.group_version == "resource.k8s.io/v1beta1"
    srv.set_served_resource_versions(())
    assert client.ApisApi(api_client).get_api_versions().groups == []


def test_slice_round_trips_between_v1_and_v1beta1() -> None:
    with FakeAPIServer(("v1", "v1beta2", "v1beta1")) as srv:
        c = srv.api_client()
        v1, beta1 = client.ResourceV1Api(c), client.ResourceV1beta1Api(c)
        beta2 = client.ResourceV1beta2Api(c)
        body = make_slice("s1")
        body["apiVersion"] = "resource.k8s.io/v1beta1"
        body["spec"]["devices"] = [{"name": "gpu-0", "basic": {
            "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}}}}]
        created = raw(beta1.create_resource_slice, body)
        assert created["apiVersion"] == "resource.k8s.io/v1beta1"
        assert created["spec"]["devices"][0]["basic"]["capacity"]["memory"]["value"] == "80Gi"
        flat = raw(v1.read_resource_slice, "s1")
        assert flat["spec"]["devices"] == [{"name": "gpu-0", "attributes": {
            "type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}}}]
        assert raw(beta2.read_resource_slice, "s1")["spec"]["devices"] == flat["spec"]["devices"]
        assert srv.get_object("resourceslices", "s1", version="v1beta1")["spec"]["devices"][0][
            "basic"]["attributes"] == {"type": {"string": "gpu"}}
        # A typed v1beta1 client reads it back as its own model.
        typed = beta1.read_resource_slice("s1")
        assert typed.spec.devices[0].basic.attributes["type"].string == "gpu"


def test_claim_requests_convert_for_v1beta1() -> None:
    with FakeAPIServer(("v1", "v1beta1")) as srv:
        beta1 = client.ResourceV1beta1Api(srv.api_client())
        raw(client.ResourceV1Api(srv.api_client()).create_namespaced_resource_claim, "default",
            make_claim())
        got = raw(beta1.read_namespaced_resource_claim, "claim", "default")
        assert got["spec"]["devices"]["requests"] == [{
            "name": "gpu", "deviceClassName": "gpu.dra-agent.io", "allocationMode": "ExactCount",
            "count": 1}]


def test_dynamic_client_discovers_and_lists(srv: FakeAPIServer,
                                            api_client: client.ApiClient) -> None:
    srv.put_object(make_slice("s1"))
    dyn = dynamic.DynamicClient(api_client)
    slices = dyn.resources.get(api_version="resource.k8s.io/v1", kind="ResourceSlice")
    assert [i.metadata.name for i in slices.get().items] == ["s1"]
    nodes = dyn.resources.get(api_version="v1", kind="Node")
    assert nodes.get().items == []
