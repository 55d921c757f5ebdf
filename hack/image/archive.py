"""A directory tree packed as a docker-archive tarball: what `ctr images import` and
`docker load` read, written by tarfile and hashlib alone.

The archive holds one layer (``<diff-id>/layer.tar``, an uncompressed tar of the tree), the image
config (``<config digest>.json``) and ``manifest.json`` naming both with the image's RepoTags.
The layer keeps symlinks, hardlinks, modes and numeric owners; it leaves out device nodes and
sockets, and the contents of /dev, /proc and /sys (the runtime mounts those), keeping the
directories. Entries are sorted, names and header fields fixed, so a tree packs to the same bytes
whenever its files' contents and times are the same.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# Directories whose contents a container runtime provides (mounts); a root file system made by
# mmdebstrap has device nodes in /dev that an image must not carry.
RUNTIME_DIRS = ("dev", "proc", "sys")
# The config's creation time: fixed, so the config digest depends on the image alone.
CREATED = "1970-01-01T00:00:00Z"
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le",
           "s390x": "s390x", "riscv64": "riscv64"}


def host_architecture() -> str:
    """The host's architecture as image configs name it (Go's GOARCH); mmdebstrap builds it."""
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


@dataclass(frozen=True)
class ImageConfig:
    """What the image config says about running the image."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    user: str = ""
    working_dir: str = "/"
    architecture: str = ""

    def document(self, diff_id: str) -> dict[str, object]:
        config: dict[str, object] = {
            "Entrypoint": list(self.entrypoint),
            "Env": [f"{k}={v}" for k, v in self.env],
            "WorkingDir": self.working_dir,
        }
        if self.cmd:
            config["Cmd"] = list(self.cmd)
        if self.labels:
            config["Labels"] = dict(self.labels)
        if self.user:
            config["User"] = self.user
        return {
            "architecture": self.architecture or host_architecture(),
            "os": "linux",
            "created": CREATED,
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": CREATED, "created_by": "python -m hack.image build"}],
        }


@dataclass(frozen=True)
class PackedImage:
    path: Path
    tags: tuple[str, ...]
    # sha256:<hex> of the uncompressed layer tar: the config's diff_id.
    diff_id: str
    # sha256:<hex> of the config JSON: the image id.
    config_digest: str
    size: int


def _walk(root: Path, rel: str = "") -> Iterator[tuple[str, Path]]:
    """(archive name, path) for every entry below root, sorted, without following symlinks."""
    here = root / rel if rel else root
    with os.scandir(here) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        name = f"{rel}/{entry.name}" if rel else entry.name
        yield name, Path(entry.path)
        if entry.is_dir(follow_symlinks=False) and name not in RUNTIME_DIRS:
            yield from _walk(root, name)


def write_layer(
    root: Path, out: IO[bytes], *, mtime: int | None = None, owner: tuple[int, int] | None = None,
) -> None:
    """The tree below ``root`` as a tar on ``out``.

    ``mtime`` None keeps each file's time (whole seconds): a venv's bytecode records its source's
    time and Python recompiles, in memory on every start under a read-only root, when the two
    differ. ``owner`` replaces every entry's uid:gid (a tree made by a non-root builder that is
    root's in the image).
    """
    # PAX, as Docker writes layers: long names and large files need no GNU extensions.
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in _walk(root):
            info = tar.gettarinfo(str(path), arcname=name)
            if info is None or info.ischr() or info.isblk():
                continue  # sockets, device nodes
            info.mtime = int(info.mtime) if mtime is None else mtime
            # Names of the builder's users mean nothing in the image; the runtime uses ids.
            info.uname = info.gname = ""
            if owner is not None:
                info.uid, info.gid = owner
            if info.isreg():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def pack(
    root: Path,
    dest: Path,
    tags: tuple[str, ...],
    config: ImageConfig,
    *,
    mtime: int | None = None,
    owner: tuple[int, int] | None = None,
) -> PackedImage:
    """Pack ``root`` as a one-layer docker-archive at ``dest`` (written aside, then renamed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pack-") as tmp:
        layer = Path(tmp) / "layer.tar"
        with layer.open("wb") as out:
            write_layer(root, out, mtime=mtime, owner=owner)
        diff_id = _sha256(layer)
        document = json.dumps(config.document(diff_id), sort_keys=True, separators=(",", ":"))
        config_bytes = document.encode()
        config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        layer_hex = diff_id.removeprefix("sha256:")
        layer_name = f"{layer_hex}/layer.tar"
        config_name = f"{config_digest.removeprefix('sha256:')}.json"
        manifest = [{"Config": config_name, "RepoTags": list(tags), "Layers": [layer_name]}]
        partial = Path(tmp) / "image.tar"
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            layer_dir = tarfile.TarInfo(layer_hex)
            layer_dir.type, layer_dir.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(layer_dir)
            info = tarfile.TarInfo(layer_name)
            info.size, info.mode = layer.stat().st_size, 0o644
            with layer.open("rb") as fh:
                tar.addfile(info, fh)
            _add_bytes(tar, config_name, config_bytes)
            _add_bytes(tar, "manifest.json", json.dumps(manifest, separators=(",", ":")).encode())
        os.replace(partial, dest)
    return PackedImage(dest, tags, diff_id, config_digest, dest.stat().st_size)

