"""ResourceSlice, DeviceClass and metadata validation: 422 causes, 400 decoding, drops."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.apiserver.conftest import fails, make_slice, raw, send, server_minor
from tests.fakes.apiserver import FakeAPIServer

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _causes(rapi: client.ResourceV1Api, body: dict[str, Any]) -> list[tuple[str, str]]:
    code, status = fails(rapi.create_resource_slice, body)
    assert code == 422, status
    assert status["reason"] == "Invalid" and status["details"]["kind"] == "ResourceSlice"
    assert status["details"]["group"] == "resource.k8s.io"
    assert status["message"].startswith('ResourceSlice.resource.k8s.io "')
    return [(c["reason"], c["field"]) for c in status["details"]["causes"]]


def test_too_many_devices(rapi: client.ResourceV1Api) -> None:
    assert _causes(rapi, make_slice("s", devices=129)) == [("FieldValueTooMany", "spec.devices")]
    raw(rapi.create_resource_slice, make_slice("ok", devices=128))


def test_device_limit_is_64_with_taints(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s", devices=65)
    body["spec"]["devices"][0]["taints"] = [{"key": "example.com/bad", "effect": "NoSchedule"}]
    if server_minor(rapi.api_client) < 36:
        # DRADeviceTaints is off in 1.35: the taints are dropped, so 128 devices stay allowed.
        assert "taints" not in raw(rapi.create_resource_slice, body)["spec"]["devices"][0]
        return
    assert _causes(rapi, body) == [("FieldValueTooMany", "spec.devices")]
    body["spec"]["devices"].pop()
    out = raw(rapi.create_resource_slice, body)
    assert out["spec"]["devices"][0]["taints"][0]["timeAdded"]  # defaulted by the server


def test_exactly_one_node_selection_field(rapi: client.ResourceV1Api) -> None:
    none = make_slice("s")
    del none["spec"]["nodeName"]
    assert _causes(rapi, none) == [("FieldValueRequired", "spec")]
    both = make_slice("s", allNodes=True)
    code, status = fails(rapi.create_resource_slice, both)
    assert code == 422 and "but multiple fields are set" in status["message"]
    selector = make_slice("s", nodeSelector={"nodeSelectorTerms": []})
    del selector["spec"]["nodeName"]
    assert _causes(rapi, selector) == [  # ValidateNodeSelector's, then the slice's own rule
        ("FieldValueRequired", "spec.nodeSelector.nodeSelectorTerms"),
        ("FieldValueInvalid", "spec.nodeSelector.nodeSelectorTerms")]
    # A zero value is an error of its own and does not count as the one field set.
    all_false = make_slice("s", allNodes=False)
    del all_false["spec"]["nodeName"]
    assert _causes(rapi, all_false) == [("FieldValueInvalid", "spec.allNodes"),
                                        ("FieldValueRequired", "spec")]
    assert _causes(rapi, make_slice("s", nodeName="")) == [("FieldValueInvalid", "spec.nodeName"),
                                                           ("FieldValueRequired", "spec")]


def test_attribute_limits_and_formats(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s")
    dev = body["spec"]["devices"][0]
    dev["attributes"] = {f"a{i}": {"int": i} for i in range(30)}
    dev["capacity"] = {"memory": {"value": "1Gi"}, "cores": {"value": "4"},
                       "extra": {"value": "1"}}
    assert _causes(rapi, body) == [("FieldValueInvalid", "spec.devices[0]")]  # not TooMany
    dev["attributes"] = {
        "1bad": {"string": "x"},
        "example.com/ok": {"string": "x" * 65},
        "ver": {"version": "1.2"},
        "two": {"int": 1, "bool": True},
        "none": {},
        "Bad_Domain/x": {"bool": True},
    }
    dev["capacity"] = {}
    # Since 1.36 a bad key is reported on the map itself (1.35: on the key's own path).
    keys = "spec.devices[0].attributes"
    old = server_minor(rapi.api_client) < 36
    assert sorted(_causes(rapi, body)) == sorted([
        ("FieldValueInvalid", keys + ("[1bad]" if old else "")),
        ("FieldValueTooLong", "spec.devices[0].attributes[example.com/ok].string"),
        ("FieldValueInvalid", "spec.devices[0].attributes[ver].version"),
        ("FieldValueInvalid", "spec.devices[0].attributes[two]"),
        ("FieldValueInvalid", "spec.devices[0].attributes[none]"),
        ("FieldValueInvalid", keys + ("[Bad_Domain/x]" if old else "")),
    ])
    # More than one slash is not checked upstream (a known gap): the name passes.
    dev["attributes"] = {"a/b/c": {"bool": True}}
    raw(rapi.create_resource_slice, body)


def test_device_names_are_unique_dns_labels(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s", devices=2)
    body["spec"]["devices"][1]["name"] = "gpu-0"
    body["spec"]["devices"].append({"name": "GPU_1"})
    # validateSet: every item's own errors first, then duplicates at the item's path.
    assert _causes(rapi, body) == [("FieldValueInvalid", "spec.devices[2].name"),
                                   ("FieldValueDuplicate", "spec.devices[1]")]


def test_driver_pool_and_name_formats(rapi: client.ResourceV1Api) -> None:
    body = make_slice("Bad_Name", driver="", node="node-a")
    body["spec"]["pool"] = {"name": "a//b", "generation": -1, "resourceSliceCount": 0}
    assert sorted(_causes(rapi, body)) == sorted([
        ("FieldValueInvalid", "metadata.name"),
        ("FieldValueRequired", "spec.driver"),
        ("FieldValueInvalid", "spec.pool.name"),
        ("FieldValueInvalid", "spec.pool.generation"),
        ("FieldValueInvalid", "spec.pool.resourceSliceCount"),
    ])
    assert _causes(rapi, make_slice("s", driver="x" * 64 + ".io"))[0] == (
        "FieldValueTooLong", "spec.driver")


def test_immutable_fields_on_update(rapi: client.ResourceV1Api) -> None:
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    obj["spec"]["driver"] = "other.io"
    obj["spec"]["nodeName"] = "node-b"
    obj["spec"]["pool"]["name"] = "other"
    code, status = fails(rapi.replace_resource_slice, "s1", obj)
    assert code == 422
    assert [c["field"] for c in status["details"]["causes"]] == [
        "spec.pool.name", "spec.driver", "spec.nodeName"]


def test_devices_and_shared_counters_exclusive(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s", sharedCounters=[{"name": "mem", "counters": {"memory": {
        "value": "80Gi"}}}])
    if server_minor(rapi.api_client) < 36:
        # DRAPartitionableDevices is off in 1.35: the field is dropped, not checked.
        assert "sharedCounters" not in raw(rapi.create_resource_slice, body)["spec"]
        return
    assert _causes(rapi, body) == [("FieldValueInvalid", "spec")]


def test_owner_references_need_fields_and_one_controller(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s")
    ref = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u1", "controller": True}
    body["metadata"]["ownerReferences"] = [ref, {**ref, "uid": "u2"}, {"kind": "Node"}]
    code, _, status = send(rapi.api_client, "POST", SLICES, body)
    assert code == 422
    fields = [c["field"] for c in status["details"]["causes"]]
    assert "metadata.ownerReferences" in fields
    # 1.35 named the field without the index.
    index = "" if server_minor(rapi.api_client) < 36 else "[2]"
    assert f"metadata.ownerReferences{index}.uid" in fields


def test_unknown_fields_warn_by_default_and_fail_when_strict(api_client: client.ApiClient) -> None:
    body = make_slice("s1")
    body["spec"]["bogus"] = 1
    body["spec"]["devices"][0]["basic"] = {"attributes": {}}  # v1beta1 shape sent to v1
    code, headers, stored = send(api_client, "POST", SLICES, body)
    assert code == 201
    warning = headers["Warning"]
    assert 'unknown field \\"spec.bogus\\"' in warning
    assert 'unknown field \\"spec.devices[0].basic\\"' in warning
    assert "bogus" not in stored["spec"] and "basic" not in stored["spec"]["devices"][0]
    body["metadata"]["name"] = "s2"
    code, _, status = send(api_client, "POST", SLICES, body, query=[("fieldValidation", "Strict")])
    assert code == 400 and status["message"].startswith(
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: strict decoding '
        "error: unknown field")


def test_wrong_json_type_is_400(api_client: client.ApiClient) -> None:
    body = make_slice("s1")
    body["spec"]["devices"] = {"name": "x"}
    code, _, status = send(api_client, "POST", SLICES, body)
    assert code == 400 and "cannot unmarshal object" in status["message"]
    body = make_slice("s1")
    body["spec"]["pool"]["generation"] = "one"
    assert send(api_client, "POST", SLICES, body)[0] == 400
    assert send(api_client, "POST", SLICES, "not an object")[0] == 400
    # A body type no serializer takes is refused before decoding.
    code, _, status = send(api_client, "POST", SLICES, "{not json", content_type="text/plain")
    assert code == 415 and status["reason"] == "UnsupportedMediaType"
    assert status["message"].startswith("the body of the request was in an unknown format - "
                                        "accepted media types include: application/json, ")


def test_quantities_come_back_canonical(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s1")
    body["spec"]["devices"][0]["capacity"] = {
        "memory": {"value": "1024Mi"}, "cores": {"value": "1000m"}, "bw": {"value": "1500"},
        "half": {"value": "0.5"}, "big": {"value": 2000000}}
    code, _, out = send(rapi.api_client, "POST", SLICES, body)  # a JSON number is a quantity too
    assert code == 201
    caps = {k: v["value"] for k, v in out["spec"]["devices"][0]["capacity"].items()}
    assert caps == {"memory": "1Gi", "cores": "1", "bw": "1500", "half": "500m", "big": "2M"}
    body["metadata"]["name"] = "s2"
    body["spec"]["devices"][0]["capacity"] = {"memory": {"value": "lots"}}
    assert fails(rapi.create_resource_slice, body)[0] == 400


def test_gated_fields_are_dropped_not_rejected() -> None:
    with FakeAPIServer(feature_gates={"DRADeviceTaints": False}) as srv:
        rapi = client.ResourceV1Api(srv.api_client())
        body = make_slice("s1")
        body["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
        out = raw(rapi.create_resource_slice, body)
        assert "taints" not in out["spec"]["devices"][0]  # gate off: dropped, not rejected
        # DRAListTypeAttributes is alpha (off): the list value is dropped, which leaves an
        # attribute without a value, and that fails validation just as on a real server.
        body["metadata"]["name"] = "s2"
        body["spec"]["devices"][0]["attributes"]["list"] = {"strings": ["a"]}
        code, status = fails(rapi.create_resource_slice, body)
        assert code == 422
        assert status["details"]["causes"][0]["field"] == "spec.devices[0].attributes[list]"


def test_request_policy_needs_multiple_allocations(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s")
    body["spec"]["devices"][0]["capacity"] = {"memory": {
        "value": "1Gi", "requestPolicy": {"default": "1Mi"}}}
    if server_minor(rapi.api_client) < 36:
        # DRAConsumableCapacity is off in 1.35: requestPolicy is dropped, not checked.
        out = raw(rapi.create_resource_slice, body)
        assert "requestPolicy" not in out["spec"]["devices"][0]["capacity"]["memory"]
        return
    assert _causes(rapi, body) == [("FieldValueForbidden",
                                    "spec.devices[0].capacity[memory].requestPolicy")]


def test_device_class_validation_and_generation(rapi: client.ResourceV1Api) -> None:
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": "gpu.dra-agent.io"},
           "spec": {"selectors": [{"cel": {"expression": "device.driver == 'dra-agent.io'"}}]}}
    out = raw(rapi.create_device_class, cls)
    assert out["metadata"]["generation"] == 1
    out["spec"]["selectors"].append({"cel": {"expression": "true"}})
    assert raw(rapi.replace_device_class, out["metadata"]["name"], out)["metadata"][
        "generation"] == 2
    bad = {**cls, "metadata": {"name": "c2"}, "spec": {"selectors": [{"cel": {}}]}}
    code, _, status = send(rapi.api_client, "POST", "/apis/resource.k8s.io/v1/deviceclasses", bad)
    assert code == 422
    assert status["details"]["causes"][0]["field"] == "spec.selectors[0].cel.expression"


@pytest.mark.parametrize("labels", [{"bad key": "v"}, {"k": "bad value!"}])
def test_bad_labels_are_422(rapi: client.ResourceV1Api, labels: dict[str, str]) -> None:
    body = make_slice("s")
    body["metadata"]["labels"] = labels
    assert _causes(rapi, body) == [("FieldValueInvalid", "metadata.labels")]


def test_body_over_3_mib_is_413(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s")
    body["metadata"]["annotations"] = {"big": "x" * (3 * 1024 * 1024)}
    code, status = fails(rapi.create_resource_slice, body)
    assert code == 413 and status["reason"] == "RequestEntityTooLarge"


def test_empty_lists_and_maps_are_omitted_like_go_omitempty(rapi: client.ResourceV1Api) -> None:
    body = make_slice("s1")
    body["metadata"]["labels"] = {}
    body["metadata"]["finalizers"] = []
    dev = body["spec"]["devices"][0]
    dev["taints"] = []
    dev["capacity"] = {}
    out = raw(rapi.create_resource_slice, body)
    assert "labels" not in out["metadata"] and "finalizers" not in out["metadata"]
    assert "taints" not in out["spec"]["devices"][0]
    assert "capacity" not in out["spec"]["devices"][0]
