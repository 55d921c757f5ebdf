"""The container runtime: which one, whether CDI is on, and whether it reads the agent's CDI dir.

The runtime's binary cannot be run from a read-only host root, so everything comes from files:
containerd's ``/etc/containerd/config.toml`` (with its ``imports``) and socket, CRI-O's
``/etc/crio/crio.conf`` and ``crio.conf.d``. Without CDI the runtime never turns the kubelet's
CDI device IDs into device nodes: the container starts, with no GPU in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from agent.doctor.context import Context
from agent.doctor.host import HostFileError, HostRoot, table
from agent.doctor.model import Check, fail, ok, skipped, warn
from agent.doctor.packages import Installed, containerd_installed, from_dpkg

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CRIO_DIR = "/etc/crio"
CRIO_SOCKET = "/var/run/crio/crio.sock"
#: The CDI spec dirs both runtimes read unless told otherwise.
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: Where the CRI plugin's settings live, by containerd config version (1: containerd 1.x's
#: oldest format; 2: containerd 1.x; 3: containerd 2.x).
CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
#: containerd follows imports of imports; a loop or a runaway chain stops here.
MAX_IMPORTS = 64

NAME, CDI, CDI_DIRS = "container runtime", "runtime CDI", "runtime CDI dirs"


@dataclass(frozen=True, slots=True)
class Runtime:
    kind: str  # "containerd" or "CRI-O"
    socket: bool
    config: dict[str, Any]
    files: tuple[str, ...]  # the config files read, in order
    error: str = ""  # why the config could not be read ("" when it could)

    @property
    def config_version(self) -> int:
        version = self.config.get("version", 1)
        return version if isinstance(version, int) and version in CRI_PLUGIN else 1

    def describe(self, installed: Installed | None = None) -> str:
        """``containerd 2.1.4 (dpkg containerd.io), config version 3``: the installed version
        where a package database or the binary says it, else what the config's format says."""
        name = self.kind
        if installed is not None:
            name += f" {installed.version} ({installed.source})"
        if self.kind == "CRI-O" or not self.files or self.error:
            return name
        v = self.config_version
        if installed is None:
            name += f" {'2.x' if v == 3 else '1.x'}"
        return f"{name}, config version {v}"

    def cri_table(self) -> dict[str, Any]:
        if self.kind == "CRI-O":
            return table(self.config, "crio", "runtime")
        return table(self.config, "plugins", CRI_PLUGIN[self.config_version])


def _merge_containerd(host: HostRoot, path: str, into: dict[str, Any], files: list[str],
                      seen: set[str], *, deep: bool | None) -> None:
    """Read ``path`` and its imports into ``into`` as containerd does. containerd 1.x replaces
    a whole ``[plugins."<id>"]`` section with a later file's (so a drop-in that sets one CRI
    key silently drops the ``enable_cdi`` set before it); 2.x merges the sections key by key
    (containerd#9982). ``deep`` None: decided by the main file's version (3: 2.x)."""
    if path in seen or len(seen) >= MAX_IMPORTS:
        return
    seen.add(path)
    doc = host.read_toml(path)
    files.append(path)
    if deep is None:
        deep = doc.get("version") == 3
    for key, value in doc.items():
        if key == "plugins" and isinstance(value, dict) and isinstance(into.get("plugins"), dict):
            if deep:
                _deep_merge(into["plugins"], value)
            else:
                into["plugins"].update(value)
        elif key == "version" and len(files) > 1:
            continue  # the main file's version decides how containerd reads the config
        elif key != "imports":
            into[key] = value
    imports = doc.get("imports", [])
    if not isinstance(imports, list):
        raise HostFileError(f"{path}: imports must be a list of paths")
    for entry in imports:
        if not isinstance(entry, str) or not entry:
            raise HostFileError(f"{path}: imports holds {entry!r}, not a path")
        for found in _glob(host, PurePosixPath(path).parent / entry):
            _merge_containerd(host, str(found), into, files, seen, deep=deep)


