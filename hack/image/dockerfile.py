"""The Dockerfile, generated from the recipe (``python -m hack.image dockerfile > Dockerfile``).

The committed Dockerfile is this module's output byte for byte (tests/image/test_dockerfile.py),
so a change to what the image holds is made once, in hack/image/recipe.py, and both builds follow.
"""

from __future__ import annotations

import json
import re
import shlex

from hack.image.recipe import AgentRecipe

COMMAND = "python -m hack.image dockerfile > Dockerfile"
# Only the wheel stage has this venv: pip, for `pip wheel`, without touching the system python.
WHEEL_VENV = "/opt/wheel-build"
_CONTINUED = " \\\n    "
_BARE = re.compile(r"[A-Za-z0-9_./:,+@=-]+")


def _value(value: str) -> str:
    """A LABEL or ENV value; quoted when it has to be, and refused where quoting would not do."""
    if _BARE.fullmatch(value):
        return value
    if any(c in value for c in '"\\$\n'):
        # Dockerfile quoting expands $ and needs escapes; no value of ours needs either, and
        # getting them wrong would make the two builds differ silently.
        raise ValueError(f"value needs Dockerfile escaping: {value!r}")
    return f'"{value}"'


def _pairs(word: str, pairs: tuple[tuple[str, str], ...]) -> str:
    body = (_CONTINUED + "  ").join(f"{k}={_value(v)}" for k, v in pairs)
    return f"{word} {body}"


def _apt(recipe: AgentRecipe) -> str:
    steps = (
        "apt-get update",
        shlex.join(recipe.apt_install()),
        recipe.cleanup_command(),
    )
    return "RUN " + (_CONTINUED + "&& ").join(steps)


def render(recipe: AgentRecipe, version: str) -> str:
    """The Dockerfile's text for ``recipe``; ``version`` is the tag deploy/ expects."""
    venv_python = f"{WHEEL_VENV}/bin/python"
    wheel = recipe.wheel_command(venv_python, ".", recipe.wheels)
    install = (_CONTINUED + "&& ").join(shlex.join(step) for step in recipe.install_steps())
    copies = [f"COPY {' '.join(recipe.source_files)} ./"]
    copies += [f"COPY {d} ./{d}" for d in recipe.source_dirs]
    lines = [
        # A parser directive is read only on the first line.
        "# syntax=docker/dockerfile:1",
        f"# GENERATED from hack/image/recipe.py by `{COMMAND}`:",
        "# edit the recipe, not this file (tests/image checks the two are the same).",
        f"# The {recipe.project} image. deploy/ expects it as {recipe.project}:{version}:",
        f"#   docker build -t {recipe.project}:{version} .",
        "# The same recipe builds it without a daemon or registry: python -m hack.image build",
        f"ARG BASE_IMAGE={recipe.debian.image}",
        "",
        "# Build the wheels (ours and every dependency's) in a throwaway stage, on the python the",
        "# image runs, so the final image has no build tools, no pip cache and no source tree.",
        "FROM ${BASE_IMAGE} AS build",
        _apt(recipe),
        f"RUN {shlex.join(('python3', '-m', 'venv', WHEEL_VENV))}",
        "WORKDIR /src",
        *copies,
        "RUN --mount=type=cache,target=/root/.cache/pip" + _CONTINUED + shlex.join(wheel),
        "",
        "FROM ${BASE_IMAGE}",
        _pairs("LABEL", recipe.labels),
        _apt(recipe),
        "# Bytecode is compiled at install time; at run time the root file system is read-only.",
        _pairs("ENV", recipe.env),
        f"RUN --mount=type=bind,from=build,source={recipe.wheels},target={recipe.wheels}"
        + _CONTINUED + install,
        "# Fail the build, not the node, when a native dependency is missing from the packages",
        "# (pyudev loads libudev.so.1 at run time).",
        f"RUN {recipe.check}",
        "# Root on purpose: the kubelet (root) owns the plugin and registry directories the",
        "# agent creates sockets in, and /var/run/cdi is root's. The DaemonSet makes the root",
        "# file system read-only; under systemd the unit drops every capability instead.",
        f"USER {recipe.user}",
        f"ENTRYPOINT {json.dumps(list(recipe.entrypoint))}",
        f"CMD {json.dumps(list(recipe.cmd))}",
    ]
    return "\n".join(lines) + "\n"
