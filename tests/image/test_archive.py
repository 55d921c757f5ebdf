"""The packer: a tree becomes a docker-archive whose digests, tags and layer entries are right."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

from hack.image.archive import ImageConfig, host_architecture, pack
from tests.image.conftest import read_archive

CONFIG = ImageConfig(
    entrypoint=("/bin/tool",), cmd=("run",), env=(("PATH", "/bin"), ("A", "b c")),
    labels=(("org.opencontainers.image.title", "t"),), user="0:0",
)


def _tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    tool = root / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    data = root / "etc" / "data"
    data.parent.mkdir()
    data.write_text("x" * 5000)
    data.chmod(0o640)
    os.link(data, root / "etc" / "data-link")
    (root / "bin" / "alias").symlink_to("tool")
    (root / "etc" / "absolute").symlink_to("/nonexistent/target")
    (root / "empty").mkdir()
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    for runtime in ("dev", "proc"):
        (root / runtime).mkdir()
        (root / runtime / "leftover").write_text("not for the image")
    return root


def test_manifest_config_and_layer_digests(tmp_path: Path) -> None:
    packed = pack(_tree(tmp_path / "root"), tmp_path / "image.tar", ("t:1", "t:latest"), CONFIG,
                  mtime=0)
    archive = read_archive(packed.path)
    layer_hex = packed.diff_id.removeprefix("sha256:")
    assert set(archive.names) == {
        "manifest.json", archive.config_name, layer_hex, f"{layer_hex}/layer.tar",
    }
    assert archive.manifest == [
        {"Config": archive.config_name, "RepoTags": ["t:1", "t:latest"],
         "Layers": [f"{layer_hex}/layer.tar"]},
    ]
    assert archive.layer_name == f"{layer_hex}/layer.tar"
    assert "sha256:" + hashlib.sha256(archive.layer_bytes).hexdigest() == packed.diff_id
    config_hex = hashlib.sha256(archive.config_bytes).hexdigest()
    assert archive.config_name == f"{config_hex}.json"
    assert packed.config_digest == f"sha256:{config_hex}"
    assert archive.config["rootfs"] == {"type": "layers", "diff_ids": [packed.diff_id]}
    assert archive.config["os"] == "linux"
    assert archive.config["architecture"] == host_architecture()
    assert archive.config["config"] == {
        "Entrypoint": ["/bin/tool"], "Cmd": ["run"], "Env": ["PATH=/bin", "A=b c"],
        "Labels": {"org.opencontainers.image.title": "t"}, "User": "0:0", "WorkingDir": "/",
    }
    assert packed.size == packed.path.stat().st_size


def test_layer_keeps_links_modes_and_owners(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    packed = pack(root, tmp_path / "image.tar", ("t:1",), CONFIG, mtime=0)
    members = read_archive(packed.path).members
    assert members["bin/alias"].issym() and members["bin/alias"].linkname == "tool"
    assert members["etc/absolute"].issym()
    assert members["etc/absolute"].linkname == "/nonexistent/target"
    # The first of the two names in the walk holds the bytes; the other links to it.
    assert members["etc/data"].isreg() and members["etc/data"].size == 5000
    assert members["etc/data-link"].islnk() and members["etc/data-link"].linkname == "etc/data"
    assert members["bin/tool"].mode == 0o755
    assert members["etc/data"].mode == 0o640
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert members["empty"].isdir()
    stat = (root / "etc" / "data").stat()
    for member in members.values():
        assert (member.uid, member.gid) == (stat.st_uid, stat.st_gid)
        assert member.uname == member.gname == ""
        assert member.mtime == 0
        assert not member.name.startswith(("/", "./"))
    # The runtime's directories stay, their contents do not.
    assert members["dev"].isdir() and members["proc"].isdir()
    assert "dev/leftover" not in members and "proc/leftover" not in members


def test_owner_override_and_kept_times(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    os.utime(root / "bin" / "tool", (1_700_000_000.75, 1_700_000_000.75))
    packed = pack(root, tmp_path / "image.tar", ("t:1",), CONFIG, owner=(0, 0))
    archive = read_archive(packed.path)
    # Whole seconds, as the bytecode a venv compiled records its source's time.
    assert archive.members["bin/tool"].mtime == 1_700_000_000
    assert all((m.uid, m.gid) == (0, 0) for m in archive.members.values())
    # No pax header for a fractional time (the layer would differ with the file system's
    # time resolution).
    with tarfile.open(fileobj=io.BytesIO(archive.layer_bytes)) as layer:
        assert all("mtime" not in m.pax_headers for m in layer.getmembers())


def test_same_tree_packs_to_the_same_bytes(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    first = pack(root, tmp_path / "a.tar", ("t:1",), CONFIG, mtime=0)
    second = pack(root, tmp_path / "b.tar", ("t:1",), CONFIG, mtime=0)
    assert first.path.read_bytes() == second.path.read_bytes()
    assert read_archive(first.path).read("bin/tool") == b"#!/bin/sh\necho tool\n"


def test_pack_replaces_and_leaves_no_partial_file(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    dest = tmp_path / "out" / "image.tar"
    pack(root, dest, ("t:1",), CONFIG, mtime=0)
    (root / "bin" / "new").write_text("new")
    pack(root, dest, ("t:1",), CONFIG, mtime=0)
    assert "bin/new" in read_archive(dest).members
    assert sorted(p.name for p in dest.parent.iterdir()) == ["image.tar"]
