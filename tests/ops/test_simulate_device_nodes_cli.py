"""``--simulate-device-nodes``: a flag, ``DRA_AGENT_SIMULATE_DEVICE_NODES`` and the config key
``simulate-device-nodes`` reach ``run``; without ``--simulate`` it is one ``error:`` line and exit
2; ``cdi generate`` refuses it in one line (it writes nothing on the host)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import main
from agent.common.config import Config
from tests.conftest import REPO
from tests.ops.runconfig import run_config as parse_run

ENV = "DRA_AGENT_SIMULATE_DEVICE_NODES"


def run_config(*args: str, env: dict[str, str] | None = None) -> Config:
    return parse_run(args, env)


def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRA_AGENT_")}
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], cwd=REPO,
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_off_by_default_and_on_by_flag_env_or_file(tmp_path: Path) -> None:
    assert Config().simulate_device_nodes is False
    assert run_config("--simulate", "dgx-h100").simulate_device_nodes is False
    on = run_config("--simulate", "dgx-h100", "--simulate-device-nodes")
    assert on.simulate_device_nodes is True
    assert on.simulated_dev_dir == Path("/var/lib/kubelet/plugins/dra-agent.io/simulated-dev")
    assert run_config("--simulate", "sriov-nic", env={ENV: "true"}).simulate_device_nodes
    assert not run_config("--simulate", "sriov-nic", env={ENV: "0"}).simulate_device_nodes
    config = tmp_path / "agent.yaml"
    config.write_text("simulate: dgx-h100\nsimulate-device-nodes: true\n"
                      "kubelet-dir: /var/lib/k0s/kubelet\ndriver-name: gpu.example.com\n")
    cfg = run_config("--config", str(config))
    assert cfg.simulate_device_nodes is True
    assert cfg.simulated_dev_dir == Path(
        "/var/lib/k0s/kubelet/plugins/gpu.example.com/simulated-dev")
    # The environment wins over the file, as for every option.
    assert not run_config("--config", str(config), env={ENV: "false"}).simulate_device_nodes


@pytest.mark.parametrize(("args", "env"), [
    (["--simulate-device-nodes"], {}),
    ([], {ENV: "1"}),
])
def test_without_simulate_it_is_one_error_line_and_exit_2(
        tmp_path: Path, args: list[str], env: dict[str, str]) -> None:
    out = agent("run", "--kubeconfig", "none", "--kubelet-dir", str(tmp_path / "k"),
                "--cdi-dir", str(tmp_path / "c"), *args, env=env)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: --simulate-device-nodes needs --simulate"), line
    assert not (tmp_path / "k").exists()  # refused before anything started


def test_a_file_saying_yes_is_refused_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text("simulate: dgx-h100\nsimulate-device-nodes: yes please\n")
    result = CliRunner().invoke(main, ["config", "check", str(config)])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert "simulate-device-nodes: expected true or false" in line, line


def test_cdi_generate_refuses_it_in_one_line() -> None:
    out = agent("cdi", "generate", "--simulate", "dgx-h100", "--simulate-device-nodes")
    assert out.returncode == 2
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: --simulate-device-nodes is an option of 'dra-agent run'")
    help_text = CliRunner().invoke(main, ["cdi", "generate", "--help"]).output
    assert "--simulate-device-nodes" not in help_text
    assert "--simulate-device-nodes" in CliRunner().invoke(main, ["run", "--help"]).output


def test_cdi_generate_leaves_a_shared_files_key_unused(tmp_path: Path) -> None:
    """One file serves every command: the key run reads does not break cdi generate."""
    config = tmp_path / "agent.yaml"
    config.write_text("simulate: dgx-h100\nsimulate-device-nodes: true\n")
    out = agent("cdi", "generate", "--config", str(config), "--device", "gpu-0", "-o", "json")
    assert out.returncode == 0, out.stderr
    assert "deviceNodes" not in out.stdout
    assert "DRA_AGENT_DEVICE_GPU_0_UUID=" in out.stdout
