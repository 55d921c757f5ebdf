"""Verdicts are judged once per distinct input (CEL view, holder, constraint value) and the
parser builds plain devices on a fast path: devices that share a shape but not their values
still get their own verdicts."""

import pytest

from agent.explain import InputError, explain
from tests.explain.builders import (
    CLASSES,
    DRIVER,
    NODE,
    allocated,
    claim,
    device,
    exactly,
    slice_,
)

PCIE = "resource.kubernetes.io/pcieRoot"


def verdicts(result, request):
    report = next(r for r in result.requests if r.request == request)
    return {v.device: v for v in report.devices}


def test_devices_of_one_shape_with_different_values_get_their_own_selector_verdicts():
    devices = [device(f"gpu-{i}", productName=name)
               for i, name in enumerate(["H100", "A100", "H100", "A100"])]
    h100 = f'device.attributes["{DRIVER}"].productName == "H100"'
    result = explain(claim(exactly("gpu", "gpu.dra-agent.io", 1, h100)),
                     CLASSES, [slice_(devices)], NODE)
    got = verdicts(result, "gpu")
    assert got["gpu-0"].chosen
    assert got["gpu-2"].reason is None and not got["gpu-2"].chosen  # a candidate, not needed
    for name in ("gpu-1", "gpu-3"):
        assert got[name].reason is not None and got[name].reason.code == "selector"


def test_devices_held_by_different_claims_each_name_their_own_holder():
    devices = [device(f"gpu-{i}") for i in range(3)]
    held = [allocated("a", "gpu-0"), allocated("b", "gpu-1")]
    result = explain(claim(exactly("gpu", count=1)), CLASSES, [slice_(devices)], NODE, held)
    got = verdicts(result, "gpu")
    assert got["gpu-0"].reason.detail == {"claim": "default/a"}
    assert got["gpu-1"].reason.detail == {"claim": "default/b"}
    assert got["gpu-2"].chosen


def test_a_constraint_verdict_carries_each_devices_own_value():
    devices = [device("gpu-0", root="pci0000:15"),
               device("nic-0", "nic", root="pci0000:16", memory=None),
               device("nic-1", "nic", root="pci0000:17", memory=None),
               device("nic-2", "nic", root="pci0000:16", memory=None),
               device("nic-3", "nic", root="pci0000:15", memory=None)]
    result = explain(claim(exactly("gpu"), exactly("nic", "nic.dra-agent.io"),
                           constraints=[{"matchAttribute": PCIE, "requests": ["gpu", "nic"]}]),
                     CLASSES, [slice_(devices)], NODE)
    got = verdicts(result, "nic")
    assert got["nic-3"].chosen
    assert [got[n].reason.detail["value"] for n in ("nic-0", "nic-1", "nic-2")] == [
        "pci0000:16", "pci0000:17", "pci0000:16"]
    assert got["nic-0"].reason.message == got["nic-1"].reason.message  # they group


def test_requests_that_refuse_a_device_alike_report_the_same_verdict():
    devices = [device("gpu-0"), device("nic-0", "nic", memory=None)]
    result = explain(claim(exactly("a"), exactly("b")), CLASSES, [slice_(devices)], NODE)
    a, b = verdicts(result, "a")["nic-0"], verdicts(result, "b")["nic-0"]
    assert a.to_dict() == b.to_dict()
    assert a.reason.code == "selector"


def test_a_device_without_a_string_name_is_refused_by_the_schema():
    bad = {"name": 7, "attributes": {"type": {"string": "gpu"}}}
    with pytest.raises(InputError, match=r"spec\.devices\[1\]\.name: expected str, got int 7"):
        explain(claim(exactly("gpu")), CLASSES, [slice_([device("gpu-0"), bad])], NODE)
