"""Which generation of a pool counts, when other nodes publish slices of the same pool.

Upstream's GatherPools keeps the newest generation among the node's own slices; a pool complete
from those is used without looking further. Only an incomplete one is checked against all
slices: a newer generation anywhere drops it, the same generation elsewhere may complete it.
"""

from __future__ import annotations

from agent.explain.api import explain
from tests.explain.builders import CLASSES, NODE, claim, device, exactly, slice_


def test_a_complete_pool_ignores_a_newer_generation_on_another_node() -> None:
    mine = slice_([device("gpu-0")], pool="shared", generation=1, name="mine")
    theirs = slice_([device("gpu-7")], pool="shared", generation=2, node="node-b", name="theirs")
    r = explain(claim(exactly("g")), CLASSES, [mine, theirs], NODE)
    assert r.fits
    assert r.allocation is not None
    assert r.allocation["devices"]["results"][0]["device"] == "gpu-0"
    assert [(p.pool, p.generation, p.status) for p in r.pools] == [("shared", 1, "ok")]


def test_an_incomplete_pool_is_dropped_for_a_newer_generation_elsewhere() -> None:
    mine = slice_([device("gpu-0")], pool="shared", generation=1, count=2, name="mine")
    theirs = slice_([device("gpu-7")], pool="shared", generation=2, node="node-b", name="theirs")
    r = explain(claim(exactly("g")), CLASSES, [mine, theirs], NODE)
    assert not r.fits and r.pools == ()


def test_an_incomplete_pool_is_completed_by_another_nodes_slice() -> None:
    mine = slice_([device("gpu-0")], pool="shared", generation=1, count=2, name="mine")
    theirs = slice_([device("gpu-7")], pool="shared", generation=1, count=2, node="node-b",
                    name="theirs")
    r = explain(claim(exactly("g")), CLASSES, [mine, theirs], NODE)
    assert r.fits and [p.status for p in r.pools] == ["ok"]
    two = explain(claim(exactly("g", count=2)), CLASSES, [mine, theirs], NODE)
    assert not two.fits  # node-b's device is not this node's to allocate
