from __future__ import annotations

from typing import Any

import pytest

from agent.slices.validate import PoolValidationError, Problem, check_pool, validate_pool
from discovery.model import Pool, Slice
from tests.slices.helpers import DRIVER, device, devices


def problems(pool: Pool, name: str = "node1", driver: str = DRIVER) -> list[Problem]:
    return validate_pool(driver, name, pool)


def fields(pool: Pool) -> list[str]:
    return [p.field for p in problems(pool)]


def one(devs: list[dict[str, Any]], counters: tuple[dict[str, Any], ...] = ()) -> Pool:
    return Pool((Slice(tuple(devs), counters),))


def test_a_normal_pool_passes() -> None:
    assert problems(one(devices(128))) == []
    check_pool(DRIVER, "node1", one(devices(8)))


def test_129_devices_are_too_many_and_the_message_says_how_many() -> None:
    (problem,) = problems(one(devices(129)))
    assert problem.field == "spec.devices"
    assert problem.slice_index == 0
    assert "at most 128" in problem.message and "has 129" in problem.message


def test_a_tainted_device_lowers_the_limit_to_64() -> None:
    devs = devices(65)
    devs[3]["taints"] = [{"key": "example.com/unhealthy", "effect": "NoSchedule"}]
    (problem,) = problems(one(devs))
    assert "at most 64" in problem.message and "taints" in problem.message


def test_33_attributes_and_capacities_are_too_many() -> None:
    dev = device(0)
    dev["attributes"] = {f"a{i}": {"int": i} for i in range(32)}
    (problem,) = problems(one([dev]))
    assert problem.field == "spec.devices[0]"
    assert "33" in problem.message and "32 attributes, 1 capacities" in problem.message


def test_string_attribute_longer_than_64_is_named_precisely() -> None:
    dev = device(0)
    dev["attributes"]["productName"] = {"string": "x" * 65}
    (problem,) = problems(one([dev]))
    assert problem.field == "spec.devices[0].attributes['productName']"
    assert "at most 64" in problem.message and "65" in problem.message


@pytest.mark.parametrize(
    ("attr", "text"),
    [
        ({"version": "1.2"}, "semantic version"),
        ({"int": 1, "string": "x"}, "exactly one"),
        ({}, "exactly one"),
        ({"int": "1"}, "not an integer"),
        ({"bool": 1}, "not a boolean"),
    ],
)
def test_bad_attribute_values(attr: dict[str, Any], text: str) -> None:
    dev = device(0)
    dev["attributes"]["x"] = attr
    (problem,) = problems(one([dev]))
    assert text in problem.message


@pytest.mark.parametrize(
    "key", ["1abc", "a" * 33, "Bad_Domain/x", "-x.io/y", "x/" + "b" * 33]
)
def test_bad_attribute_names(key: str) -> None:
    dev = device(0)
    dev["attributes"][key] = {"int": 1}
    assert fields(one([dev])) == [f"spec.devices[0].attributes[{key!r}]"]


def test_qualified_standard_attribute_names_pass() -> None:
    dev = device(0)
    dev["attributes"]["resource.kubernetes.io/pcieRoot"] = {"string": "pci0000:00"}
    assert problems(one([dev])) == []


@pytest.mark.parametrize("name", ["GPU-0", "gpu_0", "-gpu", "g" * 64, ""])
def test_device_names_must_be_dns_labels(name: str) -> None:
    assert fields(one([device(0, name=name)])) == ["spec.devices[0].name"]


def test_device_names_must_be_unique_in_the_pool_across_slices() -> None:
    pool = Pool((Slice((device(0),)), Slice((device(1), device(0)))))
    (problem,) = problems(pool)
    assert problem.slice_index == 1 and problem.field == "spec.devices[1].name"
    assert "slice #0" in problem.message


def test_bad_capacity_quantity() -> None:
    dev = device(0, capacity={"memory": {"value": "80 GiB"}})
    assert fields(one([dev])) == ["spec.devices[0].capacity['memory'].value"]


def test_taint_rules() -> None:
    dev = device(0, taints=[{"key": "bad key", "effect": "Sometimes"}, {"effect": "None"}])
    assert fields(one([dev])) == [
        "spec.devices[0].taints[0].key",
        "spec.devices[0].taints[0].effect",
        "spec.devices[0].taints[1].key",
    ]


