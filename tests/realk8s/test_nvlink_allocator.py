"""The NVLink claims of tests/explain/nvlink_cases.py through the scheduler's own allocator
(``bin/<minor>/allocate``): it must give explain's answer and the one recorded in
tests/data/explain/nvlink-allocator.json, which the fast suite replays.

``DRA_AGENT_RECORD=1`` writes this minor's answers into that file instead of comparing them
with it (run it once per minor after a change to the cases or to the simulated machines).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.explain.differential import (
    FEATURES,
    allocator_doc,
    answer_of_allocator,
    answer_of_explain,
    compare,
    explain_case,
)
from tests.explain.nvlink_cases import RECORDED, cases
from tests.realk8s.test_explain_differential import Allocate

pytestmark = pytest.mark.versioned

WHY = ("The allocator's answers to NVLink claims (matchAttribute dra-agent.io/nvlinkDomain) "
       "on the agent's slices of the simulated NVLink machines; written by "
       "DRA_AGENT_RECORD=1 pytest tests/realk8s/test_nvlink_allocator.py, once per minor.")


def test_the_allocator_gives_explains_and_the_recorded_answers(minor: str) -> None:
    record = os.environ.get("DRA_AGENT_RECORD") == "1"
    stored: dict[str, Any] = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    answers: dict[str, dict[str, Any]] = stored.get("answers", {})
    allocate = Allocate(minor)
    try:
        for name, case in cases().items():
            # 1.35's allocator keeps the slices' input order within a pool: give it the
            # order explain uses (by name), as the differential test does.
            reply = allocate(allocator_doc(case, by_name=minor == "1.35"))
            assert set(reply) <= {"allocations", "unschedulable", "error"}, (name, reply)
            expected = answer_of_allocator(reply)
            diff = compare(expected, answer_of_explain(explain_case(case, FEATURES[minor])))
            assert diff is None, f"{name}: {diff}"
            if record:
                answers.setdefault(name, {})[minor] = reply
            else:
                assert name in answers and minor in answers[name], f"{name} not recorded"
                assert compare(answer_of_allocator(answers[name][minor]), expected) is None, (
                    f"{name}: the recorded answer is not the allocator's; record it again")
    finally:
        allocate.close()
    if record:
        RECORDED.write_text(json.dumps({"why": WHY, "answers": dict(sorted(answers.items()))},
                                       indent=1, sort_keys=True) + "\n")
