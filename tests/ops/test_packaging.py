"""What the README's plain install (``pip install .``) gives: a wheel whose ``dra-agent explain``
works with no extra and no repository checkout, and CI that installs what the tests call."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from agent.cli import main
from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_packaged_deviceclasses_are_the_deployed_ones() -> None:
    # One source of truth: deploy/base is what a cluster gets; the package carries a copy.
    packaged = REPO / "agent" / "deviceclasses.yaml"
    assert packaged.read_bytes() == (REPO / "deploy" / "base" / "deviceclasses.yaml").read_bytes()


def test_setuptools_reads_the_spdx_license_string() -> None:
    assert isinstance(PYPROJECT["project"]["license"], str)
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    m = re.fullmatch(r"setuptools>=(\d+)", setuptools)
    assert m is not None and int(m[1]) >= 77, setuptools


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the tree (the build writes build/ and *.egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("agent", "discovery", "cdi", "protos"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(src)],
                   check=True, capture_output=True, timeout=240)
    (built,) = out.glob("dra_agent-*.whl")
    return built


def test_wheel_carries_the_classes_and_the_cel_engine(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(z.read(meta).decode())
        assert z.read("agent/deviceclasses.yaml") == (
            REPO / "deploy" / "base" / "deviceclasses.yaml").read_bytes()
    requires = metadata.get_all("Requires-Dist") or []
    plain = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("common-expression-language") for r in plain), requires
    assert metadata["License-Expression"] == "Apache-2.0"


def _gpu_claim(tmp_path: Path, count: int) -> str:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {
            "deviceClassName": "gpu.dra-agent.io", "count": count}}]}},
    }))
    return str(path)


def test_explain_without_class_uses_the_packaged_classes(tmp_path: Path) -> None:
    argv = ["explain", "--simulate", "dgx-h100", "--node-name", "node-a", "-o", "json"]
    fits = CliRunner().invoke(main, [*argv, "-f", _gpu_claim(tmp_path, 8)])
    assert fits.exit_code == 0, fits.output
    assert '"fits": true' in fits.stdout
    # Nine GPUs on an eight-GPU node: the class matched, the count did not.
    too_many = CliRunner().invoke(main, [*argv, "-f", _gpu_claim(tmp_path, 9)])
    assert too_many.exit_code == 1, too_many.output


#: Programs the tests run (tests/** and hack/** they start) -> the Debian package holding it.
CALLED = {"openssl": "openssl", "curl": "curl", "unshare": "util-linux", "ldconfig": "libc-bin",
          "systemd-analyze": "systemd", "bash": "bash"}


def test_ci_installs_every_program_the_tests_call() -> None:
    script = (REPO / ".ci" / "run").read_text()
    m = re.search(r"^PKGS=\(([^)]*)\)", script, re.M)
    assert m is not None
    pkgs = set(m[1].split())
    assert {"python3-venv", *CALLED.values()} <= pkgs, sorted(set(CALLED.values()) - pkgs)
