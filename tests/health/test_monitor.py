"""HealthMonitor as the daemon uses it: threads, wake-ups, inventory changes, callbacks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace

import pytest

from agent.common.metrics import Metrics
from agent.health import DeviceHealth, HealthMonitor, HealthOptions, HealthState
from discovery.hotplug import DeviceEvent
from tests.health.conftest import Node
from tests.waiting import wait_for

OPTIONS = HealthOptions(quiet_period_s=0.2, min_publish_interval_s=0.05, nic_poll_s=0.02,
                        gpu_wait_ms=20, gpu_poll_s=0.1)


class Calls:
    def __init__(self) -> None:
        self.seen: list[Mapping[str, DeviceHealth]] = []

    def __call__(self, health: Mapping[str, DeviceHealth]) -> None:
        self.seen.append(health)


class QueueEvents:
    """A DeviceEvents source the test feeds by hand."""

    def __init__(self) -> None:
        self.q: queue.Queue[DeviceEvent] = queue.Queue()
        self.closed = False

    def poll(self, timeout: float) -> DeviceEvent | None:
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed = True


def health_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("health-")]


@pytest.fixture
def monitors() -> Iterator[list[HealthMonitor]]:
    made: list[HealthMonitor] = []
    yield made
    for m in made:
        m.stop()
    assert health_threads() == []


def test_stop_ends_every_thread_and_closes_event_sources(
        h100: Node, monitors: list[HealthMonitor]) -> None:
    events = QueueEvents()
    m = HealthMonitor(h100.sources, "dra-agent.io", OPTIONS, Calls(), events=[events])
    m.start(h100.provider())
    assert sorted(health_threads()) == ["health-events-0", "health-gpu", "health-worker"]
    with pytest.raises(RuntimeError, match="already started"):
        m.start(h100.provider())
    m.stop()
    assert health_threads() == []
    assert events.closed
    with pytest.raises(RuntimeError, match="stopped"):
        m.start(h100.provider())


def test_udev_event_wakes_the_link_poll(h100: Node, monitors: list[HealthMonitor]) -> None:
    events = QueueEvents()
    options = replace(OPTIONS, nic_poll_s=3600)  # only the event can make it look
    m = HealthMonitor(h100.sources, "dra-agent.io", options, Calls(), events=[events])
    monitors.append(m)
    m.start(h100.provider())
    nic = h100.device("nic-0000-18-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    events.q.put(DeviceEvent("net", "change", f"/devices/virtual/net/{nic.host.if_name}"))
    wait_for(lambda: m.snapshot()[nic.name].state is HealthState.UNHEALTHY, what="link down")


def _link_down_under(h100: Node, monitors: list[HealthMonitor],
                     links: QueueEvents | None) -> tuple[HealthMonitor, str]:
    """A monitor polling every 0.02 s without link messages, every hour with them (``links``:
    the source; None: none opens), and a NIC whose link then went down."""
    options = replace(OPTIONS, nic_poll_s=0.02, nic_backstop_s=3600)
    m = HealthMonitor(h100.sources, "dra-agent.io", options, Calls(), open_links=lambda: links)
    monitors.append(m)
    m.start(h100.provider())
    nic = h100.device("nic-0000-18-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    return m, nic.name


def test_with_link_messages_the_poll_is_a_backstop(h100: Node,
                                                   monitors: list[HealthMonitor]) -> None:
    """A link change is read when its message comes, at once; without one only the backstop
    poll (``nic_backstop_s``, not ``nic_poll_s``) would read it."""
    links = QueueEvents()
    m, nic = _link_down_under(h100, monitors, links)
    assert not threading.Event().wait(0.3)  # fifteen of nic_poll_s's periods
    assert m.snapshot()[nic].state is HealthState.HEALTHY
    links.q.put(DeviceEvent("net", "change", "rtnetlink"))
    wait_for(lambda: m.snapshot()[nic].state is HealthState.UNHEALTHY, what="link down")


def test_without_link_messages_the_poll_keeps_its_period(
        h100: Node, monitors: list[HealthMonitor]) -> None:
    m, nic = _link_down_under(h100, monitors, None)
    wait_for(lambda: m.snapshot()[nic].state is HealthState.UNHEALTHY, what="link down")


def test_on_change_gets_the_complete_mapping_and_its_errors_do_not_stop_monitoring(
        h100: Node, monitors: list[HealthMonitor]) -> None:
    calls: list[Mapping[str, DeviceHealth]] = []

    def broken(health: Mapping[str, DeviceHealth]) -> None:
        calls.append(health)
        raise RuntimeError("handler bug")

    m = HealthMonitor(h100.sources, "dra-agent.io", OPTIONS, broken)
    monitors.append(m)
    m.start(h100.provider())
    assert calls == []  # a healthy start needs no republish
    h100.nvml.inject_xid(h100.device("gpu-0").host.uuid, 48)
    wait_for(lambda: calls, what="first change")
    assert len(calls[0]) == len(h100.inventory.devices)
    h100.nvml.inject_xid(h100.device("gpu-1").host.uuid, 48)
    wait_for(lambda: any(h["gpu-1"].state is HealthState.UNHEALTHY for h in calls),
             what="second change after the handler failed")


def test_fault_present_at_start_is_in_the_first_state(
        h100: Node, monitors: list[HealthMonitor]) -> None:
    nic = h100.device("nic-0000-dc-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    calls = Calls()
    m = HealthMonitor(h100.sources, "dra-agent.io", OPTIONS, calls)
    monitors.append(m)
    m.start(h100.provider())
    assert m.snapshot()[nic.name].state is HealthState.UNHEALTHY  # before any thread ran
    assert len(calls.seen) == 1
    assert [t.key for t in m.apply_taints(h100.inventory).by_name()[nic.name].taints] == [
        "dra-agent.io/link-down"]


def test_without_nvml_gpus_are_unmonitored(h100: Node, monitors: list[HealthMonitor]) -> None:
    sources = replace(h100.sources, gpu=None)
    m = HealthMonitor(sources, "dra-agent.io", OPTIONS, Calls())
    monitors.append(m)
    m.start(h100.provider())
    gpu = m.snapshot()["gpu-0"]
    assert gpu.state is HealthState.UNMONITORED
    assert gpu.message == "NVML is not available"
    assert m.snapshot()["nic-0000-18-00-0"].state is HealthState.HEALTHY
    [taint] = m.apply_taints(h100.inventory).by_name()["gpu-0"].taints
    assert (taint.key, taint.effect) == ("dra-agent.io/unmonitored", "None")


def test_inventory_changes_are_followed(h100: Node, monitors: list[HealthMonitor]) -> None:
    m = HealthMonitor(h100.sources, "dra-agent.io", OPTIONS, Calls())
    monitors.append(m)
    m.start(h100.provider())
    full = h100.inventory
    h100.inventory = replace(full, devices=tuple(d for d in full.devices if d.name != "gpu-7"))
    wait_for(lambda: "gpu-7" not in m.snapshot(), what="device removed")
    before = m.changes.version
    h100.inventory = full
    wait_for(lambda: "gpu-7" in m.snapshot(), what="device back")
    assert m.snapshot()["gpu-7"].healthy
    assert m.changes.version > before  # the kubelet stream resends the new list


def test_metrics_count_events_and_recoveries(h100: Node, monitors: list[HealthMonitor]) -> None:
    metrics = Metrics()
    m = HealthMonitor(h100.sources, "dra-agent.io", OPTIONS, Calls(), metrics)
    monitors.append(m)
    m.start(h100.provider())
    uuid = h100.device("gpu-4").host.uuid
    h100.nvml.inject_xid(uuid, 13)
    h100.nvml.inject_xid(uuid, 63)
    wait_for(lambda: not m.snapshot()["gpu-4"].healthy)
    wait_for(lambda: m.snapshot()["gpu-4"].healthy, what="recovery")

    def sample(kind: str) -> float:
        return metrics.registry.get_sample_value(
            "dra_agent_health_events_total", {"kind": kind}) or 0.0

    assert (sample("xid"), sample("xid-ignored"), sample("recovered")) == (1, 1, 1)
    assert m.snapshot()["gpu-4"].conditions == ()


def test_link_messages_wake_once_per_burst() -> None:
    import socket

    from agent.health.netlink import LinkEvents

    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    events = LinkEvents(ours)
    try:
        assert events.poll(0.01) is None
        kernel.send(b"RTM_NEWLINK 1")
        kernel.send(b"RTM_NEWLINK 2")
        event = events.poll(1.0)
        assert event is not None and event.subsystem == "net"
        assert events.poll(0.01) is None  # the burst was one wake-up
    finally:
        events.close()
        kernel.close()
    assert events.poll(0.01) is None  # closed: quiet, not an error


def test_host_link_events_open_or_are_skipped_without_error() -> None:
    from agent.health.netlink import open_link_events

    events = open_link_events()  # None where the sandbox forbids netlink
    if events is not None:
        events.poll(0.01)
        events.close()
