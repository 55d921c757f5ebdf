"""``dra-agent config example`` documents every key ``run`` reads; ``config check`` reads a file
exactly as ``run --config`` would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from agent.cli import main
from agent.commands.options import pop_config
from agent.commands.run import command as run_command

KEY = re.compile(r"^#([a-z][a-z-]*):", re.MULTILINE)


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def run_settings(*args: str) -> dict[str, Any]:
    """What ``run`` would start with, from the flags given, without starting it."""
    ctx = run_command.make_context("run", list(args))
    with ctx:
        kwargs = dict(ctx.params)
        cfg = pop_config(kwargs)
    return {**kwargs, "config": {k: v for k, v in vars_of(cfg).items() if k != "config_file"}}


def vars_of(cfg: Any) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.__slots__}


def test_the_example_names_every_option_of_run_once() -> None:
    code, text = cli("config", "example")
    assert code == 0
    keys = KEY.findall(text)
    flags = {o[2:] for p in run_command.params for o in getattr(p, "opts", ())
             if o.startswith("--") and p.name != "config_file"}
    assert sorted(keys) == sorted(set(keys))  # each once
    assert set(keys) <= flags
    named = {p.name for p in run_command.params
             if any(o[2:] in keys for o in getattr(p, "opts", ()))}
    assert named == {p.name for p in run_command.params if p.name != "config_file"}


def test_the_example_with_every_key_set_is_valid_and_changes_nothing(tmp_path: Path) -> None:
    _, text = cli("config", "example")
    on = tmp_path / "all.yaml"
    on.write_text(KEY.sub(r"\1:", text))
    assert cli("config", "check", str(on)) == (0, f"{on}: ok\n")
    with_file = run_settings("--config", str(on))
    without = run_settings()
    assert with_file == without  # the example's values are the defaults


def test_run_options_in_a_file_use_the_flags_spelling(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("shutdown-grace: 5\nrolling_update: true\nnode-address: [10.0.0.1]\n"
                    "rescan-interval: 30\nverbose: 2\n")
    settings = run_settings("--config", str(path))
    assert settings["shutdown_grace_s"] == 5.0 and settings["slow_rescan_s"] == 30.0
    assert settings["rolling_update"] is True
    assert settings["node_addresses"] == ("10.0.0.1",)
    assert settings["config"]["verbosity"] == 2


def test_a_misspelled_key_names_the_nearest_one(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("shutdwn-grace: 5\n")
    code, out = cli("config", "check", str(path))
    assert code == 2
    assert "unknown key 'shutdwn-grace'; did you mean shutdown-grace?" in out
    assert len(out.strip().splitlines()) == 1


def test_a_wrong_type_is_named_by_the_files_spelling(tmp_path: Path) -> None:
    for body, named in (("shutdown-grace: soon\n", "shutdown-grace"),
                        ("kubelet-dir: [1, 2]\n", "kubelet-dir")):
        path = tmp_path / "c.yaml"
        path.write_text(body)
        code, out = cli("config", "check", str(path))
        assert code == 2 and named in out, out
        assert len(out.strip().splitlines()) == 1
