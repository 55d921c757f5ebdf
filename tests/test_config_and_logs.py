"""Shared options (flags > env > file > default) and the structured log formats."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from agent.commands.configfile import ConfigError, build_config
from agent.commands.options import common_options, pop_config
from agent.common.config import Config
from agent.common.logs import JsonFormatter, LogfmtFormatter, setup_logging


@click.command()
@common_options
def show(**kwargs: Any) -> None:
    cfg = pop_config(kwargs)
    click.echo(json.dumps({
        "driver": cfg.driver_name, "node": cfg.node_name, "cdi": str(cfg.cdi_dir),
        "types": list(cfg.device_types), "verbosity": cfg.verbosity,
    }))


def invoke(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = CliRunner().invoke(show, args, env=env or {}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-from-downward-api")
    out = invoke([])
    assert out == {"driver": "dra-agent.io", "node": "node-from-downward-api",
                   "cdi": "/var/run/cdi", "types": ["gpu", "mig", "nic", "vf"], "verbosity": 0}


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    cfg_file = tmp_path / "agent.yaml"
    cfg_file.write_text("driver-name: from-file.io\nnode_name: file-node\ncdi_dir: /file/cdi\n")
    env = {"DRA_AGENT_CONFIG": str(cfg_file), "DRA_AGENT_NODE_NAME": "env-node",
           "DRA_AGENT_DRIVER_NAME": "env.io"}
    out = invoke(["--driver-name", "flag.io"], env)
    assert out["driver"] == "flag.io"  # flag over env
    assert out["node"] == "env-node"  # env over file
    assert out["cdi"] == "/file/cdi"  # file over default


def test_device_types_and_verbosity() -> None:
    out = invoke(["--device-types", "gpu, nic", "-vv"])
    assert out["types"] == ["gpu", "nic"]
    assert out["verbosity"] == 2


def test_unknown_device_type_is_a_usage_error() -> None:
    result = CliRunner().invoke(show, ["--device-types", "gpu,fpga"])
    assert result.exit_code == 2
    assert "unknown device type(s) fpga" in result.output


@pytest.mark.parametrize(("text", "message"), [
    ("- a list\n", "top level must be a mapping"),
    ("driver: x\n", "unknown key 'driver'; did you mean driver-name?"),
    ("node_name: [unclosed\n", "not valid YAML"),
    # YAML's escapes make strings no path can hold; they reached open() as ValueError.
    ('cdi-dir: "\\ud800"\n', "cdi-dir: expected a path"),
    ('kubelet-dir: "/var/lib/k\\0"\n', "kubelet-dir: expected a path"),
])
def test_bad_config_file_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        build_config({"config_file": str(path)})
    assert str(path) in str(err.value) and message in str(err.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        build_config({"config_file": str(tmp_path / "nope.yaml")})


def test_paths_derive_from_kubelet_dir() -> None:
    cfg = Config(kubelet_dir=Path("/k"), driver_name="d.io")
    assert cfg.registry_dir == Path("/k/plugins_registry")
    assert cfg.checkpoint_path == Path("/k/plugins/d.io/checkpoint.json")


@click.command()
@click.option("--rolling-update/--no-rolling-update", default=False)
@click.option("--grace", type=float, default=10.0)
@common_options
def own(**kwargs: Any) -> None:
    cfg = pop_config(kwargs)
    click.echo(json.dumps({"node": cfg.node_name, "rolling": kwargs["rolling_update"],
                           "grace": kwargs["grace"]}))


def test_config_file_sets_a_commands_own_options_below_flags(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node-name: n1\nrolling-update: true\ngrace: 2.5\n")
    result = CliRunner().invoke(own, ["--config", str(path)], catch_exceptions=False)
    assert json.loads(result.output) == {"node": "n1", "rolling": True, "grace": 2.5}
    result = CliRunner().invoke(own, ["--config", str(path), "--no-rolling-update",
                                      "--grace", "1"], catch_exceptions=False)
    assert json.loads(result.output) == {"node": "n1", "rolling": False, "grace": 1.0}


def test_config_file_value_of_the_wrong_type_names_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("grace: soon\n")
    result = CliRunner().invoke(own, ["--config", str(path)])
    assert result.exit_code == 2
    assert str(path) in result.output and "grace" in result.output


def test_config_file_keys_of_other_commands_are_unknown(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("grace: 1\n")
    result = CliRunner().invoke(show, ["--config", str(path)])  # `show` has no --grace
    assert result.exit_code == 2 and "unknown key 'grace'" in result.output


def _record(msg: str, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("agent.plugin", logging.INFO, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def test_logfmt_one_line_with_fields_quoted_when_needed() -> None:
    line = LogfmtFormatter().format(_record("claim prepared", claim="uid-1", devices="gpu-0 gpu-1"))
    assert "\n" not in line
    assert 'msg="claim prepared"' in line
    assert "claim=uid-1" in line and 'devices="gpu-0 gpu-1"' in line
    assert "level=info" in line and "logger=agent.plugin" in line


def test_logfmt_quotes_each_special_character_and_times_each_record() -> None:
    fmt = LogfmtFormatter()
    for value in ("a b", "a=b", 'a"b', "a\\b", "a\nb", "a\tb", ""):
        assert f"v={json.dumps(value)}" in fmt.format(_record("m", v=value)), value
    assert "v=3 " in fmt.format(_record("m", v=3, w=Path("/x"))) + " "
    first, second = _record("m"), _record("m")
    first.created, first.msecs = 0.25, 250
    second.created, second.msecs = 61.5, 500  # another second than the one formatted last
    assert fmt.format(first).startswith("time=1970-01-01T00:00:00.250Z ")
    assert fmt.format(second).startswith("time=1970-01-01T00:01:01.500Z ")
    assert fmt.format(first).startswith("time=1970-01-01T00:00:00.250Z ")
    warning = _record("m")
    warning.levelno, warning.levelname = logging.WARNING, "WARNING"
    assert "level=warning" in fmt.format(warning)


def test_json_log_is_one_object_per_line() -> None:
    line = JsonFormatter().format(_record("prepared", claim="u", count=3, ok=True, path=Path("/x")))
    obj = json.loads(line)
    assert obj["msg"] == "prepared" and obj["claim"] == "u"
    assert obj["count"] == 3 and obj["ok"] is True and obj["path"] == "/x"


def test_setup_logging_levels() -> None:
    stream = io.StringIO()
    setup_logging("json", 1, stream)
    log = logging.getLogger("test.levels")
    log.debug("hidden")
    log.info("shown", extra={"k": "v"})
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["k"] == "v"
    setup_logging("logfmt", 0)
