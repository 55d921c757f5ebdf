"""Faults become taints in the published ResourceSlices and go away on recovery
(HealthMonitor -> apply_taints -> slice controller -> fake API server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from agent.health import HealthOptions, HealthState, Kind
from agent.slices import DroppedFieldsError
from tests.fakes.apiserver import FakeAPIServer
from tests.health.conftest import Node
from tests.health.wiring import DRIVER, Wiring, node_object, published_taints, settled_writes
from tests.waiting import wait_for

QUIET = 0.3
OPTIONS = HealthOptions(quiet_period_s=QUIET, min_publish_interval_s=0.1, nic_poll_s=0.02,
                        gpu_wait_ms=20, gpu_poll_s=0.1)


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.5) as server:
        server.put_object(node_object())
        yield server


@pytest.fixture
def wire(srv: FakeAPIServer) -> Iterator[Callable[..., Wiring]]:
    made: list[Wiring] = []

    def make(node: Node, options: HealthOptions = OPTIONS) -> Wiring:
        w = Wiring(node, srv, options)
        made.append(w)
        assert w.controller.synced(5.0)
        return w

    yield make
    for w in made:
        w.close()


def taints_of(srv: FakeAPIServer, device: str) -> list[tuple[str, str, str]]:
    return published_taints(srv).get(device, [])


def test_healthy_node_publishes_no_taints_and_no_health_change(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    w = wire(h100)
    assert published_taints(srv) == {}
    assert w.monitor.publishes == 0
    assert {h.state for h in w.monitor.snapshot().values()} == {HealthState.HEALTHY}


def test_xid_taints_the_gpu_and_recovery_removes_it(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    w = wire(h100)
    h100.nvml.inject_xid(h100.device("gpu-3").host.uuid, 48)
    assert wait_for(lambda: taints_of(srv, "gpu-3"), what="xid taint") == [
        (f"{DRIVER}/xid", "48", "NoSchedule")]
    assert set(published_taints(srv)) == {"gpu-3"}
    assert wait_for(lambda: not taints_of(srv, "gpu-3"), what="recovery")
    assert w.events("xid") == 1
    assert w.events("recovered") == 1


def test_ignored_xid_changes_nothing(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    w = wire(h100)
    before = settled_writes(srv)
    h100.nvml.inject_xid(h100.device("gpu-0").host.uuid, 13)
    h100.nvml.inject_xid(h100.device("gpu-1").host.uuid, 94)  # a marker that does count
    wait_for(lambda: taints_of(srv, "gpu-1"), what="marker taint")
    assert set(published_taints(srv)) == {"gpu-1"}
    assert settled_writes(srv) == before + 1
    assert w.events("xid-ignored") == 1


def test_double_bit_ecc_taints_the_gpu(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    wire(h100)
    h100.nvml.inject_ecc(h100.device("gpu-6").host.uuid, double_bit=True)
    assert wait_for(lambda: taints_of(srv, "gpu-6")) == [
        (f"{DRIVER}/ecc", "double-bit", "NoSchedule")]


def test_lost_gpu_is_tainted_until_it_answers_again(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    w = wire(h100)
    h100.nvml.set_lost(h100.device("gpu-5").host.uuid)
    want = [(f"{DRIVER}/gpu-lost", "", "NoSchedule"), (f"{DRIVER}/xid", "79", "NoSchedule")]
    assert wait_for(lambda: taints_of(srv, "gpu-5") == want and want, what="lost taints")
    assert w.monitor.snapshot()["gpu-5"].message == (
        f"GPU {h100.device('gpu-5').host.uuid} is lost (NVML: GPU_IS_LOST); "
        "Xid 79: GPU has fallen off the bus")
    # The Xid event expires after its hold; the loss is a level and stays well past that.
    wait_for(lambda: taints_of(srv, "gpu-5") == want[:1], what="xid expired")
    time.sleep(QUIET)
    assert taints_of(srv, "gpu-5") == want[:1]
    h100.nvml.clear_faults()
    assert wait_for(lambda: not taints_of(srv, "gpu-5"), what="recovery")
    assert w.events("gpu-lost") == 1


def test_mig_devices_inherit_their_parents_fault(
        srv: FakeAPIServer, a100: Node, wire: Callable[..., Wiring]) -> None:
    wire(a100)
    parent = a100.device("gpu-2-mig-4g40gb-0").host.parent_uuid
    a100.nvml.inject_xid(parent, 119)
    wait_for(lambda: len(published_taints(srv)) == 2, what="both MIG devices")
    assert published_taints(srv) == {
        "gpu-2-mig-3g40gb-4": [(f"{DRIVER}/xid", "119", "NoSchedule")],
        "gpu-2-mig-4g40gb-0": [(f"{DRIVER}/xid", "119", "NoSchedule")],
    }


def test_link_down_taints_the_nic_until_carrier_returns(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    wire(h100)
    nic = h100.device("nic-0000-9a-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    assert wait_for(lambda: taints_of(srv, nic.name)) == [
        (f"{DRIVER}/link-down", "carrier", "NoSchedule")]
    h100.set_carrier(nic.host.if_name, up=True)
    assert wait_for(lambda: not taints_of(srv, nic.name), what="link back")


def test_effects_are_configurable_per_condition(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    options = HealthOptions(effects={Kind.XID: "NoExecute", Kind.LINK_DOWN: None},
                            quiet_period_s=5, nic_poll_s=0.02, gpu_wait_ms=20)
    w = wire(h100, options)
    nic = h100.device("nic-0000-9a-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    h100.nvml.inject_xid(h100.device("gpu-0").host.uuid, 79)
    wait_for(lambda: taints_of(srv, "gpu-0"))
    assert published_taints(srv) == {"gpu-0": [(f"{DRIVER}/xid", "79", "NoExecute")]}
    # No taint for the link, but the device is still reported unhealthy.
    wait_for(lambda: w.monitor.snapshot()[nic.name].state is HealthState.UNHEALTHY)


def test_flapping_link_causes_a_bounded_number_of_writes(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    interval = 0.5
    options = HealthOptions(quiet_period_s=0, min_publish_interval_s=interval,
                            nic_poll_s=0.02, gpu_wait_ms=20)
    w = wire(h100, options)
    nic = h100.device("nic-0000-c0-00-0")
    before = settled_writes(srv)
    stop = threading.Event()

    def flap() -> None:
        up = False
        while not stop.is_set():
            h100.set_carrier(nic.host.if_name, up=up)
            up = not up
            stop.wait(0.05)  # 10 Hz: down 50 ms, up 50 ms
        h100.set_carrier(nic.host.if_name, up=True)

    flapper = threading.Thread(target=flap)
    started = time.monotonic()
    flapper.start()
    time.sleep(2.0)
    stop.set()
    flapper.join()
    duration = time.monotonic() - started
    assert wait_for(lambda: w.monitor.snapshot()[nic.name].state is HealthState.HEALTHY
                    and not taints_of(srv, nic.name), what="settled")
    assert w.controller.synced(5.0)
    writes = settled_writes(srv) - before
    # One publish per window at most, plus the final state after the flapping stopped.
    assert 1 <= writes <= duration / interval + 2
    assert w.events("link-down") >= 2  # the flaps were seen, not slept through


def test_flapping_inside_the_quiet_period_is_one_fault(
        srv: FakeAPIServer, h100: Node, wire: Callable[..., Wiring]) -> None:
    options = HealthOptions(quiet_period_s=0.5, min_publish_interval_s=0.2,
                            nic_poll_s=0.02, gpu_wait_ms=20)
    wire(h100, options)
    nic = h100.device("nic-0000-c0-00-0")
    before = settled_writes(srv)
    for i in range(20):  # 10 Hz for 1 s
        h100.set_carrier(nic.host.if_name, up=i % 2 == 1)
        time.sleep(0.05)
    h100.set_carrier(nic.host.if_name, up=True)
    wait_for(lambda: taints_of(srv, nic.name), what="taint")
    wait_for(lambda: not taints_of(srv, nic.name), what="recovery")
    assert settled_writes(srv) - before == 2  # tainted once, untainted once


def test_api_without_device_taints_is_reported_and_not_retried(h100: Node) -> None:
    with FakeAPIServer(feature_gates={"DRADeviceTaints": False}) as srv:
        srv.put_object(node_object())
        w = Wiring(h100, srv, OPTIONS)
        try:
            assert w.controller.synced(5.0)
            h100.nvml.inject_xid(h100.device("gpu-2").host.uuid, 79)
            wait_for(lambda: any(isinstance(e, DroppedFieldsError) for e in w.errors),
                     what="dropped fields reported")
            writes = settled_writes(srv)
            wait_for(lambda: w.monitor.snapshot()["gpu-2"].healthy, what="recovery")
            assert w.controller.synced(5.0)
            # The tainted update and nothing more: the untainted state equals what the
            # server stored, so recovery needs no write and nothing loops.
            assert settled_writes(srv) == writes
            assert published_taints(srv) == {}
        finally:
            w.close()
