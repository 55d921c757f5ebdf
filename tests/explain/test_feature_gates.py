"""--feature-gates / --kubernetes-version: the allocator's gates change what it does, from the
defaults of the release explain models (1.37), and --node-labels for nodeSelector slices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.explain.api import explain
from agent.explain.features import DEFAULTS, MODELLED_KUBERNETES, parse_gates
from tests.explain.builders import CLASSES, NODE, claim, device, exactly, slice_


def _tainted() -> dict[str, Any]:
    d = device("gpu-0")
    d["taints"] = [{"key": "broken", "effect": "NoSchedule"}]
    return slice_([d])


def test_defaults_are_kubernetes_1_37s_and_1_35_is_at_hand() -> None:
    assert MODELLED_KUBERNETES == "1.37"
    on = parse_gates("").enabled()
    assert on["DRADeviceTaints"] and on["DRAPartitionableDevices"]
    assert not on["DRAListTypeAttributes"] and not on["DRAFractionalCapacityRange"]
    old = parse_gates("", "1.35").enabled()
    assert not old["DRADeviceTaints"] and not old["DRAPartitionableDevices"]
    assert old["DRAPrioritizedList"] and old["DRAAdminAccess"]
    assert parse_gates("DRAListTypeAttributes=true").list_type_attributes
    assert set(DEFAULTS) == {"1.35", "1.37"}


def test_taints_block_only_with_device_taints_on() -> None:
    c = claim(exactly("g"))
    assert not explain(c, CLASSES, [_tainted()], NODE).fits
    assert explain(c, CLASSES, [_tainted()], NODE, feature_gates={"DRADeviceTaints": False}).fits
    assert explain(c, CLASSES, [_tainted()], NODE, kubernetes_version="1.35").fits


def test_prioritized_list_off_is_an_error_not_a_fit() -> None:
    c = claim({"name": "g", "firstAvailable": [{"name": "a", "deviceClassName":
                                                "gpu.dra-agent.io"}]})
    assert explain(c, CLASSES, [slice_([device("gpu-0")])], NODE).fits
    r = explain(c, CLASSES, [slice_([device("gpu-0")])], NODE,
                feature_gates={"DRAPrioritizedList": False}, kubernetes_version="1.35")
    assert not r.fits and r.error is not None and "DRAPrioritizedList" in r.error


def test_partitionable_off_skips_devices_consuming_counters() -> None:
    counters = slice_([], name="counters",
                      counters=[{"name": "mem", "counters": {"m": {"value": "2"}}}], count=2)
    d = device("gpu-0")
    d["consumesCounters"] = [{"counterSet": "mem", "counters": {"m": {"value": "1"}}}]
    devs = slice_([d], name="devs", count=2)
    assert explain(claim(exactly("g")), CLASSES, [counters, devs], NODE).fits
    assert not explain(claim(exactly("g")), CLASSES, [counters, devs], NODE,
                       kubernetes_version="1.35").fits


def test_node_labels_select_slices_by_node_selector(tmp_path: Path) -> None:
    s = slice_([device("gpu-0")], node="")
    del s["spec"]["nodeName"]
    s["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["gpu"]}]}]}
    assert not explain(claim(exactly("g")), CLASSES, [s], NODE).fits
    assert explain(claim(exactly("g")), CLASSES, [s], NODE, node_labels={"pool": "gpu"}).fits
    files = {}
    for k, objs in {"c": [claim(exactly("g"))], "k": CLASSES, "s": [s]}.items():
        files[k] = tmp_path / f"{k}.yaml"
        files[k].write_text(yaml.safe_dump_all(objs))
    argv = ["explain", "-f", str(files["c"]), "--class", str(files["k"]), "--slices",
            str(files["s"]), "--node-name", NODE]
    codes = [CliRunner().invoke(main, argv + extra, catch_exceptions=False).exit_code
             for extra in ([], ["--node-labels", "pool=gpu,zone=a"], ["--node-labels", "=x"])]
    assert codes == [1, 0, 2]


def test_cli_feature_gates_and_version_line() -> None:
    out = CliRunner().invoke(main, ["version"], catch_exceptions=False).output
    assert "explain models: kube-scheduler 1.37" in out
