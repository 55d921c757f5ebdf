"""The daemonless builder with its tools faked: what it runs, what it caches, how it fails."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hack.image import __main__ as cli
from hack.image.build import Builder, archive_name, image_names
from hack.image.errors import FAILED, USAGE, BuildError
from hack.image.keys import agent_key
from hack.image.recipe import AGENT_IMAGE, PAUSE_IMAGE, RECIPE, WORKLOAD_IMAGE, Recipe
from hack.image.runner import SubprocessRunner
from hack.image.steps import Command, debian_command
from tests.image.conftest import FakeTools, make_repo, read_archive

# A package more than the real recipe, so what ran can only have come from this object.
WITH_JQ = dataclasses.replace(
    RECIPE, agent=dataclasses.replace(RECIPE.agent, packages=(*RECIPE.agent.packages, "jq"))
)


def _builder(tmp_path: Path, repo: Path, recipe: Recipe = WITH_JQ) -> tuple[Builder, FakeTools]:
    tools = FakeTools(recipe)
    builder = Builder(tmp_path / "out", repo=repo, cache=tmp_path / "cache", recipe=recipe,
                      runner=tools, python="/usr/bin/python-of-the-test")
    return builder, tools


def test_build_runs_the_recipes_steps_and_packs_the_result(tmp_path: Path, repo: Path) -> None:
    builder, tools = _builder(tmp_path, repo)
    built = builder.build()
    assert [b.name for b in built] == list(image_names()) == [
        AGENT_IMAGE, WORKLOAD_IMAGE, PAUSE_IMAGE]
    assert {b.path for b in built} == {tmp_path / "out" / archive_name(n) for n in image_names()}
    assert tools.steps() == [
        "debian root (mmdebstrap)", "debian cleanup", "wheels (pip wheel)",
        "agent: python3 -m venv", "agent: pip install --no-index", "agent check",
        "busybox (mmdebstrap)",
    ]
    debian, cleanup, wheels, *chrooted, _busybox = tools.ran
    partial = tmp_path / "cache" / next(
        p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith("debian-"))
    assert debian.argv == debian_command(WITH_JQ.agent, Path(f"{partial}.partial")).argv
    assert f"--include={','.join(WITH_JQ.agent.packages)}" in debian.argv
    assert cleanup.argv == ("/bin/sh", "-c", WITH_JQ.agent.cleanup_command())
    assert wheels.argv[:4] == ("/usr/bin/python-of-the-test", "-m", "pip", "wheel")
    agent_root = built[0].rootfs
    assert agent_root is not None and agent_root.is_dir()
    assert [c.argv for c in chrooted] == [
        *WITH_JQ.agent.install_steps(), WITH_JQ.agent.check_command()]
    assert all(c.env is not None and dict(c.env)["PATH"] == WITH_JQ.agent.environment()["PATH"]
               for c in chrooted)

    archive = read_archive(built[0].path)
    assert archive.manifest[0]["RepoTags"] == [AGENT_IMAGE]
    config = archive.config["config"]
    assert isinstance(config, dict)
    assert config["Entrypoint"] == ["dra-agent"] and config["Cmd"] == ["run"]
    assert config["User"] == "0:0"
    assert config["Env"] == [f"{k}={v}" for k, v in WITH_JQ.agent.env]
    members = archive.members
    assert members["opt/dra-agent/bin/dra-agent"].mode == 0o755
    assert archive.read("opt/dra-agent/lib/dra_agent-0.1.0-py3-none-any.whl") == (
        repo / "agent" / "cli.py").read_bytes()
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    # Build-time leftovers are not in the image: the wheels, the host's resolver and name, the
    # runtime's /dev.
    assert not any(n == "wheels" or n.startswith("wheels/") for n in members)
    assert members["etc/resolv.conf"].size == 0 and members["etc/hostname"].size == 0
    assert "dev" in members and "dev/fd" not in members
    # Nothing of a build is left half-made.
    assert not [p for p in (tmp_path / "cache").iterdir()
                if p.name.endswith(".partial") or p.name.startswith(".tmp-")]


def test_a_second_build_with_nothing_changed_runs_nothing(tmp_path: Path, repo: Path) -> None:
    builder, tools = _builder(tmp_path, repo)
    first = builder.build()
    agent_bytes = first[0].path.read_bytes()
    first[0].path.unlink()
    tools.ran.clear()
    again = builder.build()
    assert tools.ran == []
    assert again[0].cached and again[0].path.read_bytes() == agent_bytes
    assert [b.path.read_bytes() for b in again[1:]] == [b.path.read_bytes() for b in first[1:]]


def test_a_source_change_re_does_the_pip_step_only(tmp_path: Path, repo: Path) -> None:
    builder, tools = _builder(tmp_path, repo)
    builder.build()
    tools.ran.clear()
    (repo / "agent" / "cli.py").write_text("def main() -> None:\n    print('changed')\n")
    again = builder.build()
    assert "debian root (mmdebstrap)" not in tools.steps()
    assert "busybox (mmdebstrap)" not in tools.steps()
    assert tools.steps()[0] == "wheels (pip wheel)" and "agent check" in tools.steps()
    assert not again[0].cached
    archive = read_archive(again[0].path)
    assert b"changed" in archive.read("opt/dra-agent/lib/dra_agent-0.1.0-py3-none-any.whl")


def test_a_package_change_re_does_the_debian_root(tmp_path: Path, repo: Path) -> None:
    _builder(tmp_path, repo)[0].build()
    other = dataclasses.replace(
        WITH_JQ, agent=dataclasses.replace(WITH_JQ.agent, packages=("python3", "python3-venv")))
    changed, tools = _builder(tmp_path, repo, other)
    changed.build()
    assert tools.steps()[0] == "debian root (mmdebstrap)"
    assert "--include=python3,python3-venv" in tools.ran[0].argv
    # busybox comes from the suite and its sources, whatever the agent installs.
    assert "busybox (mmdebstrap)" not in tools.steps()


def test_no_cache_re_does_every_step(tmp_path: Path, repo: Path) -> None:
    builder, tools = _builder(tmp_path, repo)
    builder.build()
    first = tools.steps()
    tools.ran.clear()
    builder.use_cache = False
    builder.build()
    assert tools.steps() == first


def test_the_cache_keeps_two_of_each_kind(tmp_path: Path, repo: Path) -> None:
    builder, _ = _builder(tmp_path, repo)
    for n in range(4):
        (repo / "agent" / "cli.py").write_text(f"# version {n}\n")
        builder.build()
    agents = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("agent-")]
    assert len(agents) == 2
    assert (tmp_path / "cache" / f"agent-{agent_key(WITH_JQ, repo)}").is_dir()


def test_cache_key_follows_the_sources_and_nothing_else(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    key = agent_key(RECIPE, repo)
    assert agent_key(RECIPE, make_repo(tmp_path / "copy")) == key  # contents, not the place
    cli_py = repo / "agent" / "cli.py"
    os.utime(cli_py, (1_000_000, 1_000_000))
    (repo / "agent" / "__pycache__").mkdir()
    (repo / "agent" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0bytecode")
    (repo / "README.md").write_text("# a README edit changes no installed code\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("not a wheel input\n")
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '[tool.pytest.ini_options]\naddopts = "-ra"\n')
    assert agent_key(RECIPE, repo) == key

    changes: list[Callable[[], object]] = [
        lambda: cli_py.write_text(cli_py.read_text() + "# edited\n"),
        lambda: (repo / "cdi" / "spec.py").write_text("NEW = 1\n"),
        lambda: (repo / "protos" / "api.proto").write_text('syntax = "proto3";\n'),
        lambda: (repo / "discovery" / "__init__.py").chmod(0o755),
        lambda: pyproject.write_text(pyproject.read_text().replace(
            "[tool.pytest", 'dependencies = ["click"]\n[tool.pytest')),
        lambda: pyproject.write_text(
            pyproject.read_text() + '[tool.setuptools.package-data]\nagent = ["py.typed"]\n'),
    ]
    seen = {key}
    for change in changes:
        change()
        new = agent_key(RECIPE, repo)
        assert new not in seen
        seen.add(new)
    other = dataclasses.replace(
        RECIPE, agent=dataclasses.replace(RECIPE.agent, check="dra-agent version"))
    assert agent_key(other, repo) not in seen


def test_invalid_pyproject_is_bad_input(tmp_path: Path, repo: Path) -> None:
    (repo / "pyproject.toml").write_text("[project\n")
    with pytest.raises(BuildError) as caught:
        agent_key(RECIPE, repo)
    assert caught.value.status == USAGE and "pyproject.toml" in str(caught.value)


def test_missing_wheel_input_is_bad_input(tmp_path: Path, repo: Path) -> None:
    (repo / "protos" / "__init__.py").unlink()
    (repo / "protos").rmdir()
    with pytest.raises(BuildError) as caught:
        _builder(tmp_path, repo)[0].build()
    assert caught.value.status == USAGE and "protos is missing" in str(caught.value)


def test_runner_failures_are_one_line_with_the_step_and_log(tmp_path: Path) -> None:
    runner = SubprocessRunner(tmp_path / "logs")
    failing = Command("wheels (pip wheel)",
                      (sys.executable, "-c", "print('resolution impossible'); raise SystemExit(3)"))
    with pytest.raises(BuildError) as caught:
        runner(failing)
    message = str(caught.value)
    assert caught.value.status == FAILED and "\n" not in message
    assert message.startswith("wheels (pip wheel) failed (exit 3): resolution impossible; log: ")
    log = Path(message.rsplit("log: ", 1)[1])
    assert log.parent == tmp_path / "logs" and "resolution impossible" in log.read_text()

    with pytest.raises(BuildError) as caught:
        runner(Command("debian root (mmdebstrap)", ("no-such-tool-for-the-test",)))
    assert caught.value.status == USAGE
    assert str(caught.value) == "debian root (mmdebstrap): no-such-tool-for-the-test not found"


def test_not_root_is_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    runner = SubprocessRunner(tmp_path / "logs")
    for command in (debian_command(RECIPE.agent, tmp_path / "root"),
                    Command("agent check", ("/bin/true",), chroot=tmp_path)):
        with pytest.raises(BuildError) as caught:
            runner(command)
        assert caught.value.status == USAGE and "needs root" in str(caught.value)


def test_cli_says_one_line_and_exits_2_or_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    status = cli.main(["build", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == USAGE
    assert err[-1].startswith("hack.image: debian root (mmdebstrap): needs root")
    assert not [line for line in err if "Traceback" in line]

    (tmp_path / "file").write_text("")
    assert cli.main(["build", "--out", str(tmp_path / "file")]) == USAGE
    assert capsys.readouterr().err == f"hack.image: --out {tmp_path / 'file'} is not a directory\n"

    assert cli.main(["build", "--print-names"]) == 0
    assert capsys.readouterr().out.split() == list(image_names())
