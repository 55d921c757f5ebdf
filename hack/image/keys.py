"""The cache keys: a hash of what each cache entry is made from (build.py's docstring lists the
entries and what each key covers)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

from hack.image.errors import USAGE, BuildError
from hack.image.recipe import AgentRecipe, Recipe
from hack.image.steps import busybox_command, debian_command

__all__ = ["agent_key", "busybox_key", "debian_key", "source_digest"]

# This builder's modules whose code decides the agent image's bytes: part of its cache key.
# cache.py and keys.py make none of them, but are keyed as when all of this was one build.py.
_SHAPING = ("build.py", "steps.py", "runner.py", "cache.py", "keys.py", "archive.py")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def debian_key(recipe: Recipe) -> str:
    return _digest(*debian_command(recipe.agent, Path("/TARGET")).argv)


def busybox_key(recipe: Recipe) -> str:
    return _digest(*busybox_command(recipe, Path("/TARGET")).argv, recipe.busybox.path)


def _source_files(repo: Path, agent: AgentRecipe) -> Iterator[str]:
    """The keyed wheel inputs, relative to repo, sorted; a missing one is bad input."""
    names: list[str] = []
    for name in (*agent.source_files, *agent.source_dirs):
        if not (repo / name).exists():
            raise BuildError(f"wheel inputs: {repo / name} is missing", USAGE)
    names += [f for f in agent.source_files if f not in agent.unkeyed_sources]
    for top in agent.source_dirs:
        for here, dirs, files in os.walk(repo / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = Path(here).relative_to(repo)
            names += [str(rel / f) for f in files if not f.endswith(".pyc")]
    yield from sorted(names)


def _wheel_tables(pyproject: Path) -> bytes:
    """The parts of pyproject.toml a wheel is made from; the linters' and pytest's settings
    there change often and change no installed byte."""
    try:
        data = tomllib.loads(pyproject.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"wheel inputs: {pyproject}: {exc}", USAGE) from exc
    tool = data.get("tool", {})
    tables = {name: data.get(name) for name in ("build-system", "project")}
    tables["tool"] = {k: v for k, v in tool.items() if k.startswith("setuptools")}
    return json.dumps(tables, sort_keys=True).encode()


def source_digest(repo: Path, agent: AgentRecipe) -> str:
    """Names, exec bits and contents of the keyed wheel inputs (times do not count)."""
    h = hashlib.sha256()
    for name in _source_files(repo, agent):
        path = repo / name
        if path.is_symlink():
            kind, data = "l", os.readlink(path).encode()
        elif name == "pyproject.toml":
            kind, data = "t", _wheel_tables(path)
        else:
            kind, data = ("x" if os.access(path, os.X_OK) else "f"), path.read_bytes()
        h.update(f"{name}\0{kind}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def agent_key(recipe: Recipe, repo: Path) -> str:
    here = Path(__file__).resolve().parent
    code = [hashlib.sha256((here / name).read_bytes()).hexdigest() for name in _SHAPING]
    agent = json.dumps(dataclasses.asdict(recipe.agent), sort_keys=True)
    return _digest(debian_key(recipe), agent, *code, source_digest(repo, recipe.agent))
