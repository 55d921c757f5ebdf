"""The fuzz line in the terminal summary: pytest swallows a passing test's print(), so the
case counts reach the output only through pytest_terminal_summary (tests/conftest.py), also
from pytest-xdist's workers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.fuzz.report import MUTATION_TEST, FuzzReport, failed_fuzz_tests


@pytest.mark.parametrize(("workers", "rss"), [("0", "this pytest process"),
                                              ("2", "largest pytest worker")])
def test_a_passing_fuzz_run_prints_its_case_count(workers: str, rss: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--numprocesses={workers}",
         "tests/fuzz/test_inputs.py::test_fuzzed_kubeconfigs_load_or_refuse_without_secrets"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    line = re.search(r"^fuzz: .*$", out.stdout, re.M)
    assert line, out.stdout[-2000:]
    assert re.fullmatch(r"fuzz: [\d,]+ hypothesis cases, 0 failures, peak RSS \d+ MiB "
                        rf"\({rss}\)", line[0]), line[0]
    assert int(line[0].split()[1].replace(",", "")) >= 200  # test_inputs' kubeconfig budget


def test_the_line_adds_up_every_source() -> None:
    report = FuzzReport()
    assert not report.ran
    report.add_mutation({"seed": 7, "total": 10_500, "failures": [], "peak_rss_mib": 83.4})
    report.add_hypothesis({"claims": 300, "kubeconfigs": 200})
    report.add_hypothesis({"claims": 1_000, "requests": 5})
    assert report.ran and report.hypothesis == {"claims": 1_300, "kubeconfigs": 200,
                                                "requests": 5}
    line = report.line(failed_tests=0)
    assert line.startswith("fuzz: 10,500 mutation cases (seed 7) + 1,505 hypothesis cases, "
                           "0 failures, peak RSS 83 MiB (mutation run), "), line
    assert line.endswith(" MiB (this pytest process)")


def test_workers_hand_their_counts_to_the_controller() -> None:
    one, two, controller = FuzzReport(), FuzzReport(), FuzzReport()
    one.add_mutation({"seed": 0, "total": 10, "failures": [{}], "peak_rss_mib": 80})
    two.add_hypothesis({"claims": 5})
    for worker in (one, two):
        controller.add_worker(worker.worker_output())
    assert (controller.mutation_cases, controller.mutation_failures, controller.hypothesis) == (
        10, 1, {"claims": 5})
    line = controller.line(failed_tests=0)
    assert line.startswith("fuzz: 10 mutation cases (seed 0) + 5 hypothesis cases, 1 failure, "
                           "peak RSS 80 MiB (mutation run), "), line
    assert line.endswith(" MiB (largest pytest worker)"), line


def test_failures_count_cases_and_tests_once() -> None:
    report = FuzzReport()
    report.add_mutation({"seed": 0, "total": 10, "failures": [{}, {}], "peak_rss_mib": 1})
    # The mutation test failed because of its two failing cases: counted as those two.
    failed = failed_fuzz_tests([MUTATION_TEST, "tests/fuzz/test_fuzz.py::test_fuzzed_claims"],
                               MUTATION_TEST, report.mutation_failures)
    assert failed == 1
    assert ", 3 failures, " in report.line(failed)
    # Failed with no failing case (memory, stderr): the test itself is the failure.
    assert failed_fuzz_tests([MUTATION_TEST], MUTATION_TEST, 0) == 1
    assert ", 1 failure, " in FuzzReport().line(1)


def test_property_tests_draw_the_same_cases_unless_exploring(
    request: pytest.FixtureRequest,
) -> None:
    from hypothesis import settings

    # tests/conftest.py: CI's draws are fixed; `--hypothesis-profile=explore` draws anew.
    chosen = request.config.getoption("hypothesis_profile", default=None)
    assert settings.default.derandomize is (chosen in (None, "derandomized"))
    assert settings.default.database is None
    assert not settings.get_profile("explore").derandomize
