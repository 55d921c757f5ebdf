"""The build cache's directory: where it is, its lock, and entries made whole or not at all.

Each entry is made under a ``.partial`` (or ``.tmp-``) name and renamed into place, so a reader
sees all of it or none; what a killed build left partial is removed under the lock. The
entries and their keys are described in build.py's docstring.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["copy_file", "default_cache", "install_dir", "locked", "prune", "remove", "tmp_dir"]

# Kept of each kind of cache entry: the current one and the one before (a branch switch back).
_KEEP = 2


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-agent" / "image"


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def install_dir(partial: Path, done: Path) -> None:
    """Move a finished entry into place (a rename: a reader sees all of it or none)."""
    remove(done)
    partial.rename(done)


def copy_file(src: Path, dest: Path) -> None:
    partial = dest.with_name(f".{dest.name}.partial")
    shutil.copyfile(src, partial)
    os.replace(partial, dest)



@contextmanager
def locked(cache: Path) -> Iterator[None]:
    """Hold the cache's lock: builds sharing the cache take turns."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        # Under the lock nothing else builds: what is partial is a killed build's.
        for leftover in cache.iterdir():
            if leftover.name.endswith(".partial") or leftover.name.startswith(".tmp-"):
                remove(leftover)
        yield


def prune(cache: Path, prefix: str) -> None:
    """Keep the ``_KEEP`` most recently used entries named ``prefix``*."""
    entries = [p for p in cache.iterdir() if p.name.startswith(prefix)]
    entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[_KEEP:]:
        remove(old)


def tmp_dir(cache: Path) -> tempfile.TemporaryDirectory[str]:
    """A scratch directory in the cache; one a killed build left is removed by the next."""
    return tempfile.TemporaryDirectory(dir=cache, prefix=".tmp-")
