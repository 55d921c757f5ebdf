"""Fault hooks, request records, restarts, kubeconfig and the process mode."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.apiserver.conftest import fails, make_node, make_slice, raw
from tests.conftest import REPO
from tests.fakes.apiserver import FakeAPIServer


def test_fail_next_matches_verb_and_path(srv: FakeAPIServer, rapi: client.ResourceV1Api,
                                         core: client.CoreV1Api) -> None:
    srv.fail_next(2, 503, verb="create", path_contains="resourceslices")
    core.create_node(make_node())  # another path: unaffected
    code, body = fails(rapi.create_resource_slice, make_slice("s1"))
    assert code == 503 and body["reason"] == "ServiceUnavailable"
    assert fails(rapi.create_resource_slice, make_slice("s1"))[0] == 503
    rapi.create_resource_slice(make_slice("s1"))  # the third one goes through
    assert srv.get_object("resourceslices", "s1") is not None


def test_fail_next_by_http_method_and_429_retry_after(srv: FakeAPIServer,
                                                      rapi: client.ResourceV1Api) -> None:
    srv.fail_next(1, 500, verb="GET")
    assert fails(rapi.list_resource_slice)[0] == 500
    # A 429 carries Retry-After, as the real server's; urllib3 honours it for a GET.
    srv.clear_requests()
    srv.fail_next(1, 429, verb="GET")
    assert rapi.list_resource_slice().items == []
    assert [r.status for r in srv.requests] == [429, 200]
    srv.fail_next(1, 429, verb="POST")  # a POST is not retried
    with pytest.raises(ApiException) as info:
        rapi.create_resource_slice(make_slice("s1"))
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "1"


def test_delay_holds_matching_answers(srv: FakeAPIServer, rapi: client.ResourceV1Api) -> None:
    srv.delay(0.3, verb="list")
    start = time.monotonic()
    rapi.list_resource_slice()
    slow = time.monotonic() - start
    srv.delay(0)
    start = time.monotonic()
    rapi.list_resource_slice()
    assert slow >= 0.3 and time.monotonic() - start < slow


def test_delay_past_client_timeout_is_a_client_timeout(srv: FakeAPIServer,
                                                       rapi: client.ResourceV1Api) -> None:
    import urllib3

    srv.delay(1.0, path_contains="resourceslices")
    with pytest.raises(urllib3.exceptions.HTTPError):
        rapi.list_resource_slice(_request_timeout=0.2)


def test_requests_are_recorded_by_verb(srv: FakeAPIServer, rapi: client.ResourceV1Api) -> None:
    srv.clear_requests()
    obj = raw(rapi.create_resource_slice, make_slice("s1"))
    raw(rapi.replace_resource_slice, "s1", obj)
    rapi.list_resource_slice(field_selector="spec.nodeName=node-a")
    fails(rapi.read_resource_slice, "ghost")
    rapi.delete_collection_resource_slice(field_selector="spec.nodeName=node-a")
    verbs = [(r.verb, r.status) for r in srv.requests]
    assert verbs == [("create", 201), ("update", 200), ("list", 200), ("get", 404),
                     ("deletecollection", 200)]
    assert srv.requests[2].query == {"fieldSelector": "spec.nodeName=node-a"}
    assert srv.requests[0].path == "/apis/resource.k8s.io/v1/resourceslices"
    assert srv.requests[0].method == "POST"
    srv.clear_requests()
    assert srv.requests == []


def test_restart_keeping_state(srv: FakeAPIServer, rapi: client.ResourceV1Api) -> None:
    before = raw(rapi.create_resource_slice, make_slice("s1"))
    port = srv.port
    srv.restart(keep_state=True)
    assert srv.port == port
    after = raw(rapi.read_resource_slice, "s1")  # the client reconnects on its own
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    again = raw(rapi.create_resource_slice, make_slice("s2"))
    assert int(again["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    # History survives too: a watch from the old revision sees the later change.
    types = [e["type"] for e in watch.Watch().stream(
        rapi.list_resource_slice, resource_version=before["metadata"]["resourceVersion"],
        timeout_seconds=1)]
    assert types == ["ADDED"]


def test_restart_losing_state(srv: FakeAPIServer, rapi: client.ResourceV1Api,
                              core: client.CoreV1Api) -> None:
    old = raw(rapi.create_resource_slice, make_slice("s1"))
    srv.restart(keep_state=False)
    assert rapi.list_resource_slice().items == []
    assert [n.metadata.name for n in core.list_namespace().items] == [
        "default", "kube-node-lease", "kube-public", "kube-system"]
    new = raw(rapi.create_resource_slice, make_slice("s1"))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(rapi.list_resource_slice,
                                  resource_version=old["metadata"]["resourceVersion"],
                                  timeout_seconds=1))
    assert info.value.status == 410


def test_stop_cuts_open_watches_and_leaves_no_thread() -> None:
    import threading

    before = {t.ident for t in threading.enumerate()}
    srv = FakeAPIServer().start()
    rapi = client.ResourceV1Api(srv.api_client())
    resp = rapi.list_resource_slice(watch=True, resource_version="1", _preload_content=False)
    deadline = time.monotonic() + 2
    while srv.open_watches != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.open_watches == 1
    srv.stop()
    resp.release_conn()
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert [t.name for t in left if "fake-apiserver" in t.name or "process_request" in t.name] \
        == []


def test_kubeconfig_works_with_the_config_loader(srv: FakeAPIServer, tmp_path: Path) -> None:
    path = srv.write_kubeconfig(tmp_path / "kubeconfig")
    srv.put_object(make_slice("s1"))
    api = client.ResourceV1Api(config.new_client_from_config(config_file=str(path)))
    assert [s.metadata.name for s in api.list_resource_slice().items] == ["s1"]


def test_process_mode_prints_url_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.apiserver", "--port", "0", "--kubeconfig",
         str(kubeconfig)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        assert "default" in [n.metadata.name for n in api.list_namespace().items]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_request_is_recorded_before_its_answer_arrives(srv: FakeAPIServer,
                                                         rapi: client.ResourceV1Api) -> None:
    for i in range(20):
        rapi.create_resource_slice(make_slice(f"s{i}"))
        assert len(srv.requests) == i + 1
