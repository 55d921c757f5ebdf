"""``explain`` against the scheduler's own allocator (``bin/<minor>/allocate --lines``) on
hypothesis-generated cases: they must agree on fit and on the exact devices chosen.

No cluster is needed, only the allocate binary of the minor under test. A disagreement prints
the case as the allocator's input line and both answers; record it in
tests/explain/test_allocator_agreement.py once its cause is known.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.explain.differential import (
    PROFILES,
    Features,
    allocator_doc,
    answer_of_allocator,
    answer_of_explain,
    cases,
    compare,
    exact_choice_defined,
    explain_case,
    uids_of,
)
from tests.realk8s.cluster import bin_dir

# Versioned: the allocator of each minor, with its own quirks (explain --kubernetes-version).
pytestmark = pytest.mark.versioned

CASES = 2000  # per minor; with other gate settings too, a quarter goes to those
#: How often a 1.35 answer that depends on Go map order is asked again (2 pools: 1 in 2 orders).
ORDER_RETRIES = 12


class Allocate:
    """One ``allocate --lines`` process: a line in, a line out."""

    def __init__(self, minor: str, gates: str = "") -> None:
        binary = bin_dir(minor) / "allocate"
        assert binary.is_file(), f"{binary} not built: run hack/realk8s/build.sh {minor}"
        self.proc = subprocess.Popen([str(binary), "--lines", f"--feature-gates={gates}"],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def __call__(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, f"allocate exited ({self.proc.poll()})"
        answer: dict[str, Any] = json.loads(reply)
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _run(features: Features, allocate: Allocate, n: int) -> None:
    minor = features.minor
    seen = {"cases": 0, "fits": 0, "errors": 0, "exact": 0, "pods": 0, "reordered": 0,
            "timed out": 0}
    start = time.monotonic()

    # The same cases every run, so CI answers for this code and not for the draw; set
    # DRA_AGENT_DIFF_RANDOM=1 to explore new ones (each disagreement found that way becomes a
    # case in tests/explain/test_allocator_agreement.py).
    @settings(max_examples=n, deadline=None, database=None,
              derandomize=os.environ.get("DRA_AGENT_DIFF_RANDOM") != "1",
              suppress_health_check=list(HealthCheck))
    @given(case=cases(features))
    def check(case: dict[str, Any]) -> None:
        exact = exact_choice_defined(case, minor)
        line = allocator_doc(case, by_name=minor == "1.35")
        reply = allocate(line)
        assert set(reply) <= {"allocations", "unschedulable", "error", "timedOut"}, reply
        if reply.get("timedOut"):
            # The scheduler itself gives up such a search after its filter timeout (10 s):
            # there is no answer to agree with. Counted and shown, never silently dropped.
            seen["timed out"] += 1
            return
        if reply.get("error") and not reply.get("unschedulable"):
            # Bad input is our generator's fault, not a disagreement: the tool says "input:".
            assert not reply["error"].startswith("input:"), reply["error"]
        expected = answer_of_allocator(reply, uids_of(case))
        got = answer_of_explain(explain_case(case, features))
        seen["cases"] += 1
        seen["fits"] += expected["fits"]
        seen["errors"] += expected["error"]
        seen["exact"] += exact
        seen["pods"] += len(uids_of(case)) > 1
        diff = compare(expected, got, exact)
        if diff is not None and not exact:
            # 1.35 with several pools: the allocator walks them in Go map order, which changes
            # from call to call, and a search aborted by a CEL runtime error (or the device it
            # stops at) depends on that order, so one input has several right answers. Explain
            # must give one the allocator gives; asking again draws other orders.
            for _ in range(ORDER_RETRIES):
                again = answer_of_allocator(allocate(line), uids_of(case))
                if compare(again, got, exact) is None:
                    seen["reordered"] += 1
                    diff = None
                    break
        assert diff is None, (f"{diff}\nallocator reply: {json.dumps(reply)}\n"
                              f"case (allocate input): {line}")

    check()
    took = time.monotonic() - start
    print(f"\nexplain vs allocate {minor} {features.gates or '(default gates)'}: "
          f"{seen['cases']} cases ({seen['fits']} fit, {seen['errors']} allocator errors; "
          f"exact choice compared in {seen['exact']}; {seen['pods']} of several claims; "
          f"{seen['reordered']} matched another pool order; "
          f"{seen['timed out']} past the scheduler's 10 s filter timeout) "
          f"in {took:.1f} s")
    assert seen["cases"] + seen["timed out"] >= n
    assert seen["timed out"] <= n // 100, "too many cases with no answer to compare"


def test_explain_agrees_with_the_allocator(minor: str) -> None:
    profiles = PROFILES[minor]
    others = len(profiles) - 1
    start = time.monotonic()
    for i, features in enumerate(profiles):
        allocate = Allocate(minor, features.gates)
        try:
            _run(features, allocate, (CASES * 3 // 4 if others else CASES) if i == 0
                 else CASES // 4 // others)
        finally:
            allocate.close()
    print(f"explain vs allocate {minor}: {CASES} cases in {time.monotonic() - start:.1f} s")