def _deep_merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _glob(host: HostRoot, pattern: PurePosixPath) -> list[PurePosixPath]:
    """An import's files: a pattern in the last component (``conf.d/*.toml``), sorted as
    containerd's filepath.Glob returns them; a plain path that does not exist is skipped."""
    import fnmatch

    if not any(c in pattern.name for c in "*?["):
        return [pattern] if host.exists(pattern) else []
    names = host.listdir(pattern.parent)
    return [pattern.parent / n for n in names if fnmatch.fnmatchcase(n, pattern.name)]


def _containerd(host: HostRoot, installed: Installed | None) -> Runtime | None:
    socket = host.is_socket(CONTAINERD_SOCKET)
    config: dict[str, Any] = {"plugins": {}}
    files: list[str] = []
    try:
        if not host.exists(CONTAINERD_CONFIG):  # (a link chain past the limit raises here)
            # No file: containerd runs on its built-in defaults (version 2 in 1.x, 3 in 2.x).
            return Runtime("containerd", socket, {}, ()) if socket else None
        # An installed 2.x merges like 2.x whatever the config's version.
        two = installed is not None and (installed.major_minor or (0, 0)) >= (2, 0)
        _merge_containerd(host, CONTAINERD_CONFIG, config, files, set(),
                          deep=True if two else None)
    except (HostFileError, FileNotFoundError) as err:
        return Runtime("containerd", socket, {}, tuple(files), str(err) or "file vanished")
    return Runtime("containerd", socket, config, tuple(files))


def _crio(host: HostRoot) -> Runtime | None:
    socket = host.is_socket(CRIO_SOCKET)
    config: dict[str, Any] = {}
    files: list[str] = []
    try:
        if not host.is_dir(CRIO_DIR):  # (a link chain past the limit raises here)
            return Runtime("CRI-O", socket, {}, ()) if socket else None
        drop_ins = [f"{CRIO_DIR}/crio.conf.d/{n}"
                    for n in host.listdir(f"{CRIO_DIR}/crio.conf.d")]
        for path in [f"{CRIO_DIR}/crio.conf", *drop_ins]:
            if not host.exists(path):
                continue
            doc = host.read_toml(path)
            files.append(path)
            # CRI-O merges drop-ins key by key: a later file overrides single options.
            for key, value in table(doc, "crio", "runtime").items():
                config.setdefault("crio", {}).setdefault("runtime", {})[key] = value
    except HostFileError as err:
        return Runtime("CRI-O", socket, {}, tuple(files), str(err))
    return Runtime("CRI-O", socket, config, tuple(files))


def detect(ctx: Context) -> list[Runtime]:
    """The runtimes found, the one with a socket (the one running) first."""
    installed = containerd_installed(ctx.host, ctx.packages())
    found = [r for r in (_containerd(ctx.host, installed), _crio(ctx.host)) if r is not None]
    return sorted(found, key=lambda r: not r.socket)


def check_runtime(ctx: Context) -> Check:
    found = detect(ctx)
    if not found:
        return warn(NAME, f"neither containerd ({CONTAINERD_CONFIG}, {CONTAINERD_SOCKET}) nor "
                    f"CRI-O ({CRIO_DIR}, {CRIO_SOCKET}) found under {ctx.host.root}",
                    "mount the host's / at --host-root (read-only); only containerd and CRI-O "
                    "inject CDI devices")
    rt = found[0]
    files = ", ".join(rt.files) or "no config file: built-in defaults"
    installed = _installed(ctx, rt)
    if rt.error:
        return warn(NAME, f"{rt.describe(installed)}: {rt.error}",
                    "fix the file: the runtime refuses to start with it, or runs without it")
    where = CONTAINERD_SOCKET if rt.kind == "containerd" else CRIO_SOCKET
    if not rt.socket:
        return warn(NAME, f"{rt.describe(installed)} ({files}); no socket at {where}",
                    f"start {rt.kind} (systemctl start {rt.kind.lower()})")
    return ok(NAME, f"{rt.describe(installed)}, socket {where} ({files})")


def _installed(ctx: Context, rt: Runtime) -> Installed | None:
    if rt.kind == "CRI-O":
        return from_dpkg(ctx.packages(), "cri-o")
    return containerd_installed(ctx.host, ctx.packages())


