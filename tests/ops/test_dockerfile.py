"""The Dockerfile builds the package it claims to, from what it copies.

No container engine runs here, so the test reads the Dockerfile's instructions and repeats
its build stage on a copy of exactly the files it COPYs: a package directory or README that
the Dockerfile forgets fails here rather than in someone's image build.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


@pytest.fixture(scope="module")
def project() -> dict[str, object]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert isinstance(data, dict)
    return data


def _copied_sources() -> list[str]:
    sources: list[str] = []
    for word, args in _instructions():
        if word == "COPY" and "--from" not in args:
            *srcs, _dest = args.split()
            sources += srcs
    return sources


def test_based_on_the_recipes_debian_12() -> None:
    """Both stages start from the recipe's Debian 12 image (hack/image/recipe.py), whose
    python3 is 3.11, as the daemonless build's root file system does."""
    from hack.image import RECIPE

    args = {a.split("=")[0]: a.split("=", 1)[1] for w, a in _instructions() if w == "ARG"}
    assert args["BASE_IMAGE"] == RECIPE.agent.debian.image
    assert RECIPE.agent.debian.image.startswith("debian:bookworm")
    froms = [a for w, a in _instructions() if w == "FROM"]
    assert len(froms) == 2 and all(f.startswith("${BASE_IMAGE}") for f in froms)


def test_entrypoint_is_the_console_script(project: dict[str, object]) -> None:
    scripts = project["scripts"]
    assert isinstance(scripts, dict)
    entry = [a for w, a in _instructions() if w == "ENTRYPOINT"]
    assert entry == ['["dra-agent"]'] and "dra-agent" in scripts
    assert [a for w, a in _instructions() if w == "CMD"] == ['["run"]']


def test_copies_every_package_and_the_build_inputs(project: dict[str, object]) -> None:
    sources = _copied_sources()
    assert {"pyproject.toml", str(project["readme"])} <= set(sources)
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "hack"}
    assert packages <= set(sources), f"not copied: {packages - set(sources)}"
    for src in sources:
        assert (REPO / src).exists(), src


def test_dockerignore_keeps_what_is_copied() -> None:
    patterns = [
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for src in _copied_sources():
        assert not any(fnmatch.fnmatch(src, p) for p in patterns), src
    assert ".venv" in patterns and ".git" in patterns


def test_build_stage_makes_a_wheel_with_the_agent(tmp_path: Path) -> None:
    context = tmp_path / "src"
    context.mkdir()
    for src in _copied_sources():
        path = REPO / src
        if path.is_dir():
            shutil.copytree(path, context / src, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, context / src)
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "wheels").glob("dra_agent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"agent/cli.py", "agent/httpserver.py", "agent/sdnotify.py"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "dra-agent = agent.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
