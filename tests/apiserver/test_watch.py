"""Watch streams through kubernetes.watch.Watch: events, bookmarks, replay, 410, faults."""

from __future__ import annotations

import json
import threading
import time

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.apiserver.conftest import fails, make_slice, raw
from tests.fakes.apiserver import FakeAPIServer


def _events(rapi: client.ResourceV1Api, **kwargs: object) -> list[tuple[str, str, str]]:
    """(type, name, resourceVersion) of every event until the stream's timeout."""
    out = []
    w = watch.Watch()
    for ev in w.stream(rapi.list_resource_slice, **kwargs):
        obj = ev["raw_object"]
        out.append((ev["type"], obj["metadata"].get("name", ""),
                    obj["metadata"]["resourceVersion"]))
    return out


def test_watch_from_list_revision_sees_every_change_in_order(rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("before"))
    rv = raw(rapi.list_resource_slice)["metadata"]["resourceVersion"]
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    obj["spec"]["devices"] = []
    raw(rapi.replace_resource_slice, "s1", obj)
    gone = raw(rapi.delete_resource_slice, "s1")
    events = _events(rapi, resource_version=rv, timeout_seconds=1)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "s1"), ("MODIFIED", "s1"),
                                             ("DELETED", "s1")]
    rvs = [int(r) for _, _, r in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)
    assert events[-1][2] == gone["metadata"]["resourceVersion"]


def test_watch_without_revision_starts_with_current_state(rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("b"))
    rapi.create_resource_slice(make_slice("a"))
    events = _events(rapi, timeout_seconds=1)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "a"), ("ADDED", "b")]


def test_live_events_arrive_while_streaming(rapi: client.ResourceV1Api,
                                            srv: FakeAPIServer) -> None:
    timer = threading.Timer(0.2, lambda: srv.put_object(make_slice("live")))
    timer.start()
    try:
        w = watch.Watch()
        seen = []
        for ev in w.stream(rapi.list_resource_slice, timeout_seconds=5):
            seen.append((ev["type"], ev["object"].metadata.name))
            w.stop()
    finally:
        timer.join()
    assert seen == [("ADDED", "live")]


def test_bookmarks_carry_the_revision(srv: FakeAPIServer, rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("s1"))
    rv = str(srv.resource_version)
    srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "other-kind"}})
    w = watch.Watch()
    types = [ev["type"] for ev in w.stream(rapi.list_resource_slice, resource_version=rv,
                                            allow_watch_bookmarks=True, timeout_seconds=1)]
    assert types and set(types) == {"BOOKMARK"}
    # A bookmark moves the client past revisions of other kinds.
    assert w.resource_version == str(srv.resource_version)


def test_send_initial_events_ends_with_annotated_bookmark(rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("s1"))
    w = watch.Watch()
    events = []
    for ev in w.stream(rapi.list_resource_slice, send_initial_events=True,
                       resource_version_match="NotOlderThan", allow_watch_bookmarks=True,
                       timeout_seconds=1):
        events.append(ev)
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    meta = events[1]["raw_object"]["metadata"]
    assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_watch_option_errors_are_422_and_400(rapi: client.ResourceV1Api) -> None:
    code, body = fails(rapi.list_resource_slice, watch=True, send_initial_events=True)
    assert code == 422 and body["details"]["kind"] == "ListOptions"
    assert "name" not in body["details"]  # StatusDetails.name is omitempty
    assert [c["field"] for c in body["details"]["causes"]] == ["resourceVersionMatch"]
    code, _ = fails(rapi.list_resource_slice, watch=True, resource_version_match="NotOlderThan",
                    resource_version="1")
    assert code == 422
    code, _ = fails(rapi.list_resource_slice, watch=True, field_selector="spec.pool.generation=1")
    assert code == 400


def test_initial_events_without_bookmarks_have_no_end_marker(rapi: client.ResourceV1Api) -> None:
    # Not a watch-list request without allowWatchBookmarks: accepted, the initial events
    # come, but no k8s.io/initial-events-end bookmark follows them.
    created = rapi.create_resource_slice(make_slice("s1"))
    events = _events(rapi, send_initial_events=True, resource_version_match="NotOlderThan",
                     timeout_seconds=1)
    assert events == [("ADDED", "s1", created.metadata.resource_version)]


