"""Helpers of the image tests: an archive read back, a small repository, tools faked."""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hack.image.recipe import Recipe
from hack.image.steps import Command


@dataclass(frozen=True)
class Archive:
    names: tuple[str, ...]
    manifest: list[dict[str, object]]
    config: dict[str, object]
    config_name: str
    config_bytes: bytes
    layer_name: str
    layer_bytes: bytes
    members: dict[str, tarfile.TarInfo]
    order: tuple[str, ...]

    def read(self, name: str) -> bytes:
        with tarfile.open(fileobj=io.BytesIO(self.layer_bytes)) as layer:
            data = layer.extractfile(name)
            assert data is not None
            return data.read()


def read_archive(path: Path) -> Archive:
    with tarfile.open(path) as tar:
        names = tuple(m.name for m in tar.getmembers())

        def blob(name: str) -> bytes:
            data = tar.extractfile(name)
            assert data is not None, name
            return data.read()

        manifest = json.loads(blob("manifest.json"))
        (entry,) = manifest
        config_bytes = blob(entry["Config"])
        (layer_name,) = entry["Layers"]
        layer_bytes = blob(layer_name)
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer:
        members = layer.getmembers()
    return Archive(
        names, manifest, json.loads(config_bytes), entry["Config"], config_bytes, layer_name,
        layer_bytes, {m.name: m for m in members}, tuple(m.name for m in members),
    )


def make_repo(root: Path) -> Path:
    """The wheel inputs of a repository, small: what the cache key and the wheel step read."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[project]\nname = "dra-agent"\nversion = "0.1.0"\n')
    (root / "README.md").write_text("# dra-agent\n")
    for package in ("agent", "cdi", "discovery", "protos"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(f'"""{package}"""\n')
    (root / "agent" / "cli.py").write_text("def main() -> None:\n    pass\n")
    return root


def fake_busybox(path: Path, applets: tuple[str, ...]) -> Path:
    """A stand-in for the static busybox: a script that answers --list as busybox does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(f"'{a}'" for a in applets) + "\n")
    path.chmod(0o755)
    return path


@dataclass
class FakeTools:
    """A Runner that does what mmdebstrap, pip and the chroot-ed steps leave behind, fast,
    and records every command it was given."""

    recipe: Recipe
    ran: list[Command] = field(default_factory=list)

    def steps(self) -> list[str]:
        return [c.step for c in self.ran]

    def __call__(self, command: Command) -> None:
        self.ran.append(command)
        argv = command.argv
        if command.chroot is not None:
            root = command.chroot
            if argv[1:3] == ("-m", "venv"):
                bin_dir = root / argv[3].lstrip("/") / "bin"
                bin_dir.mkdir(parents=True)
                (bin_dir / "dra-agent").write_text("#!/opt/dra-agent/bin/python\n")
                (bin_dir / "dra-agent").chmod(0o755)
            links = [a.split("=", 1)[1] for a in argv if a.startswith("--find-links=")]
            for found in links:
                # "Installs" the wheels: their bytes end up in the image, as real code would.
                site = root / "opt/dra-agent/lib"
                site.mkdir(parents=True, exist_ok=True)
                for wheel in (root / found.lstrip("/")).iterdir():
                    (site / wheel.name).write_bytes(wheel.read_bytes())
            return
        if argv[0] == "mmdebstrap":
            target = Path(argv[argv.index(self.recipe.agent.debian.suite) + 1])
            if "--variant=extract" in argv:
                applets = (*self.recipe.workload.applets, *self.recipe.workload.optional_applets)
                fake_busybox(target / self.recipe.busybox.path, applets)
                return
            for name in ("etc", "usr/bin", "dev", "proc", "var/lib/apt/lists"):
                (target / name).mkdir(parents=True)
            (target / "bin").symlink_to("usr/bin")
            (target / "usr/bin/python3").write_text("#!ELF\n")
            (target / "etc/resolv.conf").write_text("nameserver 192.0.2.1\n")
            (target / "etc/hostname").write_text("build-host\n")
            (target / "dev/fd").symlink_to("/proc/self/fd")
            return
        if "wheel" in argv:
            source = Path(argv[-1])
            assert (source / "pyproject.toml").is_file()
            assert not list(source.rglob("__pycache__")), "the wheel source is a clean copy"
            wheels = Path(argv[argv.index("--wheel-dir") + 1])
            wheels.mkdir()
            (wheels / "dra_agent-0.1.0-py3-none-any.whl").write_bytes(
                (source / "agent" / "cli.py").read_bytes()
            )
            return
        raise AssertionError(f"unexpected command {command}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")
