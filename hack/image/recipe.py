"""The one recipe for the agent's image and the two busybox images next to it.

Everything that decides what goes into an image is written here once. The Dockerfile is
generated from it (``python -m hack.image dockerfile``, hack/image/dockerfile.py) and the
daemonless builder (hack/image/build.py) reads the same objects, so both start from Debian
bookworm, install the same packages without recommends, make the same venv, pip-install the
same wheels into it and run the same check; tests/image holds the two to that.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]

# One PATH for both builds, written out rather than "$PATH"-extended: an image config holds the
# value itself, and the daemonless build has no base image to extend.
SYSTEM_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def project_version(repo: Path = REPO) -> str:
    """The package version in pyproject.toml: deploy/ runs the image dra-agent:<version>."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    return str(project["version"])


VERSION: Final = project_version()
AGENT_REPOSITORY: Final = "dra-agent"
AGENT_IMAGE: Final = f"{AGENT_REPOSITORY}:{VERSION}"
# Test pods of the real-cluster bench run this one: a shell and the tools their commands use.
WORKLOAD_IMAGE: Final = "dra-agent-workload:local"
# The CRI sandbox image; a containerd configured with sandbox_image = this name needs no
# registry to start a pod.
PAUSE_IMAGE: Final = "registry.k8s.io/pause:local"


@dataclass(frozen=True)
class Debian:
    """Where the packages come from."""

    suite: str
    # The Dockerfile's base: Debian's own image of the same suite.
    image: str
    # mmdebstrap's variant closest to that image (priority required and apt, no more).
    variant: str
    # apt source lines; updates and security as the Debian image's sources have them.
    sources: tuple[str, ...]
    # dpkg never unpacks these; the Debian slim image is configured the same way, so the
    # daemonless root file system matches it (documentation and locales: about 50 MB).
    path_excludes: tuple[str, ...]
    path_includes: tuple[str, ...]
    # The suite's python3; the daemonless build makes the wheels with a host python of this
    # version so that their ABI tags fit the image's interpreter.
    python: str


@dataclass(frozen=True)
class AgentRecipe:
    """The agent's image: Debian packages, a venv with our wheels, the run-time settings."""

    debian: Debian
    packages: tuple[str, ...]
    project: str
    venv: str
    # Where the wheels are during the install step (a bind mount in the Dockerfile, a copy
    # removed afterwards in the daemonless build).
    wheels: str
    # The files and package directories the wheel is built from.
    source_files: tuple[str, ...]
    source_dirs: tuple[str, ...]
    # Sources that change no installed code: pyproject reads README.md for the long description
    # only, and a README edit should not re-do the pip step of a cached build.
    unkeyed_sources: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    # Run at build time, in the image, by /bin/sh with `env`: a native library missing from the
    # packages fails the build rather than the node (pyudev loads libudev.so.1 at run time).
    check: str
    # Removed after the packages are in (shell globs, absolute in the image).
    cleanup: tuple[str, ...]

    def apt_install(self) -> tuple[str, ...]:
        """The Dockerfile's package install; mmdebstrap does the same from --include."""
        return ("apt-get", "install", "-y", "--no-install-recommends", *self.packages)

    def cleanup_command(self) -> str:
        # Globs, so a shell line, not an argv; the same line runs in the daemonless root.
        return "rm -rf " + " ".join(self.cleanup)

    def install_steps(self) -> tuple[tuple[str, ...], ...]:
        """The commands that make the venv and install the wheels, run in the image's root."""
        pip = f"{self.venv}/bin/pip"
        return (
            ("python3", "-m", "venv", self.venv),
            (pip, "install", "--no-index", f"--find-links={self.wheels}", self.project),
        )

    def check_command(self) -> tuple[str, ...]:
        return ("/bin/sh", "-c", self.check)

    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def wheel_command(self, python: str, source: str, wheel_dir: str) -> tuple[str, ...]:
        """Our wheel and every dependency's, from a copy of the sources."""
        return (python, "-m", "pip", "wheel", "--wheel-dir", wheel_dir, source)


