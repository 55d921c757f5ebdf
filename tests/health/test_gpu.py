"""The NVML watcher against FakeNvml: events, MIG inheritance, lost GPUs, fallbacks."""

from __future__ import annotations

import threading

import pytest

from agent.health.gpu import GpuWatcher, Mode, devices_for
from agent.health.model import Kind
from agent.health.options import HealthOptions
from discovery.gpulib import DriverNotLoadedError, GpuLibraryError, NotSupportedError
from discovery.simulate import FakeNvml
from tests.health.conftest import FakeClock, Node, RecordingSink

FAST = HealthOptions(gpu_wait_ms=20, gpu_poll_s=1.0, gpu_retry_s=1.0)


def watcher(node: Node, options: HealthOptions = FAST,
            lib: FakeNvml | None = None) -> tuple[GpuWatcher, RecordingSink, FakeClock]:
    sink, clock = RecordingSink(), FakeClock()
    w = GpuWatcher(lib or node.nvml, options, sink, inventory=node.provider(),
                   stop=threading.Event(), clock=clock)
    w.setup()
    return w, sink, clock


def uuid_of(node: Node, name: str) -> str:
    uuid = node.device(name).host.uuid
    assert uuid
    return str(uuid)


def test_every_gpu_is_registered_for_events(h100: Node) -> None:
    w, _, _ = watcher(h100)
    assert set(w.modes().values()) == {Mode.EVENTS}
    assert len(w.modes()) == 8
    assert w.levels(h100.inventory) == {}


def test_critical_xid_reaches_the_device_with_its_meaning(h100: Node) -> None:
    w, sink, _ = watcher(h100)
    h100.nvml.inject_xid(uuid_of(h100, "gpu-3"), 79)
    w.step()
    [(devices, source, cond)] = sink.events
    assert devices == ("gpu-3",) and source == "gpu"
    assert (cond.kind, cond.value, cond.message) == (
        Kind.XID, "79", "Xid 79: GPU has fallen off the bus")
    assert sink.counts["xid"] == 1


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored(h100: Node, xid: int) -> None:
    w, sink, _ = watcher(h100)
    h100.nvml.inject_xid(uuid_of(h100, "gpu-0"), xid)
    w.step()
    assert sink.events == []
    assert sink.counts == {"xid-ignored": 1}


def test_ignore_list_is_configurable(h100: Node) -> None:
    w, sink, _ = watcher(h100, HealthOptions(ignored_xids=frozenset({94}), gpu_wait_ms=20))
    h100.nvml.inject_xid(uuid_of(h100, "gpu-0"), 94)
    h100.nvml.inject_xid(uuid_of(h100, "gpu-0"), 13)  # no longer ignored
    w.step()
    w.step()
    assert [c.value for _, _, c in sink.events] == ["13"]


def test_double_bit_ecc_is_a_fault_single_bit_is_not_registered(h100: Node) -> None:
    w, sink, _ = watcher(h100)
    uuid = uuid_of(h100, "gpu-1")
    h100.nvml.inject_ecc(uuid, double_bit=False)
    h100.nvml.inject_ecc(uuid, double_bit=True)
    w.step()
    w.step()
    assert [(d, c.kind, c.value) for d, _, c in sink.events] == [
        (("gpu-1",), Kind.ECC, "double-bit")]


def test_whole_gpu_event_reaches_every_mig_device_and_mig_event_only_its_own(a100: Node) -> None:
    w, sink, _ = watcher(a100)
    parent = a100.device("gpu-3-mig-1g20gb-4").host.parent_uuid
    migs = sorted(d.name for d in a100.inventory.devices if d.host.parent_uuid == parent)
    a100.nvml.inject_xid(parent, 48)
    w.step()
    assert sorted(sink.events[-1][0]) == migs
    a100.nvml.inject_xid(a100.device("gpu-3-mig-1g20gb-4").host.uuid, 74)
    w.step()
    assert sink.events[-1][0] == ("gpu-3-mig-1g20gb-4",)


def test_gi_event_covers_each_compute_instance_of_that_gi(a100: Node) -> None:
    parent = a100.device("gpu-3-mig-1c3g40gb-0-ci0").host.parent_uuid
    assert parent
    assert devices_for(a100.inventory, parent, gi=1) == [
        "gpu-3-mig-1c3g40gb-0-ci0", "gpu-3-mig-1c3g40gb-0-ci1", "gpu-3-mig-1c3g40gb-0-ci2"]
    assert devices_for(a100.inventory, parent, gi=1, ci=2) == ["gpu-3-mig-1c3g40gb-0-ci2"]
    assert devices_for(a100.inventory, parent, gi=99) == []


