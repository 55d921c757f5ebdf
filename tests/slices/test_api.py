"""The plain-dict client against the fake API server: errors, paging, watch."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from agent.kube.transport import as_kubehttp
from agent.slices.api import ApiError, KubeSliceClient
from tests.fakes.apiserver import FakeAPIServer
from tests.slices.helpers import DRIVER, NODE, devices

SELECTOR = f"spec.driver={DRIVER},spec.nodeName={NODE}"


def slice_obj(n: int = 1, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": DRIVER, "nodeName": NODE, "devices": devices(n),
        "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
    }
    body.update(spec)
    return {"metadata": {"generateName": f"00000-{DRIVER}-{NODE}-"}, "spec": body}


def test_create_update_delete_round_trip(srv: FakeAPIServer) -> None:
    client = KubeSliceClient(srv.kube())
    assert client.served_versions() == ["v1"]
    created = client.create("v1", slice_obj(2))
    name = created["metadata"]["name"]
    assert name.startswith(f"00000-{DRIVER}-{NODE}-") and len(name) == len(
        f"00000-{DRIVER}-{NODE}-") + 5
    created["spec"]["devices"] = created["spec"]["devices"][:1]
    updated = client.update("v1", created)
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    with pytest.raises(ApiError) as stale:
        client.update("v1", created)  # the old resourceVersion
    assert stale.value.conflict and stale.value.status == 409
    with pytest.raises(ApiError) as wrong_uid:
        client.delete("v1", name, "not-the-uid", None)
    assert wrong_uid.value.conflict
    rv = client.delete("v1", name, updated["metadata"]["uid"],
                       updated["metadata"]["resourceVersion"])
    assert rv is not None and int(rv) > int(updated["metadata"]["resourceVersion"])
    assert client.get("v1", name) is None
    with pytest.raises(ApiError) as gone:
        client.delete("v1", name, None, None)
    assert gone.value.not_found


def test_invalid_slice_gives_422_with_the_fields(srv: FakeAPIServer) -> None:
    client = KubeSliceClient(srv.kube())
    with pytest.raises(ApiError) as info:
        client.create("v1", slice_obj(129))
    err = info.value
    assert err.invalid and not err.transient
    assert any(c.field == "spec.devices" for c in err.causes)


def test_list_follows_continue_tokens(srv: FakeAPIServer) -> None:
    client = KubeSliceClient(srv.kube(), page_size=2)
    for _ in range(5):
        client.create("v1", slice_obj(1))
    result = client.list("v1", SELECTOR)
    assert len(result.items) == 5 and result.requests == 3
    assert int(result.resource_version) >= max(
        int(o["metadata"]["resourceVersion"]) for o in result.items)


def test_watch_delivers_events_and_expiry(srv: FakeAPIServer) -> None:
    client = KubeSliceClient(srv.kube())
    start_rv = client.list("v1", SELECTOR).resource_version
    created = client.create("v1", slice_obj(1))
    stream = client.watch("v1", SELECTOR, start_rv, 5)
    event = next(iter(stream))
    assert event.type == "ADDED" and event.obj["metadata"]["name"] == created["metadata"]["name"]
    stream.close()
    srv.restart(keep_state=False)
    with pytest.raises(ApiError) as info:
        list(client.watch("v1", SELECTOR, start_rv, 5))
    assert info.value.expired


def test_no_server_is_a_transient_error_with_status_0() -> None:
    from kubernetes import client as k8s

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = False
    with pytest.raises(ApiError) as info:
        KubeSliceClient(as_kubehttp(k8s.ApiClient(configuration))).served_versions()
    assert info.value.status == 0 and info.value.transient


def test_an_older_client_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match=">= 37"):
        KubeSliceClient(as_kubehttp(object()))