@dataclass(frozen=True)
class BusyboxImage:
    """A tiny image from Debian's static busybox: the binary and symlinks to its applets."""

    name: str
    # Linked into /bin; the build fails when the binary lacks one of them.
    applets: tuple[str, ...]
    # Linked when the binary has them (Debian's build may leave one out).
    optional_applets: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Busybox:
    """Where the busybox binary comes from and what every busybox image holds besides it."""

    package: str
    # The binary's path inside the package.
    path: str
    passwd: str
    group: str


@dataclass(frozen=True)
class Recipe:
    agent: AgentRecipe
    busybox: Busybox
    workload: BusyboxImage
    pause: BusyboxImage


BOOKWORM: Final = Debian(
    suite="bookworm",
    image="debian:bookworm-slim",
    variant="minbase",
    sources=(
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ),
    path_excludes=(
        "/usr/share/doc/*",
        "/usr/share/groff/*",
        "/usr/share/info/*",
        "/usr/share/linda/*",
        "/usr/share/lintian/overrides/*",
        "/usr/share/locale/*",
        "/usr/share/man/*",
    ),
    # Licences stay, as in Debian's slim image.
    path_includes=("/usr/share/doc/*/copyright",),
    python="3.11",
)

_BUSYBOX_ENV: Final = (("PATH", SYSTEM_PATH),)
_VENV: Final = "/opt/dra-agent"

RECIPE: Final = Recipe(
    agent=AgentRecipe(
        debian=BOOKWORM,
        # python3-venv brings ensurepip's wheels (a venv's pip); libudev1 is what pyudev
        # loads; ca-certificates for TLS to the API server when no CA bundle is mounted.
        packages=("ca-certificates", "libudev1", "python3", "python3-venv"),
        project="dra-agent",
        venv=_VENV,
        wheels="/wheels",
        source_files=("pyproject.toml", "README.md"),
        source_dirs=("agent", "cdi", "discovery", "protos"),
        unkeyed_sources=("README.md",),
        labels=(
            ("org.opencontainers.image.title", "dra-agent"),
            ("org.opencontainers.image.description",
             "Kubernetes DRA node agent for GPUs and NICs"),
            ("org.opencontainers.image.licenses", "Apache-2.0"),
            ("org.opencontainers.image.version", VERSION),
        ),
        env=(
            ("PATH", f"{_VENV}/bin:{SYSTEM_PATH}"),
            # Bytecode is compiled at install time; at run time the root file system is
            # read-only.
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("PIP_NO_CACHE_DIR", "1"),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        ),
        # Root on purpose (the Dockerfile's comment on USER says why).
        user="0:0",
        entrypoint=("dra-agent",),
        cmd=("run",),
        check='dra-agent version && python -c "import pyudev; pyudev.Context()"',
        cleanup=("/var/lib/apt/lists/*", "/var/cache/apt/*.bin", "/var/cache/apt/archives/*.deb"),
    ),
    busybox=Busybox(
        package="busybox-static",
        path="bin/busybox",
        passwd="root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        group="root:x:0:\nnogroup:x:65534:\n",
    ),
    workload=BusyboxImage(
        name=WORKLOAD_IMAGE,
        applets=(
            "[", "awk", "basename", "cat", "chmod", "cp", "cut", "date", "df", "dirname", "du",
            "echo", "env", "false", "find", "grep", "head", "hostname", "id", "kill", "ln", "ls",
            "mkdir", "mount", "mv", "nproc", "printf", "ps", "readlink", "realpath",
            "rm", "sed", "seq", "sh", "sleep", "sort", "stat", "tail", "tee", "test", "timeout",
            "touch", "tr", "true", "uname", "uniq", "wc", "xargs",
        ),
        optional_applets=("ip",),
        entrypoint=("/bin/sh",),
        cmd=(),
        env=_BUSYBOX_ENV,
    ),
    pause=BusyboxImage(
        name=PAUSE_IMAGE,
        applets=("sh", "sleep"),
        optional_applets=(),
        # A sandbox process that waits for ever and exits 0 on TERM, as the real pause does:
        # `wait` returns at once on a trapped signal, where a foreground sleep would not.
        entrypoint=(
            "/bin/sh", "-c", 'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done',
        ),
        cmd=(),
        env=_BUSYBOX_ENV,
    ),
)
