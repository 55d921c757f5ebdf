"""Device health: fault to taint published and to kubelet stream update; writes under a flap.

A simulated DGX H100 runs the whole path: FakeNvml or the sysfs tree holds the fault, the
HealthMonitor (daemon defaults: NVML wait 500 ms, link poll 500 ms) notices it, the slice
controller writes the tainted slice to the fake API server, and the kubelet stand-in reads
the health stream from the plugin's unix socket. Each round takes a different device, so the
per-device rate limit never delays a first fault.

The flap figure toggles one NIC's carrier at 10 Hz and counts ResourceSlice writes, once
with the default quiet period (the fault never clears while flapping) and once with no quiet
period, where only the per-device rate limit (one publish per 5 s) bounds the writes.
"""

from __future__ import annotations

import logging
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from agent import slices
from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.health import DeviceHealth, HealthMonitor, HealthOptions, HealthServicer
from agent.health.nic import NicProbe
from agent.plugin import PluginOptions, PluginServer
from agent.prepare import EnvOnlyEdits
from discovery.model import Inventory
from discovery.pools import build_resources
from discovery.scan import discover
from discovery.simulate import FakeNvml, scratch_dir, simulated_sources
from discovery.sources import Sources
from hack.benches import Figure
from hack.benches.plugin import prepare_options

DRIVER = "dra-agent.io"
NODE = "bench-node"
GOAL_MS = 1000.0
WRITES = ("create", "update", "patch", "delete")


class _NoClaims:
    def get(self, ref: Any) -> Mapping[str, Any]:
        raise LookupError("no claims in the health benchmark")


class _Rig:
    """Monitor -> taints -> controller -> fake API server, plus the kubelet stream."""

    def __init__(self, sources: Sources, srv: Any, root: Path, options: HealthOptions,
                 stream: bool) -> None:
        from tests.fakes.kubelet import KubeletStandIn

        self.inventory = discover(sources)
        self.srv = srv
        self.controller = slices.start(srv.kube(), DRIVER, slices.Owner(name=NODE), None,
                                       metrics=Metrics(), resync_period_s=3600)
        self.monitor = HealthMonitor(sources, DRIVER, options, self._changed)
        self.monitor.start(lambda: self.inventory)
        self._changed({})
        self.controller.synced(10)
        self.arrivals: list[tuple[float, dict[str, int]]] = []
        self.server: PluginServer | None = None
        self.kubelet: Any = None
        if stream:
            opts = PluginOptions(driver_name=DRIVER, kubelet_dir=root / "kubelet")
            self.server = plugin_server(opts, prepare_options(root), lambda: self.inventory,
                                        EnvOnlyEdits(), _NoClaims(),
                                        health_servicer=HealthServicer(self.monitor, NODE))
            self.server.start()
            self.kubelet = KubeletStandIn(root / "kubelet" / "plugins_registry").start()
            self.kubelet.wait_registered(DRIVER)
            self._stream = self.kubelet.health_stream(DRIVER)
            threading.Thread(target=self._read, daemon=True).start()

    def _changed(self, _health: Mapping[str, DeviceHealth]) -> None:
        tainted = self.monitor.apply_taints(self.inventory)
        self.controller.update(build_resources(tainted, NODE))

    def _read(self) -> None:
        try:
            for response in self._stream:
                health = {d.device.device_name: d.health for d in response.devices}
                self.arrivals.append((time.perf_counter(), health))
        except Exception:  # cancelled at the end
            return

    def tainted(self, device: str) -> bool:
        for obj in self.srv.list_objects("resourceslices", "v1"):
            for dev in obj["spec"].get("devices") or []:
                if dev["name"] == device:
                    return bool(dev.get("taints"))
        return False

    def untainted(self, *devices: str) -> bool:
        return not any(self.tainted(d) for d in devices)

    def writes(self) -> int:
        return sum(1 for r in self.srv.requests
                   if r.verb in WRITES and "resourceslices" in r.path)

    def close(self) -> None:
        if self.kubelet is not None:
            self._stream.cancel()
            self.kubelet.stop()
        if self.server is not None:
            self.server.stop(0)
        self.monitor.stop()
        self.controller.stop()


def _until(check: Callable[[], bool], timeout: float = 10.0) -> float:
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.001)
    return time.perf_counter()


def _stream_time(rig: _Rig, device: str, since: float, unhealthy: int = 2) -> float:
    def seen() -> bool:
        return any(t >= since and h.get(device) == unhealthy for t, h in rig.arrivals)

    _until(seen)
    return min(t for t, h in rig.arrivals if t >= since and h.get(device) == unhealthy)


