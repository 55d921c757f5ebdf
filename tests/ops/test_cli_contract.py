"""The DaemonSet and the systemd unit pass the agent only flags and variables it knows.

A misspelled flag makes the pod crash-loop; a misspelled ``DRA_AGENT_*`` variable is silently
ignored, which is worse. Both are checked against the real click command.
"""

from __future__ import annotations

import re
from typing import Any

import click
import pytest

from agent.commands.run import command as run_command
from tests.conftest import REPO
from tests.ops.kustomize import render

TARGETS = ("base", "overlays/simulated", "overlays/gpu-node")


def _known_env() -> set[str]:
    names: set[str] = set()
    for param in run_command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
        elif envvar:
            names.update(envvar)
    return names


def _agent_container(target: str) -> dict[str, Any]:
    (daemonset,) = [o for o in render(REPO / "deploy" / target) if o["kind"] == "DaemonSet"]
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "agent" or "dra-agent" in " ".join(c.get("command", []))]
    return container


def _parse_run(args: list[str]) -> dict[str, Any]:
    """Parse like the real CLI would, without running the daemon."""
    ctx = run_command.make_context("run", list(args), resilient_parsing=False)
    return dict(ctx.params)


@pytest.mark.parametrize("target", TARGETS)
def test_daemonset_args_and_env_are_known_to_run(target: str) -> None:
    container = _agent_container(target)
    args = [a for a in container.get("args", []) if a != "run"]
    # $(POD_IP) is expanded by the kubelet; any value parses here.
    expanded = [re.sub(r"\$\([A-Z_]+\)", "10.0.0.7", a) for a in args]
    params = _parse_run(expanded)
    assert params["rolling_update"] is True
    env_names = {e["name"] for e in container.get("env", [])}
    unknown = sorted(n for n in env_names
                     if n.startswith("DRA_AGENT_") and n not in _known_env())
    assert unknown == [], f"{target}: DRA_AGENT_ variables no option reads: {unknown}"
    # The rolling-update mode needs the pod UID, which the downward API provides.
    assert {"POD_UID", "NODE_NAME"} <= env_names


def test_systemd_unit_and_env_file_use_known_names() -> None:
    unit = (REPO / "systemd" / "dra-agent.service").read_text()
    env_file = (REPO / "systemd" / "dra-agent.env").read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", unit, flags=re.M)
    argv = exec_start.split()
    assert argv[0].endswith("dra-agent") and argv[1] == "run"
    flags = [a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")]
    known_flags = {opt for p in run_command.params for opt in getattr(p, "opts", [])}
    known_flags |= {opt for p in run_command.params for opt in getattr(p, "secondary_opts", [])}
    assert set(flags) <= known_flags, set(flags) - known_flags
    mentioned = set(re.findall(r"\bDRA_AGENT_[A-Z_]+", unit + env_file))
    assert mentioned, "the unit documents no DRA_AGENT_ variable"
    assert mentioned <= _known_env(), sorted(mentioned - _known_env())


def test_a_misspelled_flag_is_refused() -> None:
    with pytest.raises(click.NoSuchOption):
        _parse_run(["--rolling-updates"])


def test_every_run_option_has_an_env_var() -> None:
    missing = [p.name for p in run_command.params
               if isinstance(p, click.Option) and not p.envvar and p.name != "help"]
    assert missing == []
