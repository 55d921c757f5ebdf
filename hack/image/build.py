"""The daemonless build: the agent, workload and pause images as docker-archive tarballs.

    python -m hack.image build [--out DIR]     # as root; one line per image: name, file, size, time
    python -m hack.image build --print-names   # the image names, one a line

The agent image: mmdebstrap makes a Debian root file system of the recipe's suite and packages
(mode root; no daemon, no registry); the host's python of the image's version makes the wheels of
the repository (pip wheel, dependencies too); chroot-ed into the root, ``python3 -m venv`` and
``pip install --no-index`` put them into the venv and the recipe's check runs there. The workload
and pause images are Debian's busybox-static and links to the applets each needs.
hack/image/archive.py packs each tree; ``ctr -n k8s.io images import FILE`` loads it.

Cache: ``${XDG_CACHE_HOME:-$HOME/.cache}/dra-agent/image/``

    debian-<key>/          the Debian root file system before our wheels: the slow part (it
                           downloads). <key> hashes the mmdebstrap command made from the recipe
                           (suite, sources, variant, dpkg excludes, packages) and nothing else,
                           so a source change leaves it.
    busybox-<key>          the busybox binary from the same suite, keyed the same way.
    agent-<key>/rootfs/    the agent's root file system: the Debian one plus the venv.
    agent-<key>/image.tar  its archive. <key> adds the agent recipe, the code of this builder that
                           shapes the image (its modules, named in keys.py) and the wheel
                           inputs: names, modes and contents of the files below agent/ cdi/
                           discovery/ protos/ (no __pycache__) and pyproject.toml's
                           [build-system], [project] and [tool.setuptools*] (not the linters' or
                           pytest's tables; nor README.md, which is only the wheel's long
                           description).
    logs/<step>.log        each step's output, from the last build that ran it.
    lock                   builds sharing the cache take turns.

With nothing changed a build copies the cached archive (seconds); a source change re-does the
wheels, the venv and the pack on a copy of the cached Debian root. The two newest entries of each
kind are kept, older ones removed. Neither key knows about new uploads: dependencies are not
pinned, so a rebuild after a source change may pick up new releases (a cached build does not),
and Debian security updates arrive with ``--no-cache``, which re-does everything. pip's download
cache (~/.cache/pip) is the host's own.

The parts: steps.py makes the recipe's commands, runner.py runs them, keys.py hashes the keys,
cache.py keeps the entries; this module puts them together into images.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hack.image.archive import ImageConfig, pack
from hack.image.busybox import applets_of, make_tree
from hack.image.cache import copy_file, default_cache, install_dir, locked, prune, tmp_dir
from hack.image.errors import USAGE, BuildError
from hack.image.keys import agent_key, busybox_key, debian_key
from hack.image.recipe import AGENT_IMAGE, RECIPE, REPO, AgentRecipe, BusyboxImage, Recipe
from hack.image.runner import SubprocessRunner
from hack.image.steps import (
    Command,
    Runner,
    busybox_command,
    debian_cleanup_command,
    debian_command,
    install_commands,
)

__all__ = ["Builder", "Built", "archive_name", "build_all", "image_names", "wheel_python"]


def image_names(recipe: Recipe = RECIPE) -> tuple[str, ...]:
    """Every image the build makes: the agent, the workload, the pause."""
    return (AGENT_IMAGE, recipe.workload.name, recipe.pause.name)


def archive_name(image: str) -> str:
    """The archive's file name: the image name with / and : as _."""
    return re.sub(r"[/:]", "_", image) + ".tar"


def agent_config(agent: AgentRecipe) -> ImageConfig:
    return ImageConfig(
        entrypoint=agent.entrypoint, cmd=agent.cmd, env=agent.env, labels=agent.labels,
        user=agent.user,
    )


def busybox_config(image: BusyboxImage) -> ImageConfig:
    return ImageConfig(entrypoint=image.entrypoint, cmd=image.cmd, env=image.env)


