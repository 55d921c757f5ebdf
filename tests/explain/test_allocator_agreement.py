"""Cases where explain and the scheduler's allocator (``bin/<minor>/allocate``) once
disagreed, found by tests/realk8s/test_explain_differential.py: each is the input and the
allocator's recorded answer per minor (tests/data/explain/allocator-agreement.json, ``why``
says what went wrong); explain must give the same answer (fit, exact results, config, node
selector, error). The fast suite needs no allocate binary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.explain.differential import (
    FEATURES,
    answer_of_allocator,
    answer_of_explain,
    compare,
    explain_case,
    uids_of,
)

RECORDED = Path(__file__).parent.parent / "data" / "explain" / "allocator-agreement.json"
CASES = [
    pytest.param(entry["case"], entry["answers"], minor, id=f"{entry['name']}-{minor}")
    for entry in json.loads(RECORDED.read_text())
    for minor in sorted(entry["answers"], reverse=True)
]


@pytest.mark.parametrize(("case", "answers", "minor"), CASES)
def test_explain_gives_the_allocators_answer(case: dict[str, Any], answers: dict[str, Any],
                                             minor: str) -> None:
    expected = answer_of_allocator(answers[minor], uids_of(case))
    got = answer_of_explain(explain_case(case, FEATURES[minor]))
    assert compare(expected, got) is None, compare(expected, got)
