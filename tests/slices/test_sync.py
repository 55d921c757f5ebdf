"""The planning rules, one per test, on plain dicts (no server)."""

from __future__ import annotations

import copy
from typing import Any

from agent.slices.sync import DesiredPool, OwnerRef, PoolPlan, SliceContent, plan_pool
from tests.slices.helpers import DRIVER, NODE, devices

OWNER = OwnerRef("v1", "Node", NODE, "uid-1")


def desired(*sizes: int, generation: int = 0, **kw: Any) -> DesiredPool:
    start, slices = 0, []
    for n in sizes:
        slices.append(SliceContent(tuple(devices(n, start))))
        start += n
    kw.setdefault("node_name", NODE)
    return DesiredPool(NODE, tuple(slices), generation=generation, **kw)


def apply(plan: PoolPlan, existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a server would hold after the plan (names from generateName, new versions)."""
    gone = {d.name for d in plan.deletes}
    out = {o["metadata"]["name"]: o for o in existing if o["metadata"]["name"] not in gone}
    for u in plan.updates:
        obj = copy.deepcopy(u.obj)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 100)
        out[obj["metadata"]["name"]] = obj
    for c in plan.creates:
        obj = copy.deepcopy(c.obj)
        meta = obj["metadata"]
        meta["name"] = meta.pop("generateName") + "abcde"
        meta["uid"] = f"uid-{meta['name']}"
        meta["resourceVersion"] = "1"
        out[meta["name"]] = obj
    return sorted(out.values(), key=lambda o: o["metadata"]["name"])


def plan(pool: DesiredPool | None, existing: list[dict[str, Any]], floor: int = 0) -> PoolPlan:
    return plan_pool(DRIVER, NODE, pool, existing, OWNER, generation_floor=floor)


def converge(pool: DesiredPool, existing: list[dict[str, Any]] | None = None) -> list[Any]:
    state = apply(plan(pool, existing or []), existing or [])
    assert plan(pool, state).empty, "a second plan must have nothing left to do"
    return state


def test_new_pool_creates_one_slice_with_everything_set() -> None:
    p = plan(desired(8), [])
    (create,) = p.creates
    assert not p.deletes and not p.updates and p.bumped
    meta, spec = create.obj["metadata"], create.obj["spec"]
    assert meta["generateName"] == "00000-dra-agent.io-node1-"
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-1", "controller": True}
    ]
    assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
    # A new pool starts at generation 1, as upstream's (a create always bumps).
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert len(spec["devices"]) == 8


def test_nothing_changed_means_no_writes() -> None:
    state = converge(desired(128, 128))
    assert plan(desired(128, 128), state).empty


def test_one_changed_device_is_one_update_without_a_generation_bump() -> None:
    state = converge(desired(128, 128))
    changed = desired(128, 128)
    devs = list(changed.slices[1].devices)
    devs[5] = {**devs[5], "attributes": {"type": {"string": "gpu"}, "index": {"int": 999}}}
    changed = DesiredPool(NODE, (changed.slices[0], SliceContent(tuple(devs))), NODE)
    p = plan(changed, state)
    assert [u.index for u in p.updates] == [1] and not p.creates and not p.deletes
    assert not p.bumped
    assert p.updates[0].obj["metadata"]["resourceVersion"] == state[1]["metadata"][
        "resourceVersion"]  # optimistic lock on what we saw


def test_more_than_one_write_bumps_the_generation_on_every_slice() -> None:
    state = converge(desired(128, 128))
    assert [o["spec"]["pool"]["generation"] for o in state] == [1, 1]  # two creates: bumped
    p = plan(desired(128, 128, 8), state)
    assert p.bumped and p.generation == 2
    assert [u.index for u in p.updates] == [0, 1] and [c.index for c in p.creates] == [2]
    for op in (*p.updates, *p.creates):
        assert op.obj["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 3}


def test_split_into_16_slices_and_back() -> None:
    state = converge(desired(8))
    big = desired(*[128] * 16)
    p = plan(big, state)
    assert len(p.updates) == 1 and len(p.creates) == 15 and p.generation == 2
    state = converge(big, state)
    assert len(state) == 16
    assert [o["metadata"]["name"][:5] for o in state] == [f"{i:05x}" for i in range(16)]
    p = plan(desired(8), state)
    # Deletes never bump: one update is all the remaining slice needs (upstream's rule).
    assert len(p.deletes) == 15 and len(p.updates) == 1 and p.generation == 2 and not p.bumped
    state = converge(desired(8), state)
    assert len(state) == 1 and state[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_a_single_missing_slice_is_recreated_at_a_new_generation_on_every_slice() -> None:
    state = converge(desired(128, 128, 128))
    del state[1]
    p = plan(desired(128, 128, 128), state)
    assert [c.index for c in p.creates] == [1] and [u.index for u in p.updates] == [0, 2]
    assert p.bumped and p.generation == 2


def test_pool_shrinking_from_two_slices_to_one_keeps_its_generation() -> None:
    state = converge(desired(8, 8))
    p = plan(desired(8), state)
    assert len(p.deletes) == 1 and [u.index for u in p.updates] == [0] and not p.creates
    assert not p.bumped and p.generation == 1
    assert p.updates[0].obj["spec"]["pool"] == {
        "name": NODE, "generation": 1, "resourceSliceCount": 1}


def test_two_changed_slices_bump_one_does_not() -> None:
    state = converge(desired(8, 8))
    one = desired(8, 8)
    edited = [{**d, "attributes": {"index": {"int": -1}}} for d in one.slices[1].devices]
    p = plan(DesiredPool(NODE, (one.slices[0], SliceContent(tuple(edited))), NODE), state)
    assert not p.bumped and [u.index for u in p.updates] == [1]
    p = plan(DesiredPool(NODE, (SliceContent(tuple(edited)), one.slices[0]), NODE), state)
    assert p.bumped and p.generation == 2 and [u.index for u in p.updates] == [0, 1]


def test_wiped_pool_comes_back_with_a_newer_generation_than_published_before() -> None:
    p = plan(desired(128, 128), [], floor=4)
    assert p.generation == 5 and len(p.creates) == 2


def test_driver_generation_wins_when_higher() -> None:
    state = converge(desired(8))
    p = plan(desired(8, generation=7), state)
    assert p.generation == 7 and p.bumped and len(p.updates) == 1


def test_slices_of_an_older_generation_are_deleted_first() -> None:
    state = converge(desired(8, 8))
    stale = copy.deepcopy(state[0])
    stale["metadata"]["name"] = "00000-dra-agent.io-node1-old00"
    stale["spec"]["pool"]["generation"] = -1 + state[0]["spec"]["pool"]["generation"]
    p = plan(desired(8, 8), [*state, stale])
    assert [d.name for d in p.deletes] == ["00000-dra-agent.io-node1-old00"]
    assert p.deletes[0].reason == "older generation"
    assert not p.updates and not p.creates


def test_deletes_carry_uid_and_resource_version_preconditions() -> None:
    state = converge(desired(8, 8))
    p = plan(desired(8), state)
    (delete,) = p.deletes
    assert delete.uid == state[1]["metadata"]["uid"]
    assert delete.resource_version == state[1]["metadata"]["resourceVersion"]


def test_duplicate_for_one_index_keeps_the_matching_copy() -> None:
    state = converge(desired(8))
    dup = copy.deepcopy(state[0])
    dup["metadata"]["name"] = "00000-dra-agent.io-node1-aaaaa"  # sorts first
    dup["spec"]["devices"] = dup["spec"]["devices"][:2]
    p = plan(desired(8), [*state, dup])
    assert [d.name for d in p.deletes] == ["00000-dra-agent.io-node1-aaaaa"]
    assert not p.updates


def test_old_naming_scheme_is_replaced() -> None:
    state = converge(desired(8))
    state[0]["metadata"]["name"] = "node1-dra-agent.io-xyz12"
    p = plan(desired(8), state)
    assert len(p.deletes) == 1 and len(p.creates) == 1


def test_removed_pool_deletes_all_its_slices() -> None:
    state = converge(desired(8, 8))
    p = plan(None, state)
    assert len(p.deletes) == 2 and not p.creates and not p.updates


def test_hand_edit_is_reverted_and_foreign_metadata_kept() -> None:
    state = converge(desired(8))
    state[0]["spec"]["devices"][0]["attributes"]["index"] = {"int": 42}
    state[0]["metadata"]["labels"] = {"team": "x"}
    state[0]["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    p = plan(desired(8), state)
    (update,) = p.updates
    assert update.obj["spec"]["devices"][0]["attributes"]["index"] == {"int": 0}
    assert update.obj["metadata"]["labels"] == {"team": "x"}
    assert "managedFields" not in update.obj["metadata"]


def test_missing_owner_reference_is_restored() -> None:
    state = converge(desired(8))
    state[0]["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}
    ]
    (update,) = plan(desired(8), state).updates
    refs = update.obj["metadata"]["ownerReferences"]
    assert refs[0]["uid"] == "uid-1" and refs[0]["controller"] is True and len(refs) == 2


def test_node_selector_pool_has_no_node_name() -> None:
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    pool = DesiredPool("fabric", (SliceContent(tuple(devices(2))),), node_selector=selector)
    (create,) = plan_pool(DRIVER, "fabric", pool, [], OWNER).creates
    assert create.obj["spec"]["nodeSelector"] == selector
    assert "nodeName" not in create.obj["spec"]


def test_pool_moving_from_node_local_to_selector_replaces_its_slices() -> None:
    state = converge(desired(8))
    moved = DesiredPool(NODE, (SliceContent(tuple(devices(8))),),
                        node_selector={"nodeSelectorTerms": [{}]})
    p = plan(moved, state)
    assert p.deletes[0].reason == "node selection changed" and len(p.creates) == 1


def test_all_nodes_is_published_only_when_asked_for() -> None:
    pool = DesiredPool("shared", (SliceContent(tuple(devices(1))),), all_nodes=True)
    (create,) = plan_pool(DRIVER, "shared", pool, [], None).creates
    assert create.obj["spec"]["allNodes"] is True
    assert "ownerReferences" not in create.obj["metadata"]
    assert create.obj["metadata"]["generateName"] == "00000-dra-agent.io-"
    implied = DesiredPool("shared", pool.slices)
    assert not implied.has_node_selection
    spec = plan_pool(DRIVER, "shared", implied, [], None).creates[0].obj["spec"]
    assert not {"allNodes", "nodeName", "nodeSelector"} & set(spec)


def test_counter_slice_carries_no_devices_field() -> None:
    counters = ({"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}},)
    pool = DesiredPool(NODE, (SliceContent((), counters), SliceContent(tuple(devices(1)))),
                       NODE)
    creates = plan(pool, []).creates
    assert "devices" not in creates[0].obj["spec"] and creates[0].obj["spec"]["sharedCounters"]
    assert creates[1].obj["spec"]["devices"]


def test_taint_time_added_is_kept_on_update() -> None:
    tainted = [{**d, "taints": [{"key": "k", "effect": "NoSchedule"}]} for d in devices(2)]
    pool = DesiredPool(NODE, (SliceContent(tuple(tainted)),), NODE)
    state = converge(pool)
    state[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-29T10:00:00Z"
    assert plan(pool, state).empty
    bumped = plan(DesiredPool(NODE, pool.slices, NODE, generation=3), state)
    taint = bumped.updates[0].obj["spec"]["devices"][0]["taints"][0]
    assert taint["timeAdded"] == "2026-11-29T10:00:00Z"
