"""The busybox images' root file systems: Debian's static busybox and links to its applets."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Collection
from pathlib import Path

from hack.image.errors import BuildError
from hack.image.recipe import Busybox, BusyboxImage


def applets_of(busybox: Path) -> set[str]:
    """The applets the binary was built with (a static binary: it runs on the host)."""
    try:
        out = subprocess.run(
            [str(busybox), "--list"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"busybox: cannot list the applets of {busybox}: {exc}") from exc
    return set(out.stdout.split())


def linked_applets(image: BusyboxImage, available: Collection[str]) -> tuple[str, ...]:
    """The applets ``image`` links: all it requires and those optional ones the binary has."""
    missing = [a for a in image.applets if a not in available]
    if missing:
        raise BuildError(f"{image.name}: busybox has no {', '.join(missing)}")
    return image.applets + tuple(a for a in image.optional_applets if a in available)


def make_tree(
    busybox: Path, dest: Path, recipe: Busybox, image: BusyboxImage, available: Collection[str],
) -> tuple[str, ...]:
    """Lay out ``image``'s root file system at ``dest`` (made here); returns the applets linked.

    The packer gives every entry uid:gid 0:0, so a non-root builder makes the same image.
    """
    applets = linked_applets(image, available)
    for name, mode in (("bin", 0o755), ("etc", 0o755), ("root", 0o700), ("tmp", 0o1777),
                       *((d, 0o755) for d in ("dev", "proc", "sys"))):
        (dest / name).mkdir(parents=True)
        (dest / name).chmod(mode)  # mkdir's mode is masked by the umask; chmod's is not
    binary = dest / "bin" / "busybox"
    shutil.copyfile(busybox, binary)
    binary.chmod(0o755)
    for applet in applets:
        # Relative, so the link means the same inside the image as in the tree.
        (dest / "bin" / applet).symlink_to("busybox")
    for name, text in (("passwd", recipe.passwd), ("group", recipe.group)):
        (dest / "etc" / name).write_text(text)
        (dest / "etc" / name).chmod(0o644)
    return applets
