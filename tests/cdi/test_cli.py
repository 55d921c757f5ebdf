"""``dra-agent cdi generate``: simulated profiles end to end, real edits on a fake host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.commands.cdi import GenerateError, generate_spec
from cdi.edits import EditsProvider
from cdi.spec import Spec
from tests.cdi.conftest import Checker, gpu, nic
from tests.cdi.fakeroot import LIB_DIR, RM, FakeHost

KIND = "dra-agent.io/device"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["cdi", "generate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_simulated_node_spec_names_devices_as_the_inventory_does(
    checker: Checker, tmp_path: Path
) -> None:
    code, out, err = run("--simulate", "dgx-h100", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    names = [d["name"] for d in doc["devices"]]
    assert names == sorted(names) and "gpu-0" in names and len(names) >= 16
    path = tmp_path / "dra-agent.io-device.json"
    path.write_text(out)
    report = checker.validate(path)
    assert f"{KIND}=gpu-7" in report
    oci = checker.inject(tmp_path, f"{KIND}=gpu-3")
    assert "DRA_AGENT_DEVICE_GPU_3_NAME=gpu-3" in oci["process"]["env"]


def test_yaml_output_is_deterministic_and_valid(checker: Checker, tmp_path: Path) -> None:
    first = run("--simulate", "dgx-h100", "--device", "gpu-1", "--device", "gpu-0")
    second = run("--simulate", "dgx-h100", "--device", "gpu-1", "--device", "gpu-0")
    assert first == second and first[0] == 0
    doc = yaml.safe_load(first[1])
    assert [d["name"] for d in doc["devices"]] == ["gpu-1", "gpu-0"]
    path = tmp_path / "spec.yaml"
    path.write_text(first[1])
    checker.validate(path)


def test_unknown_device_or_bad_class_is_a_usage_error() -> None:
    code, _, err = run("--simulate", "dgx-h100", "--device", "gpu-99")
    assert code == 2 and "unknown device(s) gpu-99" in err and "gpu-0" in err
    code, _, err = run("--simulate", "dgx-h100", "--class", "a/b")
    assert code == 2 and "invalid CDI" in err


@pytest.fixture
def node(host: FakeHost) -> FakeHost:
    host.install_driver()
    host.make_control_nodes()
    host.add_gpu(0, "0000:1b:00.0")
    host.add_gpu(1, "0000:2b:00.0")
    host.add_rdma("mlx5_0", 0)
    host.add_rdma_cm()
    return host


def provider(host: FakeHost) -> EditsProvider:
    return EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys)


def write(spec: Spec, tmp_path: Path) -> Path:
    path = tmp_path / "dra-agent.io-device.json"
    path.write_text(json.dumps(spec.to_dict(), indent=2))
    return path


def test_gpu_only_node_shares_the_driver_edits_at_spec_level(
    node: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    spec = generate_spec([gpu(), gpu("gpu-1", 1, "0000:2b:00.0")], provider(node), KIND)
    assert any(m.container_path.endswith(f"libcuda.so.{RM}") for m in spec.container_edits.mounts)
    assert [n.path for n in spec.devices[1].container_edits.device_nodes] == ["/dev/nvidia1"]
    checker.validate(write(spec, tmp_path))


def test_mixed_node_gives_each_device_only_its_own_share(
    node: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    spec = generate_spec([gpu(), nic()], provider(node), KIND)
    assert spec.container_edits.is_empty()
    assert spec.to_dict()["cdiVersion"] == "0.5.0"  # hostPath: nodes live under a fake /dev
    checker.validate(write(spec, tmp_path))
    nic_oci = checker.inject(tmp_path, f"{KIND}=nic-0")
    assert not nic_oci.get("mounts")
    assert {d["path"] for d in nic_oci["linux"]["devices"]} == {
        "/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0",
        "/dev/infiniband/rdma_cm",
    }  # fmt: skip
    gpu_oci = checker.inject(tmp_path, f"{KIND}=gpu-0")
    assert f"{LIB_DIR}/libcuda.so.{RM}" in {m["destination"] for m in gpu_oci["mounts"]}
    assert "DRA_AGENT_DEVICE_GPU_0_UUID=GPU-00000000" in gpu_oci["process"]["env"]


def test_netdev_is_opt_in_because_it_needs_cdi_1_1_0(node: FakeHost) -> None:
    assert generate_spec([nic()], provider(node), KIND).to_dict()["cdiVersion"] == "0.5.0"
    spec = generate_spec([nic()], provider(node), KIND, netdev=True)
    assert spec.to_dict()["cdiVersion"] == "1.1.0"


def test_devices_the_host_cannot_back_are_all_reported(node: FakeHost) -> None:
    missing = [gpu("gpu-5", 5, "0000:5b:00.0"), gpu("gpu-6", 6, "0000:6b:00.0")]
    with pytest.raises(GenerateError) as info:
        generate_spec([gpu(), *missing], provider(node), KIND)
    message = info.value.format_message()
    assert "gpu-5" in message and "gpu-6" in message and "gpu-0" not in message
    with pytest.raises(GenerateError, match="no devices"):
        generate_spec([], provider(node), KIND)
