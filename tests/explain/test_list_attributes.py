"""List-type attributes (DRAListTypeAttributes) in matchAttribute / distinctAttribute.

Upstream (structured/internal/experimental) treats a value as a set, a scalar as a one-element
set: matchAttribute needs one element common to every chosen device, distinctAttribute
pairwise-disjoint sets. With the gate off only scalars compare.
"""

from __future__ import annotations

from typing import Any

from agent.explain.api import explain
from tests.explain.builders import CLASSES, NODE, claim, device, exactly, slice_

ROOT = "resource.kubernetes.io/pcieRoot"
LIST_ON = {"DRAListTypeAttributes": True}


def _gpus(*roots: Any) -> dict[str, Any]:
    devs = []
    for i, r in enumerate(roots):
        d = device(f"gpu-{i}")
        d["attributes"][ROOT] = {"strings": r} if isinstance(r, list) else {"string": r}
        devs.append(d)
    return slice_(devs)


def _run(kind: str, count: int, *roots: Any, gates: Any = LIST_ON) -> Any:
    c = claim(exactly("g", count=count), constraints=[{kind: ROOT}])
    return explain(c, CLASSES, [_gpus(*roots)], NODE, feature_gates=gates)


def _picked(result: Any) -> list[str]:
    return [r["device"] for r in result.allocation["devices"]["results"]]


def test_match_needs_one_common_element_across_all_devices() -> None:
    assert _picked(_run("matchAttribute", 2, ["a", "b"], ["b", "c"])) == ["gpu-0", "gpu-1"]
    # pairwise they all intersect, but no element is common to all three
    assert not _run("matchAttribute", 3, ["a", "b"], ["b", "c"], ["a", "c"]).fits
    assert _run("matchAttribute", 3, ["a", "b"], ["b", "c"], ["b"]).fits


def test_match_scalar_is_a_one_element_set() -> None:
    assert _run("matchAttribute", 2, "b", ["b", "c"]).fits
    assert not _run("matchAttribute", 2, "a", ["b", "c"]).fits


def test_match_backtracking_restores_the_intersection() -> None:
    # gpu-0 narrows to {a}; nothing else has a, so the search drops it and restarts from gpu-1
    r = _run("matchAttribute", 2, ["a"], ["b", "c"], ["c", "d"])
    assert _picked(r) == ["gpu-1", "gpu-2"]


def test_match_refusal_names_the_common_values() -> None:
    r = _run("matchAttribute", 2, ["a"], ["b"])
    assert not r.fits
    reason = next(v.reason for v in r.requests[0].devices if v.device == "gpu-1")
    assert reason is not None and "[b] here has nothing in common with [a]" in reason.message


def test_distinct_needs_pairwise_disjoint_sets() -> None:
    assert _picked(_run("distinctAttribute", 2, ["a", "b"], ["b", "c"], ["c"])) == [
        "gpu-0", "gpu-2"]
    assert not _run("distinctAttribute", 2, ["a", "b"], ["b", "c"], ["a", "c"]).fits
    assert _run("distinctAttribute", 3, ["a"], "b", ["c", "d"]).fits


def test_gate_off_lists_never_compare_like_upstream() -> None:
    # kube-scheduler 1.37 defaults: DRAListTypeAttributes is alpha, off
    r = _run("matchAttribute", 2, ["a", "b"], ["a", "b"], gates=None)
    assert not r.fits and r.error is None
    reason = next(v.reason for v in r.requests[0].devices if v.device == "gpu-1")
    assert reason is not None and "DRAListTypeAttributes" in reason.message
    # a scalar pair still matches with the gate off, lists elsewhere in the pool notwithstanding
    assert _picked(_run("matchAttribute", 2, ["a"], "x", "x", gates=None)) == ["gpu-1", "gpu-2"]
    assert _run("distinctAttribute", 2, ["a"], "a", gates=None).fits  # list vs scalar: no clash
