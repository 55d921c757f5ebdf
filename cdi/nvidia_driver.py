"""Find an NVIDIA driver installation under a driver root: version, libraries, binaries,
GSP firmware, IPC sockets and the toolkit's hook binary.

The MPS control daemon's pipe directory is no IPC socket of the driver's: it holds the
daemon's control socket, so it is mounted only into the containers of MPS shares (the agent's
MPS effect names it per share), never into every NVIDIA container.

The driver root is ``/`` for a host install, or wherever the driver is mounted in the agent's
container (``/run/nvidia/driver`` with the GPU Operator's driver container). Paths are looked
up under it and reported both as the file here and as the absolute path the host sees.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cdi.elf import ElfError, soname
from cdi.host import HostLookupError, in_root, resolve_in_root, strip_root
from cdi.ldcache import LdCacheError, read_ld_cache

#: Where distributions put the 64-bit driver libraries; the ld cache is read too.
LIBRARY_DIRS = (
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
#: Libraries whose presence marks a directory as the driver's (and give its version).
MARKER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
HOOK_CANDIDATES = (
    "/usr/bin/nvidia-cdi-hook",
    "/usr/local/nvidia/toolkit/nvidia-cdi-hook",
    "/usr/bin/nvidia-ctk",
    "/usr/local/nvidia/toolkit/nvidia-ctk",
)
LDCONFIG_CANDIDATES = ("/sbin/ldconfig.real", "/sbin/ldconfig")
_VERSION_RE = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")
_SEMVER_RE = re.compile(r"version\s+v?(\d+)\.(\d+)\.(\d+)")


class DriverNotFoundError(HostLookupError):
    """No usable NVIDIA driver installation under the driver root."""


def kernel_driver_version(proc_root: Path, sysfs_root: Path | None = None) -> str | None:
    """The loaded kernel module's version (``570.86.15``), or ``None`` when none is loaded."""
    path = proc_root / "driver" / "nvidia" / "version"
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        first = ""
    if "Kernel Module" in first:
        # Proprietary: "...Kernel Module  570.86.15  <date>"; open: "...Kernel Module for
        # x86_64  570.86.15  Release Build ...". The first dotted number after it is the RM.
        match = _VERSION_RE.search(first.split("Kernel Module", 1)[1])
        if match:
            return match.group(1)
    if sysfs_root is not None:
        with contextlib.suppress(OSError):
            text = (sysfs_root / "module" / "nvidia" / "version").read_text().strip()
            if _VERSION_RE.fullmatch(text):
                return text
    return None


@dataclass(frozen=True, slots=True)
class DriverFile:
    """A file of the driver: ``source`` here, ``path`` as the host and container see it."""

    source: Path  # the real file (symlinks resolved) under the driver root
    path: str  # host-absolute path of ``source`` (the driver root stripped)
    link_path: str  # where it was found (binaries keep /usr/bin/x even if that is a link)


@dataclass(frozen=True, slots=True)
class Library:
    file: DriverFile
    soname: str | None  # DT_SONAME, e.g. libcuda.so.1


@dataclass(frozen=True, slots=True)
class HookBinary:
    """The toolkit's CDI hook (``nvidia-cdi-hook`` or ``nvidia-ctk hook``)."""

    path: str  # host-absolute
    version: tuple[int, int, int] | None  # None when ``--version`` could not be read
    under_root: bool = True  # found under the driver root (else: a path on this machine)

    def argv(self, subcommand: str, *args: str) -> tuple[str, ...]:
        name = os.path.basename(self.path)
        if name == "nvidia-ctk":
            return (name, "hook", subcommand, *args)
        return (name, subcommand, *args)

    def supports(self, minimum: tuple[int, int, int]) -> bool:
        return self.version is not None and self.version >= minimum


@dataclass(frozen=True, slots=True)
class DriverRoot:
    """An NVIDIA driver installation, as found under ``root``."""

    root: Path
    version: str
    libraries: tuple[Library, ...]
    binaries: tuple[DriverFile, ...]
    firmware: tuple[DriverFile, ...]
    ipc: tuple[DriverFile, ...]
    hook: HookBinary | None
    ldconfig: str | None

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return tuple(sorted({os.path.dirname(lib.file.link_path) for lib in self.libraries}))

    @classmethod
    def discover(
        cls,
        root: Path,
        proc_root: Path,
        *,
        sysfs_root: Path | None = None,
        hook_path: str | None = None,
        kernel_release: str | None = None,
    ) -> DriverRoot:
        """Look the driver up; ``DriverNotFoundError`` says what is missing."""
        kernel = kernel_driver_version(proc_root, sysfs_root)
        dirs = _library_dirs(root)
        version = kernel or _version_from_libraries(root, dirs)
        if version is None:
            raise DriverNotFoundError(
                f"no NVIDIA driver under {root}: no loaded kernel module in "
                f"{proc_root}/driver/nvidia/version and no libcuda.so.<version> or "
                f"libnvidia-ml.so.<version> in the ld cache or {', '.join(LIBRARY_DIRS)}"
            )
        libraries = _libraries(root, dirs, version)
        if not libraries:
            found = _version_from_libraries(root, dirs)
            detail = f" (found libraries of {found})" if found else ""
            raise DriverNotFoundError(
                f"NVIDIA kernel module {version} is loaded but its user-space libraries "
                f"(*.so.{version}) are not under {root}{detail}"
            )
        return cls(
            root=root,
            version=version,
            libraries=libraries,
            binaries=_binaries(root),
            firmware=_firmware(root, version, sysfs_root, kernel_release or os.uname().release),
            ipc=_ipc(root),
            hook=_hook(root, hook_path),
            ldconfig=next(
                (p for p in LDCONFIG_CANDIDATES if in_root(root, p).exists()), None
            ),
        )


