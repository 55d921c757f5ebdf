"""What the fuzz tests tried in this session, for the one line the terminal summary shows
(``pytest_terminal_summary`` in tests/conftest.py): pytest swallows a passing test's
print(), so the case counts the hardening issue asks to see are gathered here instead.

Under pytest-xdist the tests fuzz in the workers and the controller writes the summary: each
worker hands its counts over when it is done (``worker_output``, ``add_worker``)."""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MUTATION_TEST = "tests/fuzz/test_mutation.py::test_ten_thousand_mutated_inputs_break_no_parser"


@dataclass
class FuzzReport:
    mutation_cases: int = 0
    #: Failing mutation cases (tests.fuzz.mutate records at most ten in detail).
    mutation_failures: int = 0
    mutation_peak_rss_mib: float | None = None
    #: The mutation run's seed (a failure replays with python -m tests.fuzz.mutate --seed S).
    mutation_seed: int | None = None
    #: Hypothesis input cases by kind, over every fuzz test module that ran.
    hypothesis: dict[str, int] = field(default_factory=dict)
    #: The largest peak RSS of the pytest-xdist workers that fuzzed (None: no worker did).
    worker_peak_rss_mib: float | None = None

    def add_mutation(self, summary: Mapping[str, object]) -> None:
        total, failures, rss = summary["total"], summary["failures"], summary["peak_rss_mib"]
        assert isinstance(total, int) and isinstance(failures, list)
        assert isinstance(rss, int | float)
        self.mutation_cases += total
        self.mutation_failures += len(failures)
        self.mutation_peak_rss_mib = max(self.mutation_peak_rss_mib or 0.0, float(rss))
        seed = summary.get("seed")
        self.mutation_seed = seed if isinstance(seed, int) else None

    def add_hypothesis(self, counts: Mapping[str, int]) -> None:
        for kind, n in counts.items():
            self.hypothesis[kind] = self.hypothesis.get(kind, 0) + n

    def worker_output(self) -> dict[str, Any]:
        """What a pytest-xdist worker hands the controller: plain values, as execnet wants."""
        return {"mutation_cases": self.mutation_cases,
                "mutation_failures": self.mutation_failures,
                "mutation_peak_rss_mib": self.mutation_peak_rss_mib,
                "mutation_seed": self.mutation_seed, "hypothesis": dict(self.hypothesis),
                "peak_rss_mib": own_peak_rss_mib()}

    def add_worker(self, out: Mapping[str, Any]) -> None:
        """A worker's ``worker_output``, added to the controller's report."""
        self.mutation_cases += out["mutation_cases"]
        self.mutation_failures += out["mutation_failures"]
        if out["mutation_peak_rss_mib"] is not None:
            self.mutation_peak_rss_mib = max(self.mutation_peak_rss_mib or 0.0,
                                             out["mutation_peak_rss_mib"])
        if out["mutation_seed"] is not None:
            self.mutation_seed = out["mutation_seed"]
        self.add_hypothesis(out["hypothesis"])
        self.worker_peak_rss_mib = max(self.worker_peak_rss_mib or 0.0, out["peak_rss_mib"])

    @property
    def ran(self) -> bool:
        return bool(self.mutation_cases or self.hypothesis)

    def line(self, failed_tests: int) -> str:
        """e.g. "fuzz: 10,500 mutation cases (seed 0) + 2,003 hypothesis cases, 0 failures,
        peak RSS 83 MiB (mutation run), 412 MiB (this pytest process)"; "(largest pytest
        worker)" instead under pytest-xdist."""
        parts = []
        if self.mutation_cases:
            parts.append(f"{self.mutation_cases:,} mutation cases (seed {self.mutation_seed})")
        if self.hypothesis:
            parts.append(f"{sum(self.hypothesis.values()):,} hypothesis cases")
        failures = self.mutation_failures + failed_tests
        rss = []
        if self.mutation_peak_rss_mib is not None:
            rss.append(f"{self.mutation_peak_rss_mib:.0f} MiB (mutation run)")
        if self.worker_peak_rss_mib is None:
            rss.append(f"{own_peak_rss_mib():.0f} MiB (this pytest process)")
        else:
            rss.append(f"{self.worker_peak_rss_mib:.0f} MiB (largest pytest worker)")
        return (f"fuzz: {' + '.join(parts)}, {failures} failure{'s' * (failures != 1)}, "
                f"peak RSS {', '.join(rss)}")


def own_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def failed_fuzz_tests(nodeids: Sequence[str], mutation_test: str,
                      mutation_failures: int) -> int:
    """Failed fuzz tests beyond what the mutation cases already count: the mutation test's
    own failure is its failing cases, unless it failed with none (memory, stderr)."""
    return sum(1 for n in nodeids if not (n == mutation_test and mutation_failures))


def write_summary(terminalreporter: Any) -> None:
    """The one line, in every run that fuzzed: how many cases, how many failed, peak memory."""
    if not REPORT.ran:
        return
    failed = [r.nodeid for key in ("failed", "error")
              for r in terminalreporter.stats.get(key, [])
              if getattr(r, "nodeid", "").startswith("tests/fuzz/")]
    terminalreporter.write_sep("-", "fuzzing")
    terminalreporter.write_line(REPORT.line(
        failed_fuzz_tests(failed, MUTATION_TEST, REPORT.mutation_failures)))


REPORT = FuzzReport()
