"""KubeHTTP with the lean backend against the fake API server: requests, errors, watch."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.kube.client import api_client
from agent.kube.errors import KubeAPIError, parse_status
from agent.kube.lean import LeanBackend
from agent.kube.transport import KubeHTTP, Response, as_kubehttp
from agent.slices.api import KubeSliceClient
from tests.fakes.apiserver import FakeAPIServer
from tests.kube.conftest import Answer, EchoServer, kubeconfig
from tests.slices.helpers import DRIVER, NODE, devices

SELECTOR = f"spec.driver={DRIVER},spec.nodeName={NODE}"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


@pytest.fixture
def http(srv: FakeAPIServer, tmp_path: Path) -> KubeHTTP:
    client = api_client(str(srv.write_kubeconfig(tmp_path / "kubeconfig")))
    assert client is not None and isinstance(client.backend, LeanBackend)
    return client


def slice_obj(n: int = 1) -> dict[str, object]:
    return {"metadata": {"generateName": f"{NODE}-"}, "spec": {
        "driver": DRIVER, "nodeName": NODE, "devices": devices(n),
        "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1}}}


def test_get_json_with_the_kubeconfig_token(http: KubeHTTP, srv: FakeAPIServer) -> None:
    group = http.request("GET", "/apis/resource.k8s.io").raise_for_status().json()
    assert [v["version"] for v in group["versions"]] == ["v1"]
    assert http.server == srv.url


def test_the_slice_client_round_trip_over_the_lean_backend(http: KubeHTTP) -> None:
    client = KubeSliceClient(http)
    created = client.create("v1", slice_obj(2))
    listed = client.list("v1", SELECTOR)
    assert [o["metadata"]["name"] for o in listed.items] == [created["metadata"]["name"]]
    assert client.delete("v1", created["metadata"]["name"], created["metadata"]["uid"], None)
    assert client.get("v1", created["metadata"]["name"]) is None


def test_watch_events_arrive_and_close_unblocks_the_reader(http: KubeHTTP) -> None:
    client = KubeSliceClient(http)
    rv = client.list("v1", SELECTOR).resource_version
    stream = client.watch("v1", SELECTOR, rv, 60)
    seen: list[str] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            seen.extend(event.type for event in stream)
        except BaseException as err:  # reported to the test thread
            errors.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    client.create("v1", slice_obj())
    deadline = threading.Event()
    for _ in range(200):
        if seen:
            break
        deadline.wait(0.02)
    stream.close()
    reader.join(10)
    assert not reader.is_alive() and not errors
    assert seen[0] == "ADDED"


def test_a_status_error_carries_reason_message_causes_and_details(http: KubeHTTP) -> None:
    missing = http.request("GET", f"{CLAIMS}/nope")
    assert missing.status == 404 and not missing.ok
    err = missing.error()
    assert err.not_found and err.reason == "NotFound" and "nope" in err.message
    assert err.about("resourceclaims", "nope") and not err.about("resourceclaims", "other")
    with pytest.raises(KubeAPIError) as invalid:
        KubeSliceClient(http).create("v1", slice_obj(129))
    assert invalid.value.invalid and invalid.value.status == 422
    assert any(c.field == "spec.devices" for c in invalid.value.causes)


def test_server_errors_are_transient(http: KubeHTTP, srv: FakeAPIServer) -> None:
    srv.fail_next(1, 503)
    with pytest.raises(KubeAPIError) as info:
        http.request("GET", "/apis/resource.k8s.io").raise_for_status()
    assert info.value.status == 503 and info.value.transient
    assert http.request("GET", "/apis/resource.k8s.io").ok


def test_a_refused_connection_is_status_0(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = kubeconfig(tmp_path / "kc", {"server": f"http://127.0.0.1:{port}"}, {})
    http = api_client(str(path))
    assert http is not None
    with pytest.raises(KubeAPIError) as info:
        http.request("GET", "/version")
    err = info.value
    assert err.status == 0 and err.transient and err.path == "/version"
    assert str(err).startswith("GET /version: ")
    with pytest.raises(KubeAPIError):
        http.stream("GET", "/apis", [("watch", "true")])


def test_bodies_queries_and_content_types_go_out_as_given(echo: EchoServer) -> None:
    http = KubeHTTP(LeanBackend(_creds(echo)))
    http.request("POST", "/x", query=[("fieldManager", "m"), ("a", "b c")], body={"k": [1]})
    http.request("PATCH", "/y", body=b"raw: yaml", content_type="application/apply-patch+yaml")
    post, patch = echo.seen
    assert post.path == "/x?fieldManager=m&a=b+c" and post.body == b'{"k":[1]}'
    assert post.headers["content-type"] == "application/json"
    assert patch.body == b"raw: yaml"
    assert patch.headers["content-type"] == "application/apply-patch+yaml"
    assert post.headers["accept"] == "application/json"


def test_answers_that_are_not_json(echo: EchoServer) -> None:
    http = KubeHTTP(LeanBackend(_creds(echo)))
    echo.answers += [Answer(200, b"<html>"), Answer(502, b"Bad gateway from the proxy")]
    with pytest.raises(KubeAPIError, match="answer is not JSON") as info:
        http.request("GET", "/a").json()
    assert info.value.reason == "BadResponse" and info.value.status == 0
    err = http.request("GET", "/b").error()
    assert err.status == 502 and err.transient and err.message == "Bad gateway from the proxy"
    assert parse_status("GET", "/c", 0, b'{"kind":"Status","code":410}').expired


def test_redirects_are_not_followed(echo: EchoServer) -> None:
    echo.answers.append(Answer(302, b""))
    assert KubeHTTP(LeanBackend(_creds(echo))).request("GET", "/a").status == 302


def test_as_kubehttp_takes_either_client(srv: FakeAPIServer, http: KubeHTTP) -> None:
    assert as_kubehttp(http) is http
    official = as_kubehttp(srv.api_client())
    assert type(official.backend).__name__ == "OfficialBackend" and official.server == srv.url
    created = KubeSliceClient(official).create("v1", slice_obj())
    assert KubeSliceClient(http).get("v1", created["metadata"]["name"]) is not None
    with pytest.raises(TypeError, match=">= 37"):
        as_kubehttp(object())


def test_response_json_of_an_empty_body_is_empty() -> None:
    assert Response("DELETE", "/x", 200, "OK").json() == {}


def _creds(echo: EchoServer):  # type: ignore[no-untyped-def]
    from agent.kube.credentials import Credentials

    return Credentials(server=echo.url(), token="t")


def test_a_watch_does_not_take_the_connection_requests_reuse(echo: EchoServer) -> None:
    # From one shared pool the stream would take the warm connection, and the request after
    # it (a publish's first write) would pay a new handshake.
    http = KubeHTTP(LeanBackend(_creds(echo)))
    http.request("GET", "/before")
    lines = http.stream("GET", "/watch")  # held open, as a watch is
    http.request("GET", "/after")
    lines.close()
    before, watch, after = echo.seen
    assert after.client_port == before.client_port != watch.client_port


def test_bodies_encode_any_mapping() -> None:
    from types import MappingProxyType

    sent: list[bytes | None] = []

    class Recorder:
        server = "http://recorder"

        def send(self, method: str, path: str, headers: dict[str, str], body: bytes | None,
                 timeout: object) -> object:
            sent.append(body)
            raise ConnectionError("recorded only")

        def close(self) -> None:
            pass

    with pytest.raises(KubeAPIError):
        KubeHTTP(Recorder()).request("POST", "/x", body={"d": (MappingProxyType({"a": 1}),)})
    assert sent == [b'{"d":[{"a":1}]}']
    with pytest.raises(TypeError, match="not JSON serializable"):
        KubeHTTP(Recorder()).request("POST", "/x", body={"d": object()})
