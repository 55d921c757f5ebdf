"""Fixtures shared by every test package."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Property tests draw the same cases on every run, as the mutation fuzzer does with its seed 0:
# CI answers for the change under test, not for a new draw. A failure found by exploring
# (`pytest --hypothesis-profile=explore tests/fuzz`, fresh draws each run) becomes an explicit
# regression case next to the parser it broke.
# Hypothesis's too_slow check times input generation against the wall clock, so on a 2-CPU
# machine under load it fails a run whose every assertion holds (seen at load 16): off, as
# timing belongs in ``python -m hack.bench``, never in a test's verdict.
settings.register_profile("derandomized", derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile("derandomized")

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """pyproject.toml's addopts run the suite on pytest-xdist workers (--numprocesses,
    --dist). With the plugin off (``-p no:xdist``) those options would be unknown and every
    run an error: they are taken here instead and mean nothing; the run is serial, as with
    ``-n 0``."""
    if not pluginmanager.has_plugin("xdist"):
        group = parser.getgroup("xdist", "pytest-xdist (off: its options are ignored)")
        group.addoption("--numprocesses", dest="numprocesses", default=0)
        group.addoption("--dist", dest="dist", default="no")


# The fuzz tests' line in the terminal summary (tests/fuzz/report.py). Here, not in
# tests/fuzz/conftest.py: a pytest-xdist controller collects nothing and loads only this
# conftest, and the workers, where the fuzzing happens, hand it their counts.


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz.report import write_summary

    write_summary(terminalreporter)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.fuzz.report import REPORT

    worker_output = getattr(session.config, "workeroutput", None)  # on an xdist worker
    if worker_output is not None and REPORT.ran:
        worker_output["fuzz_report"] = REPORT.worker_output()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown to pytest without the plugin
def pytest_testnodedown(node: Any, error: Any) -> None:
    from tests.fuzz.report import REPORT

    fuzzed = getattr(node, "workeroutput", {}).get("fuzz_report")
    if fuzzed is not None:
        REPORT.add_worker(fuzzed)
CDI_CHECK = REPO / "hack" / "cdi-check.sh"


@pytest.fixture(scope="session")
def cdi_check_bin() -> Path:
    """The built CDI checker (the reference CDI library); built once per machine."""
    out = subprocess.run(
        [str(CDI_CHECK), "setup"], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, f"cdi-check setup failed:\n{out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])
