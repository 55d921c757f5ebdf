"""Installed versions from a read-only host root: dpkg's database, containerd's own binary."""

from __future__ import annotations

import pytest

from agent.doctor import kubelet, runtime
from agent.doctor.model import Status
from agent.doctor.packages import Installed, containerd_installed, dpkg_versions
from tests.doctor.conftest import Tree, assert_check, context

CFG = "/etc/containerd/config.toml"
SOCK = "/run/containerd/containerd.sock"
V2_NO_CDI = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'


def _dpkg(tree: Tree, **versions: str) -> None:
    """Package names as keywords: _ stands for . in containerd_io, for - in cri_o."""
    names = {"containerd_io": "containerd.io", "cri_o": "cri-o"}
    stanzas = [f"Package: {names.get(name, name)}\nStatus: install ok installed\n"
               f"Version: {version}\n" for name, version in versions.items()]
    stanzas.append("Package: removed\nStatus: deinstall ok config-files\nVersion: 9.9\n")
    tree.write("/var/lib/dpkg/status", "\n".join(stanzas))


def test_dpkg_lists_installed_packages_only(tree: Tree) -> None:
    _dpkg(tree, containerd_io="1.7.27-1", kubelet="1.33.2-1.1")
    versions = dpkg_versions(context(tree).host)
    assert versions == {"containerd.io": "1.7.27-1", "kubelet": "1.33.2-1.1"}


@pytest.mark.parametrize(("version", "expected"), [
    ("1.7.27-1", (1, 7)), ("1:1.7.2-0ubuntu1", (1, 7)), ("2.x", (2, 0)), ("v1.35.0", (1, 35)),
    ("garbage", None),
])
def test_major_minor(version: str, expected: tuple[int, int] | None) -> None:
    assert Installed(version, "test").major_minor == expected


def test_a_version_2_config_on_containerd_2_has_cdi_on(tree: Tree) -> None:
    tree.write(CFG, V2_NO_CDI).socket(SOCK)
    _dpkg(tree, containerd_io="2.1.4-1")
    check = runtime.check_cdi_enabled(context(tree))
    assert_check(check, Status.OK, "containerd 2.1.4-1 (dpkg containerd.io), config version 2",
                 "on by default in containerd 2.x")
    _dpkg(tree, containerd_io="1.7.27-1")
    check = runtime.check_cdi_enabled(context(tree))
    assert_check(check, Status.FAIL, "containerd 1.7.27-1", "defaults it to false",
                 fix="enable_cdi = true")


def test_the_binary_says_which_major_version(tree: Tree) -> None:
    tree.write(CFG, V2_NO_CDI).socket(SOCK)
    blob = b"\x7fELF" + b"\0" * (3 << 20)
    # The module path straddles a read chunk boundary: still found.
    tree.write("/usr/bin/containerd", blob[: (1 << 20) - 10] + b"github.com/containerd/"
               b"containerd/v2/core/runtime" + blob)
    found = containerd_installed(context(tree).host, {})
    assert found == Installed("2.x", "the binary /usr/bin/containerd")
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.OK, "containerd 2.x (the "
                 "binary /usr/bin/containerd), config version 2", "on by default")
    tree.write("/usr/bin/containerd", blob + b"github.com/containerd/containerd/pkg/cri")
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.FAIL, "containerd 1.x (the "
                 "binary", fix="enable_cdi = true")


def test_a_binary_that_is_a_fifo_or_a_link_is_not_read(tree: Tree) -> None:
    tree.fifo("/usr/bin/containerd")
    tree.write("/usr/local/bin/real", b"github.com/containerd/containerd/v2/x")
    tree.symlink("/usr/local/bin/containerd", "real")  # resolved inside the root: read
    assert containerd_installed(context(tree).host, {}) == Installed(
        "2.x", "the binary /usr/local/bin/containerd")


def test_containerd_2_without_a_config_file(tree: Tree) -> None:
    tree.socket(SOCK)
    _dpkg(tree, containerd="2.0.5~ds1-1")
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.OK, "CDI on by default")
    assert_check(runtime.check_runtime(context(tree)), Status.OK,
                 "containerd 2.0.5~ds1-1 (dpkg containerd)", "built-in defaults")


def test_old_crio_has_no_cdi(tree: Tree) -> None:
    tree.write("/etc/crio/crio.conf", "[crio.runtime]\n").socket("/var/run/crio/crio.sock")
    _dpkg(tree, cri_o="1.22.5~0")
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.FAIL, "CRI-O 1.22.5~0",
                 fix="upgrade CRI-O")
    _dpkg(tree, cri_o="1.33.1-1.1")
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.OK, "CRI-O 1.33.1-1.1")


def test_kubelet_version_from_dpkg_without_an_api(tree: Tree) -> None:
    _dpkg(tree, kubelet="1.33.2-1.1")
    assert_check(kubelet.check_version(context(tree)), Status.FAIL,
                 "kubelet 1.33.2 (dpkg kubelet): DRA is beta", fix="DynamicResourceAllocation")
    _dpkg(tree, kubelet="1.34.1-1.1")
    assert_check(kubelet.check_version(context(tree)), Status.OK, "kubelet 1.34.1 (dpkg kubelet)")


def test_a_planted_dpkg_database_is_ignored(tree: Tree) -> None:
    tree.fifo("/var/lib/dpkg/status")
    assert dpkg_versions(context(tree).host) == {}
    assert_check(kubelet.check_version(context(tree)), Status.SKIPPED, "package database")
