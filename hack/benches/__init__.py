"""Benchmarks, one module per area, collected by ``python -m hack.bench``.

Each module exposes ``run(quick: bool) -> list[Figure]`` and can also be run on its own
(``python -m hack.benches.<area>``), printing its figures.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Figure:
    name: str  # e.g. "discovery dgx-h100 full, median"
    value: float
    unit: str  # "ms", "MiB", "requests", "writes/min", ...
    goal: str | None = None  # e.g. "<= 50 ms"
    ok: bool | None = None  # None when there is no goal

    def row(self) -> str:
        verdict = "" if self.ok is None else ("pass" if self.ok else "falls short")
        goal = self.goal or ""
        return f"{self.name:<58} {self.value:>10.2f} {self.unit:<10} {goal:<14} {verdict}"


def percentile(values: list[float], q: float) -> float:
    """The value at quantile ``q`` (0.5: median, 0.99: p99) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def compiled() -> None:
    """Our packages' bytecode compiled, as ``pip install`` compiles it in the image.

    A checkout installed editable (``pip install -e``) under PYTHONDONTWRITEBYTECODE=1 (this
    VM's environment, and the image's, where it is harmless because the wheel was compiled at
    install) never writes ``__pycache__``: every start would compile about 150 source files,
    0.2-0.26 s of CPU on 2026-12-01, which no deployed agent pays. The start-up figures are
    taken after this; compileall writes the ``__pycache__`` dirs (git-ignored) whatever that
    variable says, and costs nothing once they are current.
    """
    import subprocess
    import sys
    from pathlib import Path

    subprocess.run([sys.executable, "-m", "compileall", "-q", "agent", "cdi", "discovery",
                    "protos"], check=True, cwd=Path(__file__).resolve().parents[2], timeout=300)


def median_ms(func: Callable[[], object], runs: int) -> float:
    """The median of ``runs`` timed calls of ``func``, in milliseconds."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)
