"""The steps of the build, made from the recipe: what runs, where, in which environment.

A ``Command`` is data; a ``Runner`` runs it (runner.py's ``SubprocessRunner``; tests pass one
that fakes the tools). The Debian and busybox commands are also what their cache keys hash
(keys.py), so a recipe change that changes a command changes its key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hack.image.recipe import SYSTEM_PATH, AgentRecipe, Recipe

__all__ = [
    "Command",
    "Runner",
    "busybox_command",
    "debian_cleanup_command",
    "debian_command",
    "install_commands",
]


@dataclass(frozen=True)
class Command:
    """One step of the build, run by a Runner."""

    step: str
    argv: tuple[str, ...]
    # None: the builder's own environment; else exactly these variables.
    env: tuple[tuple[str, str], ...] | None = None
    # Run argv inside this root (chroot); argv's paths are the image's.
    chroot: Path | None = None
    cwd: Path | None = None
    needs_root: bool = False


Runner = Callable[[Command], None]


def debian_command(agent: AgentRecipe, target: Path) -> Command:
    """mmdebstrap of the recipe's suite and packages into ``target``, without recommends as the
    Dockerfile's ``apt-get install --no-install-recommends``."""
    debian = agent.debian
    argv = (
        "mmdebstrap", "--mode=root", f"--variant={debian.variant}", "--format=directory",
        '--aptopt=APT::Install-Recommends "false"',
        *(f"--dpkgopt=path-exclude={p}" for p in debian.path_excludes),
        *(f"--dpkgopt=path-include={p}" for p in debian.path_includes),
        f"--include={','.join(agent.packages)}",
        debian.suite, str(target), *debian.sources,
    )
    return Command("debian root (mmdebstrap)", argv, needs_root=True)


def debian_cleanup_command(agent: AgentRecipe, root: Path) -> Command:
    # In the chroot, as the Dockerfile's RUN does it: its globs then cannot reach the host
    # through one of the root's absolute symlinks.
    return Command(
        "debian cleanup", ("/bin/sh", "-c", agent.cleanup_command()),
        env=(("PATH", SYSTEM_PATH),), chroot=root,
    )


def busybox_command(recipe: Recipe, target: Path) -> Command:
    """The busybox package unpacked (not installed) from the agent's suite and sources."""
    debian = recipe.agent.debian
    argv = (
        "mmdebstrap", "--mode=root", "--variant=extract", "--format=directory",
        f"--include={recipe.busybox.package}", debian.suite, str(target), *debian.sources,
    )
    return Command("busybox (mmdebstrap)", argv, needs_root=True)


def install_commands(agent: AgentRecipe, root: Path) -> list[Command]:
    """The recipe's install steps and its check, in the agent's root, in the image's env."""
    # HOME as a Dockerfile RUN has it for root.
    env = (*agent.env, ("HOME", "/root"))
    # Named by program and first words ("agent: pip install --no-index"): the log's first line
    # has the whole command.
    steps = [
        Command(f"agent: {' '.join((Path(argv[0]).name, *argv[1:3]))}", argv, env=env, chroot=root)
        for argv in agent.install_steps()
    ]
    return [*steps, Command("agent check", agent.check_command(), env=env, chroot=root)]
