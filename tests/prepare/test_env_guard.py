"""A claim's opaque ``env`` can never change what the agent and the runtime decide.

The attack (security review, issue 19, high): a claim sets ``NVIDIA_VISIBLE_DEVICES=all``; CDI
applies device edits after spec edits, so the claim's value beat the agent's ``void`` and
nvidia-container-runtime handed the container every GPU on the node. Checked here end to end
with the reference CDI library's inject (hack/cdi-check), as the runtime would apply the spec.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.claim.model import ClaimRef
from agent.claim.opaque import ConfigDecodeError, merge_configs
from agent.claim.parse import parse_claim
from agent.prepare import CDIClaimSpecs, EnvOnlyEdits
from agent.prepare.devices import SpecDevice
from agent.prepare.errors import BadConfigError
from cdi.edits import EditsProvider
from tests.cdi.fakeroot import FakeHost
from tests.plugnode import DRIVER, make_claim
from tests.prepare.test_hardware_specs import nvidia_gpu, preparer, provider

GOOD = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig"}


def opaque(source: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"source": source, "requests": [], "opaque": {"driver": DRIVER, "parameters": params}}


def gpu_claim(*configs: dict[str, Any]) -> dict[str, Any]:
    return make_claim("c", ["gpu-0"], config=list(configs))


def injected_env(cdi_check: Path, cdi_dir: Path, *ids: str) -> dict[str, str]:
    out = subprocess.run([str(cdi_check), "inject", str(cdi_dir), *ids], capture_output=True,
                         text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    env = json.loads(out.stdout)["process"]["env"]
    return dict(e.split("=", 1) for e in env)


@pytest.fixture
def gpu_host(tmp_path: Path) -> FakeHost:
    fake = FakeHost(tmp_path / "host")
    for d in (fake.root, fake.dev, fake.proc, fake.sys):
        d.mkdir(parents=True)
    fake.install_driver()
    fake.make_control_nodes()
    fake.add_gpu(0, "0000:1b:00.0")
    return fake


@pytest.mark.parametrize("name", [
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH", "DRA_AGENT_CLAIM_UID",
    "DRA_AGENT_DEVICE_GPU_0",
])
def test_claim_env_may_not_set_guarded_variables(tmp_path: Path, name: str) -> None:
    p = preparer(tmp_path, EnvOnlyEdits(), [nvidia_gpu(0)])
    claim = parse_claim(gpu_claim(opaque("FromClaim", {**GOOD, "env": {name: "all"}})))
    with pytest.raises(BadConfigError, match=f"field env.{name}: .*never by a claim"):
        p.prepare(claim)
    assert p.checkpoint.claims() == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []


@pytest.mark.parametrize("name", [
    "FOO\n", "FOO\nNVIDIA_VISIBLE_DEVICES", "FOO\0", "9FOO", "FO-O", "FÖO", "", "A" * 257,
])
def test_env_names_are_matched_whole(name: str) -> None:
    with pytest.raises(ConfigDecodeError, match="not a valid environment variable name"):
        merge_configs([{**GOOD, "env": {name: "1"}}])


def test_env_values_without_nul_and_bounded() -> None:
    with pytest.raises(ConfigDecodeError, match="without NUL"):
        merge_configs([{**GOOD, "env": {"A": "x\0y"}}])
    with pytest.raises(ConfigDecodeError, match="at most"):
        merge_configs([{**GOOD, "env": {"A": "x" * (32 * 1024 + 1)}}])


def test_harmless_cuda_and_other_variables_pass() -> None:
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"}
    assert dict(merge_configs([{**GOOD, "env": env}]).env) == env


def test_class_config_tightens_and_claim_cannot_loosen() -> None:
    deny = {**GOOD, "denyEnv": ["NCCL_*", "OMP_NUM_THREADS"]}
    # The class's own list applies to the claim's env...
    with pytest.raises(ConfigDecodeError, match=r"env.NCCL_DEBUG: denied by the DeviceClass"):
        merge_configs([{**GOOD, "env": {"NCCL_DEBUG": "INFO"}}], class_params=[deny])
    with pytest.raises(ConfigDecodeError, match=r"env.OMP_NUM_THREADS: denied"):
        merge_configs([{**GOOD, "env": {"OMP_NUM_THREADS": "1"}}], class_params=[deny])
    # ...to another class's env too (one class cannot undo another's list)...
    with pytest.raises(ConfigDecodeError, match=r"env.NCCL_IB_HCA: denied"):
        merge_configs([], class_params=[{**GOOD, "env": {"NCCL_IB_HCA": "mlx5"}}, deny])
    # ...and a claim cannot carry a list of its own (nor loosen the built-in one).
    with pytest.raises(ConfigDecodeError, match="denyEnv: may only be set in a DeviceClass"):
        merge_configs([{**GOOD, "denyEnv": []}])
    with pytest.raises(ConfigDecodeError, match=r"env\.NVIDIA_VISIBLE_DEVICES"):
        merge_configs([{**GOOD, "env": {"NVIDIA_VISIBLE_DEVICES": "all"}}],
                      class_params=[{**GOOD, "denyEnv": []}])
    # Names not denied still pass beside a deny list.
    merged = merge_configs([{**GOOD, "env": {"NCCLX": "1"}}], class_params=[deny])
    assert dict(merged.env) == {"NCCLX": "1"}
    assert merged.deny_env == ("NCCL_*", "OMP_NUM_THREADS")


@pytest.mark.parametrize("deny", ["NCCL_*", ["NCCL*X"], ["A\n"], [1], ["*"]])
def test_bad_deny_lists_are_refused(deny: Any) -> None:
    with pytest.raises(ConfigDecodeError, match="denyEnv"):
        merge_configs([], class_params=[{**GOOD, "denyEnv": deny}])


def test_class_deny_list_refuses_the_claim_through_prepare(tmp_path: Path) -> None:
    p = preparer(tmp_path, EnvOnlyEdits(), [nvidia_gpu(0)])
    claim = parse_claim(gpu_claim(
        opaque("FromClass", {**GOOD, "denyEnv": ["NCCL_*"]}),
        opaque("FromClaim", {**GOOD, "env": {"NCCL_ALGO": "Tree"}})))
    with pytest.raises(BadConfigError, match=r"env\.NCCL_ALGO: denied by the DeviceClass"):
        p.prepare(claim)


def test_agent_variables_are_applied_last(
    tmp_path: Path, gpu_host: FakeHost, cdi_check_bin: Path
) -> None:
    """Even an env that got past the deny list cannot replace the agent's values: the
    reference library's inject ends with the agent's guard and claim identity."""
    specs = CDIClaimSpecs(tmp_path / "cdi", DRIVER, provider(gpu_host))
    ref = ClaimRef("default", "c", "uid-1")
    smuggled = ("NVIDIA_VISIBLE_DEVICES=all", "DRA_AGENT_CLAIM_UID=someone-else", "KEEP=1")
    specs.write(ref, [SpecDevice(device=nvidia_gpu(0), env=smuggled)],
                env=("DRA_AGENT_CLAIM_UID=uid-1",))
    env = injected_env(cdi_check_bin, tmp_path / "cdi", specs.cdi_id("uid-1", "gpu-0"))
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["DRA_AGENT_CLAIM_UID"] == "uid-1"
    assert env["KEEP"] == "1"


def test_prepared_gpu_spec_injects_void(
    tmp_path: Path, gpu_host: FakeHost, cdi_check_bin: Path
) -> None:
    p = preparer(tmp_path, EditsProvider(gpu_host.root, gpu_host.dev, gpu_host.proc,
                                         sysfs_root=gpu_host.sys), [nvidia_gpu(0)])
    claim = parse_claim(gpu_claim(opaque("FromClaim", {**GOOD, "env": {"NCCL_DEBUG": "INFO"}})))
    record = p.prepare(claim)
    env = injected_env(cdi_check_bin, tmp_path / "cdi", *record.devices[0].cdi_ids)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["DRA_AGENT_CLAIM_UID"] == claim.ref.uid
