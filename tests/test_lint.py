"""ruff and mypy are part of the test command: a lint or type error fails the suite."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, check=False
    )


def test_ruff_clean() -> None:
    out = _run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_clean() -> None:
    out = _run("mypy")
    assert out.returncode == 0, out.stdout + out.stderr
