from __future__ import annotations

import pytest

from agent.slices.versions import NoResourceAPIError, choose_version, from_wire, to_wire

SLICE = {
    "metadata": {"name": "s"},
    "spec": {
        "driver": "d.io",
        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "n",
        "devices": [{"name": "gpu-0", "attributes": {"a": {"int": 1}}, "taints": []}],
    },
}


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (["v1beta1", "v1beta2", "v1"], "v1"),
        (["v1beta1", "v1beta2"], "v1beta2"),
        (["v1beta1", "v1alpha3"], "v1beta1"),
    ],
)
def test_choose_prefers_v1_then_v1beta2_then_v1beta1(served: list[str], chosen: str) -> None:
    assert choose_version(served) == chosen


def test_no_usable_version_names_what_is_served() -> None:
    with pytest.raises(NoResourceAPIError, match="served: v1alpha3") as info:
        choose_version(["v1alpha3"])
    assert info.value.served == ("v1alpha3",)


def test_v1beta1_nests_device_fields_under_basic() -> None:
    wire = to_wire(SLICE, "v1beta1")
    assert wire["apiVersion"] == "resource.k8s.io/v1beta1"
    assert wire["spec"]["devices"] == [
        {"name": "gpu-0", "basic": {"attributes": {"a": {"int": 1}}, "taints": []}}
    ]
    assert SLICE["spec"]["devices"][0]["attributes"] == {"a": {"int": 1}}  # input untouched


def test_v1beta1_round_trip_gives_v1_shape_back() -> None:
    wire = to_wire(SLICE, "v1beta1")
    wire["spec"]["allNodes"] = False
    back = from_wire(wire, "v1beta1")
    assert back["spec"]["devices"] == SLICE["spec"]["devices"]
    assert "allNodes" not in back["spec"]


def test_v1beta1_empty_node_name_means_unset() -> None:
    back = from_wire({"spec": {"nodeName": "", "allNodes": True, "devices": []}}, "v1beta1")
    assert back["spec"] == {"allNodes": True, "devices": []}


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_flat_versions_only_get_their_api_version(version: str) -> None:
    wire = to_wire(SLICE, version)
    assert wire["spec"] == SLICE["spec"]
    assert wire["apiVersion"] == f"resource.k8s.io/{version}"
    assert from_wire(wire, version)["spec"] == SLICE["spec"]
