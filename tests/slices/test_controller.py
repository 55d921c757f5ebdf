"""The controller against the fake API server, through the real kubernetes client."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from kubernetes import client as k8s

from agent.slices import (
    DroppedFieldsError,
    Owner,
    PoolValidationError,
    RejectedSliceError,
    chunk_devices,
    start,
)
from discovery.model import Pool, Slice
from tests.fakes.apiserver import FakeAPIServer
from tests.slices.conftest import FAST, Harness, listings, our_slices, slice_threads, writes
from tests.slices.helpers import DRIVER, NODE, device, devices, pool_of, resources
from tests.waiting import wait_for


def wipe(srv: FakeAPIServer, node_name: str = NODE) -> None:
    """What a restarting kubelet does: one deletecollection for the node."""
    k8s.ResourceV1Api(srv.api_client()).delete_collection_resource_slice(
        field_selector=f"spec.nodeName={node_name}"
    )


def device_names(objs: list[dict[str, Any]]) -> list[str]:
    ordered = sorted(objs, key=lambda o: o["metadata"]["name"])
    return [d["name"] for o in ordered for d in o["spec"].get("devices", [])]


def test_create_publishes_the_pool_owned_by_the_node(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(8)))
    assert c.synced(10)
    assert c.active and c.api_version == "v1"
    (obj,) = our_slices(srv)
    node_uid = srv.get_object("nodes", NODE)["metadata"]["uid"]
    assert obj["metadata"]["name"].startswith("00000-dra-agent.io-node1-")
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert obj["spec"]["nodeName"] == NODE
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert device_names([obj]) == [f"gpu-{i}" for i in range(8)]
    assert harness.metric("dra_agent_resourceslice_writes_total", verb="create", result="ok") == 1
    assert harness.metric("dra_agent_last_successful_publish_timestamp_seconds") > 0
    assert harness.errors == []


def test_node_uid_is_looked_up_once_or_not_at_all(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(2), other=pool_of(2)))
    assert c.synced(10)
    assert [r.path for r in srv.requests if "/nodes/" in r.path] == ["/api/v1/nodes/node1"]
    # Stopped first: c would see c2 rewrite the owner of its slices and check its Node again.
    c.stop()
    srv.clear_requests()
    c2 = harness.start(srv, resources(node1=pool_of(2)), Owner(name=NODE, uid="given-uid"))
    assert c2.synced(10)
    assert not [r for r in srv.requests if "/nodes/" in r.path]


def test_changed_device_is_one_update_in_place(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(8)))
    assert c.synced(10)
    (before,) = our_slices(srv)
    srv.clear_requests()
    devs = devices(8)
    devs[3]["attributes"]["health"] = {"string": "degraded"}
    c.update(resources(node1=Pool(chunk_devices(devs))))
    assert c.synced(10)
    (after,) = our_slices(srv)
    assert writes(srv) == [("update", f"/apis/resource.k8s.io/v1/resourceslices/"
                                      f"{before['metadata']['name']}", 200)]
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"]
    assert after["spec"]["devices"][3]["attributes"]["health"] == {"string": "degraded"}


def test_split_of_2048_devices_into_16_slices_and_back(
    srv: FakeAPIServer, harness: Harness
) -> None:
    c = harness.start(srv, resources(node1=pool_of(8)))
    assert c.synced(10)
    c.update(resources(node1=pool_of(2048)))
    assert c.synced(20)
    objs = our_slices(srv)
    assert len(objs) == 16
    assert device_names(objs) == [f"gpu-{i}" for i in range(2048)]
    assert {o["spec"]["pool"]["generation"] for o in objs} == {2}  # 1 at the start, creates bump
    assert {o["spec"]["pool"]["resourceSliceCount"] for o in objs} == {16}
    assert sorted(o["metadata"]["name"][:6] for o in objs) == [f"{i:05x}-" for i in range(16)]

    srv.clear_requests()
    c.update(resources(node1=pool_of(8)))
    assert c.synced(10)
    (obj,) = our_slices(srv)
    # Shrinking is deletes and one update: the generation stays (upstream's rule).
    assert obj["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    verbs = [w[0] for w in writes(srv)]
    assert verbs.index("update") > max(i for i, v in enumerate(verbs) if v == "delete")
    assert verbs.count("delete") == 15 and verbs.count("update") == 1


def test_restart_with_the_same_hardware_adopts_with_zero_writes(
    srv: FakeAPIServer, harness: Harness
) -> None:
    first = harness.start(srv, resources(node1=pool_of(300)))
    assert first.synced(10)
    names = sorted(o["metadata"]["name"] for o in our_slices(srv))
    first.stop()
    srv.clear_requests()
    second = harness.start(srv, resources(node1=pool_of(300)))
    assert second.synced(10)
    time.sleep(0.3)
    assert writes(srv) == []
    assert sorted(o["metadata"]["name"] for o in our_slices(srv)) == names


def test_steady_state_makes_no_writes_even_across_watch_drops(
    srv: FakeAPIServer, harness: Harness
) -> None:
    c = harness.start(srv, resources(node1=pool_of(200)))
    assert c.synced(10)
    srv.clear_requests()
    srv.drop_watches()
    time.sleep(0.5)
    srv.drop_watches(graceful=True)
    time.sleep(0.5)
    assert writes(srv) == []
    assert listings(srv) == 0  # resumed, not relisted


def test_kubelet_wipe_is_repaired_from_the_watch(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(256)))  # resync far away: only the watch
    assert c.synced(10)
    generation = our_slices(srv)[0]["spec"]["pool"]["generation"]
    srv.clear_requests()
    started = time.monotonic()
    wipe(srv)
    wait_for(lambda: len(our_slices(srv)) == 2, what="slices back")
    elapsed = time.monotonic() - started
    print(f"wipe repaired in {elapsed:.3f}s")
    objs = our_slices(srv)
    assert {o["spec"]["pool"]["generation"] for o in objs} == {generation + 1}
    assert device_names(objs) == [f"gpu-{i}" for i in range(256)]
    assert c.synced(10)
    # The burst of deletions was waited out: no write was planned on a half-deleted pool.
    assert [w[0] for w in writes(srv)] == ["create", "create"]


def test_one_deleted_slice_is_recreated_at_a_new_generation(
    srv: FakeAPIServer, harness: Harness
) -> None:
    c = harness.start(srv, resources(node1=pool_of(384)))
    assert c.synced(10)
    generation = our_slices(srv)[0]["spec"]["pool"]["generation"]
    victim = sorted(o["metadata"]["name"] for o in our_slices(srv))[1]
    srv.clear_requests()
    k8s.ResourceV1Api(srv.api_client()).delete_resource_slice(victim)
    wait_for(lambda: len(our_slices(srv)) == 3, what="slice back")
    assert c.synced(10)
    # Upstream's rule: a create bumps the generation, so every slice is rewritten with it.
    assert [w[0] for w in writes(srv)] == ["delete", "update", "update", "create"]
    assert {o["spec"]["pool"]["generation"] for o in our_slices(srv)} == {generation + 1}
    assert sorted(o["metadata"]["name"] for o in our_slices(srv))[1].startswith("00001-")


def test_hand_edit_is_reverted(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(4)))
    assert c.synced(10)
    api = k8s.ResourceV1Api(srv.api_client())
    (obj,) = our_slices(srv)
    obj["spec"]["devices"] = obj["spec"]["devices"][:1]
    obj["metadata"]["labels"] = {"edited-by": "hand"}
    api.replace_resource_slice(obj["metadata"]["name"], obj)
    wait_for(lambda: len(our_slices(srv)[0]["spec"]["devices"]) == 4, what="edit reverted")
    (fixed,) = our_slices(srv)
    assert fixed["metadata"]["labels"] == {"edited-by": "hand"}  # not ours to remove


def test_api_server_down_then_back(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(8)))
    assert c.synced(10)
    srv.stop()
    c.update(resources(node1=pool_of(300), extra=pool_of(2)))
    time.sleep(0.6)
    assert not c.synced(0)
    srv.start()
    assert c.synced(15)
    objs = our_slices(srv)
    by_pool: dict[str, list[str]] = {}
    for o in objs:
        by_pool.setdefault(o["spec"]["pool"]["name"], []).append(o["metadata"]["name"])
    assert {p: len(n) for p, n in by_pool.items()} == {"node1": 3, "extra": 1}
    assert device_names([o for o in objs if o["spec"]["pool"]["name"] == NODE]) == [
        f"gpu-{i}" for i in range(300)
    ]
    assert harness.metric("dra_agent_resourceslice_errors_total", reason="unavailable") >= 1


def test_lost_server_state_is_republished_after_410(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(8)))
    assert c.synced(10)
    srv.clear_requests()
    srv.restart(keep_state=False)  # history gone: the watch resumes into 410 Expired
    wait_for(lambda: len(our_slices(srv)) == 1, what="slice republished")
    assert c.synced(10)
    assert listings(srv) >= 1


def test_watch_expiry_relists_without_writing(harness: Harness, caplog: Any) -> None:
    caplog.set_level("INFO", logger="agent.slices")
    with FakeAPIServer(event_log_size=3, bookmark_interval=0.2) as server:
        server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        c = harness.start(server, resources(node1=pool_of(4)))
        assert c.synced(10)
        server.clear_requests()
        server.delay(0.5, verb="watch")
        server.drop_watches()
        for i in range(6):  # another node's churn rolls the history past our version
            server.put_object({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"other-{i}"},
                "spec": {"driver": DRIVER, "nodeName": "node2", "devices": [],
                         "pool": {"name": "node2", "generation": 0, "resourceSliceCount": 1}},
            })
        wait_for(lambda: listings(server) == 1, what="a relist")
        server.delay(0)
        time.sleep(0.3)
        assert c.synced(10)
        assert writes(server) == []
        assert any(r.getMessage() == "watch expired, listing again" for r in caplog.records)
        c.stop()


def test_v1beta1_only_server_gets_nested_devices(harness: Harness) -> None:
    with FakeAPIServer(served_resource_versions=("v1beta1",)) as server:
        server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        c = harness.start(server, resources(node1=pool_of(3)))
        assert c.synced(10)
        assert c.api_version == "v1beta1"
        (obj,) = our_slices(server, "v1beta1")
        assert obj["spec"]["devices"][0]["basic"]["attributes"]["index"] == {"int": 0}
        server.clear_requests()
        time.sleep(0.3)
        assert writes(server) == []  # the nested form compares equal: no update loop
        assert all("/v1beta1/" in r.path for r in server.requests if "resourceslices" in r.path)
        c.stop()


def test_node_selector_pool_is_published_without_node_name(
    srv: FakeAPIServer, harness: Harness
) -> None:
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "fabric", "operator": "In", "values": ["a"]}]}]}
    foreign = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "00000-dra-agent.io-node2-zzzzz", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node2", "uid": "u2",
             "controller": True}]},
        "spec": {"driver": DRIVER, "nodeSelector": selector, "devices": [],
                 "pool": {"name": "node2-fabric", "generation": 0, "resourceSliceCount": 1}},
    }
    srv.put_object(foreign)
    res = resources(node1=pool_of(2), fabric=Pool(pool_of(2).slices, node_selector=selector))
    c = harness.start(srv, res)
    assert c.synced(10)
    fabric = [o for o in our_slices(srv) if o["spec"]["pool"]["name"] == "fabric"]
    assert len(fabric) == 1 and "nodeName" not in fabric[0]["spec"]
    assert fabric[0]["spec"]["nodeSelector"] == selector
    assert srv.get_object("resourceslices", foreign["metadata"]["name"]) is not None
    # Its own scope is watched too: a deleted selector slice comes back.
    k8s.ResourceV1Api(srv.api_client()).delete_resource_slice(fabric[0]["metadata"]["name"])
    wait_for(lambda: len([o for o in our_slices(srv)
                          if o["spec"]["pool"]["name"] == "fabric"]) == 1, what="fabric back")
    c.update(resources(node1=pool_of(2)))
    assert c.synced(10)
    assert sorted(o["spec"]["pool"]["name"] for o in our_slices(srv)) == ["node1", "node2-fabric"]


def test_server_rejection_is_reported_once_and_other_pools_publish(
    srv: FakeAPIServer, harness: Harness
) -> None:
    srv.fail_next(1, 422, verb="create")
    c = harness.start(srv, resources(aaa=pool_of(2), node1=pool_of(2)))
    assert c.synced(10)  # the refused pool was retried, and the server took it this time
    assert sorted(o["spec"]["pool"]["name"] for o in our_slices(srv)) == ["aaa", "node1"]
    (err,) = harness.errors_of(RejectedSliceError)
    assert err.pool == "aaa" and "slice #0" in str(err)
    assert [(w[0], w[2]) for w in writes(srv)] == [("create", 422), ("create", 201),
                                                   ("create", 201)]
    assert harness.metric("dra_agent_resourceslice_errors_total", reason="invalid") == 1


def test_rejected_pool_is_retried_with_backoff_until_the_server_accepts_it(
    srv: FakeAPIServer, harness: Harness, caplog: Any
) -> None:
    caplog.set_level("DEBUG", logger="agent.slices")
    srv.fail_next(4, 422, verb="create")
    timing = replace(FAST, rejected_retry_max_s=0.1)
    c = harness.start(srv, resources(node1=pool_of(2)), timing=timing)
    assert c.synced(10)
    assert [w[2] for w in writes(srv)] == [422, 422, 422, 422, 201]
    assert len(harness.errors_of(RejectedSliceError)) == 1  # said once per content
    assert harness.metric("dra_agent_resourceslice_errors_total", reason="invalid") == 4
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert [r.levelname for r in rejected] == ["ERROR", "DEBUG", "DEBUG", "DEBUG"]
    delays = [r.__dict__["retry_in_s"] for r in rejected]
    assert all(0 < d <= 0.1 for d in delays), delays  # the cap holds
    assert any("publishing recovered" in r.getMessage() for r in caplog.records)


def test_pool_without_node_selection_is_refused_before_any_write(
    srv: FakeAPIServer, harness: Harness
) -> None:
    owner = Owner(kind="ConfigMap", name="cfg", api_version="v1", uid="cfg-uid")
    c = harness.start(srv, resources(shared=pool_of(2)), owner)
    wait_for(lambda: harness.errors, what="an error")
    (err,) = harness.errors_of(PoolValidationError)
    assert str(err) == (
        "pool 'shared' is not publishable: pool 'shared': spec: no node selection: without a "
        "Node owner the pool needs a node_selector or all_nodes (allNodes is never implied)")
    assert "\n" not in str(err) and writes(srv) == [] and not c.synced(0)
    selector = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    c.update(resources(shared=Pool(pool_of(2).slices, node_selector=selector)))
    assert c.synced(10)
    (published,) = our_slices(srv)
    assert published["spec"]["nodeSelector"] == selector and "allNodes" not in published["spec"]
    # Asked for explicitly, allNodes is published (and only then).
    c.update(resources(shared=Pool(pool_of(2).slices, all_nodes=True)))
    wait_for(lambda: [s["spec"].get("allNodes") for s in our_slices(srv)] == [True],
             what="the pool published for all nodes")
    (published,) = our_slices(srv)
    assert "nodeSelector" not in published["spec"] and "nodeName" not in published["spec"]


def test_local_limits_stop_a_pool_before_any_write(srv: FakeAPIServer, harness: Harness) -> None:
    bad = device(0)
    bad["attributes"]["x"] = {"string": "y" * 65}
    c = harness.start(srv, resources(aaa=Pool((Slice((bad,)),)), node1=pool_of(2)))
    wait_for(lambda: harness.errors, what="an error")
    wait_for(lambda: len(our_slices(srv)) == 1, what="the good pool")
    (err,) = harness.errors_of(PoolValidationError)
    assert "pool 'aaa' slice #0: spec.devices[0].attributes['x']: string: must be at most 64" in (
        str(err))
    assert [w[0] for w in writes(srv)] == ["create"]  # only the good pool's
    c.update(resources(aaa=Pool((Slice((bad,)),)), node1=pool_of(2)))
    time.sleep(0.3)
    assert len(harness.errors) == 1  # the same bad content is not reported again


def test_dropped_fields_are_reported_once_without_an_update_loop(harness: Harness) -> None:
    with FakeAPIServer(feature_gates={"DRADeviceTaints": False}) as server:
        server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        devs = devices(2)
        devs[0]["taints"] = [{"key": "example.com/ecc", "effect": "NoSchedule"}]
        res = resources(node1=Pool((Slice(tuple(devs)),)))
        c = harness.start(server, res)
        assert c.synced(10)
        time.sleep(0.4)
        c.update(res)  # the same content again: still nothing to do
        assert c.synced(10)
        assert [w[0] for w in writes(server)] == ["create"]
        (err,) = harness.errors_of(DroppedFieldsError)
        assert err.gates == ("DRADeviceTaints",)
        c.stop()


def test_conflicts_and_server_errors_are_retried(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(4)))
    assert c.synced(10)
    srv.fail_next(2, 409, verb="update")
    srv.fail_next(2, 503, verb="create")
    c.update(resources(node1=pool_of(300)))
    assert c.synced(10)
    objs = our_slices(srv)
    assert len(objs) == 3
    assert device_names(objs) == [f"gpu-{i}" for i in range(300)]


def test_without_api_server_the_controller_is_inactive(caplog: Any) -> None:
    c = start(None, DRIVER, Owner(name=NODE), resources(node1=pool_of(1)))
    c.update(resources(node1=pool_of(2)))
    assert not c.active and c.api_version is None and not c.synced(0.01)
    c.stop()
    assert sum("not published" in r.getMessage() for r in caplog.records) == 1
    assert slice_threads() == []


def test_stop_waits_for_the_request_in_flight_and_ends_every_thread(
    srv: FakeAPIServer, harness: Harness
) -> None:
    c = harness.start(srv, resources(node1=pool_of(2)))
    assert c.synced(10)
    assert len(slice_threads()) == 2  # one worker, one watcher
    srv.delay(0.5, verb="create")
    srv.clear_requests()
    c.update(resources(node1=pool_of(2), extra=pool_of(1)))
    time.sleep(0.2)  # the create is now held by the server
    c.stop()
    assert slice_threads() == []
    assert [w[0] for w in writes(srv)] == ["create"]  # answered before the worker ended
    srv.delay(0)
    srv.clear_requests()
    time.sleep(0.2)
    assert writes(srv) == []  # nothing more after stop()


def test_a_callers_stop_event_stops_the_controller(srv: FakeAPIServer, harness: Harness) -> None:
    import threading

    event = threading.Event()
    c = harness.start(srv, resources(node1=pool_of(2)), stop_event=event)
    assert c.synced(10)
    event.set()
    wait_for(lambda: slice_threads() == [], what="threads to end")


def test_periodic_resync_relists_without_writing(srv: FakeAPIServer, harness: Harness) -> None:
    c = harness.start(srv, resources(node1=pool_of(130)), resync_period_s=0.3)
    assert c.synced(10)
    srv.clear_requests()
    wait_for(lambda: listings(srv) >= 2, what="two resyncs")
    assert c.synced(10)
    assert writes(srv) == []


def test_owner_other_than_a_node_needs_a_uid() -> None:
    import pytest

    with pytest.raises(ValueError, match="needs a uid"):
        start(None, DRIVER, Owner(kind="ConfigMap", name="x", api_version="v1"), None)


def test_a_refused_watch_is_reported_once_and_retried(
    srv: FakeAPIServer, harness: Harness
) -> None:
    from agent.slices import ApiError

    srv.fail_next(3, 403, verb="watch")
    c = harness.start(srv, resources(node1=pool_of(2)))
    assert c.synced(10)
    (err,) = harness.errors_of(ApiError)
    assert err.status == 403 and "fieldSelector=spec.driver=dra-agent.io,spec.nodeName=node1" in (
        str(err))
    assert len(our_slices(srv)) == 1


def test_a_429_is_retried_no_sooner_than_its_retry_after(
    srv: FakeAPIServer, harness: Harness
) -> None:
    """The fake's 429 says Retry-After: 1, past FAST's whole back-off (0.05-0.5 s): a fleet
    that a busy server turns away comes back when it asked, spread over 1-1.5 s."""
    srv.fail_next(2, 429, verb="create")
    started = time.monotonic()
    c = harness.start(srv, resources(node1=pool_of(2)), timing=FAST)
    assert c.synced(20)
    assert [w[2] for w in writes(srv)] == [429, 429, 201]
    assert time.monotonic() - started >= 2.0
