"""Convergence of the planner from any starting point (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.slices.sync import DesiredPool, SliceContent, plan_pool
from tests.slices.helpers import DRIVER, NODE, devices
from tests.slices.test_sync import OWNER, apply

sizes = st.lists(st.integers(min_value=0, max_value=5), min_size=0, max_size=4)


def pool(shape: list[int], generation: int = 0) -> DesiredPool | None:
    if not shape:
        return None
    start, slices = 0, []
    for n in shape:
        slices.append(SliceContent(tuple(devices(n, start))))
        start += n
    return DesiredPool(NODE, tuple(slices), node_name=NODE, generation=generation)


def converge(desired: DesiredPool | None, state: list[dict[str, Any]], floor: int) -> Any:
    plan = plan_pool(DRIVER, NODE, desired, state, OWNER, generation_floor=floor)
    return plan, apply(plan, state)


@settings(max_examples=150, deadline=None)
@given(
    before=sizes,
    after=sizes,
    drop=st.sets(st.integers(0, 5)),
    edit=st.sets(st.integers(0, 5)),
    dup=st.sets(st.integers(0, 5)),
)
def test_any_state_converges_in_one_plan(
    before: list[int], after: list[int], drop: set[int], edit: set[int], dup: set[int]
) -> None:
    _, state = converge(pool(before), [], 0)
    # Someone else meddles: deletes, edits and duplicates some slices.
    meddled = []
    for i, stored in enumerate(state):
        if i in drop:
            continue
        obj = copy.deepcopy(stored)
        if i in edit and obj["spec"]["devices"]:
            obj["spec"]["devices"][0]["attributes"]["index"] = {"int": -1}
        meddled.append(obj)
        if i in dup:
            twin = copy.deepcopy(obj)
            twin["metadata"]["name"] += "z"
            meddled.append(twin)
    floor = max((o["spec"]["pool"]["generation"] for o in state), default=0)
    target = pool(after)
    first, final = converge(target, meddled, floor)
    again = plan_pool(DRIVER, NODE, target, final, OWNER, generation_floor=first.generation)
    assert again.empty
    if target is None or not target.slices:
        assert final == []
        return
    assert len(final) == len(target.slices)
    generations = {o["spec"]["pool"]["generation"] for o in final}
    assert len(generations) == 1 and generations.pop() >= floor
    assert all(o["spec"]["pool"]["resourceSliceCount"] == len(target.slices) for o in final)
    names = [d["name"] for o in final for d in o["spec"]["devices"]]
    assert names == [d["name"] for s in target.slices for d in s.devices]
    # Upstream's bump rule: any create, or more than one update, means a new generation.
    assert first.bumped or (not first.creates and len(first.updates) <= 1)
