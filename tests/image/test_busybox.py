"""The workload and pause images: Debian's static busybox and the recipe's applets."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from hack.image.build import Builder
from hack.image.busybox import applets_of, linked_applets
from hack.image.errors import BuildError
from hack.image.keys import busybox_key
from hack.image.recipe import PAUSE_IMAGE, RECIPE, WORKLOAD_IMAGE
from tests.image.conftest import FakeTools, fake_busybox, read_archive

HOST_BUSYBOX = Path("/bin/busybox")


@pytest.fixture
def busybox(tmp_path: Path) -> Path:
    """The host's static busybox where it has one (Debian's busybox-static), else a stand-in
    that knows the recipe's applets."""
    if HOST_BUSYBOX.is_file():
        return HOST_BUSYBOX
    applets = (*RECIPE.workload.applets, *RECIPE.workload.optional_applets)
    return fake_busybox(tmp_path / "fake" / "busybox", applets)


def _builder(tmp_path: Path, busybox: Path) -> Builder:
    cache = tmp_path / "cache"
    cache.mkdir(parents=True)
    # The cached binary, as a build that fetched it leaves it: nothing here downloads.
    (cache / f"busybox-{busybox_key(RECIPE)}").write_bytes(busybox.read_bytes())
    (cache / f"busybox-{busybox_key(RECIPE)}").chmod(0o755)
    return Builder(tmp_path / "out", cache=cache, runner=FakeTools(RECIPE))


def test_workload_image_holds_busybox_and_its_applets(tmp_path: Path, busybox: Path) -> None:
    built = _builder(tmp_path, busybox).build_busybox(RECIPE.workload)
    archive = read_archive(built.path)
    assert archive.manifest[0]["RepoTags"] == [WORKLOAD_IMAGE]
    members = archive.members
    binary = members["bin/busybox"]
    assert binary.isreg() and binary.mode == 0o755 and binary.size == busybox.stat().st_size
    available = applets_of(busybox)
    expected = set(RECIPE.workload.applets) | (set(RECIPE.workload.optional_applets) & available)
    links = {n.removeprefix("bin/") for n, m in members.items() if m.issym()}
    assert links == expected
    assert all(members[f"bin/{a}"].linkname == "busybox" for a in expected)
    assert ("ip" in links) == ("ip" in available)
    assert archive.read("etc/passwd").startswith(b"root:x:0:0:root:/root:/bin/sh\n")
    assert archive.read("etc/group").startswith(b"root:x:0:\n")
    assert members["tmp"].mode == 0o1777 and members["root"].mode == 0o700
    assert {"dev", "proc", "sys"} <= set(members)
    assert all((m.uid, m.gid, m.mtime) == (0, 0, 0) for m in members.values())
    config = archive.config["config"]
    assert isinstance(config, dict)
    assert config["Entrypoint"] == ["/bin/sh"] and "Cmd" not in config
    assert config["Env"] == [f"PATH={dict(RECIPE.workload.env)['PATH']}"]


def test_pause_image_is_a_shell_that_sleeps(tmp_path: Path, busybox: Path) -> None:
    built = _builder(tmp_path, busybox).build_busybox(RECIPE.pause)
    archive = read_archive(built.path)
    assert archive.manifest[0]["RepoTags"] == [PAUSE_IMAGE]
    links = {n.removeprefix("bin/") for n, m in archive.members.items() if m.issym()}
    assert links == {"sh", "sleep"}
    config = archive.config["config"]
    assert isinstance(config, dict)
    assert config["Entrypoint"] == list(RECIPE.pause.entrypoint)


def test_the_pause_process_exits_0_on_term() -> None:
    # The image's own shell where the host has it; the script is POSIX, so /bin/sh otherwise.
    shell = [str(HOST_BUSYBOX), "sh"] if HOST_BUSYBOX.is_file() else ["/bin/sh"]
    _sh, flag, script = RECIPE.pause.entrypoint
    proc = subprocess.Popen([*shell, flag, script])
    try:
        time.sleep(0.3)
        assert proc.poll() is None, "the pause process exited by itself"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_the_same_busybox_packs_to_the_same_bytes(tmp_path: Path, busybox: Path) -> None:
    first = _builder(tmp_path / "a", busybox).build_busybox(RECIPE.workload)
    second = _builder(tmp_path / "b", busybox).build_busybox(RECIPE.workload)
    assert first.path.read_bytes() == second.path.read_bytes()


def test_a_required_applet_missing_fails_the_build(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="busybox has no sleep"):
        linked_applets(RECIPE.pause, {"sh"})
    fake = fake_busybox(tmp_path / "fake" / "busybox", ("sh",))
    with pytest.raises(BuildError, match=f"{PAUSE_IMAGE}: busybox has no sleep"):
        _builder(tmp_path, fake).build_busybox(RECIPE.pause)
