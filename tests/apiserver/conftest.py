"""Fixtures for the fake API server's own tests: a running server and clients bound to it."""

from __future__ import annotations

import contextlib
import json
import os
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fakes.apiserver import FakeAPIServer

#: One fixture switch: ``FAKE_APISERVER_TESTS_AGAINST=real`` runs these tests against a real
#: kube-apiserver (hack/realk8s, minor from REALK8S_VERSION) instead of the fake, so that every
#: behaviour the fake claims is checked against the real thing (hack/realk8s/test.sh does).
#: Tests that use the fake's own hooks (``srv``: fault injection, seeding) stay fake-only.
AGAINST_REAL = os.environ.get("FAKE_APISERVER_TESTS_AGAINST", "fake") == "real"


#: What a test calls to learn the server's minor: its answer then depends on that minor.
MINOR_QUERIES = frozenset({"server_minor", "minor_under_test"})


def _asks_the_minor(code: types.CodeType) -> bool:
    """Whether the code, or a function defined in it, calls one of ``MINOR_QUERIES``."""
    return not MINOR_QUERIES.isdisjoint(code.co_names) or any(
        _asks_the_minor(c) for c in code.co_consts if isinstance(c, types.CodeType))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    # A test that asks the server's minor answers per minor: ``versioned``, as the tests of
    # tests/realk8s that are; hack/realk8s/test.sh runs only these against the older minors.
    for item in items:
        function = getattr(item, "function", None)
        if (function is not None and here in Path(str(item.fspath)).parents
                and _asks_the_minor(function.__code__)):
            item.add_marker(pytest.mark.versioned)
    if not AGAINST_REAL:
        return
    fake_only = [i for i in items if "srv" in getattr(i, "fixturenames", ())
                 and here in Path(str(i.fspath)).parents]
    if fake_only:
        config.hook.pytest_deselected(items=fake_only)
        items[:] = [i for i in items if i not in fake_only]
        print(f"\n{len(fake_only)} tests use the fake's own hooks (srv) and run only against it")


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.2) as server:
        yield server


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[Any]:
    """The real kube-apiserver, started once (only with FAKE_APISERVER_TESTS_AGAINST=real)."""
    from tests.realk8s.cluster import running

    with running("fakeparity-") as cluster:
        yield cluster


@pytest.fixture
def api_client(request: pytest.FixtureRequest) -> Iterator[client.ApiClient]:
    if not AGAINST_REAL:
        c = request.getfixturevalue("srv").api_client()
        yield c
        c.close()
        return
    from kubernetes import config as kube_config

    real = request.getfixturevalue("real_cluster")
    c = kube_config.new_client_from_config(str(real.admin_kubeconfig))
    try:
        yield c
    finally:
        reset_real(c)
        c.close()


@pytest.fixture(scope="session")
def v1_only_cluster() -> Iterator[Any]:
    """A real server run as upstream's default: resource.k8s.io served at v1 only (the shared
    one serves v1beta2 and v1beta1 too, which hack/realk8s does by default)."""
    from tests.realk8s.cluster import running

    with running("fakeparity-v1-", "--resource-versions", "v1") as cluster:
        yield cluster


@pytest.fixture
def v1_only_client(request: pytest.FixtureRequest) -> Iterator[client.ApiClient]:
    """A client of a server that serves resource.k8s.io at v1 only: the fake by default."""
    if not AGAINST_REAL:
        c = request.getfixturevalue("srv").api_client()
    else:
        from kubernetes import config as kube_config

        real = request.getfixturevalue("v1_only_cluster")
        c = kube_config.new_client_from_config(str(real.admin_kubeconfig))
    try:
        yield c
    finally:
        c.close()


def server_minor(api_client: client.ApiClient) -> int:
    """The server's minor version (GET /version): the fake says 36, it models 1.36/1.37."""
    return int(client.VersionApi(api_client).get_code().minor.rstrip("+"))


SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def reset_real(api_client: client.ApiClient) -> None:
    """Leave the shared real server as empty as a new fake: the tests' objects gone, their
    namespaces finalized at once (no namespace controller runs there)."""
    rapi, core = client.ResourceV1Api(api_client), client.CoreV1Api(api_client)
    for claim in rapi.list_resource_claim_for_all_namespaces().items:
        meta = claim.metadata
        if meta.finalizers:
            rapi.patch_namespaced_resource_claim(meta.name, meta.namespace,
                                                 {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiException):
            rapi.delete_namespaced_resource_claim(meta.name, meta.namespace)
    for slice_ in rapi.list_resource_slice().items:
        if slice_.metadata.finalizers:
            rapi.patch_resource_slice(slice_.metadata.name, {"metadata": {"finalizers": None}})
    rapi.delete_collection_resource_slice()
    rapi.delete_collection_device_class()
    for node in core.list_node().items:
        core.delete_node(node.metadata.name)
    for ns in core.list_namespace().items:
        name = ns.metadata.name
        if name in SYSTEM_NAMESPACES:
            continue
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)
        with contextlib.suppress(ApiException):
            core.replace_namespace_finalize(name, {"metadata": {"name": name},
                                                   "spec": {"finalizers": []}})


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
