"""Claims read from the (fake) API server through the kubernetes client, end to end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.claim.model import ClaimFetchError, ClaimNotFoundError, ClaimRef
from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.plugin.apiclaims import APIClaimSource
from discovery.model import Inventory
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn
from tests.plugnode import DRIVER, NodeEdits, build_node, gpu, make_claim, ref


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(served_resource_versions=("v1", "v1beta1")) as s:
        yield s


def test_get_claim_from_api_server(srv: FakeAPIServer) -> None:
    claim = srv.put_object(make_claim("c1", ["gpu-0"]))
    source = APIClaimSource(srv.kube())
    got = source.get(ClaimRef("default", "c1", claim["metadata"]["uid"]))
    assert got["metadata"]["uid"] == claim["metadata"]["uid"]
    assert got["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    with pytest.raises(ClaimNotFoundError, match="default/nope"):
        source.get(ClaimRef("default", "nope", "u"))


def test_server_errors_become_claim_errors(srv: FakeAPIServer) -> None:
    claim = srv.put_object(make_claim("c1", ["gpu-0"]))
    srv.fail_next(1, 500, verb="get")
    with pytest.raises(ClaimFetchError, match="500"):
        APIClaimSource(srv.kube()).get(ClaimRef("default", "c1", claim["metadata"]["uid"]))


def test_falls_back_to_an_older_served_version() -> None:
    with FakeAPIServer(served_resource_versions=("v1beta1",)) as old:
        claim = old.put_object(make_claim("c1", ["gpu-0"]))
        got = APIClaimSource(old.kube()).get(
            ClaimRef("default", "c1", claim["metadata"]["uid"]))
        assert got["metadata"]["name"] == "c1"


def test_plugin_with_api_server_prepares_and_unprepares_without_it(
    srv: FakeAPIServer, short_root: Path
) -> None:
    boot = short_root / "boot_id"
    boot.write_text("b\n")
    n = build_node(short_root)  # only for its options and directories
    n.kubelet.stop()
    n.server.stop(0)
    server = plugin_server(n.options, n.prepare_options,
                           lambda: Inventory(devices=(gpu(0), gpu(1))), NodeEdits(),
                           APIClaimSource(srv.kube()), metrics=Metrics())
    server.start()
    try:
        with KubeletStandIn(n.options.kubelet_dir / "plugins_registry") as kubelet:
            kubelet.wait_registered(DRIVER)
            claim = srv.put_object(make_claim("c1", ["gpu-1"]))
            uid = claim["metadata"]["uid"]
            assert kubelet.prepare(DRIVER, [ref(claim)])[uid].ok
            srv.stop()  # the API server is gone; unprepare must not care
            assert kubelet.unprepare(DRIVER, [ref(claim)])[uid].ok
            srv.start()
    finally:
        server.stop(0)


def test_a_stray_404_does_not_drop_a_served_version(srv: FakeAPIServer) -> None:
    """A 404 not naming the claim (a proxy, an upgrade in progress) fails this GET only:
    discovery still lists v1, so v1 stays the version used."""
    claim = srv.put_object(make_claim("c1", ["gpu-0"]))
    source = APIClaimSource(srv.kube())
    target = ClaimRef("default", "c1", claim["metadata"]["uid"])
    srv.fail_next(1, 404, verb="get", path_contains="/v1/")
    with pytest.raises(ClaimFetchError, match="404"):
        source.get(target)
    before = len(srv.requests)
    assert source.get(target)["metadata"]["name"] == "c1"
    assert [r.path for r in srv.requests[before:]] == [
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"]


@pytest.mark.parametrize(("namespace", "name"), [
    ("default", "../../../api/v1/secrets"), ("default", "c1?watch=true"), ("default", "a/b"),
    ("kube-system/..", "c1"), ("Default", "c1"), ("default", "C1"), ("default", "x" * 254),
    ("n" * 64, "c1"), ("default", "c1\n"),
])
def test_impossible_claim_names_never_reach_the_api_server(
    srv: FakeAPIServer, short_root: Path, namespace: str, name: str
) -> None:
    n = build_node(short_root)
    n.kubelet.stop()
    n.server.stop(0)
    server = plugin_server(n.options, n.prepare_options, lambda: Inventory(devices=(gpu(0),)),
                           NodeEdits(), APIClaimSource(srv.kube()), metrics=Metrics())
    server.start()
    try:
        with KubeletStandIn(n.options.kubelet_dir / "plugins_registry") as kubelet:
            kubelet.wait_registered(DRIVER)
            before = len(srv.requests)
            uid = "6c2bdfd4-66d5-4f4b-9a4b-5d1c9b0b8f21"
            from tests.fakes.kubelet import ClaimRef as KubeletRef

            result = kubelet.prepare(DRIVER, [KubeletRef(namespace, name, uid)])[uid]
            assert not result.ok and "is not a DNS" in (result.error or ""), result.error
            assert srv.requests[before:] == []
    finally:
        server.stop(0)
