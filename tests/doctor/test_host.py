"""``HostRoot.path``: symlinks resolved inside the host root, and past the kernel's 40 links an
error, never a path that still holds a link (which the kernel would follow out of the root)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agent.cli import main
from agent.doctor import runtime
from agent.doctor.context import Options
from agent.doctor.host import HostFileError
from agent.doctor.model import Status
from agent.doctor.runner import run_one
from agent.doctor.simulate import healthy_host_root
from tests.doctor.conftest import Tree, assert_check, context

CFG = "/etc/containerd/config.toml"
V2_CDI_ON = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n'


def _chain(tree: Tree, start: str, links: int, target: str, under: str = "/chain") -> None:
    """``start`` and then ``/chain/l1``... : ``links`` symlinks in all, the last to ``target``."""
    names = [start, *(f"{under}/l{i}" for i in range(1, links))]
    for name, following in zip(names, [*names[1:], target], strict=True):
        tree.symlink(name, following)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the host root, which nothing read through the root may reach."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "config.toml").write_text(V2_CDI_ON)
    return out


def test_41_links_out_of_the_host_root_are_an_error(tree: Tree, outside: Path) -> None:
    _chain(tree, "/etc/containerd", 41, str(outside))
    host = context(tree).host
    with pytest.raises(HostFileError) as err:
        host.path(CFG)
    assert str(err.value) == (f"{CFG}: more than 40 symbolic links to follow "
                              "(the kernel refuses as many)")
    with pytest.raises(HostFileError):
        host.read_text(CFG)  # never the file beside the root


def test_40_links_resolve_inside_the_host_root(tree: Tree, outside: Path) -> None:
    _chain(tree, "/etc/containerd", 40, str(outside))
    host = context(tree).host
    inside = tree.root / str(outside).lstrip("/") / "config.toml"
    assert host.path(CFG) == inside  # the absolute target starts again at the host root
    assert not os.path.lexists(inside)
    with pytest.raises(FileNotFoundError):
        host.read_text(CFG)


def test_no_path_returned_holds_a_link(tree: Tree, outside: Path) -> None:
    for links in (1, 2, 39, 40, 41, 80):
        _chain(tree, f"/n{links}", links, str(outside), under=f"/chain{links}")
        try:
            local = context(tree).host.path(f"/n{links}/config.toml")
        except HostFileError:
            assert links > 40
            continue
        assert links <= 40
        here = tree.root
        for part in local.relative_to(tree.root).parts:
            here = here / part
            assert not here.is_symlink(), (links, here)


def test_a_loop_past_the_limit_is_one_line_for_its_check(tree: Tree) -> None:
    tree.symlink("/etc/containerd", "/etc/a").symlink("/etc/a", "/etc/containerd")
    tree.socket("/run/containerd/containerd.sock")
    check = run_one(context(tree), runtime.NAME, runtime.check_runtime)
    assert_check(check, Status.WARN, f"{CFG}: more than 40 symbolic links", fix="fix the file")
    assert "bug in dra-agent doctor" not in check.fix


def test_a_check_never_reads_a_config_past_the_limit(tree: Tree, outside: Path) -> None:
    _chain(tree, "/etc/containerd", 41, str(outside))
    tree.socket("/run/containerd/containerd.sock")
    for name, func in ((runtime.NAME, runtime.check_runtime),
                       (runtime.CDI, runtime.check_cdi_enabled),
                       (runtime.CDI_DIRS, runtime.check_cdi_dirs)):
        check = run_one(context(tree), name, func)
        assert "enable_cdi = true" not in check.found, check  # the file outside, unread
        assert check.status is not Status.OK, check


def _doctor(root: Path) -> Result:
    return CliRunner().invoke(main, ["doctor", "--host-root", str(root), "--kubeconfig", "none",
                                     "--metrics-address", "none", "-o", "json"])


def test_doctor_reports_a_chain_past_the_limit_in_one_line(tree: Tree, outside: Path) -> None:
    _chain(tree, "/etc/containerd", 41, str(outside))
    result = _doctor(tree.root)
    assert result.exit_code in (0, 1), result.output
    assert "Traceback" not in result.output
    found = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    runtime_check = found["container runtime"]
    assert runtime_check["status"] == "warn"
    assert f"{CFG}: more than 40 symbolic links" in runtime_check["found"]
    assert "enable_cdi = true" not in found["runtime CDI"]["found"]


def test_a_sys_past_the_limit_is_bad_input(tree: Tree) -> None:
    # Followed by the kernel, the last link would be this machine's own /sys.
    _chain(tree, "/sys", 41, "/sys")
    result = _doctor(tree.root)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: --host-root: /sys: more than 40 symbolic links to "
                                    "follow (the kernel refuses as many)")
    assert result.stderr.count("\n") == 1
    assert result.stdout == ""


#: Where a chain makes no line of its own, by design: the package database and the binaries
#: are hints (a version), read as absent when they cannot be read.
_QUIET = ("/var/lib/dpkg", "/usr/bin")


@pytest.mark.parametrize("start", [
    "/etc/containerd", "/run/containerd", "/var/run", "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/plugins_registry",
    "/var/lib/kubelet/plugins", "/etc/nvidia-container-runtime", "/sys/module", "/sys",
    "/proc", "/dev", *_QUIET])
def test_every_place_doctor_reads_past_the_limit_is_one_line(tmp_path: Path, outside: Path,
                                                              start: str) -> None:
    """A healthy node with one of the doctor's places turned into a chain past the limit: no
    check reads through it (the files beside the root hold a config and a package database
    that would show), none crashes, and the report names the place."""
    (outside / "status").write_text("Package: containerd.io\nStatus: install ok installed\n"
                                    "Version: 9.9.9\n")
    tree = Tree(tmp_path / "node")
    healthy_host_root("dgx-h100", tree.root, Options())
    local = tree.root / start.lstrip("/")
    if local.is_dir() and not local.is_symlink():
        shutil.rmtree(local)
    else:
        local.unlink(missing_ok=True)
    _chain(tree, start, 41, str(outside))
    result = _doctor(tree.root)
    assert "Traceback" not in result.output and "bug in dra-agent doctor" not in result.output
    if start in ("/sys", "/proc", "/dev"):
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"error: --host-root: {start}: more than 40")
        return
    assert result.exit_code in (0, 1), result.output
    assert "enable_cdi = true" not in result.stdout or start != "/etc/containerd"
    assert "9.9.9" not in result.stdout
    if start not in _QUIET:
        lines = [c["found"] for c in json.loads(result.stdout)["checks"]
                 if "more than 40 symbolic links" in c["found"]]
        assert lines and all(start in line for line in lines), result.stdout