def wheel_python(version: str) -> str:
    """A host python of the image's version: its wheels' ABI tags must fit the image's."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found is None:
        raise BuildError(
            f"wheels: no python{version} on this host (the image runs {version}; the wheels it"
            " installs are built by the same version)", USAGE,
        )
    return found


def _copy_tree(src: Path, dest: Path) -> None:
    # cp -a keeps what shutil.copytree drops: hardlinks, device nodes, owners, xattrs.
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", str(src), str(dest)], capture_output=True, text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"copying {src} to {dest}: {done.stderr.strip()[-200:]}")


def _blank_host_files(root: Path) -> None:
    """mmdebstrap copies the host's resolv.conf and hostname in; the runtime mounts its own
    over them, so they stay as empty files (mount targets) without the build host's values."""
    etc = root / "etc"
    if not etc.is_dir() or etc.is_symlink():
        return
    for name in ("resolv.conf", "hostname"):
        path = etc / name
        if path.exists() or path.is_symlink():
            path.unlink()  # not written through: a symlink would point at the host's file
            path.write_text("")


@dataclass(frozen=True)
class Built:
    name: str
    path: Path
    size: int
    seconds: float
    cached: bool
    # The image's root file system where the cache keeps it (the agent's), for a chroot.
    rootfs: Path | None = None


def _quiet(_: str) -> None:
    pass


