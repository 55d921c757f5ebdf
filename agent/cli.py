"""The ``dra-agent`` command line: a thin click group.

Subcommands live in ``agent/commands/<name>.py`` and are imported only when invoked, so
``dra-agent discover`` never pays for grpc or the kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

#: command name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "version": "agent.commands.version:command",
    "cdi": "agent.commands.cdi:command",
    "claims": "agent.commands.claims:command",
    "discover": "agent.commands.discover:command",
    "explain": "agent.commands.explain:command",
    "run": "agent.commands.run:command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command: Any = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """dra-agent: a Kubernetes DRA node agent for GPUs and NICs."""


if __name__ == "__main__":
    main()