def test_lost_gpu_is_a_level_until_it_answers_again(h100: Node) -> None:
    w, sink, clock = watcher(h100)
    uuid = uuid_of(h100, "gpu-5")
    h100.nvml.set_lost(uuid)
    w.step()  # the Xid 79 event the driver sends first
    assert [c.value for _, _, c in sink.events] == ["79"]
    w.step()  # the probe the Xid 79 asked for
    w.step()  # the wait notices the lost GPU
    assert w.modes()[uuid] is Mode.LOST
    levels = w.levels(h100.inventory)
    assert [(c.kind, c.message) for c in levels["gpu-5"]] == [
        (Kind.GPU_LOST, f"GPU {uuid} is lost (NVML: GPU_IS_LOST)")]
    assert set(levels) == {"gpu-5"}
    w.step()  # other GPUs still deliver events: the lost one left the event set
    h100.nvml.inject_xid(uuid_of(h100, "gpu-0"), 92)
    w.step()
    assert sink.events[-1][0] == ("gpu-0",)
    h100.nvml.clear_faults()  # reset
    clock.advance(1.0)
    w.step()
    assert w.modes()[uuid] is Mode.EVENTS
    assert w.levels(h100.inventory) == {}


def test_gpu_refusing_events_is_polled_and_still_healthy(h100: Node) -> None:
    uuid = uuid_of(h100, "gpu-2")
    h100.nvml.fail("device_register_events", NotSupportedError("no events"), uuid)
    w, _, clock = watcher(h100)
    assert w.modes()[uuid] is Mode.POLLED
    assert w.levels(h100.inventory) == {}
    h100.nvml.gpus[2].lost = True  # polled: the probe notices the loss
    clock.advance(1.0)
    w.step()
    assert w.modes()[uuid] is Mode.LOST
    assert [c.kind for c in w.levels(h100.inventory)["gpu-2"]] == [Kind.GPU_LOST]


def test_neither_events_nor_probe_means_unmonitored(h100: Node) -> None:
    uuid = uuid_of(h100, "gpu-2")
    h100.nvml.fail("device_register_events", GpuLibraryError("Unknown Error"), uuid)
    h100.nvml.fail("device_memory_total", GpuLibraryError("Unknown Error"), uuid)
    w, _, clock = watcher(h100)
    assert w.modes()[uuid] is Mode.UNMONITORED
    [cond] = w.levels(h100.inventory)["gpu-2"]
    assert cond.kind is Kind.UNMONITORED and "Unknown Error" in cond.message
    h100.nvml.clear_faults()
    clock.advance(1.0)
    w.step()
    assert w.modes()[uuid] is Mode.EVENTS


def test_nvml_unavailable_marks_every_gpu_unmonitored_and_is_retried(h100: Node) -> None:
    lib = h100.nvml
    lib.init_error = DriverNotLoadedError("Driver Not Loaded", call="init")
    w, sink, clock = watcher(h100, lib=lib)
    levels = w.levels(h100.inventory)
    assert len(levels) == 8
    assert all(c.kind is Kind.UNMONITORED and "Driver Not Loaded" in c.message
               for conds in levels.values() for c in conds)
    lib.init_error = None
    clock.advance(1.0)
    w.step()
    assert w.levels(h100.inventory) == {}
    assert sink.wakes >= 1


def test_event_set_failure_falls_back_to_polling(h100: Node) -> None:
    h100.nvml.fail("event_set_create", GpuLibraryError("Unknown Error"))
    w, _, _ = watcher(h100)
    assert set(w.modes().values()) == {Mode.POLLED}
    assert w.levels(h100.inventory) == {}


def test_thread_stops_and_shuts_nvml_down(h100: Node) -> None:
    w, _, _ = watcher(h100)
    t = threading.Thread(target=w.run)
    t.start()
    w.stop_event.set()
    t.join(2)
    assert not t.is_alive()
    assert h100.nvml._refs == 0


def test_unattributed_lost_report_taints_nothing_and_events_resume(h100: Node) -> None:
    from discovery.gpulib import GpuIsLostError

    w, sink, _ = watcher(h100)
    h100.nvml.fail("event_set_wait", GpuIsLostError("GPU is lost", call="event_set_wait"))
    w.step()
    assert set(w.modes().values()) == {Mode.EVENTS}
    assert w.levels(h100.inventory) == {}
    h100.nvml.clear_faults()
    h100.nvml.inject_xid(uuid_of(h100, "gpu-2"), 48)
    w.step()
    assert sink.events[-1][0] == ("gpu-2",)


def test_failed_event_wait_re_registers(h100: Node) -> None:
    w, sink, _ = watcher(h100)
    h100.nvml.fail("event_set_wait", GpuLibraryError("Unknown Error", call="event_set_wait"))
    w.step()
    assert sink.counts == {"nvml-error": 1}
    h100.nvml.clear_faults()
    h100.nvml.inject_xid(uuid_of(h100, "gpu-4"), 48)
    w.step()
    assert sink.events[-1][0] == ("gpu-4",)
