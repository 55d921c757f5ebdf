"""PodClaims: the kubelet's DRA manager per pod, as the real one showed itself in
tests/realk8s/test_kubelet_dra.py, over the stand-in and a scripted plugin."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
import pytest

from tests.fakes.kubelet import KubeletStandIn, PodClaims, PodError
from tests.kubelet.plugin import FakePlugin, good_prepare

MakePlugin = Callable[..., FakePlugin]
DRIVER = "gpu.example.com"
POD_UID = "pod-uid-1"


def claim(name: str, uid: str, *, reserved: str | None = POD_UID, allocated: bool = True,
          owner: str | None = None, driver: str = DRIVER) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p",
                                    "uid": owner, "controller": True}]
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": "node-a", "device": "gpu-0"}]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": reserved}]
    return {"metadata": meta, "status": status}


def pod(*claims: Mapping[str, Any], uid: str = POD_UID,
        statuses: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pod naming each claim; a claim given as {"template": ..., "name": ...} comes from a
    template and ``statuses`` maps its pod claim name to the generated name."""
    pod_claims = [{"name": c["name"], **({"resourceClaimTemplateName": c["template"]}
                                         if "template" in c else
                                         {"resourceClaimName": c["name"]})} for c in claims]
    out: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"claims": [
            {"name": c["name"]} for c in claims]}}], "resourceClaims": pod_claims}}
    if statuses:
        out["status"] = {"resourceClaimStatuses": [
            {"name": k, "resourceClaimName": v} for k, v in statuses.items()]}
    return out