def test_counters_must_exist_in_the_pool() -> None:
    counters = ({"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}},)
    mig = device(1, consumesCounters=[
        {"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}},
        {"counterSet": "nope", "counters": {"memory": {"value": "1"}}},
    ])
    pool = Pool((Slice((), counters), Slice((mig,))))
    assert [(p.slice_index, p.field) for p in problems(pool)] == [
        (1, "spec.devices[0].consumesCounters[1].counterSet")
    ]


def test_devices_and_counters_cannot_share_a_slice() -> None:
    counters = ({"name": "c", "counters": {"m": {"value": "1"}}},)
    assert "spec" in fields(one([device(0)], counters))


@pytest.mark.parametrize(
    ("driver", "pool_name", "field"),
    [
        ("Bad_Driver", "node1", "spec.driver"),
        ("d" * 64 + ".io", "node1", "spec.driver"),
        (DRIVER, "Node1", "spec.pool.name"),
        (DRIVER, "a//b", "spec.pool.name"),
        (DRIVER, "x" * 254, "spec.pool.name"),
    ],
)
def test_driver_and_pool_names(driver: str, pool_name: str, field: str) -> None:
    assert [p.field for p in problems(one([device(0)]), pool_name, driver)] == [field]


def test_upper_case_driver_is_accepted_like_the_server_does() -> None:
    assert problems(one([device(0)]), driver="GPU.Example.com") == []


def test_node_selector_needs_exactly_one_term() -> None:
    pool = Pool((Slice((device(0),)),), node_selector={"nodeSelectorTerms": []})
    assert fields(pool) == ["spec.nodeSelector.nodeSelectorTerms"]


def test_check_pool_raises_with_all_problems_in_the_message() -> None:
    devs = devices(129)
    devs[0]["name"] = "Bad"
    with pytest.raises(PoolValidationError) as info:
        check_pool(DRIVER, "node1", one(devs))
    assert len(info.value.problems) == 2
    assert "pool 'node1' slice #0: spec.devices: must have at most 128" in str(info.value)


@pytest.mark.parametrize("field", ["nodeAllocatableResources",  # 1.37's name
                                   "nodeAllocatableResourceMappings"])  # 1.36's
def test_node_allocatable_resources_pass_under_either_name(field: str) -> None:
    mapping = {"cpu": {"mapping": {"capacityKey": "memory"}}}
    assert problems(one([device(0, **{field: mapping})])) == []


def test_numa_node_list_form_counts_its_values_and_lowers_the_slice_limit() -> None:
    numa = {"resource.kubernetes.io/numaNode": {"ints": [0, 2]}}
    listed = [device(i, attributes={**device(i)["attributes"], **numa}) for i in range(65)]
    (problem,) = problems(one(listed))
    assert "at most 64" in problem.message and "list attributes" in problem.message
    assert problems(one(listed[:64])) == []
    empty = device(0, attributes={"resource.kubernetes.io/numaNode": {"ints": []}})
    assert [p.message for p in problems(one([empty]))] == ["ints must not be empty"]


@pytest.mark.parametrize(
    ("key", "attr"),
    [
        ("gpu\n", {"int": 1}),  # a C identifier with a trailing newline
        ("x", {"version": "1.2.3\n"}),
        ("x", {"version": "1\u0661.2.3"}),  # an Arabic-Indic digit: \d without re.ASCII
        ("x", {"versions": ["1.0.0", "2.0.0\n"]}),
    ],
    ids=["identifier", "version", "unicode-digit", "version-list"],
)
def test_a_trailing_newline_is_not_a_match(key: str, attr: dict[str, Any]) -> None:
    """Each pattern is matched whole: re.match with "$" accepted the value plus one "\\n"."""
    dev = device(0)
    dev["attributes"][key] = attr
    assert fields(one([dev])) == [f"spec.devices[0].attributes[{key!r}]"]


@pytest.mark.parametrize(
    ("taint", "field"),
    [
        ({"key": "example.com/unhealthy\n", "effect": "NoSchedule"}, "key"),
        ({"key": "example.com/unhealthy", "value": "yes\n", "effect": "NoSchedule"}, "value"),
    ],
)
def test_taint_label_names_with_a_trailing_newline_are_refused(
    taint: dict[str, str], field: str
) -> None:
    dev = device(0, taints=[taint])
    assert fields(one([dev])) == [f"spec.devices[0].taints[0].{field}"]