def _latencies(sources: Sources, srv: Any, root: Path, rounds: int) -> list[Figure]:
    nvml = sources.gpu
    assert isinstance(nvml, FakeNvml)
    options = HealthOptions(quiet_period_s=0.3)
    rng = random.Random(8)
    rig = _Rig(sources, srv, root, options, stream=True)
    out: dict[str, list[float]] = {"xid taint": [], "xid stream": [], "link taint": [],
                                   "link stream": []}
    try:
        gpus = [d for d in rig.inventory.devices if d.type == "gpu"]
        nics = [d for d in rig.inventory.devices if d.type == "nic"]
        sysfs = sources.sysfs_root
        for i in range(rounds):
            gpu, nic = gpus[i % len(gpus)], nics[i % len(nics)]
            start = time.perf_counter()
            nvml.inject_xid(str(gpu.host.uuid), 79 if i % 2 else 48)
            out["xid taint"].append((_until(partial(rig.tainted, gpu.name)) - start) * 1000)
            out["xid stream"].append((_stream_time(rig, gpu.name, start) - start) * 1000)
            base = sysfs / "class/net" / str(nic.host.if_name)
            time.sleep(rng.uniform(0, options.nic_poll_s))  # anywhere in the poll cycle
            start = time.perf_counter()
            (base / "carrier").write_text("0\n")
            out["link taint"].append((_until(partial(rig.tainted, nic.name)) - start) * 1000)
            out["link stream"].append((_stream_time(rig, nic.name, start) - start) * 1000)
            (base / "carrier").write_text("1\n")
            _until(partial(rig.untainted, gpu.name, nic.name))
    finally:
        rig.close()
    figures = []
    for name, values in out.items():
        what, where = name.split()
        label = f"health {what} fault -> {'taint published' if where == 'taint' else 'stream'}"
        figures += [
            Figure(f"{label}, median", statistics.median(values), "ms", f"<= {GOAL_MS:.0f} ms",
                   statistics.median(values) <= GOAL_MS),
            Figure(f"{label}, max of {len(values)}", max(values), "ms", f"<= {GOAL_MS:.0f} ms",
                   max(values) <= GOAL_MS),
        ]
    return figures


def _flap(sources: Sources, srv: Any, root: Path, window_s: float, quiet_s: float,
          label: str, goal: float) -> Figure:
    # A 20 ms poll sees every flip, as udev/netlink wake-ups would on a real node: the worst
    # case for writes. (A 500 ms poll would alias with a 10 Hz flap and see almost nothing.)
    options = HealthOptions(quiet_period_s=quiet_s, nic_poll_s=0.02)
    rig = _Rig(sources, srv, root, options, stream=False)
    try:
        nic = next(d for d in rig.inventory.devices if d.type == "nic" and d.host.if_name)
        carrier = sources.sysfs_root / "class/net" / str(nic.host.if_name) / "carrier"
        time.sleep(0.1)
        before = rig.writes()
        end = time.perf_counter() + window_s
        up = False
        while time.perf_counter() < end:
            carrier.write_text("1\n" if up else "0\n")
            up = not up
            time.sleep(0.05)
        carrier.write_text("1\n")
        time.sleep(0.2)  # let the last publish reach the server
        writes = rig.writes() - before
    finally:
        rig.close()
    per_min = writes * 60 / window_s
    return Figure(f"health writes under a 10 Hz flap, {label}", per_min, "writes/min",
                  f"<= {goal:.0f}/min", per_min <= goal)


def _poll_cost(rounds: int) -> Figure:
    with scratch_dir() as tmp:
        sources = simulated_sources("sriov-nic", Path(tmp))
        inventory: Inventory = discover(sources)
        probe = NicProbe(sources.sysfs_root)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            probe.poll(inventory)
            times.append((time.perf_counter() - start) * 1000)
    return Figure(f"health link poll, sriov-nic ({len(inventory.devices)} NICs+VFs), median",
                  statistics.median(times), "ms", "<= 25 ms (5% at 500 ms)",
                  statistics.median(times) <= 25)


def run(quick: bool) -> list[Figure]:
    from tests.fakes.apiserver import FakeAPIServer

    figures: list[Figure] = []
    root = Path(tempfile.mkdtemp(prefix="hb", dir="/tmp"))  # short socket paths
    # Every injected fault logs a warning; the figures are the output here.
    quiet_logs = logging.getLogger("agent")
    level = quiet_logs.level
    quiet_logs.setLevel(logging.ERROR)
    try:
        with scratch_dir() as tmp, FakeAPIServer() as srv:
            srv.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            sources = simulated_sources("dgx-h100", Path(tmp) / "h100")
            figures += _latencies(sources, srv, root, 4 if quick else 12)
            # 30 s per flap run keeps `python -m hack.bench` under 5 minutes on 2 cores;
            # writes are reported per minute.
            window = 5.0 if quick else 30.0
            defaults = HealthOptions()
            figures.append(_flap(sources, srv, root, window, defaults.quiet_period_s,
                                 "default quiet period", 2 * 60 / window))
            limit = 60 / defaults.min_publish_interval_s + 2 * 60 / window
            figures.append(_flap(sources, srv, root, window, 0.0, "no quiet period", limit))
        figures.append(_poll_cost(20 if quick else 100))
    finally:
        quiet_logs.setLevel(level)
        shutil.rmtree(root, ignore_errors=True)
    return figures


if __name__ == "__main__":
    import sys

    for figure in run(quick="--quick" in sys.argv):
        print(figure.row())
