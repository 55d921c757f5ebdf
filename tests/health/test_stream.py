"""The kubelet health stream: a real gRPC server on a unix socket (the PluginServer with the
servicer), read by the kubelet stand-in as a 1.34+ kubelet reads it."""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.daemon.wiring import plugin_server
from agent.health import (
    ChangeFeed,
    Condition,
    DeviceHealth,
    HealthMonitor,
    HealthOptions,
    HealthServicer,
    HealthState,
    Kind,
)
from agent.plugin import PluginOptions
from agent.prepare import EnvOnlyEdits
from agent.prepare.options import PrepareOptions
from discovery.gpulib import GpuLibraryError
from protos.drahealth.v1alpha1 import api_pb2 as pb
from tests.fakes.kubelet import HealthStream, KubeletStandIn
from tests.health.conftest import Node
from tests.waiting import wait_for

DRIVER = "dra-agent.io"
POOL = "node1"
OPTIONS = HealthOptions(quiet_period_s=0.3, min_publish_interval_s=0.1, nic_poll_s=0.02,
                        gpu_wait_ms=20, gpu_poll_s=0.1)

Devices = dict[str, tuple[int, str]]


class _NoClaims:
    def get(self, ref: Any) -> Mapping[str, Any]:
        raise AssertionError("no claim is prepared in health tests")


class Reader:
    """Reads a stream on a thread; the test waits for the response it expects."""

    def __init__(self, stream: HealthStream) -> None:
        self.stream = stream
        self.responses: queue.Queue[pb.NodeWatchResourcesResponse | Exception] = queue.Queue()
        self.ended = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.stream:
                self.responses.put(response)
        except grpc.RpcError as err:
            self.responses.put(err)
        finally:
            self.ended.set()

    def next(self, timeout: float = 5.0) -> pb.NodeWatchResourcesResponse:
        item = self.responses.get(timeout=timeout)
        if isinstance(item, Exception):
            raise item
        return item

    def until(self, check: Callable[[Devices], bool], timeout: float = 5.0) -> Devices:
        deadline = time.monotonic() + timeout
        while True:
            devices = by_name(self.next(max(deadline - time.monotonic(), 0.01)))
            if check(devices):
                return devices


def by_name(response: pb.NodeWatchResourcesResponse) -> Devices:
    out: Devices = {}
    for d in response.devices:
        assert d.device.pool_name == POOL
        out[d.device.device_name] = (d.health, d.message)
    return out


class Plugin:
    def __init__(self, node: Node, root: Path, options: HealthOptions = OPTIONS,
                 resend_period_s: float = 30) -> None:
        self.node = node
        self.monitor = HealthMonitor(node.sources, DRIVER, options, lambda _h: None)
        self.monitor.start(node.provider())
        self.servicer = HealthServicer(self.monitor, POOL, resend_period_s=resend_period_s)
        opts = PluginOptions(driver_name=DRIVER, kubelet_dir=root / "kubelet")
        prepare = PrepareOptions(driver_name=DRIVER, node_name=POOL, cdi_dir=root / "cdi",
                                 plugin_dir=root / "kubelet" / "plugins" / DRIVER)
        self.server = plugin_server(opts, prepare, node.provider(), EnvOnlyEdits(),
                                    _NoClaims(), health_servicer=self.servicer)
        self.server.start()
        self.kubelet = KubeletStandIn(root / "kubelet" / "plugins_registry").start()
        self.registration = self.kubelet.wait_registered(DRIVER)

    def open(self) -> Reader:
        return Reader(self.kubelet.health_stream(DRIVER))

    def close(self) -> None:
        self.kubelet.stop()
        self.server.stop(0)
        self.monitor.stop()


@pytest.fixture
def short_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))  # sockets need short paths
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin(short_root: Path) -> Iterator[Callable[..., Plugin]]:
    made: list[Plugin] = []

    def make(node: Node, **kw: Any) -> Plugin:
        p = Plugin(node, short_root, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_health_service_is_advertised_after_the_dra_services(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100)
    assert p.registration.supported_versions[-1] == "v1alpha1.DRAResourceHealth"


def test_stream_starts_with_the_complete_healthy_list(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100)
    reader = p.open()
    response = reader.next()
    names = [d.name for d in h100.inventory.devices]
    assert sorted(by_name(response)) == sorted(names)
    assert set(by_name(response).values()) == {(pb.HEALTHY, "")}
    for d in response.devices:
        assert abs(d.last_updated_time - time.time()) < 5
        assert d.health_check_timeout_seconds >= 90  # three missed resends of 30 s


def test_xid_makes_the_device_unhealthy_with_its_meaning_then_it_recovers(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100)
    reader = p.open()
    reader.next()
    h100.nvml.inject_xid(h100.device("gpu-3").host.uuid, 79)
    devices = reader.until(lambda d: d["gpu-3"][0] == pb.UNHEALTHY)
    assert devices["gpu-3"][1].startswith("Xid 79: GPU has fallen off the bus")
    assert len(devices) == len(h100.inventory.devices)  # still the complete list
    assert {v[0] for k, v in devices.items() if k != "gpu-3"} == {pb.HEALTHY}
    assert reader.until(lambda d: d["gpu-3"] == (pb.HEALTHY, ""))


def test_link_down_is_reported_with_the_link_state(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100)
    reader = p.open()
    nic = h100.device("nic-0000-5e-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    devices = reader.until(lambda d: d[nic.name][0] == pb.UNHEALTHY)
    assert devices[nic.name][1] == f"link down on {nic.host.if_name} (carrier 0, operstate down)"
    h100.set_carrier(nic.host.if_name, up=True)
    reader.until(lambda d: d[nic.name] == (pb.HEALTHY, ""))


def test_unmonitored_gpu_is_unknown(h100: Node, plugin: Callable[..., Plugin]) -> None:
    uuid = h100.device("gpu-7").host.uuid
    h100.nvml.fail("device_register_events", GpuLibraryError("Unknown Error"), uuid)
    h100.nvml.fail("device_memory_total", GpuLibraryError("Unknown Error"), uuid)
    p = plugin(h100)
    devices = by_name(p.open().next())
    assert devices["gpu-7"][0] == pb.UNKNOWN
    assert "liveness probe fails" in devices["gpu-7"][1]


def test_the_list_is_resent_periodically_without_changes(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100, resend_period_s=0.2)
    reader = p.open()
    first, second = reader.next(), reader.next(2.0)
    assert by_name(first) == by_name(second)


def test_cancelled_stream_frees_its_server_thread_at_once(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100)  # 30 s resend: the thread must not sleep through it
    reader = p.open()
    reader.next()
    assert p.servicer.streams == 1
    reader.stream.cancel()
    wait_for(lambda: p.servicer.streams == 0, timeout=2, what="stream closed")


def test_stopping_the_monitor_ends_the_stream(
        h100: Node, plugin: Callable[..., Plugin]) -> None:
    p = plugin(h100)
    reader = p.open()
    reader.next()
    p.monitor.stop()
    assert reader.ended.wait(2)


def test_long_messages_are_cut_to_what_the_kubelet_keeps() -> None:
    class Source:
        changes = ChangeFeed()

        def snapshot(self) -> Mapping[str, DeviceHealth]:
            cond = Condition(Kind.XID, "79", "x" * 5000)
            return {"gpu-0": DeviceHealth("gpu-0", HealthState.UNHEALTHY, (cond,))}

    [device] = HealthServicer(Source(), POOL).response().devices
    assert len(device.message) == 1024 and device.message.endswith("...")
