"""Fixtures shared by every test package."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CDI_CHECK = REPO / "hack" / "cdi-check.sh"


@pytest.fixture(scope="session")
def cdi_check_bin() -> Path:
    """The built CDI checker (the reference CDI library); built once per machine."""
    out = subprocess.run(
        [str(CDI_CHECK), "setup"], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, f"cdi-check setup failed:\n{out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])
