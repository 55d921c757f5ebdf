"""Fixtures shared by every test package."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same cases on every run, as the mutation fuzzer does with its seed 0:
# CI answers for the change under test, not for a new draw. A failure found by exploring
# (`pytest --hypothesis-profile=explore tests/fuzz`, fresh draws each run) becomes an explicit
# regression case next to the parser it broke.
settings.register_profile("derandomized", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile("derandomized")

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
