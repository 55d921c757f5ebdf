"""``dra-agent config``: the configuration file, documented and checked.

``config example`` prints a commented file with every key ``run`` reads and its default, built
from the command's own options, so it cannot drift from them. ``config check FILE`` reads a
file exactly as ``run --config FILE`` would (every value type-checked, unknown keys named with
the nearest valid one) without starting anything: exit 0 when it is usable, 2 when not.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import click

from agent.common.config import Config

#: Options that have no place in a file: the file itself, and the count flag's spelling.
_NOT_IN_FILE = frozenset({"config_file"})


def _run_params() -> list[click.Parameter]:
    # Lazy, here and in check: run's options are read only by the subcommand that needs them.
    from agent.commands.run import command as run_command

    return [p for p in run_command.params if p.name and p.name not in _NOT_IN_FILE]


def _key(param: click.Parameter) -> str:
    """The spelling a file uses: the long flag without dashes (``shutdown-grace``)."""
    longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return longs[0][2:] if longs else str(param.name).replace("_", "-")


def _default(param: click.Parameter) -> Any:
    value = param.default
    # click >= 8.2 marks "no default" with a sentinel object rather than None.
    if value is None or value == () or type(value).__name__ == "Sentinel":
        # The shared options' defaults live in Config (click leaves them unset so that the
        # file can fill them).
        value = getattr(Config(), str(param.name), None)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _yaml_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    return json.dumps(str(value))


def example_text() -> str:
    lines = [
        "# dra-agent configuration file: `dra-agent run --config FILE` (or DRA_AGENT_CONFIG).",
        "# Every key is optional; shown commented out with its default. Flags and DRA_AGENT_*",
        "# variables win over the file; the file wins over the defaults.",
        "# Check a file with `dra-agent config check FILE`.",
    ]
    for param in sorted(_run_params(), key=_key):
        help_text = " ".join((getattr(param, "help", None) or "").split())
        envvar = getattr(param, "envvar", None)
        env = envvar if isinstance(envvar, str) else (envvar[0] if envvar else None)
        lines.append("")
        for chunk in textwrap.wrap(help_text or _key(param), 92):
            lines.append(f"# {chunk}")
        if env:
            lines.append(f"# (flag --{_key(param)}, variable {env})")
        default = _default(param)
        multiple = getattr(param, "multiple", False)
        if multiple and not default:
            default = []
        lines.append(f"#{_key(param)}: {_yaml_value(default)}".rstrip())
    return "\n".join(lines) + "\n"


@click.group()
def command() -> None:
    """The configuration file: an example with every key, and a check."""


@command.command("example")
def example() -> None:
    """Print a commented config file with every key and its default."""
    click.echo(example_text(), nl=False)


@command.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
def check(file: str) -> None:
    """Read FILE as `run --config FILE` would; exit 0 if it is usable, 2 if not."""
    from agent.commands.options import pop_config
    from agent.commands.run import command as run_command

    # Parsed as `run --config FILE`, so the file is merged exactly as it would be there: the
    # shared keys through Config, run's own keys cast by their click types.
    ctx = run_command.make_context("run", ["--config", file])
    with ctx:
        kwargs = dict(ctx.params)
        pop_config(kwargs)
    click.echo(f"{file}: ok")
