"""parse_slice checks the common device in the loop that parses it (no second schema walk):
each check that walk skips must still fail the way the schema's would, at the same path."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agent.explain.devices import parse_slice
from agent.explain.docs import InputError, load_text


def _device(i: int) -> dict[str, Any]:
    return {"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "index": {"int": i}, "healthy": {"bool": True},
        "driverVersion": {"version": "550.54.15"}},
        "capacity": {"memory": {"value": "80Gi"}}}


def _slice(devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": {
        "driver": "d.io", "nodeName": "n", "pool": {"name": "p", "generation": 1,
                                                    "resourceSliceCount": 1},
        "devices": devices}}


def _error(obj: dict[str, Any]) -> str:
    with pytest.raises(InputError) as err:
        parse_slice(load_text(json.dumps(obj, indent=1), "s.json")[0])
    return str(err.value)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("index", {"int": True}, "expected int, got bool"),
    ("index", {"int": "3"}, "expected int, got string"),
    ("type", {"string": 7}, "expected str, got int"),
    ("healthy", {"bool": 1}, "expected bool, got int"),
    ("type", {"strnig": "gpu"}, "unknown field in DeviceAttribute"),
    ("driverVersion", {"version": "1.2"}, "semantic version"),
    ("type", "gpu", "expected an object (DeviceAttribute), got string"),
])
def test_a_bad_attribute_after_good_devices_of_its_shape_fails_at_its_line(
        field: str, value: Any, message: str) -> None:
    devices = [_device(i) for i in range(3)]
    devices[2]["attributes"][field] = value
    text = _error(_slice(devices))
    assert message in text, text
    assert "s.json:" in text  # the line of the third device's field, as the schema walk says


@pytest.mark.parametrize(("capacity", "message"), [
    ({"value": "80 Gi"}, "not a quantity"),
    ({"value": True}, "expected qty, got bool"),
    ({"vaule": "80Gi"}, "unknown field in DeviceCapacity"),
    ({"value": "80Gi", "requestPolicy": {"default": "x"}}, "not a quantity"),
])
def test_a_bad_capacity_after_good_ones_fails(capacity: dict[str, Any], message: str) -> None:
    devices = [_device(i) for i in range(3)]
    devices[1]["capacity"]["memory"] = capacity
    assert message in _error(_slice(devices))


def test_unknown_fields_and_non_objects_among_plain_devices_fail() -> None:
    devices: list[Any] = [_device(i) for i in range(3)]
    devices[1]["nmae"] = "x"
    assert "unknown field in Device" in _error(_slice(devices))
    devices = [_device(0), "gpu-1"]
    assert "expected an object (Device), got string" in _error(_slice(devices))
    devices = [_device(0), {"attributes": {}}]
    assert "a device needs a name" in _error(_slice(devices))
    obj = _slice([_device(0)])
    obj["spec"]["nodeNmae"] = "n"  # around the devices: the schema walk, as before
    assert "unknown field in ResourceSliceSpec" in _error(obj)


def test_the_one_walk_parses_as_the_full_walk_does() -> None:
    plain = [_device(i) for i in range(4)]
    # A field beyond name/attributes/capacity sends a device through the schema walk.
    full = copy.deepcopy(plain)
    for d in full:
        d["allowMultipleAllocations"] = False
    a = parse_slice(load_text(json.dumps(_slice(plain)), "a.json")[0])
    b = parse_slice(load_text(json.dumps(_slice(full)), "b.json")[0])
    assert a == b
    assert a.devices[3].attributes["index"] == ("int", 3)
    assert a.devices[0].capacity["memory"] is a.devices[3].capacity["memory"]  # shared