@dataclass
class Builder:
    """One build of the three images into ``out``; the cache under ``cache``."""

    out: Path
    repo: Path = REPO
    cache: Path = field(default_factory=default_cache)
    recipe: Recipe = RECIPE
    # None: SubprocessRunner, logs under the cache. Tests pass one that fakes the tools.
    runner: Runner | None = None
    use_cache: bool = True
    say: Callable[[str], None] = _quiet
    # The host python that makes the wheels; None: wheel_python(the recipe's version).
    python: str | None = None
    # Cache entries this build made (or is making): --no-cache re-does each once, not twice.
    _made: set[Path] = field(default_factory=set, init=False, repr=False)

    def _run(self, command: Command) -> None:
        runner = self.runner or SubprocessRunner(self.cache / "logs")
        runner(command)

    def _hit(self, entry: Path, made: Path | None = None) -> bool:
        """Whether the cache has ``entry`` (complete once ``made`` exists, when given) for this
        build: without the cache, only what this build made itself counts."""
        if (self.use_cache or entry in self._made) and (made or entry).exists():
            os.utime(entry)  # most recently used: pruned last
            return True
        self._made.add(entry)
        return False

    def debian_rootfs(self) -> Path:
        """The cached Debian root file system of the recipe (made when missing)."""
        agent = self.recipe.agent
        done = self.cache / f"debian-{debian_key(self.recipe)}"
        if self._hit(done):
            return done
        partial = done.with_name(done.name + ".partial")
        self.say(f"debian: mmdebstrap {agent.debian.suite} with {', '.join(agent.packages)}")
        self._run(debian_command(agent, partial))
        _blank_host_files(partial)
        self._run(debian_cleanup_command(agent, partial))
        install_dir(partial, done)
        prune(self.cache, "debian-")
        return done

    def busybox_binary(self) -> Path:
        """The cached busybox binary of the recipe's package (fetched when missing)."""
        recipe = self.recipe.busybox
        done = self.cache / f"busybox-{busybox_key(self.recipe)}"
        if self._hit(done):
            return done
        self.say(f"busybox: {recipe.package} from {self.recipe.agent.debian.suite}")
        with tmp_dir(self.cache) as tmp:
            target = Path(tmp) / "root"
            self._run(busybox_command(self.recipe, target))
            found = target / recipe.path
            # Read inside the unpacked tree only (a symlink out of it would be the host's).
            if not found.is_file() or not found.resolve().is_relative_to(target.resolve()):
                raise BuildError(f"busybox: {recipe.package} has no /{recipe.path}")
            partial = done.with_name(done.name + ".partial")
            shutil.copyfile(found, partial)
            partial.chmod(0o755)
            os.replace(partial, done)
        prune(self.cache, "busybox-")
        return done

    def _wheels(self, tmp: Path) -> Path:
        agent = self.recipe.agent
        source, wheels = tmp / "src", tmp / "wheels"
        # A copy of exactly what the Dockerfile COPYs: the build sees no other file of the
        # repository, and leaves nothing (build/, *.egg-info) in it.
        source.mkdir()
        for name in agent.source_files:
            shutil.copy2(self.repo / name, source / name)
        for name in agent.source_dirs:
            shutil.copytree(
                self.repo / name, source / name,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), symlinks=True,
            )
        python = self.python or wheel_python(agent.debian.python)
        self.say(f"wheels: {python} -m pip wheel")
        self._run(Command(
            "wheels (pip wheel)", agent.wheel_command(python, str(source), str(wheels)), cwd=tmp
        ))
        return wheels

    def build_agent(self) -> Built:
        start = time.monotonic()
        agent = self.recipe.agent
        entry = self.cache / f"agent-{agent_key(self.recipe, self.repo)}"
        cached = self._hit(entry, entry / "image.tar")
        if not cached:
            base = self.debian_rootfs()
            partial = entry.with_name(entry.name + ".partial")
            partial.mkdir()
            rootfs = partial / "rootfs"
            with tmp_dir(self.cache) as tmp:
                wheels = self._wheels(Path(tmp))
                self.say("agent: venv and pip install in a copy of the Debian root")
                _copy_tree(base, rootfs)
                inside = rootfs / agent.wheels.lstrip("/")
                shutil.copytree(wheels, inside)
                for command in install_commands(agent, rootfs):
                    self._run(command)
                shutil.rmtree(inside)
            self.say("agent: packing")
            pack(rootfs, partial / "image.tar", (AGENT_IMAGE,), agent_config(agent))
            install_dir(partial, entry)
            prune(self.cache, "agent-")
        dest = self.out / archive_name(AGENT_IMAGE)
        copy_file(entry / "image.tar", dest)
        return Built(AGENT_IMAGE, dest, dest.stat().st_size, time.monotonic() - start, cached,
                     entry / "rootfs")

    def build_busybox(self, image: BusyboxImage) -> Built:
        start = time.monotonic()
        busybox = self.busybox_binary()
        dest = self.out / archive_name(image.name)
        with tmp_dir(self.cache) as tmp:
            root = Path(tmp) / "root"
            make_tree(busybox, root, self.recipe.busybox, image, applets_of(busybox))
            # Every entry root's, times fixed: the same binary packs to the same bytes.
            packed = pack(root, dest, (image.name,), busybox_config(image), mtime=0, owner=(0, 0))
        return Built(image.name, dest, packed.size, time.monotonic() - start, False)

    def build(self, report: Callable[[Built], None] = lambda _: None) -> list[Built]:
        """All three images; ``report`` hears of each as it is done."""
        if self.out.exists() and not self.out.is_dir():
            raise BuildError(f"--out {self.out} is not a directory", USAGE)
        self.out.mkdir(parents=True, exist_ok=True)
        built: list[Built] = []
        self._made.clear()
        with locked(self.cache):
            for make in (
                self.build_agent,
                lambda: self.build_busybox(self.recipe.workload),
                lambda: self.build_busybox(self.recipe.pause),
            ):
                built.append(make())
                report(built[-1])
        return built


def build_all(
    out: Path,
    *,
    cache: Path | None = None,
    use_cache: bool = True,
    say: Callable[[str], None] = _quiet,
) -> dict[str, Path]:
    """Build every image into ``out``: image name -> docker-archive path (for `ctr import`).

    Needs root unless everything is cached; raises BuildError (message, status) on failure.
    """
    builder = Builder(out, cache=cache or default_cache(), use_cache=use_cache, say=say)
    return {b.name: b.path for b in builder.build()}
