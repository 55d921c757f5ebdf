"""Install the netdev hook on the host: ``python -m agent.netdev.install DIR`` (the chart's
init container runs it, with DIR a host path mounted at the same path).

The runtime runs the hook on the host, where neither the agent's Python nor its libraries
need exist, so DIR gets a bundle of exactly what the hook loads, taken from the running
interpreter: every file this process maps once it has imported the hook (the dynamic loader,
libc, the interpreter's own libraries and extension modules, read from /proc/self/maps) and
the source of every module it imported, each under ``DIR/root`` at its own absolute path
(the interpreter finds its standard library beside itself, as it does at home). The hook is
started through the bundled loader (``ld.so --library-path ...``), so the host's libc never
matters, and in isolated mode (``-I``: no environment, no user site). The command line goes
into ``DIR/hook.json`` (``HookLaunch``), which the agent reads when it writes a spec; the
bundle is replaced whole (a new directory, then a rename), so a container starting during an
upgrade runs the old hook or the new one, never half of each.
"""

from __future__ import annotations

import compileall
import importlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "hook.json"
#: What the hook imports on any path it takes (ctypes and rdma only on some).
_MODULES = ("agent.netdev.hook", "agent.netdev.rdma", "agent.netdev.netns", "ctypes")


@dataclass(frozen=True, slots=True)
class HookLaunch:
    """How the runtime starts the hook: the CDI hook's path, args (argv[0] first), env."""

    path: str
    args: tuple[str, ...]
    env: tuple[str, ...] = ()


def read_launch(hook_dir: Path) -> HookLaunch | None:
    """The installed hook's command line; None when none is installed (or it is unreadable)."""
    try:
        raw = json.loads((hook_dir / MANIFEST).read_bytes()[:65536])
        launch = HookLaunch(path=str(raw["path"]), args=tuple(str(a) for a in raw["args"]),
                            env=tuple(str(e) for e in raw.get("env", ())))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return launch if os.path.isabs(launch.path) else None


def mapped_files() -> list[str]:
    """The regular files this process maps (shared objects, the interpreter)."""
    out: list[str] = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].strip()
                if path not in out and os.path.isfile(path):
                    out.append(path)
    return out


def module_files() -> list[str]:
    """The source files of every module imported so far."""
    out = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and os.path.isfile(path):
            out.append(os.path.realpath(path))
    return out


def _copy_links(real: str, target: Path) -> None:
    """The names the loader asks for (a library's SONAME, libz.so.1) beside the file they
    name (libz.so.1.2.13): the links next to it at home that resolve to it."""
    if ".so" not in os.path.basename(real):
        return
    home = os.path.dirname(real)
    for name in os.listdir(home):
        link = os.path.join(home, name)
        if (name != os.path.basename(real) and os.path.islink(link)
                and os.path.realpath(link) == real and not (target.parent / name).exists()):
            os.symlink(os.path.basename(real), target.parent / name)


def install(dest: Path) -> HookLaunch:
    for name in _MODULES:
        importlib.import_module(name)
    interpreter = os.path.realpath(sys.executable)
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    package = Path(__file__).resolve().parent  # .../agent/netdev
    staging = dest / f".root.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    files = [interpreter, *mapped_files(), *module_files()]
    loader = next((f for f in files if os.path.basename(f).startswith("ld-linux")), None)
    if loader is None:
        raise RuntimeError("no dynamic loader among this process's mappings")
    for path in files:
        real = os.path.realpath(path)
        if real.startswith(str(package.parent) + os.sep):  # ours: beside the stdlib
            target = staging / stdlib.lstrip("/") / os.path.relpath(real, package.parent.parent)
        else:
            target = staging / real.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(real, target)
        _copy_links(real, target)
    compileall.compile_dir(str(staging), quiet=1, optimize=0)
    root = dest / "root"
    old = dest / f".old.{os.getpid()}"
    if root.exists():
        os.replace(root, old)
    os.replace(staging, root)
    shutil.rmtree(old, ignore_errors=True)
    libdirs = sorted({str(root) + os.path.dirname(os.path.realpath(f)) for f in files
                      if ".so" in os.path.basename(f)})
    ld = f"{root}{os.path.realpath(loader)}"
    launch = HookLaunch(path=ld, args=(ld, "--library-path", ":".join(libdirs),
                                       f"{root}{interpreter}", "-I", "-m", "agent.netdev.hook"))
    tmp = dest / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"path": launch.path, "args": list(launch.args),
                               "env": list(launch.env)}))
    os.replace(tmp, dest / MANIFEST)
    return launch


def main() -> int:
    if len(sys.argv) != 2 or not os.path.isabs(sys.argv[1]):
        print("usage: python -m agent.netdev.install /absolute/host/dir", file=sys.stderr)
        return 2
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    launch = install(dest)
    print(f"netdev hook installed: {launch.path} ... -m agent.netdev.hook")
    return 0


if __name__ == "__main__":
    sys.exit(main())