def _driver_file(root: Path, found: Path) -> DriverFile | None:
    try:
        real = resolve_in_root(root, found)
    except HostLookupError:
        return None
    if not real.is_file():
        return None
    return DriverFile(source=real, path=strip_root(root, real), link_path=strip_root(root, found))


def _library_dirs(root: Path) -> list[str]:
    dirs: dict[str, None] = {}
    try:
        entries = read_ld_cache(in_root(root, "/etc/ld.so.cache"))
    except LdCacheError:
        entries = []  # an unreadable cache is no reason to give up: the fixed dirs remain
    for entry in entries:
        if entry.is_64bit and entry.name.startswith(MARKER_LIBRARIES):
            dirs[os.path.dirname(entry.path)] = None
    for d in LIBRARY_DIRS:
        here = in_root(root, d)
        if any(any(here.glob(f"{m}.*.*")) for m in MARKER_LIBRARIES):
            dirs[d] = None
    return list(dirs)


def _version_from_libraries(root: Path, dirs: list[str]) -> str | None:
    for marker in MARKER_LIBRARIES:
        for d in dirs:
            for hit in sorted(in_root(root, d).glob(f"{marker}.*.*")):
                suffix = hit.name[len(marker) + 1 :]
                if _VERSION_RE.fullmatch(suffix):
                    return suffix
    return None


def _libraries(root: Path, dirs: list[str], version: str) -> tuple[Library, ...]:
    found: dict[str, Library] = {}
    for d in dirs:
        base = in_root(root, d)
        for folder in (base, base / "vdpau"):
            for hit in sorted(folder.glob(f"*.so.{version}")):
                file = _driver_file(root, hit)
                if file is None or file.path in found:
                    continue
                try:
                    name = soname(file.source)
                except ElfError:
                    name = _soname_from_links(hit.parent, hit.name)
                found[file.path] = Library(file=file, soname=name)
    return tuple(found[p] for p in sorted(found))


def _soname_from_links(folder: Path, file_name: str) -> str | None:
    # A file that is not readable ELF (a fixture, a foreign arch): the host's own
    # lib<x>.so.<major> link next to it says what the linker would use.
    stem = file_name.split(".so.", 1)[0] + ".so."
    for link in sorted(folder.glob(stem + "*")):
        if link.is_symlink() and os.readlink(link) == file_name and link.name.count(".") == 2:
            return link.name
    return None


def _binaries(root: Path) -> tuple[DriverFile, ...]:
    out: list[DriverFile] = []
    for name in BINARIES:
        for d in BINARY_DIRS:
            hit = in_root(root, f"{d}/{name}")
            file = _driver_file(root, hit) if os.access(hit, os.X_OK) else None
            if file is not None:
                out.append(file)
                break
    return tuple(out)


def _firmware(
    root: Path, version: str, sysfs_root: Path | None, release: str
) -> tuple[DriverFile, ...]:
    dirs: list[str] = []
    if sysfs_root is not None:
        with contextlib.suppress(OSError):
            custom = (sysfs_root / "module/firmware_class/parameters/path").read_text().strip()
            if custom:
                dirs.append(custom)
    dirs += [
        f"/lib/firmware/updates/{release}",
        "/lib/firmware/updates",
        f"/lib/firmware/{release}",
        "/lib/firmware",
    ]
    found: dict[str, DriverFile] = {}
    for d in dirs:
        for hit in sorted(in_root(root, d).glob(f"nvidia/{version}/gsp*.bin")):
            file = _driver_file(root, hit)
            if file is not None and file.link_path not in found:
                found[file.link_path] = file
    return tuple(found.values())


def _ipc(root: Path) -> tuple[DriverFile, ...]:
    out: list[DriverFile] = []
    for name in IPC_SOCKETS:
        for run in ("/run", "/var/run"):
            hit = in_root(root, f"{run}/{name}")
            if hit.exists():
                out.append(DriverFile(hit, strip_root(root, hit), strip_root(root, hit)))
                break
    return tuple(out)


def _hook(root: Path, hook_path: str | None) -> HookBinary | None:
    candidates = (hook_path,) if hook_path else HOOK_CANDIDATES
    for candidate in candidates:
        here = in_root(root, candidate)
        if here.is_file() and os.access(here, os.X_OK):
            return HookBinary(path=candidate, version=probe_hook_version(here))
    if hook_path is not None:
        # An explicit hook outside the driver root (the toolkit installed on the host while
        # the driver lives in a driver container): the path is the same for the runtime.
        here = Path(hook_path)
        if not here.is_absolute() or not here.is_file() or not os.access(here, os.X_OK):
            raise DriverNotFoundError(f"hook binary {hook_path} not found or not executable")
        return HookBinary(path=hook_path, version=probe_hook_version(here), under_root=False)
    return None


def probe_hook_version(binary: Path) -> tuple[int, int, int] | None:
    """``<hook> --version`` -> ``(1, 17, 8)``; ``None`` when it does not run or say."""
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = _SEMVER_RE.search(out.stdout + out.stderr)
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch
