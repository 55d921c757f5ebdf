"""Smaller rules: tolerations, per-device node selection, binding conditions, rendering."""

import pytest

from agent.explain import explain
from agent.explain.model import Toleration
from agent.explain.render import to_table
from discovery.model import Taint
from tests.explain.builders import CLASSES, NODE, claim, device, dgx_slice, exactly, slice_

TAINT = Taint(key="k", effect="NoExecute", value="v")


@pytest.mark.parametrize(("tol", "ok"), [
    (Toleration("k", "Equal", "v"), True),
    (Toleration("k", "Equal", "w"), False),
    (Toleration("k", "Exists"), True),
    (Toleration("", "Exists"), True),
    (Toleration("k", "Exists", effect="NoSchedule"), False),
    (Toleration("k", "Exists", effect="NoExecute"), True),
    (Toleration("other", "Exists"), False),
])
def test_toleration_matching(tol, ok):
    assert tol.tolerates(TAINT) is ok


def test_no_execute_taint_blocks_like_no_schedule():
    dev = device("gpu-0")
    dev["taints"] = [{"key": "k", "value": "v", "effect": "NoExecute"}]
    r = explain(claim(exactly("gpu")), CLASSES, [slice_([dev])], NODE)
    assert not r.fits and r.requests[0].devices[0].reason.code == "taint"


def test_per_device_node_selection():
    here, there = device("gpu-0"), device("gpu-1")
    here["nodeName"], there["nodeName"] = NODE, "node-b"
    s = slice_([here, there])
    del s["spec"]["nodeName"]
    s["spec"]["perDeviceNodeSelection"] = True
    r = explain(claim(exactly("gpu", count=2)), CLASSES, [s], NODE)
    assert not r.fits
    assert r.requests[0].devices[1].reason.code == "node"
    r = explain(claim(exactly("gpu")), CLASSES, [s], NODE)
    assert r.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == \
        [NODE]


def test_node_selector_slices_and_labels():
    s = slice_([device("gpu-0")])
    del s["spec"]["nodeName"]
    sel = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    s["spec"]["nodeSelector"] = sel
    assert not explain(claim(exactly("gpu")), CLASSES, [s], NODE).fits
    r = explain(claim(exactly("gpu")), CLASSES, [s], NODE, node_labels={"rack": "r1"})
    assert r.fits and r.allocation["nodeSelector"] == sel


def test_binding_conditions_are_copied_and_such_pools_come_last():
    late = device("gpu-0")
    late["bindingConditions"] = ["Ready"]
    late["bindingFailureConditions"] = ["Failed"]
    a = slice_([late], pool="a-pool", name="a")
    b = slice_([device("gpu-9")], pool="b-pool", name="b")
    r = explain(claim(exactly("gpu")), CLASSES, [a, b], NODE)
    assert r.allocation["devices"]["results"][0]["device"] == "gpu-9"
    r = explain(claim(exactly("gpu", count=2)), CLASSES, [a, b], NODE)
    first = r.allocation["devices"]["results"][1]
    assert first["bindingConditions"] == ["Ready"]
    assert first["bindingFailureConditions"] == ["Failed"]


def test_table_groups_reasons_and_ends_with_the_suggestion():
    r = explain(claim(exactly("gpu", count=5)), CLASSES, [dgx_slice()], NODE)
    text = to_table(r)
    assert text.splitlines()[0] == "claim default/job on node node-a: DOES NOT FIT"
    assert "4 x class gpu.dra-agent.io selector #0 is false" in text
    assert text.splitlines()[-1].startswith("to make it fit: request gpu needs 5")
