"""The committed Dockerfile is the recipe's, and it installs what the daemonless build does."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from pathlib import Path

from hack.image.dockerfile import render
from hack.image.recipe import RECIPE, VERSION, AgentRecipe
from hack.image.steps import debian_command, install_commands
from tests.conftest import REPO


def _runs(dockerfile: str) -> list[str]:
    """The final stage's RUN commands, continuations joined, mount options dropped."""
    joined = dockerfile.replace("\\\n", " ")
    final = joined.split("\nFROM ")[-1]
    runs = []
    for line in final.splitlines():
        if line.startswith("RUN "):
            words = line.removeprefix("RUN ").split()
            while words and words[0].startswith("--mount="):
                words.pop(0)
            runs.append(" ".join(words))
    return runs


def _commands(run: str) -> list[tuple[str, ...]]:
    return [tuple(shlex.split(part)) for part in run.split(" && ")]


def test_committed_dockerfile_is_the_generated_one() -> None:
    committed = (REPO / "Dockerfile").read_bytes()
    assert committed == render(RECIPE.agent, VERSION).encode(), (
        "Dockerfile is stale: python -m hack.image dockerfile > Dockerfile"
    )
    out = subprocess.run(
        [sys.executable, "-m", "hack.image", "dockerfile"], cwd=REPO, capture_output=True,
        check=True, timeout=60,
    )
    assert out.stdout == committed
    assert committed.startswith(b"# syntax=docker/dockerfile:1\n# GENERATED ")


def _changed() -> AgentRecipe:
    """A recipe unlike the real one in every field the two builds read."""
    return dataclasses.replace(
        RECIPE.agent, packages=("python3", "python3-venv", "jq"), venv="/srv/venv",
        wheels="/tmp/w", check="true && dra-agent version", project="other-agent",
    )


def test_both_builds_install_the_recipes_packages() -> None:
    for agent in (RECIPE.agent, _changed()):
        apt = _commands(_runs(render(agent, VERSION))[0])
        assert apt[1] == agent.apt_install()
        installed = apt[1][apt[1].index("--no-install-recommends") + 1:]
        argv = debian_command(agent, Path("/target")).argv
        (include,) = [a for a in argv if a.startswith("--include=")]
        assert tuple(include.removeprefix("--include=").split(",")) == installed
        assert '--aptopt=APT::Install-Recommends "false"' in argv
        assert argv[argv.index(agent.debian.suite) + 2:] == agent.debian.sources
        # The Docker build cleans up with the same line the daemonless one runs in its root.
        assert " ".join(apt[2]) == agent.cleanup_command()


def test_both_builds_run_the_recipes_install_steps_and_check() -> None:
    for agent in (RECIPE.agent, _changed()):
        install, check = _runs(render(agent, VERSION))[1:]
        builder = [c.argv for c in install_commands(agent, Path("/root-of-the-image"))]
        assert [*_commands(install), ("/bin/sh", "-c", check)] == builder
        assert builder[0] == ("python3", "-m", "venv", agent.venv)
        text = render(agent, VERSION)
        assert f"source={agent.wheels},target={agent.wheels}" in text
        assert f"ENV PATH={agent.environment()['PATH']}" in text


def test_every_run_setting_of_the_recipe_is_in_the_dockerfile() -> None:
    text = render(RECIPE.agent, VERSION)
    for key, value in (*RECIPE.agent.env, *RECIPE.agent.labels):
        assert f"{key}={value}" in text or f'{key}="{value}"' in text
    assert f"FROM {'${BASE_IMAGE}'}\n" in text
    assert f"ARG BASE_IMAGE={RECIPE.agent.debian.image}\n" in text
    assert text.endswith('USER 0:0\nENTRYPOINT ["dra-agent"]\nCMD ["run"]\n')
    for name in (*RECIPE.agent.source_files, *RECIPE.agent.source_dirs):
        assert (REPO / name).exists()
        assert f"COPY {name}" in text or f" {name} " in text
