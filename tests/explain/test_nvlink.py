"""``explain`` on NVLink claims over the agent's own slices of the simulated NVLink machines
(``matchAttribute: dra-agent.io/nvlinkDomain``): two GPUs sharing NVLink fit, two from
different pairs do not, and explain gives the answer the scheduler's allocator gave
(recorded in tests/data/explain/nvlink-allocator.json by tests/realk8s/test_nvlink_allocator.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.explain.result import PodExplainResult
from tests.explain.differential import (
    FEATURES,
    answer_of_allocator,
    answer_of_explain,
    compare,
    explain_case,
)
from tests.explain.nvlink_cases import DOMAIN, RECORDED, bus_id_of, cases

CASES = cases()


def _explain(name: str, minor: str = "1.37") -> PodExplainResult:
    return explain_case(CASES[name], FEATURES[minor])


def _chosen(result: PodExplainResult) -> list[str]:
    assert result.fits, result.claims[0].suggestion
    (claim,) = result.claims
    return [r["device"] for r in (claim.allocation or {})["devices"]["results"]]


def _suggestion(result: PodExplainResult) -> str:
    assert not result.fits
    (claim,) = result.claims
    assert claim.suggestion is not None
    return claim.suggestion


def test_two_gpus_sharing_nvlink_are_a_bridged_pair() -> None:
    assert _chosen(_explain("pairs-two-sharing-nvlink")) == ["gpu-0", "gpu-1"]
    assert _chosen(_explain("pairs-two-from-one-pair")) == ["gpu-2", "gpu-3"]
    # The next pair when the first is half taken, never gpu-1 with another pair's GPU.
    assert _chosen(_explain("pairs-two-with-the-first-pair-half-held")) == ["gpu-2", "gpu-3"]


def test_two_gpus_from_different_pairs_do_not_fit() -> None:
    suggestion = _suggestion(_explain("pairs-two-from-different-pairs"))
    assert suggestion == (f"constraint matchAttribute {DOMAIN}: no nvlinkDomain has free "
                          "devices for all of a, b; closest is "
                          f"{bus_id_of('pcie-nvlink-pairs', 'gpu-0')}, where b has 0 of 1")


def test_gpus_without_a_bridge_never_satisfy_an_nvlink_claim() -> None:
    suggestion = _suggestion(_explain("pairs-two-with-only-unbridged-gpus-free"))
    assert suggestion == (f"constraint matchAttribute {DOMAIN}: no free device of request(s) "
                          "gpus has the attribute")
    # The same two GPUs fit a claim that does not ask for NVLink.
    assert _chosen(_explain("pairs-two-unconstrained-with-only-unbridged-gpus-free")) == [
        "gpu-6", "gpu-7"]


def test_four_gpus_sharing_nvlink_need_an_nvswitch_or_a_clique() -> None:
    suggestion = _suggestion(_explain("pairs-four-sharing-nvlink"))
    assert suggestion.endswith("no nvlinkDomain has 4 free devices for request gpus; the most "
                               f"any has is 2 ({bus_id_of('pcie-nvlink-pairs', 'gpu-0')})")
    assert _chosen(_explain("hgx-four-sharing-nvlink")) == [f"gpu-{k}" for k in range(4)]
    assert len(_chosen(_explain("hgx-eight-sharing-nvlink"))) == 8
    assert _chosen(_explain("nvl72-four-sharing-the-clique")) == [f"gpu-{k}" for k in range(4)]
    # An HGX whose fabric manager has not run has no NVLink to offer.
    assert "has the attribute" in _suggestion(
        _explain("dgx-without-fabric-manager-two-sharing-nvlink"))


# -- the scheduler's allocator, recorded ------------------------------------------------------

RECORDED_ANSWERS: dict[str, dict[str, Any]] = json.loads(RECORDED.read_text())["answers"]


def test_every_case_has_the_allocators_answer_for_every_minor() -> None:
    assert sorted(RECORDED_ANSWERS) == sorted(CASES)
    assert all(sorted(a) == sorted(FEATURES) for a in RECORDED_ANSWERS.values())


@pytest.mark.parametrize(("name", "minor"), [(n, m) for n in sorted(CASES)
                                             for m in sorted(FEATURES, reverse=True)])
def test_explain_gives_the_allocators_answer(name: str, minor: str) -> None:
    expected = answer_of_allocator(RECORDED_ANSWERS[name][minor])
    got = answer_of_explain(_explain(name, minor))
    assert compare(expected, got) is None, compare(expected, got)
