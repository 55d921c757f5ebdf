"""NodePrepareResources / NodeUnprepareResources and the health stream through the stand-in,
checked as the kubelet checks the answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.drahealth.v1alpha1 import api_pb2 as health
from tests.fakes.kubelet import (
    ClaimRef,
    KubeletProtocolError,
    KubeletStandIn,
    PluginCallError,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)
from tests.kubelet.plugin import FakePlugin, good_prepare, good_unprepare

MakePlugin = Callable[..., FakePlugin]
DRIVER = "gpu.example.com"
A = ClaimRef("default", "claim-a", "uid-a")
B = ClaimRef("team", "claim-b", "uid-b")


def registered(kubelet: KubeletStandIn, make_plugin: MakePlugin, **kwargs: Any) -> FakePlugin:
    plugin = make_plugin(DRIVER, **kwargs).start()
    kubelet.wait_registered(DRIVER)
    return plugin


def test_prepare_returns_devices_per_claim(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)
    results = kubelet.prepare(DRIVER, [A, B])
    assert list(results) == ["uid-a", "uid-b"]
    assert results["uid-a"] == PrepareResult(
        devices=(
            PreparedDevice(
                request_names=("gpu",),
                pool_name="node-a",
                device_name="gpu-0",
                cdi_device_ids=("k8s.gpu.example.com/gpu=uid-a-gpu-0",),
            ),
        )
    )
    assert results["uid-b"].ok
    version, method, request, remaining = plugin.calls[0]
    assert (version, method) == ("v1", "NodePrepareResources")
    assert [(c.namespace, c.name, c.uid) for c in request.claims] == [
        ("default", "claim-a", "uid-a"),
        ("team", "claim-b", "uid-b"),
    ]
    # The kubelet's 45 s deadline reaches the plugin (gRPC adds a little slack in transit).
    assert remaining is not None
    assert 30 < remaining < 50


def test_unprepare_success_entries(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = registered(kubelet, make_plugin)
    assert kubelet.unprepare(DRIVER, [A, B]) == {
        "uid-a": UnprepareResult(),
        "uid-b": UnprepareResult(),
    }
    assert plugin.calls[0][1] == "NodeUnprepareResources"


def test_calls_use_the_chosen_v1beta1_service(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin, versions=["v1beta1.DRAPlugin", "v1.DRAPlugin"])
    assert kubelet.prepare(DRIVER, [A])["uid-a"].devices[0].share_id is None
    kubelet.unprepare(DRIVER, [A])
    assert [(c[0], c[1]) for c in plugin.calls] == [
        ("v1beta1", "NodePrepareResources"),
        ("v1beta1", "NodeUnprepareResources"),
    ]


def test_missing_claim_uid_is_rejected(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = registered(kubelet, make_plugin)

    def only_first(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        out = good_prepare(api, request, ctx)
        del out.claims["uid-b"]
        return out

    plugin.prepare_answer = only_first
    with pytest.raises(KubeletProtocolError, match="skipped 1 ResourceClaims") as err:
        kubelet.prepare(DRIVER, [A, B])
    assert err.value.claim_uid == "uid-b"
    assert err.value.method == "NodePrepareResources"


def test_missing_unprepare_entry_is_rejected(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)
    plugin.unprepare_answer = lambda api, request, ctx: api.NodeUnprepareResourcesResponse()
    with pytest.raises(KubeletProtocolError, match="skipped 2") as err:
        kubelet.unprepare(DRIVER, [A, B])
    assert err.value.method == "NodeUnprepareResources"


@pytest.mark.parametrize("call", ["prepare", "unprepare"])
def test_unknown_claim_uid_is_rejected(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, call: str
) -> None:
    plugin = registered(kubelet, make_plugin)

    def with_stranger(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        answer = good_prepare if call == "prepare" else good_unprepare
        out = answer(api, request, ctx)
        out.claims["uid-stranger"].error = ""
        return out

    plugin.prepare_answer = plugin.unprepare_answer = with_stranger
    with pytest.raises(KubeletProtocolError, match="unknown claim UID") as err:
        getattr(kubelet, call)(DRIVER, [A])
    assert err.value.claim_uid == "uid-stranger"


def test_per_claim_error_is_an_error_result(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)

    def fail_b(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        out = good_prepare(api, request, ctx)
        out.claims["uid-b"].error = "device gpu-0 is unhealthy"
        return out

    plugin.prepare_answer = fail_b
    results = kubelet.prepare(DRIVER, [A, B])
    assert results["uid-a"].ok
    # Devices sent along with an error are ignored, as the kubelet ignores them.
    assert results["uid-b"] == PrepareResult(error="device gpu-0 is unhealthy")
    assert not results["uid-b"].ok

    plugin.unprepare_answer = lambda api, request, ctx: api.NodeUnprepareResourcesResponse(
        claims={"uid-a": api.NodeUnprepareResourceResponse(error="busy")}
    )
    assert kubelet.unprepare(DRIVER, [A]) == {"uid-a": UnprepareResult(error="busy")}


def one_device(**fields: Any) -> Callable[[Any, Any, grpc.ServicerContext], Any]:
    def answer(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        out = api.NodePrepareResourcesResponse()
        for claim in request.claims:
            out.claims[claim.uid].devices.add(**fields)
        return out

    return answer


GOOD = {
    "request_names": ["gpu"],
    "pool_name": "node-a",
    "device_name": "gpu-0",
    "cdi_device_ids": ["k8s.gpu.example.com/gpu=x"],
}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"pool_name": ""}, "without pool or device name"),
        ({"device_name": ""}, "without pool or device name"),
        ({"request_names": []}, "no request names"),
        ({"cdi_device_ids": []}, "no CDI device IDs"),
        ({"cdi_device_ids": ["gpu-0"]}, "malformed CDI device ID"),
        ({"cdi_device_ids": ["k8s.gpu.example.com/gpu.x=a"]}, "malformed CDI device ID"),
        ({"cdi_device_ids": ["k8s.gpu.example.com/gpu=-a"]}, "malformed CDI device ID"),
        ({"cdi_device_ids": ["9vendor/gpu=a"]}, "malformed CDI device ID"),
    ],
)
def test_bad_devices_are_rejected(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, change: dict[str, Any], why: str
) -> None:
    plugin = registered(kubelet, make_plugin)
    plugin.prepare_answer = one_device(**{**GOOD, **change})
    with pytest.raises(KubeletProtocolError, match=why) as err:
        kubelet.prepare(DRIVER, [A])
    assert err.value.claim_uid == "uid-a"


def test_lenient_mode_accepts_what_a_kubelet_accepts(root: Path, make_plugin: MakePlugin) -> None:
    plugin = make_plugin(DRIVER).start()
    # No request names (= all requests) and no CDI IDs: legal in the protocol.
    plugin.prepare_answer = one_device(pool_name="node-a", device_name="gpu-0")
    registry = root / "plugins_registry"
    with KubeletStandIn(registry, poll_interval=0.02, strict_devices=False) as kubelet:
        kubelet.wait_registered(DRIVER)
        device = kubelet.prepare(DRIVER, [A])["uid-a"].devices[0]
        assert (device.request_names, device.cdi_device_ids) == ((), ())


def test_share_id_presence_passes_through_v1(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)
    plugin.prepare_answer = one_device(**GOOD, share_id="")
    assert kubelet.prepare(DRIVER, [A])["uid-a"].devices[0].share_id == ""
    plugin.prepare_answer = one_device(**GOOD, share_id="7f3a")
    assert kubelet.prepare(DRIVER, [A])["uid-a"].devices[0].share_id == "7f3a"
    plugin.prepare_answer = one_device(**GOOD)
    assert kubelet.prepare(DRIVER, [A])["uid-a"].devices[0].share_id is None


def test_empty_device_list_is_a_valid_success(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)
    plugin.prepare_answer = lambda api, request, ctx: api.NodePrepareResourcesResponse(
        claims={"uid-a": api.NodePrepareResourceResponse()}
    )
    assert kubelet.prepare(DRIVER, [A]) == {"uid-a": PrepareResult()}


def test_grpc_error_is_a_call_error(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = registered(kubelet, make_plugin)

    def refuse(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "claim default/claim-a not allocated")

    plugin.prepare_answer = refuse
    with pytest.raises(PluginCallError) as err:
        kubelet.prepare(DRIVER, [A])
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details == "claim default/claim-a not allocated"


def test_deadline_exceeded_is_a_call_error(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)

    def hang(api: Any, request: Any, ctx: grpc.ServicerContext) -> Any:
        plugin.health_done.wait(2)
        return good_prepare(api, request, ctx)

    plugin.prepare_answer = hang
    with pytest.raises(PluginCallError) as err:
        kubelet.prepare(DRIVER, [A], timeout=0.1)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_unimplemented_service_is_a_call_error(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    # The plugin claims the whole DRA service on its registration socket, which serves only
    # registration: every call fails with UNIMPLEMENTED, as against a misconfigured driver.
    plugin = make_plugin(DRIVER, endpoint="")
    plugin.start_registration()
    kubelet.wait_registered(DRIVER)
    with pytest.raises(PluginCallError) as err:
        kubelet.prepare(DRIVER, [A])
    assert err.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_duplicate_claims_in_one_request_are_a_test_bug(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = registered(kubelet, make_plugin)
    with pytest.raises(ValueError, match="duplicate"):
        kubelet.prepare(DRIVER, [A, A])
    assert plugin.calls == []


def test_health_stream(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = make_plugin(DRIVER)
    plugin.health_updates = [
        health.NodeWatchResourcesResponse(
            devices=[
                health.DeviceHealth(
                    device=health.DeviceIdentifier(pool_name="node-a", device_name="gpu-0"),
                    health=health.UNHEALTHY,
                    last_updated_time=1_800_000_000,
                    message="Xid 79",
                )
            ]
        ),
        health.NodeWatchResourcesResponse(),
    ]
    plugin.start()
    kubelet.wait_registered(DRIVER)
    stream = kubelet.health_stream(DRIVER)
    first = next(stream)
    assert first.devices[0].device.device_name == "gpu-0"
    assert first.devices[0].health == health.UNHEALTHY
    assert next(stream) == health.NodeWatchResourcesResponse()
    stream.cancel()
    with pytest.raises(grpc.RpcError) as err:
        next(stream)
    assert err.value.code() == grpc.StatusCode.CANCELLED
