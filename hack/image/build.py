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
                           shapes the image (build.py, archive.py) and the wheel inputs: names,
                           modes and contents of the files below agent/ cdi/ discovery/ protos/
                           (no __pycache__) and pyproject.toml's [build-system], [project] and
                           [tool.setuptools*] (not the linters' or pytest's tables; nor README.md,
                           which is only the wheel's long description).
    logs/<step>.log        each step's output, from the last build that ran it.
    lock                   builds sharing the cache take turns.

With nothing changed a build copies the cached archive (seconds); a source change re-does the
wheels, the venv and the pack on a copy of the cached Debian root. The two newest entries of each
kind are kept, older ones removed. Neither key knows about new uploads: dependencies are not
pinned, so a rebuild after a source change may pick up new releases (a cached build does not),
and Debian security updates arrive with ``--no-cache``, which re-does everything. pip's download
cache (~/.cache/pip) is the host's own.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hack.image.archive import ImageConfig, pack
from hack.image.busybox import applets_of, make_tree
from hack.image.errors import USAGE, BuildError
from hack.image.recipe import (
    AGENT_IMAGE,
    RECIPE,
    REPO,
    SYSTEM_PATH,
    AgentRecipe,
    BusyboxImage,
    Recipe,
)

# This builder's modules whose code decides the agent image's bytes: part of its cache key.
_SHAPING = ("build.py", "archive.py")
# Kept of each kind of cache entry: the current one and the one before (a branch switch back).
_KEEP = 2
# What a missing tool is installed with, for the one-line error.
_HINTS = {"mmdebstrap": "apt-get install -y mmdebstrap", "chroot": "apt-get install -y coreutils"}


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-agent" / "image"


def image_names(recipe: Recipe = RECIPE) -> tuple[str, ...]:
    """Every image the build makes: the agent, the workload, the pause."""
    return (AGENT_IMAGE, recipe.workload.name, recipe.pause.name)


def archive_name(image: str) -> str:
    """The archive's file name: the image name with / and : as _."""
    return re.sub(r"[/:]", "_", image) + ".tar"


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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _install_dir(partial: Path, done: Path) -> None:
    """Move a finished entry into place (a rename: a reader sees all of it or none)."""
    _remove(done)
    partial.rename(done)


def _copy_tree(src: Path, dest: Path) -> None:
    # cp -a keeps what shutil.copytree drops: hardlinks, device nodes, owners, xattrs.
    done = subprocess.run(
        ["cp", "-a", "--reflink=auto", str(src), str(dest)], capture_output=True, text=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"copying {src} to {dest}: {done.stderr.strip()[-200:]}")


def _copy_file(src: Path, dest: Path) -> None:
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.copyfile(src, partial)
    os.replace(partial, dest)


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

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.cache.mkdir(parents=True, exist_ok=True)
        with (self.cache / "lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            # Under the lock nothing else builds: what is partial is a killed build's.
            for leftover in self.cache.iterdir():
                if leftover.name.endswith(".partial") or leftover.name.startswith(".tmp-"):
                    _remove(leftover)
            yield

    def _prune(self, prefix: str) -> None:
        entries = [p for p in self.cache.iterdir() if p.name.startswith(prefix)]
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[_KEEP:]:
            _remove(old)

    def _tmp(self) -> tempfile.TemporaryDirectory[str]:
        return tempfile.TemporaryDirectory(dir=self.cache, prefix=".tmp-")

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
        _install_dir(partial, done)
        self._prune("debian-")
        return done

    def busybox_binary(self) -> Path:
        """The cached busybox binary of the recipe's package (fetched when missing)."""
        recipe = self.recipe.busybox
        done = self.cache / f"busybox-{busybox_key(self.recipe)}"
        if self._hit(done):
            return done
        self.say(f"busybox: {recipe.package} from {self.recipe.agent.debian.suite}")
        with self._tmp() as tmp:
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
        self._prune("busybox-")
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
            with self._tmp() as tmp:
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
            _install_dir(partial, entry)
            self._prune("agent-")
        dest = self.out / archive_name(AGENT_IMAGE)
        _copy_file(entry / "image.tar", dest)
        return Built(AGENT_IMAGE, dest, dest.stat().st_size, time.monotonic() - start, cached,
                     entry / "rootfs")

    def build_busybox(self, image: BusyboxImage) -> Built:
        start = time.monotonic()
        busybox = self.busybox_binary()
        dest = self.out / archive_name(image.name)
        with self._tmp() as tmp:
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
        with self._locked():
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
