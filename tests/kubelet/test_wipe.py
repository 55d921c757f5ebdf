"""Slice wiping as a restarting kubelet does it: one DELETE collection by node field selector."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.fakes.kubelet import KubeletStandIn


class Recorder(ThreadingHTTPServer):
    """Answers DELETE collection like an API server would, and remembers each request."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[tuple[str, str, dict[str, list[str]], str]] = []
        self.status = 200
        self.deleted = 2


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def do_DELETE(self) -> None:
        url = urlsplit(self.path)
        srv = self.server
        srv.requests.append(
            ("DELETE", url.path, parse_qs(url.query), self.headers.get("Accept", ""))
        )
        if srv.status == 200:
            body: dict[str, Any] = {
                "kind": "ResourceSliceList",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": "42"},
                "items": [{"metadata": {"name": f"s{i}"}} for i in range(srv.deleted)],
            }
        else:
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Forbidden",
                "code": srv.status,
                "message": "resourceslices is forbidden",
            }
        data = json.dumps(body).encode()
        self.send_response(srv.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Recorder]:
    srv = Recorder()
    thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def api_client(server: Recorder) -> Iterator[Any]:
    config = k8s.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    with k8s.ApiClient(config) as api:
        yield api


def test_wipe_deletes_the_nodes_slices(server: Recorder, api_client: Any, root: Path) -> None:
    kubelet = KubeletStandIn(root, api_client=api_client, node_name="node-a")
    assert kubelet.wipe_slices() == 2
    method, path, query, accept = server.requests[0]
    assert (method, path) == ("DELETE", "/apis/resource.k8s.io/v1/resourceslices")
    assert query == {"fieldSelector": ["spec.nodeName=node-a"]}
    assert accept == "application/json"


def test_wipe_one_driver_adds_the_driver_selector(
    server: Recorder, api_client: Any, root: Path
) -> None:
    kubelet = KubeletStandIn(root, api_client=api_client, node_name="node-a")
    server.deleted = 0
    assert kubelet.wipe_slices("gpu.example.com", api_version="v1beta2") == 0
    _, path, query, _ = server.requests[0]
    assert path == "/apis/resource.k8s.io/v1beta2/resourceslices"
    assert query == {"fieldSelector": ["spec.nodeName=node-a,spec.driver=gpu.example.com"]}


def test_wipe_refused_by_the_server_raises(server: Recorder, api_client: Any, root: Path) -> None:
    server.status = 403
    kubelet = KubeletStandIn(root, api_client=api_client, node_name="node-a")
    with pytest.raises(ApiException) as err:
        kubelet.wipe_slices()
    assert err.value.status == 403
    assert "forbidden" in str(err.value.body)


@pytest.mark.parametrize(("with_client", "node"), [(False, "node-a"), (True, None), (True, "")])
def test_wipe_needs_client_and_node(
    api_client: Any, root: Path, with_client: bool, node: Any
) -> None:
    kubelet = KubeletStandIn(root, api_client=api_client if with_client else None, node_name=node)
    with pytest.raises(RuntimeError, match="api_client and a node_name"):
        kubelet.wipe_slices()


def slice_body(name: str, node: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def test_wipe_through_the_fake_api_server(root: Path) -> None:
    # The same call against the project's fake kube-apiserver: only this node's slices go.
    from tests.fakes.apiserver import FakeAPIServer

    with FakeAPIServer() as srv, srv.api_client() as api:
        objects = k8s.CustomObjectsApi(api)
        for name, node, driver in [
            ("a-gpu", "node-a", "gpu.example.com"),
            ("a-nic", "node-a", "nic.example.com"),
            ("b-gpu", "node-b", "gpu.example.com"),
        ]:
            objects.create_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", slice_body(name, node, driver)
            )
        kubelet = KubeletStandIn(root, api_client=api, node_name="node-a")
        assert kubelet.wipe_slices("nic.example.com") == 1
        assert kubelet.wipe_slices() == 1
        left = objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
        assert [s["metadata"]["name"] for s in left["items"]] == ["b-gpu"]
        assert kubelet.wipe_slices() == 0
