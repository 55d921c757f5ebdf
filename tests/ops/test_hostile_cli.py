"""Every command, whatever file or value it is handed: exit 2 and one line on stderr saying what
is wrong, never a traceback (1 is kept for "ran and the answer is no")."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from agent.common.config import Config

HOSTILE: dict[str, bytes] = {
    "binary": bytes(range(256)) * 4,
    "latin1": "node_name: caf\xe9\n".encode("latin-1"),
    "nul": b"node_name: a\x00b\n",
    "huge": b"# " + b"x" * (2 << 20) + b"\n",
    "deep-list": b"[" * 50000 + b"]" * 50000,
    "deep-map": b"a: " + b"{a: " * 5000 + b"1" + b"}" * 5000,
    "scalar": b"42\n",
    "list": b"- a\n- b\n",
    "bad-yaml": b"node_name: [unclosed\n",
    "unknown-key": b"no_such_key: 1\n",
    "verbosity-lots": b"verbosity: lots\n",
    "verbosity-bool": b"verbosity: true\n",
    "kubelet-dir-list": b"kubelet_dir: [1, 2]\n",
    "device-types-int": b"device_types: [5]\n",
    "rolling-update-maybe": b"rolling_update: maybe\n",
}
#: Each command with what it needs to get as far as reading its options.
COMMANDS: dict[str, list[str]] = {
    "discover": ["discover", "--simulate", "dgx-h100"],
    "claims": ["claims"],
    "cdi generate": ["cdi", "generate", "--simulate", "dgx-h100"],
    "run": ["run", "--simulate", "dgx-h100", "--kubeconfig", "none", "--metrics-address", "none"],
    "explain": ["explain", "-f", "-", "--simulate", "dgx-h100"],
    "doctor": ["doctor", "--simulate", "dgx-h100", "--kubeconfig", "none"],
    "simulate fault": ["simulate", "fault", "gpu-3", "--xid", "79"],
}

#: The directories each command writes or reads under (pointed at tmp_path), and a path option
#: it takes; each command offers only the shared options it reads.
DIRS: dict[str, tuple[str, ...]] = {"claims": ("--kubelet-dir",),
                                    "run": ("--kubelet-dir", "--cdi-dir"),
                                    "simulate fault": ("--kubelet-dir",)}
PATH_FLAG: dict[str, str] = {"claims": "--kubelet-dir", "run": "--kubelet-dir",
                             "doctor": "--kubelet-dir", "simulate fault": "--kubelet-dir"}


def _one_error_line(result: object) -> str:
    exit_code = getattr(result, "exit_code")  # noqa: B009
    stderr: str = getattr(result, "stderr")  # noqa: B009
    assert exit_code == 2, (exit_code, getattr(result, "output"))  # noqa: B009
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def _invoke(command: str, argv: list[str], tmp_path: Path) -> object:
    dirs = [arg for flag in DIRS.get(command, ()) for arg in (flag, str(tmp_path / flag[2:]))]
    return CliRunner().invoke(main, [*COMMANDS[command], *argv, *dirs], input=b"",
                              catch_exceptions=False)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_config_file(tmp_path: Path, command: str, name: str) -> None:
    if name == "rolling-update-maybe" and command != "run":
        name = "unknown-key"  # only run knows the key; elsewhere it is an unknown one
    bad = tmp_path / name
    bad.write_bytes(HOSTILE[name])
    line = _one_error_line(_invoke(command, ["--config", str(bad)], tmp_path))
    assert str(bad) in line


@pytest.mark.parametrize("key", [f.name for f in fields(Config)])
@pytest.mark.parametrize("value", [[1, 2], {"a": 1}], ids=["list", "map"])
def test_every_config_key_refuses_a_wrong_type(tmp_path: Path, key: str, value: object) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text(yaml.safe_dump({key: value}))
    _one_error_line(_invoke("discover", ["--config", str(bad)], tmp_path))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", [["--config", "/"], ["--config", "/nonexistent/c.yaml"],
                                  ["--device-types", "gpu,bogus"], ["--log-format", "xml"],
                                  ["PATH", "a\x00b"], ["--no-such-flag"]],
                         ids=["config-dir", "config-missing", "device-types", "log-format",
                              "nul-path", "unknown-flag"])
def test_hostile_flags(tmp_path: Path, command: str, flag: list[str]) -> None:
    # A NUL in a path option the command takes (each takes only the options it reads).
    flag = [PATH_FLAG.get(command, "--sysfs-root") if f == "PATH" else f for f in flag]
    argv = [*COMMANDS[command], *flag]
    result = CliRunner().invoke(main, argv, input=b"", catch_exceptions=False)
    _one_error_line(result)


def test_explain_binary_stdin(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, COMMANDS["explain"], input=b"\xff\x00" * 100,
                                catch_exceptions=False)
    assert "not UTF-8" in _one_error_line(result)


def test_no_traceback_reaches_stderr_of_the_process(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_bytes(bytes(range(256)))
    out = subprocess.run([sys.executable, "-m", "agent.cli", "discover", "--config", str(bad)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: config file "), out.stderr


def test_playground_ctrl_c_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from hack import playground

    def interrupted(_argv: list[str] | None = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(playground, "main", interrupted)
    assert playground.interruptible([]) == 130
    assert capsys.readouterr().err == "playground: interrupted\n"
