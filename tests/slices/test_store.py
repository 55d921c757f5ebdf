from __future__ import annotations

from typing import Any

from agent.slices.store import SliceStore


def obj(name: str, rv: int, pool: str = "p") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)},
            "spec": {"pool": {"name": pool}}}


def test_list_then_events_in_order() -> None:
    store = SliceStore()
    assert store.replace([obj("a", 5)], "10") == {"p"}
    assert store.apply("MODIFIED", obj("a", 11)) == "p"
    assert store.apply("DELETED", obj("a", 12)) == "p"
    assert store.pool("p") == []


def test_echo_of_our_own_write_changes_nothing() -> None:
    store = SliceStore()
    store.written(obj("a", 20))
    assert store.apply("ADDED", obj("a", 20)) is None
    assert store.apply("MODIFIED", obj("a", 19)) is None
    assert store.pool("p")[0]["metadata"]["resourceVersion"] == "20"


def test_late_event_cannot_resurrect_a_deleted_slice() -> None:
    store = SliceStore()
    store.written(obj("a", 20))
    store.deleted("a", 25)
    assert store.apply("MODIFIED", obj("a", 21)) is None
    assert store.apply("DELETED", obj("a", 25)) is None
    assert store.pool("p") == []


def test_list_keeps_our_newer_writes_and_deletes() -> None:
    store = SliceStore()
    store.replace([obj("a", 5), obj("b", 6)], "10")
    store.written(obj("c", 12))  # created after the list below was taken
    store.deleted("b", 13)  # deleted after it, too
    changed = store.replace([obj("a", 5), obj("b", 6)], "11")
    assert {o["metadata"]["name"] for o in store.pool("p")} == {"a", "c"}
    assert changed == set()


def test_list_drops_what_vanished_before_it() -> None:
    store = SliceStore()
    store.replace([obj("a", 5), obj("b", 6, pool="q")], "10")
    assert store.replace([obj("a", 5)], "20") == {"q"}
    assert store.pools() == {"p"}


def test_a_server_that_went_back_in_time_is_believed() -> None:
    store = SliceStore()
    store.replace([obj("a", 500)], "500")
    store.replace([], "3")
    assert len(store) == 0


def test_drop_removes_an_object_that_left_the_scope() -> None:
    store = SliceStore()
    store.replace([obj("a", 5)], "10")
    assert store.drop("a") == "p"
    assert store.drop("a") is None
