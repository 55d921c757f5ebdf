"""The Node owner's UID is looked up again when the Node may have been registered anew, and
never in a steady state."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from agent.slices import Owner
from tests.fakes.apiserver import FakeAPIServer
from tests.slices.conftest import Harness, listings, our_slices, writes
from tests.slices.helpers import NODE, node, pool_of, resources
from tests.waiting import wait_for


def owner_uids(srv: FakeAPIServer) -> set[str]:
    return {r["uid"] for o in our_slices(srv) for r in o["metadata"]["ownerReferences"]}


def node_gets(srv: FakeAPIServer) -> list[Any]:
    return [r for r in srv.requests if r.path == f"/api/v1/nodes/{NODE}"]


def node_uid(srv: FakeAPIServer) -> str:
    obj = srv.get_object("nodes", NODE)
    assert obj is not None
    return str(obj["metadata"]["uid"])


def test_empty_server_with_a_new_node_gets_slices_owned_by_the_new_uid(
    srv: FakeAPIServer, harness: Harness
) -> None:
    c = harness.start(srv, resources(node1=pool_of(8)))
    assert c.synced(10)
    old = node_uid(srv)
    srv.restart(keep_state=False)
    srv.put_object(node())  # the kubelet registers its Node again: same name, new UID
    new = node_uid(srv)
    assert new != old
    wait_for(lambda: owner_uids(srv) == {new}, what="slices owned by the new Node")
    assert c.synced(10)
    assert len(our_slices(srv)) == 1


def test_node_missing_at_republish_keeps_the_old_uid_then_adopts_the_new(
    srv: FakeAPIServer, harness: Harness
) -> None:
    c = harness.start(srv, resources(node1=pool_of(4)))
    assert c.synced(10)
    old = node_uid(srv)
    srv.restart(keep_state=False)  # no Node at all for a while
    wait_for(lambda: owner_uids(srv) == {old}, what="republished under the last known uid")
    assert c.synced(10)  # a missing Node does not hold the pool back
    srv.put_object(node())
    new = node_uid(srv)
    # Looked for again after a back-off, without any event on the slices.
    wait_for(lambda: owner_uids(srv) == {new}, what="owner moved to the new Node")
    assert [w[0] for w in writes(srv)][-1] == "update"
    assert c.synced(10)


def test_kubelet_wipe_checks_the_node_once(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(2), other=pool_of(2)))
    assert c.synced(10)
    srv.clear_requests()
    k8s.ResourceV1Api(srv.api_client()).delete_collection_resource_slice(
        field_selector=f"spec.nodeName={NODE}"
    )
    wait_for(lambda: len(our_slices(srv)) == 2, what="slices back")
    assert c.synced(10)
    # Both pools were recreated; the Node was looked at once or twice (one per batch of
    # pools), never once per slice, and its unchanged UID is kept.
    assert 1 <= len(node_gets(srv)) <= 2
    assert owner_uids(srv) == {node_uid(srv)}


def test_steady_state_never_gets_the_node(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(4)), resync_period_s=0.2)
    assert c.synced(10)
    srv.clear_requests()
    # Periodic relists come and go: nothing changed, so no Node GET and no write.
    wait_for(lambda: listings(srv) >= 3, what="resyncs")
    assert node_gets(srv) == [] and writes(srv) == []


def test_a_given_uid_is_never_second_guessed(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(2)), Owner(name=NODE, uid="given-uid"))
    assert c.synced(10)
    srv.restart(keep_state=False)
    wait_for(lambda: owner_uids(srv) == {"given-uid"}, what="republished")
    assert c.synced(10)
    assert node_gets(srv) == []


def test_a_uid_just_read_serves_the_first_publish_then_is_checked(
    srv: FakeAPIServer, harness: Harness
) -> None:
    """``node_uid`` (the daemon's start-up read of the Node) stands for the first batch's
    lookup: no second GET at start; after that a new Node is noticed as without it."""
    srv.clear_requests()
    c = harness.start(srv, resources(node1=pool_of(2)), node_uid=node_uid(srv))
    assert c.synced(10)
    assert node_gets(srv) == []
    assert owner_uids(srv) == {node_uid(srv)}
    srv.restart(keep_state=False)
    srv.put_object(node())  # registered again: same name, new UID
    new = node_uid(srv)
    wait_for(lambda: owner_uids(srv) == {new}, what="slices owned by the new Node")
    assert len(node_gets(srv)) >= 1


def test_a_uid_read_long_before_the_first_publish_is_checked_as_a_looked_up_one() -> None:
    from agent.slices.backoff import Backoff
    from agent.slices.owner import SEED_TRUSTED_S, OwnerUID
    from agent.slices.sync import Create, PoolPlan

    now = [0.0]
    creating = PoolPlan(pool="p", generation=1, creates=(Create(0, {}),))

    def seeded() -> OwnerUID:
        return OwnerUID(Owner(name=NODE), lambda name: "uid-now", Backoff(1, 2),
                        clock=lambda: now[0], known="uid-read")

    soon = seeded()
    soon.new_batch(False)  # rounds with nothing due keep the seed
    soon.new_batch(True)
    ref = soon.ref()
    assert ref is not None and ref.uid == "uid-read"
    assert not soon.stale(creating, [], ref)  # the first batch takes it as looked up
    soon.new_batch(True)
    assert soon.stale(creating, [], ref)  # the next one checks a create's owner again

    late = seeded()
    now[0] = SEED_TRUSTED_S + 1
    late.new_batch(True)
    ref = late.ref()
    assert ref is not None and late.stale(creating, [], ref)