class Server:
    """The claims the API server holds; GETs counted."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}
        self.gets: list[str] = []

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        self.gets.append(name)
        if name not in self.claims:
            raise LookupError(f'resourceclaims "{name}" not found')
        return self.claims[name]


@pytest.fixture
def plugin(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> FakePlugin:
    started = make_plugin(DRIVER).start()
    kubelet.wait_registered(DRIVER)
    return started


def calls(plugin: FakePlugin) -> list[tuple[str, list[str]]]:
    return [(method, [c.uid for c in request.claims]) for _, method, request, _ in plugin.calls]


def test_prepares_once_per_claim_and_unprepares_with_the_last_pod(
    kubelet: KubeletStandIn, plugin: FakePlugin,
) -> None:
    shared = claim("shared", "u1")
    shared["status"]["reservedFor"].append({"resource": "pods", "name": "q", "uid": "pod-2"})
    server = Server(shared)
    pods = PodClaims(kubelet, server.get)
    first, second = pod(shared["metadata"]), pod(shared["metadata"], uid="pod-2")
    pods.prepare(first)
    pods.prepare(second)
    pods.prepare(first)  # a repeat (pod sync) GETs again but calls nothing
    assert server.gets == ["shared"] * 3
    assert calls(plugin) == [("NodePrepareResources", ["u1"])]
    assert pods.cdi_ids(first, "c") == pods.cdi_ids(second, "c") == [
        f"k8s.{DRIVER}/gpu=u1-gpu-0"]
    pods.unprepare(first)
    assert pods.prepared() == {"u1": {"pod-2"}}
    pods.unprepare(second)
    assert calls(plugin)[1:] == [("NodeUnprepareResources", ["u1"])]
    assert pods.prepared() == {}


@pytest.mark.parametrize(("bad", "said"), [
    (claim("c", "u1", reserved="someone-else"), r"is not allowed to use ResourceClaim c \(u1\)"),
    (claim("c", "u1", allocated=False), "ResourceClaim c: not allocated"),
    (claim("c", "u1", driver="nic.example.com"), "DRA driver nic.example.com is not registered"),
])
def test_refuses_before_any_plugin_call(
    kubelet: KubeletStandIn, plugin: FakePlugin, bad: dict[str, Any], said: str,
) -> None:
    good = claim("ok", "u0")
    pods = PodClaims(kubelet, Server(good, bad).get)
    with pytest.raises(PodError, match=said):
        pods.prepare(pod(good["metadata"], bad["metadata"]))
    assert plugin.calls == [] and pods.prepared() == {}


def test_a_missing_claim_names_the_claim(kubelet: KubeletStandIn, plugin: FakePlugin) -> None:
    with pytest.raises(PodError, match=r'fetch ResourceClaim gone: .*"gone" not found'):
        PodClaims(kubelet, Server().get).prepare(pod({"name": "gone"}))
    assert plugin.calls == []


def test_template_claims_by_the_pods_status_and_owned_by_the_pod(
    kubelet: KubeletStandIn, plugin: FakePlugin,
) -> None:
    made = claim("p-gpus-x1y2z", "u1", owner=POD_UID)
    forged = claim("p-gpus-a1b2c", "u2", owner="another-pod")
    pods = PodClaims(kubelet, Server(made, forged).get)
    templated = {"name": "gpus", "template": "t"}
    with pytest.raises(PodError, match="ResourceClaim not created yet"):
        pods.prepare(pod(templated))
    with pytest.raises(PodError, match=r"\(Pod is not owner\)"):
        pods.prepare(pod(templated, statuses={"gpus": "p-gpus-a1b2c"}))
    ok = pod(templated, statuses={"gpus": "p-gpus-x1y2z"})
    pods.prepare(ok)
    assert pods.cdi_ids(ok, "c") == [f"k8s.{DRIVER}/gpu=u1-gpu-0"]
    assert calls(plugin) == [("NodePrepareResources", ["u1"])]


def test_one_claims_error_fails_the_pod_and_everything_is_sent_again(
    kubelet: KubeletStandIn, plugin: FakePlugin,
) -> None:
    a, b = claim("a", "ua"), claim("b", "ub")
    pods = PodClaims(kubelet, Server(a, b).get)
    both = pod(a["metadata"], b["metadata"])

    def fail_b(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        out = good_prepare(api, request, ctx)
        out.claims["ub"].error = "device gpu-0 is unhealthy"
        return out

    plugin.prepare_answer = fail_b
    with pytest.raises(PodError, match="NodePrepareResources failed for ResourceClaim b: "
                                       "device gpu-0 is unhealthy"):
        pods.prepare(both)
    assert pods.prepared() == {}  # a prepared too, but the pod failed: nothing counts
    with pytest.raises(PodError, match="unable to get information for ResourceClaim a"):
        pods.cdi_ids(both, "c")
    plugin.prepare_answer = good_prepare
    pods.prepare(both)
    assert calls(plugin) == [("NodePrepareResources", ["ua", "ub"])] * 2
    assert pods.prepared() == {"ua": {POD_UID}, "ub": {POD_UID}}


def test_a_failed_call_fails_the_pod_and_a_claim_being_unprepared_takes_no_pod(
    kubelet: KubeletStandIn, plugin: FakePlugin,
) -> None:
    a = claim("a", "ua")
    a["status"]["reservedFor"].append({"resource": "pods", "name": "q", "uid": "pod-2"})
    pods = PodClaims(kubelet, Server(a).get)
    pods.prepare(pod(a["metadata"]))

    def refuse(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        ctx.abort(grpc.StatusCode.UNAVAILABLE, "restarting")

    plugin.unprepare_answer = refuse
    with pytest.raises(PodError, match=r"NodeUnprepareResources: .*UNAVAILABLE: restarting"):
        pods.unprepare(pod(a["metadata"]))
    with pytest.raises(PodError, match="ResourceClaim a is being unprepared"):
        pods.prepare(pod(a["metadata"], uid="pod-2"))


def test_a_pod_claim_of_neither_kind_is_one_clear_error(
    kubelet: KubeletStandIn, plugin: FakePlugin,
) -> None:
    odd = pod({"name": "x"})
    odd["spec"]["resourceClaims"] = [{"name": "x"}]
    with pytest.raises(PodError, match="none of the supported fields are set"):
        PodClaims(kubelet, Server().get).prepare(odd)
