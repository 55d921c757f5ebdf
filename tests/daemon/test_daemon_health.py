"""The daemon wires health into both outputs: ResourceSlice taints and the kubelet stream."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.common.config import Config
from agent.daemon import Daemon, RunOptions
from agent.health import HealthOptions
from discovery.simulate import FakeNvml
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn
from tests.waiting import wait_for

DRIVER = "dra-agent.io"
NODE = "node-h"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, FakeAPIServer, Path]]:
    short = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    with FakeAPIServer() as srv:
        srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        cfg = Config(
            driver_name=DRIVER, node_name=NODE,
            kubeconfig=str(srv.write_kubeconfig(tmp_path / "kubeconfig")),
            kubelet_dir=short / "k", cdi_dir=short / "cdi", simulate="dgx-h100",
            metrics_address="127.0.0.1:0",
        )
        health = HealthOptions(quiet_period_s=0.3, min_publish_interval_s=0.1, nic_poll_s=0.05,
                               gpu_wait_ms=50)
        daemon = Daemon(cfg, RunOptions(health=health, slow_rescan_s=3600), environ={})
        daemon.start()
        try:
            yield daemon, srv, short
        finally:
            daemon.shutdown()
            shutil.rmtree(short, ignore_errors=True)


def device_taints(srv: FakeAPIServer, name: str) -> list[dict[str, Any]]:
    for s in srv.list_objects("resourceslices"):
        for d in s["spec"]["devices"]:
            if d["name"] == name:
                return list(d.get("taints", []))
    raise AssertionError(f"device {name} not published")


def test_xid_taints_the_gpu_and_recovery_clears_it(
    running: tuple[Daemon, FakeAPIServer, Path],
) -> None:
    daemon, srv, _ = running
    assert daemon.controller.synced(10)
    assert device_taints(srv, "gpu-3") == []
    nvml = daemon.sources.gpu
    assert isinstance(nvml, FakeNvml)
    uuid = daemon.inventory.by_name()["gpu-3"].host.uuid
    assert uuid
    nvml.inject_xid(uuid, 79)
    wait_for(lambda: bool(device_taints(srv, "gpu-3")))
    taint = device_taints(srv, "gpu-3")[0]
    assert taint["key"] == f"{DRIVER}/xid" and taint["effect"] == "NoSchedule"
    assert taint.get("value") == "79"
    assert device_taints(srv, "gpu-2") == []  # only the faulty GPU
    sample = daemon.metrics.registry.get_sample_value
    assert sample("dra_agent_devices", {"type": "gpu", "health": "unhealthy"}) == 1
    assert sample("dra_agent_devices", {"type": "gpu", "health": "healthy"}) == 7
    # The signal stays clear for the quiet period: healthy again, taint removed.
    wait_for(lambda: device_taints(srv, "gpu-3") == [])


def test_ignored_xid_changes_nothing(running: tuple[Daemon, FakeAPIServer, Path]) -> None:
    daemon, srv, _ = running
    assert daemon.controller.synced(10)
    srv.clear_requests()
    nvml = daemon.sources.gpu
    uuid = daemon.inventory.by_name()["gpu-1"].host.uuid
    nvml.inject_xid(uuid, 13)  # graphics engine exception: the application's fault
    time.sleep(0.5)
    assert device_taints(srv, "gpu-1") == []
    assert [r for r in srv.requests if r.verb in ("create", "update", "patch", "delete")] == []


def test_link_down_reaches_the_kubelet_health_stream(
    running: tuple[Daemon, FakeAPIServer, Path],
) -> None:
    daemon, srv, short = running
    nic = daemon.inventory.by_name()["nic-0000-18-00-0"]
    with KubeletStandIn(short / "k" / "plugins_registry") as kubelet:
        reg = kubelet.wait_registered(DRIVER, timeout=10)
        assert "v1alpha1.DRAResourceHealth" in reg.supported_versions
        stream = kubelet.health_stream(DRIVER, timeout=20)
        seen: list[Any] = []

        def read() -> None:
            for response in stream:
                seen.append(response)
                states = {d.device.device_name: d.health for d in response.devices}
                if states.get(nic.name) == 2:  # UNHEALTHY
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_for(lambda: bool(seen))
        net = daemon.sources.sysfs_root / "class/net" / str(nic.host.if_name)
        (net / "carrier").write_text("0\n")
        (net / "operstate").write_text("down\n")
        reader.join(10)
        stream.cancel()
    last = {d.device.device_name: d for d in seen[-1].devices}
    assert last[nic.name].health == 2
    assert "link" in last[nic.name].message.lower()
    assert len(last) == len(daemon.inventory.devices)  # the complete list every time
    wait_for(lambda: any(t["key"] == f"{DRIVER}/link-down"
                         for t in device_taints(srv, nic.name)))


def test_a_dead_background_thread_is_fatal(running: tuple[Daemon, FakeAPIServer, Path]) -> None:
    daemon, _, _ = running
    assert daemon._check_threads() == (True, "background threads alive")
    crashed = threading.Thread(target=lambda: None, name="crashed")
    crashed.start()
    crashed.join()
    daemon._threads["crashed"] = crashed  # a vital loop that ended
    ok, why = daemon._check_threads()
    assert not ok and "crashed" in why
    # run() notices within its check period, stops everything and exits non-zero.
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(daemon.run_until_stopped()))
    runner.start()
    runner.join(10)
    assert result == [1]


def test_a_dead_registration_watchdog_is_fatal(
    running: tuple[Daemon, FakeAPIServer, Path]
) -> None:
    """Without its watchdog nobody recreates a refused registration: /healthz must not stay
    200 while /readyz is 503 for ever, the agent exits 1 instead."""
    daemon, _, _ = running
    assert daemon.plugin is not None and daemon.plugin.registration.alive()
    daemon.plugin.registration.stop(0)  # the watchdog thread ends, as if it had crashed
    ok, why = daemon._check_threads()
    assert not ok and "registration-watchdog" in why
    assert not daemon.healthy()
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(daemon.run_until_stopped()))
    runner.start()
    runner.join(10)
    assert result == [1]



class _SignalDuringReady:
    """A notifier during whose READY=1 a SIGTERM lands: the handler (run.py's) calls
    ``request_stop`` on the same thread, inside the send. Its lock is not re-entrant, like the
    real one's; ``acquire(timeout=)`` turns the deadlock that once hung the agent into a
    failure."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: list[dict[str, Any]] = []
        self.daemon: Daemon | None = None
        self.enabled = True

    def notify(self, **fields: Any) -> bool:
        assert self.lock.acquire(timeout=5), f"notifier re-entered while sending {self.sent}"
        try:
            self.sent.append(fields)
            if fields.get("READY") == 1 and self.daemon is not None:
                self.daemon.request_stop("SIGTERM")
        finally:
            self.lock.release()
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify(READY=1, STATUS=status or "ready")

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def stopping(self, status: str | None = None) -> bool:
        return self.notify(STOPPING=1, STATUS=status or "stopping")

    def run_watchdog(self, *_args: Any) -> None:
        return None

    def close(self) -> None:
        pass


def test_a_stop_request_inside_a_notification_does_not_hang(tmp_path: Path) -> None:
    short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    try:
        notifier = _SignalDuringReady()
        cfg = Config(driver_name=DRIVER, node_name=NODE, kubeconfig="none",
                     kubelet_dir=short / "k", cdi_dir=short / "cdi", simulate="dgx-h100",
                     metrics_address="127.0.0.1:0")
        daemon = Daemon(cfg, RunOptions(health=None, slow_rescan_s=3600),
                        notifier=notifier, environ={})  # type: ignore[arg-type]
        notifier.daemon = daemon
        assert daemon.run() == 0
        assert [f.get("READY") or f.get("STOPPING") for f in notifier.sent][-2:] == [1, 1]
        assert notifier.sent[-1]["STATUS"] == "stopping: SIGTERM"
    finally:
        shutil.rmtree(short, ignore_errors=True)
