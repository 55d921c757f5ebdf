"""The Config ``dra-agent run`` would start with, parsed by ``run`` itself without starting it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agent.commands.options import pop_config
from agent.commands.run import command as run_command
from agent.common.config import Config


def run_config(args: Sequence[str], env: Mapping[str, str] | None = None) -> Config:
    """``run ARGS`` with ``env`` set for the parse only (flags beat it, as on a node)."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        ctx = run_command.make_context("run", list(args))
        with ctx:
            kwargs: dict[str, Any] = dict(ctx.params)
            return pop_config(kwargs)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
