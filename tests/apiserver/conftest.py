"""Fixtures for the fake API server's own tests: a running server and clients bound to it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fakes.apiserver import FakeAPIServer


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.2) as server:
        yield server


@pytest.fixture
def api_client(srv: FakeAPIServer) -> Iterator[client.ApiClient]:
    c = srv.api_client()
    yield c
    c.close()


@pytest.fixture
def rapi(api_client: client.ApiClient) -> client.ResourceV1Api:
    return client.ResourceV1Api(api_client)


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def raw(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a client method and return the JSON body as the server sent it (no typed model)."""
    resp = fn(*args, _preload_content=False, **kwargs)
    data: dict[str, Any] = json.loads(resp.data)
    return data


def fails(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """Call a client method that must fail; return the HTTP status and the Status body."""
    with pytest.raises(ApiException) as info:
        fn(*args, **kwargs)
    body = json.loads(info.value.body) if info.value.body else {}
    return info.value.status, body


def make_slice(
    name: str = "",
    node: str = "node-a",
    driver: str = "dra-agent.io",
    devices: int = 1,
    generate: str = "",
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if name else {"generateName": generate or f"{node}-"}
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}}}
                for i in range(devices)
            ],
        },
    }
    body["spec"].update(spec)
    return body


def make_claim(name: str = "claim", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.dra-agent.io"}}]}},
    }


def make_node(name: str = "node-a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name}}}


def send(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    query: list[tuple[str, str]] | None = None,
) -> tuple[int, dict[str, str], Any]:
    """Send a body the typed client would refuse to build (the client validates dict bodies
    against its models), through the same ApiClient: (status, headers, decoded JSON body)."""
    m, url, headers, data, _ = api_client.param_serialize(
        method, path, query_params=query or [], header_params={"Content-Type": content_type},
        body=body)
    resp = api_client.call_api(m, url, header_params=headers, body=data)
    resp.read()
    payload = json.loads(resp.data) if resp.data else None
    return resp.status, dict(resp.getheaders()), payload
