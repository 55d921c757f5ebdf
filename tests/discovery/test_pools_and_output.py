"""build_resources slicing, and what `dra-agent discover` prints (table, json, yaml, tree)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.inventory import slice_objects
from discovery.model import Device, DeviceType, Inventory, Taint
from discovery.pools import build_resources

Inv = Callable[[str], Inventory]


def _nic(i: int, taints: tuple[Taint, ...] = ()) -> Device:
    return Device(f"nic-{i}", DeviceType.NIC, {"ifName": f"eth{i}"}, {}, taints=taints)


def _slice_sizes(inventory: Inventory) -> list[int]:
    pool = build_resources(inventory, "node-a").pools["node-a"]
    return [len(s.devices) for s in pool.slices]


def test_300_devices_make_3_slices_of_at_most_128() -> None:
    inventory = Inventory(devices=tuple(_nic(i) for i in range(300)))
    assert _slice_sizes(inventory) == [128, 128, 44]


def test_a_tainted_device_limits_its_slice_to_64() -> None:
    devices = [_nic(i) for i in range(200)]
    devices[100] = _nic(100, (Taint("dra-agent.io/xid", value="79"),))
    sizes = _slice_sizes(Inventory(devices=tuple(devices)))
    # 100 untainted devices fit one slice; the tainted one opens a slice capped at 64.
    assert sizes == [100, 64, 36]
    pool = build_resources(Inventory(devices=tuple(devices)), "n").pools["n"]
    assert any(d.get("taints") for d in pool.slices[1].devices)


def test_devices_are_in_natural_order_and_results_are_equal() -> None:
    devices = tuple(_nic(i) for i in (10, 2, 1, 33))
    first = build_resources(Inventory(devices=devices), "n")
    again = build_resources(Inventory(devices=tuple(reversed(devices))), "n")
    assert first == again
    names = [d["name"] for d in first.pools["n"].slices[0].devices]
    assert names == ["nic-1", "nic-2", "nic-10", "nic-33"]


def test_empty_inventory_publishes_one_empty_slice() -> None:
    pool = build_resources(Inventory(devices=()), "n").pools["n"]
    assert len(pool.slices) == 1 and pool.slices[0].devices == ()


def test_slice_objects_are_named_like_the_controller() -> None:
    inventory = Inventory(devices=tuple(_nic(i) for i in range(130)))
    objs = slice_objects(build_resources(inventory, "node-a"), "dra-agent.io", "node-a")
    assert [o["metadata"]["generateName"] for o in objs] == [
        "00000-dra-agent.io-node-a-", "00001-dra-agent.io-node-a-"]
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {2}


def _run(*args: str, env: dict[str, str] | None = None) -> Any:
    runner = CliRunner()
    return runner.invoke(main, ["discover", "--node-name", "node-a", *args], env=env)


def test_json_output_validates_against_the_openapi_schema(slice_validator: Any) -> None:
    for profile in ("dgx-h100", "dgx-a100-mig", "sriov-nic", "empty"):
        result = _run("--simulate", profile, "-o", "json")
        assert result.exit_code == 0, result.output
        listing = json.loads(result.stdout)
        assert listing["kind"] == "List"
        for obj in listing["items"]:
            errors = sorted(slice_validator.iter_errors(obj), key=str)
            assert not errors, f"{profile}: {errors[0]}"
            assert obj["spec"]["nodeName"] == "node-a"
            assert obj["spec"]["pool"]["name"] == "node-a"
            assert obj["spec"]["driver"] == "dra-agent.io"
        if profile == "sriov-nic":
            assert [len(o["spec"]["devices"]) for o in listing["items"]] == [128, 2]


def test_yaml_output_equals_json_output() -> None:
    as_json = json.loads(_run("--simulate", "dgx-h100", "-o", "json").stdout)
    as_yaml = yaml.safe_load(_run("--simulate", "dgx-h100", "-o", "yaml").stdout)
    assert as_json == as_yaml
    gpu0 = as_yaml["items"][0]["spec"]["devices"][0]
    assert gpu0["name"] == "gpu-0"
    assert gpu0["attributes"]["type"] == {"string": "gpu"}
    assert gpu0["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert gpu0["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:15"}
    assert gpu0["capacity"]["memory"] == {"value": "81559Mi"}


def test_table_lists_devices_then_reserved() -> None:
    result = _run("--simulate", "dgx-h100")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "MODEL", "PCI", "NUMA", "PCIE-ROOT", "SWITCH",
                                "DETAILS"]
    gpu0 = next(line for line in lines if line.startswith("gpu-0 "))
    assert "0000:1b:00.0" in gpu0 and "pci0000:15" in gpu0 and "0000:16:00.0" in gpu0
    assert lines[-2].split() == ["RESERVED", "REASON"]
    assert lines[-1].startswith("nic-0000-0b-00-0") and "default route" in lines[-1]
    wide = _run("--simulate", "dgx-h100", "-o", "wide").stdout.splitlines()
    assert "DRIVER" in wide[0].split() and "mlx5_core" in wide[9]


def test_topology_shows_gpu_and_nic_under_one_switch() -> None:
    out = _run("--simulate", "dgx-h100", "--topology").stdout
    lines = out.splitlines()
    assert lines[0] == "node node-a"
    start = lines.index("│  ├─ pci0000:15")
    block = lines[start:start + 4]
    assert block[1].endswith("switch 0000:16:00.0")
    assert "gpu-0 (gpu)" in block[2] and "nic-0000-18-00-0 (nic)" in block[3]
    assert any(line.startswith("└─ NUMA 1") for line in lines)


def test_device_types_option_and_env() -> None:
    out = _run("--simulate", "dgx-h100", "--device-types", "nic", "-o", "json").stdout
    types = {d["attributes"]["type"]["string"]
             for o in json.loads(out)["items"] for d in o["spec"]["devices"]}
    assert types == {"nic"}
    env_out = _run("--simulate", "dgx-h100", "-o", "json",
                   env={"DRA_AGENT_DEVICE_TYPES": "gpu"}).stdout
    assert len(json.loads(env_out)["items"][0]["spec"]["devices"]) == 8


def test_unknown_profile_is_a_usage_error() -> None:
    result = _run("--simulate", "dgx-z9000")
    assert result.exit_code == 2 and "unknown profile" in result.output


def test_unreadable_sysfs_exits_1_with_a_warning(tmp_path: Path) -> None:
    result = _run("--sysfs-root", str(tmp_path / "nothing"))
    assert result.exit_code == 1
    assert "warning: no PCI devices readable" in result.stderr


def test_real_sysfs_runs_with_exit_0() -> None:
    result = _run()
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()


NUMA = "resource.kubernetes.io/numaNode"


def test_discover_shows_the_scalar_numa_node_unless_told_list(slice_validator: Any) -> None:
    scalar = json.loads(_run("--simulate", "dgx-h100", "-o", "json").stdout)
    gpus = [d for o in scalar["items"] for d in o["spec"]["devices"]
            if d["name"].startswith("gpu-")]
    assert [g["attributes"][NUMA] for g in gpus] == [{"int": 0}] * 4 + [{"int": 1}] * 4
    listed = _run("--simulate", "dgx-h100", "-o", "json", "--numa-node-attribute", "list")
    assert listed.exit_code == 0, listed.output
    gpus = [d for o in json.loads(listed.stdout)["items"] for d in o["spec"]["devices"]
            if d["name"].startswith("gpu-")]
    assert [g["attributes"][NUMA] for g in gpus] == (
        [{"ints": [0, 2]}] * 4 + [{"ints": [1, 3]}] * 4)
    attribute = slice_validator.schema["definitions"]["io.k8s.api.resource.v1.DeviceAttribute"]
    if "ints" in attribute["properties"]:  # 1.36+: the list form is valid (behind its gate)
        for obj in json.loads(listed.stdout)["items"]:
            assert not sorted(slice_validator.iter_errors(obj), key=str)
    env = _run("--simulate", "dgx-h100", "-o", "json",
               env={"DRA_AGENT_NUMA_NODE_ATTRIBUTE": "list"}).stdout
    assert json.loads(env) == json.loads(listed.stdout)


def test_discover_table_shows_the_form_asked_for() -> None:
    def numa_of_gpu0(*args: str) -> str:
        out = _run("--simulate", "dgx-h100", *args).stdout.splitlines()
        cells = next(line for line in out if line.startswith("gpu-0 ")).split()
        return cells[cells.index("0000:1b:00.0") + 1]  # NUMA follows PCI

    assert numa_of_gpu0() == "0"
    assert numa_of_gpu0("--numa-node-attribute", "list") == "0,2"
    assert numa_of_gpu0("--numa-node-attribute", "auto") == "0"  # no API server: scalar


def test_list_form_of_130_devices_is_sliced_at_64(tmp_path: Path) -> None:
    listed = json.loads(_run("--simulate", "dgx-a100-mig", "-o", "json",
                             "--numa-node-attribute", "list").stdout)
    assert all(len(o["spec"]["devices"]) <= 64 for o in listed["items"])
    inventory = Inventory(devices=tuple(
        Device(f"nic-{i}", DeviceType.NIC, {NUMA: (0, 1)}, {}) for i in range(130)))
    resources = build_resources(inventory, "node-a")
    assert [len(s.devices) for s in resources.pools["node-a"].slices] == [128, 2]
    assert resources.list_pools is not None
    assert [len(s.devices) for s in resources.list_pools["node-a"].slices] == [64, 64, 2]


@pytest.mark.parametrize("value", ["lists", "", "LIST", "1"])
def test_bad_numa_node_attribute_is_one_line(value: str, tmp_path: Path) -> None:
    result = _run("--simulate", "empty", "--numa-node-attribute", value)
    assert result.exit_code == 2 and "Traceback" not in result.output
    config = tmp_path / "agent.yaml"
    config.write_text(f"numa-node-attribute: {value!r}\n")
    result = _run("--simulate", "empty", "--config", str(config))
    assert result.exit_code == 2 and "numa-node-attribute" in result.output
    assert len(result.output.strip().splitlines()) <= 3, result.output
    assert "Traceback" not in result.output
