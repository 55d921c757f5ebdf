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
bundle is replaced whole (a new directory, then a rename), so no hook ever starts from a
half-copied one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "hook.json"
#: What the hook imports on any path it takes (ctypes and rdma only on some; runpy for -m).
_MODULES = ("runpy", "agent.netdev.hook", "agent.netdev.rdma", "agent.netdev.netns", "ctypes")


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


#: Run by a fresh interpreter after it imported the hook's modules: the regular files it
#: maps (shared objects, the interpreter) and the sources of the modules it holds.
_LIST = """
import json, os, sys
maps = []
with open("/proc/self/maps") as f:
    for line in f:
        parts = line.split(None, 5)
        path = parts[5].strip() if len(parts) == 6 else ""
        if path.startswith("/") and path not in maps and os.path.isfile(path):
            maps.append(path)
sources = sorted({os.path.realpath(m.__file__) for m in list(sys.modules.values())
                  if isinstance(getattr(m, "__file__", None), str)
                  and m.__file__.endswith(".py") and os.path.isfile(m.__file__)})
print(json.dumps([maps, sources]))
"""


def loaded() -> tuple[list[str], list[str]]:
    """(mapped files, module sources) of a fresh interpreter that imported what the hook
    does and nothing else: the installer's own imports (shutil, subprocess) stay out."""
    code = f"import {', '.join(_MODULES)}\n{_LIST}"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    maps, modules = json.loads(out)
    return list(maps), list(modules)


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
    maps, modules = loaded()
    interpreter = os.path.realpath(sys.executable)
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    package = Path(__file__).resolve().parent  # .../agent/netdev
    staging = dest / f".root.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    files = [interpreter, *maps, *modules]
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
    import compileall  # installing only: py_compile and filecmp stay out of the daemon's start

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