def check_cdi_enabled(ctx: Context) -> Check:
    found = detect(ctx)
    if not found or found[0].error:
        return skipped(CDI, "no readable container runtime configuration (see container runtime)")
    rt = found[0]
    if rt.kind == "CRI-O":
        return _crio_cdi(ctx)
    installed = _installed(ctx, rt)
    two = installed is not None and (installed.major_minor or (0, 0)) >= (2, 0)
    if not rt.files:
        if two:
            return ok(CDI, f"{rt.describe(installed)} without a config file: CDI on by default")
        return warn(CDI, f"{rt.describe(installed)} without a config file: CDI is off in 1.7's "
                    "defaults, on in 2.x's",
                    f"write {CONTAINERD_CONFIG} with version = 2 and enable_cdi = true under "
                    f'[plugins."{CRI_PLUGIN[2]}"], or upgrade to containerd 2.x')
    version = rt.config_version
    plugin = CRI_PLUGIN[version]
    value = rt.cri_table().get("enable_cdi")
    fix = (f'set enable_cdi = true under [plugins."{plugin}"] in {CONTAINERD_CONFIG} (or the '
           "import that replaces that section) and restart containerd")
    what = rt.describe(installed)
    if value is True:
        return ok(CDI, f'{what}: enable_cdi = true in [plugins."{plugin}"]')
    if value is not None and value is not False:
        return fail(CDI, f"{what}: enable_cdi = {value!r} is not a boolean", fix)
    if value is False:
        return fail(CDI, f'{what}: enable_cdi = false in [plugins."{plugin}"]', fix)
    if version == 3 or two:
        # containerd 2.x reads (migrates) a version-2 config too, and turns CDI on by default.
        return ok(CDI, f"{what}: enable_cdi not set, on by default in containerd 2.x")
    return fail(CDI, f'{what}: enable_cdi not set in [plugins."{plugin}"]; '
                "containerd 1.7 defaults it to false", fix)


#: The first CRI-O that reads CDI specs.
CRIO_CDI = (1, 23)


def _crio_cdi(ctx: Context) -> Check:
    installed: Installed | None = from_dpkg(ctx.packages(), "cri-o")
    if installed is None:
        return ok(CDI, "CRI-O (version not recorded in a package database): CDI always on "
                  "since 1.23")
    version = installed.major_minor
    if version is not None and version < CRIO_CDI:
        return fail(CDI, f"CRI-O {installed.version} ({installed.source}): CDI needs 1.23 or "
                    "later", "upgrade CRI-O (to the kubelet's minor version)")
    return ok(CDI, f"CRI-O {installed.version} ({installed.source}): CDI always on since 1.23")


def _same_dir(host: HostRoot, a: str, b: str) -> bool:
    # /var/run/cdi and /run/cdi are one directory where /var/run -> /run, as on most hosts.
    return PurePosixPath(a) == PurePosixPath(b) or host.path(a) == host.path(b)


def check_cdi_dirs(ctx: Context) -> Check:
    found = detect(ctx)
    if not found or found[0].error:
        return skipped(CDI_DIRS, "no readable container runtime configuration")
    rt = found[0]
    dirs = rt.cri_table().get("cdi_spec_dirs")
    source = "cdi_spec_dirs"
    if dirs is None:
        dirs, source = list(DEFAULT_CDI_DIRS), "default"
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        return fail(CDI_DIRS, f"{rt.kind}: cdi_spec_dirs = {dirs!r} is not a list of paths",
                    f'write cdi_spec_dirs = ["/etc/cdi", "{ctx.options.cdi_dir}"]')
    agent_dir = str(ctx.options.cdi_dir)
    listed = ", ".join(dirs) or "none"
    if any(_same_dir(ctx.host, d, agent_dir) for d in dirs):
        return ok(CDI_DIRS, f"{rt.kind} reads {listed} ({source}); the agent writes {agent_dir}")
    return fail(CDI_DIRS, f"{rt.kind} reads {listed} ({source}), not the agent's --cdi-dir "
                f"{agent_dir}",
                f"add {agent_dir} to cdi_spec_dirs, or run the agent with --cdi-dir "
                f"{dirs[0] if dirs else '/var/run/cdi'}")