def test_too_old_revision_is_an_in_stream_410(rapi_small: client.ResourceV1Api) -> None:
    for i in range(4):
        last = rapi_small.create_resource_slice(make_slice(f"s{i}"))
    oldest = int(last.metadata.resource_version) - 1  # the log holds the last two events
    resp = rapi_small.list_resource_slice(watch=True, resource_version="1",
                                          _preload_content=False)
    assert resp.status == 200
    lines = [json.loads(line) for line in resp.data.decode().splitlines()]
    assert lines == [{"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: 1 ({oldest})", "reason": "Expired", "code": 410}}]
    # The client helper retries once, then raises ApiException(410).
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(rapi_small.list_resource_slice, resource_version="1"))
    assert info.value.status == 410


@pytest.fixture
def rapi_small() -> client.ResourceV1Api:
    with FakeAPIServer(event_log_size=2) as srv:
        yield client.ResourceV1Api(srv.api_client())


def test_selector_transitions_become_added_and_deleted(rapi: client.ResourceV1Api) -> None:
    rv = raw(rapi.list_resource_slice)["metadata"]["resourceVersion"]
    body = make_slice("s1")
    body["metadata"]["labels"] = {"pick": "yes"}
    obj = raw(rapi.create_resource_slice, body)
    obj["metadata"]["labels"] = {"pick": "no"}
    obj = raw(rapi.replace_resource_slice, "s1", obj)
    obj["metadata"]["labels"] = {"pick": "yes"}
    raw(rapi.replace_resource_slice, "s1", obj)
    events = _events(rapi, resource_version=rv, label_selector="pick=yes", timeout_seconds=1)
    assert [t for t, _, _ in events] == ["ADDED", "DELETED", "ADDED"]


def test_timeout_seconds_ends_the_stream(rapi: client.ResourceV1Api) -> None:
    # From the current revision: an older one would replay the history a real server keeps.
    rv = raw(rapi.list_resource_slice)["metadata"]["resourceVersion"]
    start = time.monotonic()
    assert _events(rapi, resource_version=rv, timeout_seconds=1) == []
    assert time.monotonic() - start < 5


def test_drop_watches_abruptly_breaks_the_client(srv: FakeAPIServer,
                                                 rapi: client.ResourceV1Api) -> None:
    timer = threading.Timer(0.3, srv.drop_watches)
    timer.start()
    try:
        with pytest.raises(urllib3.exceptions.HTTPError):
            list(watch.Watch().stream(rapi.list_resource_slice, resource_version="1"))
    finally:
        timer.join()


def test_graceful_drop_makes_the_client_rewatch(srv: FakeAPIServer,
                                                rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("s1"))

    def later() -> None:
        srv.drop_watches(graceful=True)
        time.sleep(0.2)
        srv.put_object(make_slice("s2"))

    timer = threading.Timer(0.3, later)
    timer.start()
    try:
        w = watch.Watch()
        names = []
        for ev in w.stream(rapi.list_resource_slice):
            names.append(ev["object"].metadata.name)
            if len(names) == 2:
                w.stop()
    finally:
        timer.join()
    assert names == ["s1", "s2"]
    watches = [r for r in srv.requests if r.verb == "watch"]
    assert len(watches) == 2 and watches[1].query["resourceVersion"] != ""


def test_watch_on_one_name_and_legacy_watch_path(api_client: client.ApiClient,
                                                 rapi: client.ResourceV1Api) -> None:
    rapi.create_resource_slice(make_slice("a"))
    rapi.create_resource_slice(make_slice("b"))
    resp = api_client.call_api(
        "GET", api_client.configuration.host
        + "/apis/resource.k8s.io/v1/watch/resourceslices/b?timeoutSeconds=1")
    resp.read()
    lines = [json.loads(line) for line in resp.data.decode().splitlines()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "b")]


def test_watch_from_a_revision_not_reached_yet_waits_for_it(
    srv: FakeAPIServer, rapi: client.ResourceV1Api
) -> None:
    ahead = str(srv.resource_version + 1)
    timer = threading.Timer(0.2, lambda: srv.put_object(make_slice("next")))
    timer.start()
    try:
        events = _events(rapi, resource_version=ahead, timeout_seconds=1)
    finally:
        timer.join()
    assert events == []  # the write at `ahead` itself is not newer than `ahead`
    assert srv.get_object("resourceslices", "next") is not None


def test_server_ends_a_watch_the_client_closed(srv: FakeAPIServer,
                                               rapi: client.ResourceV1Api) -> None:
    srv.put_object(make_slice("s1"))
    w = watch.Watch()
    for _ in w.stream(rapi.list_resource_slice):
        assert srv.open_watches == 1
        w.stop()
    deadline = time.monotonic() + 3
    while srv.open_watches and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.open_watches == 0
