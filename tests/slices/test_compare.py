from __future__ import annotations

from fractions import Fraction

import pytest

from agent.common.quantity import QuantityError, parse_quantity
from agent.slices.compare import (
    copy_taint_times,
    devices_equal,
    dropped_fields,
    likely_gates,
    specs_equal,
)
from tests.slices.helpers import device


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("1024Mi", 2**30),
        ("1500m", Fraction(3, 2)),
        ("1e3", 1000),
        ("2k", 2000),
        (".5", Fraction(1, 2)),
        ("132", 132),
    ],
)
def test_quantities_parse_exactly(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["80 GiB", "", "Gi", "1.2.3", "1Zi"])
def test_non_quantities_are_refused(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_canonical_quantity_from_the_server_is_equal() -> None:
    ours = [device(0, capacity={"memory": {"value": "1024Mi"}})]
    stored = [device(0, capacity={"memory": {"value": "1Gi"}})]
    assert devices_equal(ours, stored)
    stored[0]["capacity"]["memory"]["value"] = "2Gi"
    assert not devices_equal(ours, stored)


def test_device_order_matters() -> None:
    assert not devices_equal([device(0), device(1)], [device(1), device(0)])


def test_empty_lists_and_maps_equal_absent_ones() -> None:
    assert devices_equal([device(0, taints=[])], [device(0)])


def test_server_set_time_added_is_not_a_difference() -> None:
    ours = [device(0, taints=[{"key": "k", "effect": "NoSchedule"}])]
    stored = [device(0, taints=[{"key": "k", "effect": "NoSchedule",
                                 "timeAdded": "2026-11-29T10:00:00Z"}])]
    assert devices_equal(ours, stored)


def test_time_added_tolerates_second_rounding_only() -> None:
    def taint(t: str) -> list[dict[str, object]]:
        return [device(0, taints=[{"key": "k", "effect": "None", "timeAdded": t}])]

    assert devices_equal(taint("2026-11-29T10:00:00.400Z"), taint("2026-11-29T10:00:00Z"))
    assert not devices_equal(taint("2026-11-29T10:00:05Z"), taint("2026-11-29T10:00:00Z"))


def test_copy_taint_times_keeps_the_stored_time_for_unchanged_taints() -> None:
    stored = [device(0, taints=[{"key": "k", "effect": "NoSchedule", "timeAdded": "T1"}])]
    ours = [device(0, taints=[{"key": "k", "effect": "NoSchedule"},
                              {"key": "new", "effect": "NoSchedule"}])]
    out = copy_taint_times(stored, ours)
    assert out[0]["taints"][0]["timeAdded"] == "T1"
    assert "timeAdded" not in out[0]["taints"][1]
    assert "timeAdded" not in ours[0]["taints"][0]  # input untouched


def test_specs_compare_pool_metadata_and_node_selection() -> None:
    spec = {"pool": {"name": "p", "generation": 1, "resourceSliceCount": 2},
            "nodeName": "n", "devices": [device(0)]}
    assert specs_equal(spec, dict(spec))
    assert not specs_equal(spec, {**spec, "pool": {**spec["pool"], "generation": 2}})
    assert not specs_equal(spec, {**spec, "allNodes": True})
    # nodeName is immutable and selected on: not part of the comparison
    assert specs_equal(spec, {**spec, "nodeName": "other"})


def test_dropped_fields_are_found_and_named_after_their_gate() -> None:
    sent = {"devices": [device(0, taints=[{"key": "k", "effect": "NoSchedule"}])]}
    stored = {"devices": [device(0)]}
    paths = dropped_fields(sent, stored)
    assert paths == ["spec.devices[0].taints"]
    assert likely_gates(paths) == ["DRADeviceTaints"]


def test_changed_values_are_not_dropped_fields() -> None:
    sent = {"devices": [device(0, capacity={"m": {"value": "1024Mi"}})]}
    stored = {"devices": [device(0, capacity={"m": {"value": "1Gi"}})]}
    assert dropped_fields(sent, stored) == []


def test_a_dropped_node_allocatable_field_names_its_gate_under_either_name() -> None:
    for field in ("nodeAllocatableResources", "nodeAllocatableResourceMappings"):
        sent = {"devices": [device(0, **{field: {"cpu": {"mapping": {}}}})]}
        paths = dropped_fields(sent, {"devices": [device(0)]})
        assert paths == [f"spec.devices[0].{field}"]
        assert likely_gates(paths) == ["DRANodeAllocatableResources"]


def test_list_attributes_read_back_unchanged_compare_equal() -> None:
    numa = {"resource.kubernetes.io/numaNode": {"ints": [1, 3]}}
    ours = {"pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "devices": [device(0, attributes=numa)]}
    stored = {**ours, "devices": [device(0, attributes={k: dict(v) for k, v in numa.items()})]}
    assert specs_equal(stored, ours)
    scalar = {**ours, "devices": [device(0, attributes={
        "resource.kubernetes.io/numaNode": {"int": 1}})]}
    assert not specs_equal(scalar, ours)  # a form change is one update, then equal again
