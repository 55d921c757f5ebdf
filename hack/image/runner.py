"""Running a build step on this host: its output in a log, a failure in one line."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hack.image.errors import USAGE, BuildError
from hack.image.steps import Command

__all__ = ["SubprocessRunner"]

# What a missing tool is installed with, for the one-line error.
_HINTS = {"mmdebstrap": "apt-get install -y mmdebstrap", "chroot": "apt-get install -y coreutils"}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


@dataclass(frozen=True)
class SubprocessRunner:
    """Runs a command with its output in logs/<step>.log; a failure is one BuildError line."""

    logs: Path

    def _tool(self, name: str, step: str) -> str:
        found = shutil.which(name)
        if found is None:
            hint = f" ({_HINTS[name]})" if name in _HINTS else ""
            raise BuildError(f"{step}: {name} not found{hint}", USAGE)
        return found

    def __call__(self, command: Command) -> None:
        if (command.needs_root or command.chroot is not None) and os.geteuid() != 0:
            raise BuildError(
                f"{command.step}: needs root (mmdebstrap --mode=root, chroot); run as root", USAGE
            )
        argv = list(command.argv)
        if command.chroot is not None:
            argv = [self._tool("chroot", command.step), str(command.chroot), *argv]
        else:
            argv[0] = self._tool(argv[0], command.step)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{_slug(command.step)}.log"
        env = None if command.env is None else dict(command.env)
        with log.open("w") as fh:
            fh.write(f"$ {shlex.join(argv)}\n")
            fh.flush()
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                env=env, cwd=command.cwd, check=False,
            )
        if done.returncode != 0:
            lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()]
            last = next((ln for ln in reversed(lines) if ln), "")[:200]
            raise BuildError(
                f"{command.step} failed (exit {done.returncode}): {last}; log: {log}"
            )
