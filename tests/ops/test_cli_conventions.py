"""The command line's conventions: each command's help lists only the options it reads, one
``error:`` line for every failure, and no option accepted and then silently ignored."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent import __version__
from agent.cli import main
from discovery.simulate import PROFILES
from tests.conftest import REPO

#: Shared options a command does not read, and so must not offer.
NOT_READ: dict[tuple[str, ...], tuple[str, ...]] = {
    ("claims",): ("--simulate", "--metrics-address", "--kubeconfig", "--cdi-dir",
                  "--sysfs-root", "--node-name", "--log-format"),
    ("discover",): ("--kubeconfig", "--kubelet-dir", "--cdi-dir", "--metrics-address"),
    ("cdi", "generate"): ("--kubeconfig", "--kubelet-dir", "--cdi-dir", "--metrics-address"),
    ("explain",): ("--kubelet-dir", "--cdi-dir", "--metrics-address", "--log-format"),
    # doctor reads sysfs under --host-root, never a --sysfs-root of its own.
    ("doctor",): ("--sysfs-root",),
    # It only writes into the running agent's inbox: the plugin dir is all it needs.
    ("simulate", "fault"): ("--simulate", "--metrics-address", "--kubeconfig", "--cdi-dir",
                            "--sysfs-root", "--node-name", "--log-format", "--device-types",
                            "--mig", "--vfs", "--sharing", "--simulate-device-nodes"),
}


def _help(*command: str) -> str:
    # --help: a command once parsed without the group (make_context) keeps only that name.
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", NOT_READ, ids=" ".join)
def test_help_lists_only_the_options_the_command_reads(command: tuple[str, ...]) -> None:
    offered = set(re.findall(r"(?m)^\s+(?:-\w, )?(--[\w-]+)", _help(*command)))
    assert offered & set(NOT_READ[command]) == set()
    assert "--driver-name" in offered and "--config" in offered


def test_claims_keeps_what_it_reads_and_refuses_the_rest(tmp_path: Path) -> None:
    offered = _help("claims")
    assert "--kubelet-dir" in offered
    result = CliRunner().invoke(main, ["claims", "--simulate", "dgx-h100"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: No such option '--simulate'")


def test_run_still_takes_every_shared_option() -> None:
    offered = _help("run")
    for flag in ("--kubeconfig", "--kubelet-dir", "--cdi-dir", "--metrics-address",
                 "--simulate", "--sysfs-root", "--log-format", "--device-types"):
        assert flag in offered


def test_env_and_config_file_still_reach_a_command_that_takes_the_option(
    tmp_path: Path,
) -> None:
    kubelet = tmp_path / "kubelet"
    result = CliRunner().invoke(main, ["claims"], env={"DRA_AGENT_KUBELET_DIR": str(kubelet)})
    assert result.exit_code == 0 and str(kubelet) in result.stdout
    # The shared keys of one file serve every command, also those a command does not read.
    conf = tmp_path / "c.yaml"
    conf.write_text(f"kubelet-dir: {tmp_path / 'other'}\nmetrics-address: none\n")
    result = CliRunner().invoke(main, ["claims", "--config", str(conf)])
    assert result.exit_code == 0, result.stderr
    assert str(tmp_path / "other") in result.stdout


def test_version_flag() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"dra-agent {__version__}\n")


@pytest.mark.parametrize("command", [("discover",), ("cdi", "generate"), ("explain",),
                                     ("run",), ("doctor",)], ids=" ".join)
def test_simulate_help_lists_the_profiles(command: tuple[str, ...]) -> None:
    # click wraps help text at hyphens too ("amd-" / "mi300x"): join such breaks back.
    text = re.sub(r"-\n\s+", "-", _help(*command))
    text = " ".join(text.split())
    listed = ", ".join(sorted(PROFILES))
    assert f"PROFILE is one of {listed}" in text


@pytest.mark.parametrize("output", ["json", "yaml", "wide"])
def test_topology_with_a_data_output_is_refused(output: str) -> None:
    result = CliRunner().invoke(main, ["discover", "--simulate", "dgx-h100", "--topology",
                                       "-o", output])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: --topology prints a text tree; it cannot be "
                                    f"combined with -o {output}")
    assert result.stderr.count("\n") == 1


def test_topology_alone_still_draws_the_tree() -> None:
    result = CliRunner().invoke(main, ["discover", "--simulate", "dgx-h100", "--topology"])
    assert result.exit_code == 0 and "NUMA" in result.stdout


@pytest.mark.parametrize("slices", ["from-discovery", "from-cluster"])
def test_explain_refuses_a_kubeconfig_that_does_not_exist(tmp_path: Path, slices: str) -> None:
    claim = tmp_path / "claim.yaml"
    claim.write_text("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
                     "metadata: {name: c}\nspec: {devices: {requests: []}}\n")
    missing = tmp_path / "no-such-kubeconfig"
    result = CliRunner().invoke(main, ["explain", "-f", str(claim), "--simulate", "dgx-h100",
                                       "--slices", slices, "--kubeconfig", str(missing)])
    assert result.exit_code == 2
    assert result.stderr == f"error: --kubeconfig: {missing}: no such file\n"
    # A directory is not a kubeconfig either.
    result = CliRunner().invoke(main, ["explain", "-f", str(claim), "--simulate", "dgx-h100",
                                       "--kubeconfig", str(tmp_path)])
    assert result.stderr == f"error: --kubeconfig: {tmp_path}: not a regular file\n"


def test_run_with_a_missing_kubeconfig_uses_the_error_prefix(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    # The sockets are served before the kubeconfig is read: a short kubelet dir, as on a node.
    short = Path(tempfile.mkdtemp(prefix="cc", dir="/tmp"))
    try:
        out = subprocess.run(
            [sys.executable, "-m", "agent.cli", "run", "--simulate", "empty", "--no-health",
             "--kubeconfig", str(missing), "--metrics-address", "none",
             "--kubelet-dir", str(short / "k"), "--cdi-dir", str(tmp_path / "c")],
            capture_output=True, text=True, timeout=60, check=False, cwd=REPO)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and str(missing) in out.stderr, out.stderr
    assert "dra-agent: " not in out.stderr


def test_simulated_cdi_spec_says_why_it_holds_only_env_edits() -> None:
    result = CliRunner().invoke(main, ["cdi", "generate", "--simulate", "dgx-h100", "-o",
                                       "json", "--device", "gpu-0"])
    assert result.exit_code == 0
    assert result.stdout.lstrip().startswith("{")  # the note stays off the spec
    (note,) = result.stderr.splitlines()
    assert note.startswith("note: simulated devices have no device nodes")
    assert "hack.playground cdi" in note


def test_playground_shows_a_real_gpu_spec(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from hack import playground

    assert playground.main(["cdi"]) == 0
    text = capsys.readouterr().out
    spec = yaml.safe_load(text[text.index("cdiVersion"):])
    (device,) = spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == ["/dev/nvidia0"]
    shared = spec["containerEdits"]
    assert "/dev/nvidiactl" in [n["path"] for n in shared["deviceNodes"]]
    assert any(m["containerPath"].startswith("/usr/lib/x86_64-linux-gnu/libcuda.so")
               for m in shared["mounts"])
    assert shared["hooks"][0]["path"] == "/usr/bin/nvidia-cdi-hook"
    assert "/tmp" not in text  # the fixture's own paths do not leak into what is shown


def test_playground_cluster_steps_still_need_a_kubeconfig(
        capsys: pytest.CaptureFixture[str]) -> None:
    from hack import playground

    with pytest.raises(SystemExit) as info:
        playground.main(["setup"])
    assert info.value.code == 2
    assert "setup needs --kubeconfig" in capsys.readouterr().err
