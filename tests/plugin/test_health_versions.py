"""DRAResourceHealth v1 (1.37) and v1alpha1 (1.35/1.36) from one servicer: what is advertised,
which version each kubelet picks, that both carry the same list, and that both count against
the same stream slots. Over real unix sockets, through the kubelet stand-in."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.health import (
    HEALTH_SERVICES,
    ChangeFeed,
    Condition,
    DeviceHealth,
    HealthServicer,
    HealthState,
    Kind,
)
from agent.plugin.limits import MAX_STREAMS
from agent.plugin.registration import HEALTH_SERVICES as ADVERTISED
from discovery.model import Inventory
from protos.drahealth.v1 import api_pb2 as v1
from protos.drahealth.v1alpha1 import api_pb2 as v1alpha1
from tests.fakes.kubelet import HEALTH_SERVICES_135, HEALTH_SERVICES_137, KubeletStandIn
from tests.plugnode import DRIVER, NODE, ClaimBook, NodeEdits, gpu, nic, node_options
from tests.waiting import wait_for

LINK_DOWN = DeviceHealth(
    "nic-0", HealthState.UNHEALTHY, (Condition(Kind.LINK_DOWN, "carrier", "eth2: no carrier"),)
)


class _Source:
    """A HealthSource the test sets by hand."""

    def __init__(self) -> None:
        self.changes = ChangeFeed()
        self.devices: dict[str, DeviceHealth] = {"gpu-0": DeviceHealth("gpu-0")}

    def snapshot(self) -> Mapping[str, DeviceHealth]:
        return dict(self.devices)

    def set(self, health: DeviceHealth) -> None:
        self.devices[health.device] = health
        self.changes.bump()


class _Node:
    def __init__(self, root: Path) -> None:
        boot = root / "boot_id"
        boot.write_text("boot-1\n")
        self.source = _Source()
        self.servicer = HealthServicer(self.source, NODE)
        self.opts, prepare = node_options(root)
        self.server = plugin_server(
            self.opts, prepare, lambda: Inventory(devices=(gpu(0), nic(0))), NodeEdits(),
            ClaimBook(), metrics=Metrics(), health_servicer=self.servicer,
        )
        self.server.start()
        self.kubelets: list[KubeletStandIn] = []

    def kubelet(self, health_services: tuple[str, ...]) -> KubeletStandIn:
        k = KubeletStandIn(self.opts.kubelet_dir / "plugins_registry",
                           known_health_services=health_services).start()
        self.kubelets.append(k)
        k.wait_registered(DRIVER)
        return k

    def close(self) -> None:
        self.source.changes.close()
        for k in self.kubelets:
            k.stop()
        self.server.stop(0)


@pytest.fixture
def node(short_root: Path) -> Iterator[_Node]:
    n = _Node(short_root)
    yield n
    n.close()


def _devices(response: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in response.devices}


def test_both_versions_are_advertised_and_served() -> None:
    # The registration lists exactly what add_health_services serves, newest first.
    assert ADVERTISED == HEALTH_SERVICES == ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@pytest.mark.parametrize(
    ("known", "chosen", "api"),
    [(HEALTH_SERVICES_137, "v1.DRAResourceHealth", v1),
     (HEALTH_SERVICES_135, "v1alpha1.DRAResourceHealth", v1alpha1)],
    ids=["1.37-picks-v1", "1.35-picks-v1alpha1"],
)
def test_each_kubelet_gets_its_version_with_nic_health(
    node: _Node, known: tuple[str, ...], chosen: str, api: Any
) -> None:
    kubelet = node.kubelet(known)
    registration = kubelet.registered(DRIVER)
    assert registration is not None
    assert registration.supported_versions[-2:] == ADVERTISED
    assert registration.health_service == chosen
    stream = kubelet.health_stream(DRIVER, timeout=20)
    try:
        first = next(stream)
        assert type(first) is api.NodeWatchResourcesResponse
        assert _devices(first) == {"gpu-0": (api.HEALTHY, "")}
        assert node.servicer.streams_by_service()[chosen] == 1
        node.source.set(LINK_DOWN)
        # NIC link state reaches the kubelet on the same stream, in the same version.
        second = next(stream)
        assert type(second) is api.NodeWatchResourcesResponse
        assert _devices(second)["nic-0"] == (api.UNHEALTHY, "eth2: no carrier")
    finally:
        stream.cancel()
    wait_for(lambda: node.servicer.streams == 0, what="stream closed")


def test_one_change_reaches_streams_of_both_versions_alike(node: _Node) -> None:
    new, old = node.kubelet(HEALTH_SERVICES_137), node.kubelet(HEALTH_SERVICES_135)
    streams = [new.health_stream(DRIVER, timeout=20), old.health_stream(DRIVER, timeout=20)]
    try:
        assert [_devices(next(s)) for s in streams] == [{"gpu-0": (1, "")}] * 2
        assert node.servicer.streams_by_service() == dict.fromkeys(ADVERTISED, 1)
        node.source.set(LINK_DOWN)
        after = [next(s) for s in streams]
        # Same bytes on the wire: the two versions differ only in their package.
        assert after[0].SerializeToString() == after[1].SerializeToString()
        assert _devices(after[1])["nic-0"][0] == v1alpha1.UNHEALTHY
    finally:
        for s in streams:
            s.cancel()


def _first_event(stream: Any) -> str:
    try:
        next(iter(stream))
    except grpc.RpcError as err:
        return str(err.code().name)
    return "response"


def test_streams_of_both_versions_share_the_slots(node: _Node) -> None:
    new, old = node.kubelet(HEALTH_SERVICES_137), node.kubelet(HEALTH_SERVICES_135)
    streams = [new.health_stream(DRIVER) for _ in range(MAX_STREAMS)]
    events: list[str] = []
    readers = [threading.Thread(target=lambda s=s: events.append(_first_event(s)), daemon=True)
               for s in streams]
    for t in readers:
        t.start()
    try:
        wait_for(lambda: events.count("response") == MAX_STREAMS, what="v1 streams open")
        extra = old.health_stream(DRIVER, timeout=20)
        # A v1alpha1 stream beyond the slots is refused like any other, not served on the side.
        assert _first_event(extra) == "RESOURCE_EXHAUSTED"
    finally:
        for s in streams:
            s.cancel()
    wait_for(lambda: node.server.streams.open == 0, what="slots given back")


def test_an_unknown_health_version_is_unimplemented(node: _Node) -> None:
    # A future kubelet asking for a version we do not serve gets a clean status, not a hang.
    with grpc.insecure_channel(f"unix://{node.server.paths.dra}") as channel:
        call = channel.unary_stream("/v2.DRAResourceHealth/NodeWatchResources",
                                    request_serializer=lambda _m: b"",
                                    response_deserializer=bytes)
        with pytest.raises(grpc.RpcError) as err:
            next(iter(call(None, timeout=5)))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
