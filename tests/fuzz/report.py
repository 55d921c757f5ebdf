"""What the fuzz tests tried in this session, for the one line the terminal summary shows
(``pytest_terminal_summary`` in tests/fuzz/conftest.py): pytest swallows a passing test's
print(), so the case counts the hardening issue asks to see are gathered here instead."""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


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

    @property
    def ran(self) -> bool:
        return bool(self.mutation_cases or self.hypothesis)

    def line(self, failed_tests: int) -> str:
        """e.g. "fuzz: 10,500 mutation cases (seed 0) + 2,003 hypothesis cases, 0 failures,
        peak RSS 83 MiB (mutation run), 412 MiB (this pytest process)"."""
        parts = []
        if self.mutation_cases:
            parts.append(f"{self.mutation_cases:,} mutation cases (seed {self.mutation_seed})")
        if self.hypothesis:
            parts.append(f"{sum(self.hypothesis.values()):,} hypothesis cases")
        failures = self.mutation_failures + failed_tests
        rss = []
        if self.mutation_peak_rss_mib is not None:
            rss.append(f"{self.mutation_peak_rss_mib:.0f} MiB (mutation run)")
        rss.append(f"{own_peak_rss_mib():.0f} MiB (this pytest process)")
        return (f"fuzz: {' + '.join(parts)}, {failures} failure{'s' * (failures != 1)}, "
                f"peak RSS {', '.join(rss)}")


def own_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def failed_fuzz_tests(nodeids: Sequence[str], mutation_test: str,
                      mutation_failures: int) -> int:
    """Failed fuzz tests beyond what the mutation cases already count: the mutation test's
    own failure is its failing cases, unless it failed with none (memory, stderr)."""
    return sum(1 for n in nodeids if not (n == mutation_test and mutation_failures))


REPORT = FuzzReport()
