"""Hotplug debounce and change suppression; the NVML fake's event hooks; NVML value helpers."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import pytest

from discovery.gpulib import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_MIG_CONFIG_CHANGE,
    EVENT_XID_CRITICAL,
    WHOLE_GPU,
    GpuIsLostError,
    MigAttributes,
    UninitializedError,
    cuda_version_string,
    mig_profile_name,
    nvml_bus_id_to_sysfs,
)
from discovery.gpus import mig_cap_minors
from discovery.hotplug import DeviceEvent, HotplugWatcher, NullEvents
from discovery.model import Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import FakeNvml, simulated_sources
from discovery.sources import Sources
from tests.waiting import wait_for as _wait


class FakeEvents:
    """DeviceEvents fed by the test."""

    def __init__(self) -> None:
        self.queue: queue.Queue[DeviceEvent] = queue.Queue()
        self.closed = False

    def push(self, subsystem: str, action: str, count: int = 1) -> None:
        for i in range(count):
            self.queue.put(DeviceEvent(subsystem, action, f"/sys/devices/x/{i}"))

    def poll(self, timeout: float) -> DeviceEvent | None:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        self.closed = True


class Harness:
    def __init__(self, sources: Sources, slow_rescan_s: float = 60.0) -> None:
        self.events = FakeEvents()
        self.changes: list[Inventory] = []
        self.stop = threading.Event()
        self.watcher = HotplugWatcher(
            sources, DiscoveryOptions(), self.changes.append, self.events,
            debounce_s=0.05, slow_rescan_s=slow_rescan_s, stop_event=self.stop,
        )
        self.thread = self.watcher.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive() and self.events.closed


@pytest.fixture
def sriov(workdir: Path) -> Sources:
    return simulated_sources("sriov-nic", workdir)


def test_first_scan_is_reported_then_a_burst_without_change_is_silent(sriov: Sources) -> None:
    h = Harness(sriov)
    try:
        _wait(lambda: len(h.changes) == 1)
        assert len(h.changes[0].devices) == 130
        h.events.push("pci", "add", count=64)  # 64 VFs appearing at once
        _wait(lambda: h.watcher.scans == 2 and h.events.queue.empty())
        time.sleep(0.15)  # longer than the debounce: no second rescan may follow
        assert h.watcher.scans == 2
        assert len(h.changes) == 1
    finally:
        h.close()


def test_removed_device_is_reported_after_its_uevent(sriov: Sources) -> None:
    h = Harness(sriov)
    try:
        _wait(lambda: len(h.changes) == 1)
        (sriov.sysfs_root / "bus/pci/devices/0000:3b:00.2").unlink()
        h.events.push("pci", "remove")
        _wait(lambda: len(h.changes) == 2)
        names = {d.name for d in h.changes[1].devices}
        assert "vf-0000-3b-00-2" not in names and len(names) == 129
    finally:
        h.close()


def test_irrelevant_events_do_not_rescan(sriov: Sources) -> None:
    h = Harness(sriov)
    try:
        _wait(lambda: len(h.changes) == 1)
        h.events.push("block", "add", count=3)
        h.events.push("pci", "online")
        _wait(h.events.queue.empty)
        time.sleep(0.1)
        assert h.watcher.scans == 1
    finally:
        h.close()


def test_mig_reconfiguration_is_caught_by_the_slow_rescan(workdir: Path) -> None:
    sources = simulated_sources("dgx-a100-mig", workdir)
    assert isinstance(sources.gpu, FakeNvml)
    h = Harness(sources, slow_rescan_s=0.1)
    try:
        _wait(lambda: len(h.changes) == 1)
        _wait(lambda: h.watcher.scans >= 2)  # periodic rescans, nothing changed
        assert len(h.changes) == 1
        sources.gpu.gpus[2].migs.pop()  # the 3g.40gb instance at placement 4 is destroyed
        _wait(lambda: len(h.changes) == 2)
        assert "gpu-2-mig-3g40gb-4" not in {d.name for d in h.changes[1].devices}
    finally:
        h.close()


def test_initial_inventory_given_means_no_report_until_a_change(sriov: Sources) -> None:
    events = FakeEvents()
    changes: list[Inventory] = []
    scans: list[float] = []
    watcher = HotplugWatcher(sriov, DiscoveryOptions(), changes.append, events,
                             initial=discover(sriov), debounce_s=0.01,
                             on_scan=lambda inv, seconds: scans.append(seconds))
    assert watcher.rescan("test") is False and changes == []
    assert len(scans) == 1 and scans[0] > 0


def test_without_uevents_the_watcher_still_rescans_periodically(sriov: Sources) -> None:
    stop = threading.Event()
    changes: list[Inventory] = []
    watcher = HotplugWatcher(sriov, DiscoveryOptions(), changes.append, NullEvents(stop),
                             slow_rescan_s=0.05, stop_event=stop)
    thread = watcher.start()
    try:
        _wait(lambda: watcher.scans >= 3)
        assert len(changes) == 1
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()


def test_null_events_wait_out_the_timeout_or_the_stop_and_report_nothing() -> None:
    stop = threading.Event()
    events = NullEvents(stop)
    start = time.monotonic()
    assert events.poll(0.05) is None
    assert time.monotonic() - start >= 0.05
    threading.Timer(0.05, stop.set).start()
    start = time.monotonic()
    assert events.poll(30) is None  # the stop ends the wait
    assert time.monotonic() - start < 10
    events.close()


# -- the NVML fake's hooks ------------------------------------------------------------------


def test_fake_nvml_delivers_xids_ecc_and_lost_gpus(workdir: Path) -> None:
    nvml = simulated_sources("dgx-a100-mig", workdir).gpu
    assert isinstance(nvml, FakeNvml)
    with pytest.raises(UninitializedError):
        nvml.device_count()
    nvml.init()
    events = nvml.event_set_create()
    for i in range(nvml.device_count()):
        handle = nvml.device_handle_by_index(i)
        nvml.device_register_events(
            handle, nvml.device_supported_event_types(handle), events)
    gpu4, gpu0 = nvml.gpus[4], nvml.gpus[0]
    assert nvml.event_set_wait(events, 10) is None
    nvml.inject_xid(gpu4.uuid, 48)
    event = nvml.event_set_wait(events, 100)
    assert event is not None
    assert (event.uuid, event.event_type, event.data) == (gpu4.uuid, EVENT_XID_CRITICAL, 48)
    assert event.gpu_instance == WHOLE_GPU
    nvml.inject_xid(gpu0.migs[2].uuid, 94)
    mig_event = nvml.event_set_wait(events, 100)
    assert mig_event is not None and (mig_event.gpu_instance, mig_event.compute_instance) == (9, 0)
    nvml.inject_mig_change(gpu0.uuid)
    change = nvml.event_set_wait(events, 100)
    assert change is not None and change.event_type == EVENT_MIG_CONFIG_CHANGE
    nvml.inject_ecc(gpu4.uuid)
    ecc = nvml.event_set_wait(events, 100)
    assert ecc is not None and ecc.event_type == EVENT_DOUBLE_BIT_ECC
    nvml.set_lost(gpu4.uuid)
    lost = nvml.event_set_wait(events, 100)
    assert lost is not None and lost.data == 79
    with pytest.raises(GpuIsLostError):
        nvml.event_set_wait(events, 10)
    with pytest.raises(GpuIsLostError):
        nvml.device_name(nvml.device_handle_by_index(4))
    nvml.clear_faults()
    assert nvml.device_name(nvml.device_handle_by_index(4)) == "NVIDIA A100-SXM4-80GB"
    nvml.event_set_free(events)
    nvml.shutdown()


# -- value helpers ----------------------------------------------------------------------------


def test_nvml_bus_id_is_converted_to_the_sysfs_form() -> None:
    assert nvml_bus_id_to_sysfs("00000000:1B:00.0") == "0000:1b:00.0"
    assert nvml_bus_id_to_sysfs("00000001:C3:1F.7") == "0001:c3:1f.7"
    with pytest.raises(ValueError):
        nvml_bus_id_to_sysfs("garbage")


def test_cuda_version_and_mig_cap_minors() -> None:
    assert cuda_version_string(12040) == "12.4.0"
    assert cuda_version_string(13000) == "13.0.0"
    assert mig_cap_minors(0, 1, 0) == (12, 13)
    assert mig_cap_minors(0, 1, 2)[1] == 15
    assert mig_cap_minors(3, 3, 3)[1] == 439
    assert mig_cap_minors(31, 14, 7)[1] == 4322


def _attrs(g: int, mib: int, c: int = 0) -> MigAttributes:
    return MigAttributes(0, 0, 0, 0, 0, 0, g, c or g, mib)


@pytest.mark.parametrize(("total_mib", "g", "mib", "name"), [
    (81559, 1, 9984, "1g.10gb"),  # H100 80GB
    (81559, 1, 20096, "1g.20gb"),
    (81559, 3, 40448, "3g.40gb"),
    (81559, 7, 81152, "7g.80gb"),
    (143771, 3, 71168, "3g.71gb"),  # H200: the rounding rule, not the marketing name
    (143771, 1, 16384, "1g.18gb"),
    (81920, 1, 9728, "1g.10gb"),  # A100 80GB
    (81920, 4, 40192, "4g.40gb"),
])
def test_mig_profile_names_follow_the_rounding_rule(
    total_mib: int, g: int, mib: int, name: str
) -> None:
    assert mig_profile_name(_attrs(g, mib), total_mib * 1024 * 1024) == name


def test_mig_profile_name_for_split_compute_and_media_extensions() -> None:
    total = 81920 * 1024 * 1024
    assert mig_profile_name(_attrs(3, 40192, c=1), total) == "1c.3g.40gb"
    assert mig_profile_name(_attrs(1, 9728), total, me=True) == "1g.10gb+me"
