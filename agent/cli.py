"""The ``dra-agent`` command line: a thin click group.

Subcommands live in ``agent/commands/<name>.py`` and are imported only when invoked, so
``dra-agent discover`` never pays for grpc or the kubernetes client.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from agent import __version__

#: command name -> "module:attribute" of its click command.
COMMANDS: dict[str, str] = {
    "version": "agent.commands.version:command",
    "cdi": "agent.commands.cdi:command",
    "claims": "agent.commands.claims:command",
    "config": "agent.commands.config:command",
    "discover": "agent.commands.discover:command",
    "doctor": "agent.commands.doctor:command",
    "explain": "agent.commands.explain:command",
    "run": "agent.commands.run:command",
    "simulate": "agent.commands.simulate:command",
}


#: Exit code of an interrupted command: the conventional 128 + SIGINT.
INTERRUPTED = 130


def _one_line(text: str) -> str:
    return " ".join(text.split())[:1000]


def _debug(args: list[str]) -> bool:
    """-vv (or more) on the command line, or DRA_AGENT_DEBUG=1: show tracebacks."""
    count = sum(a.count("v") for a in args if a[:1] == "-" and set(a[1:]) == {"v"})
    return os.environ.get("DRA_AGENT_DEBUG") == "1" or count + args.count("--verbose") >= 2


class LazyGroup(click.Group):
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        """Every failure is one line on stderr: 2 for bad input (usage, config), 1 for the
        rest; a traceback only with -vv or DRA_AGENT_DEBUG=1."""
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0  # an int is click's Exit code (-h: 0)
        except click.UsageError as err:
            hint = f" (see '{err.ctx.command_path} -h')" if err.ctx is not None else ""
            click.echo(_one_line(f"error: {err.format_message()}") + hint, err=True)
            code = err.exit_code
        except click.ClickException as err:
            click.echo(_one_line(f"error: {err.format_message()}"), err=True)
            code = err.exit_code
        except click.Abort:  # Ctrl-C (or end of input) at a prompt
            click.echo("interrupted", err=True)
            code = INTERRUPTED
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            code = INTERRUPTED
        except Exception as err:
            if _debug(argv):
                raise
            click.echo(_one_line(f"error: {type(err).__name__}: {err}") + " (a bug: run again "
                       "with -vv or DRA_AGENT_DEBUG=1 for the traceback and report it)", err=True)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code)

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
@click.version_option(__version__, "--version", prog_name="dra-agent",
                      message="%(prog)s %(version)s")
def main() -> None:
    """dra-agent: a Kubernetes DRA node agent for GPUs and NICs."""


if __name__ == "__main__":
    main()
