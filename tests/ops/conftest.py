"""The real helm for the chart's tests (tests/ops/test_helm*.py), built by
hack/realk8s/build.sh from its Go module, or found current."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

BUILD = REPO / "hack" / "realk8s" / "build.sh"
HELM = REPO / "hack" / "realk8s" / "bin" / "helm"


def _go() -> str | None:
    return shutil.which("go") or next(
        (str(p) for p in (Path("/usr/local/go/bin/go"),) if p.is_file()), None)


@pytest.fixture(scope="session")
def helm() -> Path:
    """bin/helm, built (or found current) by build.sh."""
    go = _go()
    if go is None:
        if HELM.is_file():
            return HELM
        pytest.skip("bin/helm is not built and there is no Go (>= 1.26) to build it with: "
                    "run hack/realk8s/build.sh helm")
    env = {**os.environ, "PATH": f"{Path(go).parent}:{os.environ.get('PATH', '')}"}
    # One build at a time: each pytest-xdist worker asks for helm in its own session, and
    # build.sh would build it cold in every one of them at once; the next one finds it current.
    HELM.parent.mkdir(parents=True, exist_ok=True)
    with (HELM.parent / ".helm-test.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run([str(BUILD), "helm"], capture_output=True, text=True,
                             timeout=1700, check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(HELM)
    return HELM
