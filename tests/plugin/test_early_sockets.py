"""The sockets served before the plugin exists (``agent.plugin.serving``): the registration
answers at once; a DRA call that comes early waits for the plugin and runs once it has
recovered, or is answered UNAVAILABLE when it does not come in time or the plugin stops; a
health stream waits for the monitor."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.health.model import DeviceHealth, HealthState
from agent.plugin import PluginServer
from agent.plugin.serving import ServedSockets
from discovery.model import Inventory
from protos.dra.v1 import api_pb2, api_pb2_grpc
from protos.drahealth.v1 import api_pb2 as health_pb2
from protos.drahealth.v1 import api_pb2_grpc as health_grpc
from tests.fakes.kubelet import KubeletStandIn
from tests.plugnode import DRIVER, ClaimBook, NodeEdits, gpu, make_claim, node_options, ref

pytestmark = pytest.mark.timeout(60)


class _Calls:
    """Calls made on threads of their own, as the kubelet makes them while the agent starts."""

    def __init__(self) -> None:
        self.results: list[Any] = []
        self.threads: list[threading.Thread] = []

    def start(self, call: Any) -> threading.Thread:
        def run() -> None:
            try:
                self.results.append(call())
            except Exception as err:  # the test looks at what came back
                self.results.append(err)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread


@pytest.fixture
def sockets(short_root: Path) -> Iterator[ServedSockets]:
    options, _ = node_options(short_root)
    served = ServedSockets(options, health=False, wait_s=5.0)
    served.start()
    yield served
    served.stop(0)


def _plugin(root: Path, sockets: ServedSockets, book: ClaimBook, **kwargs: Any) -> PluginServer:
    _, prepare = node_options(root)
    inventory = Inventory(devices=tuple(gpu(i) for i in range(2)))
    return plugin_server(sockets.options, prepare, lambda: inventory, NodeEdits(), book,
                         metrics=Metrics(), sockets=sockets, **kwargs)


def _stub(sockets: ServedSockets) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{sockets.paths.dra}")
    return channel, api_pb2_grpc.DRAPluginStub(channel)


def _request(claim: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    return api_pb2.NodePrepareResourcesRequest(claims=[api_pb2.Claim(
        namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])])


def test_the_registration_answers_before_the_plugin_exists(sockets: ServedSockets) -> None:
    with KubeletStandIn(sockets.paths.registration.parent, poll_interval=0.01) as kubelet:
        registration = kubelet.wait_registered(DRIVER, timeout=10)
        assert registration.endpoint == str(sockets.paths.dra)
        assert sockets.registration.wait_registered(5)  # NotifyRegistrationStatus came
    assert sockets.serving and sockets.gate.services is None  # nothing behind them yet


def test_an_early_prepare_waits_and_runs_once_the_plugin_has_recovered(
        short_root: Path, sockets: ServedSockets) -> None:
    book = ClaimBook()
    claim = book.put(make_claim("early", ["gpu-0"]))
    calls = _Calls()
    with KubeletStandIn(sockets.paths.registration.parent, poll_interval=0.01) as kubelet:
        kubelet.wait_registered(DRIVER, timeout=10)
        waiting = calls.start(lambda: kubelet.prepare(DRIVER, [ref(claim)]))
        time.sleep(0.5)
        assert waiting.is_alive()  # held at the socket, nothing prepared
        assert not list((short_root / "cdi").glob("*.json"))
        plugin = _plugin(short_root, sockets, book)
        plugin.start()
        try:
            waiting.join(10)
            [results] = calls.results
            result = results[claim["metadata"]["uid"]]
            assert result.ok, result.error
            assert [d.device_name for d in result.devices] == ["gpu-0"]
            assert plugin.serving
        finally:
            plugin.stop(0)
    assert not sockets.paths.dra.exists() and not sockets.paths.registration.exists()


def test_a_prepare_that_outlasts_the_wait_is_answered_unavailable(short_root: Path) -> None:
    options, _ = node_options(short_root)
    served = ServedSockets(options, health=False, wait_s=0.3)
    served.start()
    channel, stub = _stub(served)
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            stub.NodePrepareResources(_request(make_claim("late")), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == ("the DRA plugin is still starting after 0.3 s: not "
                                          "ready to prepare or unprepare yet, retry")
        assert 0.3 <= time.monotonic() - started < 5
    finally:
        channel.close()
        served.stop(0)


def test_a_waiting_call_is_refused_at_once_when_the_start_fails(sockets: ServedSockets) -> None:
    channel, stub = _stub(sockets)
    calls = _Calls()
    try:
        waiting = calls.start(lambda: stub.NodeUnprepareResources(
            api_pb2.NodeUnprepareResourcesRequest(), timeout=20))
        time.sleep(0.3)
        started = time.monotonic()
        sockets.stop(1)  # what the daemon does when its start fails
        waiting.join(10)
        [err] = calls.results
        assert isinstance(err, grpc.RpcError)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 3
    finally:
        channel.close()
    assert not sockets.paths.dra.exists() and not sockets.paths.registration.exists()
    assert not sockets.lock.held


class _Monitor:
    def __init__(self) -> None:
        from agent.health.model import ChangeFeed

        self.changes = ChangeFeed()

    def snapshot(self) -> dict[str, DeviceHealth]:
        return {"gpu-0": DeviceHealth(device="gpu-0", state=HealthState.HEALTHY)}


def test_a_health_stream_waits_for_the_monitor(short_root: Path) -> None:
    from agent.health.stream import HealthServicer

    options, _ = node_options(short_root)
    served = ServedSockets(options, health=True, wait_s=0.2)
    served.start()
    channel = grpc.insecure_channel(f"unix://{served.paths.dra}")
    stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
        health_pb2.NodeWatchResourcesRequest(), timeout=20)
    calls = _Calls()
    plugin = None
    try:
        first = calls.start(lambda: next(stream))
        time.sleep(0.6)  # longer than a unary call may wait: a stream keeps waiting
        assert first.is_alive()
        plugin = _plugin(short_root, served, ClaimBook(),
                         health_servicer=HealthServicer(_Monitor(), "node"))  # type: ignore[arg-type]
        plugin.start()
        first.join(10)
        [response] = calls.results
        assert [d.device.device_name for d in response.devices] == ["gpu-0"]
    finally:
        stream.cancel()
        channel.close()
        if plugin is not None:
            plugin.stop(0)
        served.stop(0)


def test_the_plugin_refuses_sockets_made_for_other_options(
        short_root: Path, sockets: ServedSockets) -> None:
    with pytest.raises(ValueError, match="other plugin options"):
        _plugin(short_root, sockets, ClaimBook(),
                health_servicer=object())  # a health servicer: the sockets serve none
