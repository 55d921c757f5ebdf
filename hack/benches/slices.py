"""ResourceSlice controller benchmark, against the fake API server and the real client.

Figures (issue 4):
* time from ``update()`` to every slice visible to a watcher, for 8, 128 and 2,048 devices,
  and the API requests the controller sent for it, by verb;
* writes during a steady-state window (60 s, or 5 s with ``--quick``; ``--steady-s N`` or
  ``DRA_AGENT_BENCH_STEADY_S`` override it): must be 0;
* time from a kubelet wipe (one deletecollection) to all slices visible again: goal <= 2 s.

The fake API server runs as its own process (``python -m tests.fakes.apiserver``), as a real
one would: in-process, its JSON validation would compete with the controller for the GIL.
"Visible" is seen the way a scheduler sees it, through a watch. The controller runs with the
daemon's default timing.
"""

from __future__ import annotations

import collections
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from agent.kube.transport import KubeHTTP, as_kubehttp
from agent.slices import Controller, Owner, chunk_devices, start
from agent.slices.api import ApiError, KubeSliceClient, SliceList, WatchStream
from discovery.model import DriverResources, Pool
from hack.benches import Figure

DRIVER = "dra-agent.io"
NODE = "bench-node"
WRITES = ("create", "update", "delete")


def devices(count: int) -> list[dict[str, Any]]:
    """``count`` H100-like GPUs in the v1 API's form (six attributes, one capacity)."""
    return [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": i},
                "uuid": {"string": f"GPU-{i:08x}-0000-0000-0000-000000000000"},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "driverVersion": {"version": "550.54.15"},
                "resource.kubernetes.io/pciBusID": {"string": f"0000:{i % 256:02x}:00.0"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(count)
    ]


def _resources(count: int) -> DriverResources:
    return DriverResources({NODE: Pool(chunk_devices(devices(count)))})


class CountingClient(KubeSliceClient):
    """The controller's real client, counting the requests it sends by verb."""

    def __init__(self, http: KubeHTTP) -> None:
        super().__init__(http)
        self.counts: collections.Counter[str] = collections.Counter()

    def served_versions(self) -> list[str]:
        self.counts["discovery"] += 1
        return super().served_versions()

    def node_uid(self, name: str) -> str:
        self.counts["get node"] += 1
        return super().node_uid(name)

    def list(self, version: str, field_selector: str) -> SliceList:
        result = super().list(version, field_selector)
        self.counts["list"] += result.requests
        return result

    def watch(self, version: str, field_selector: str, resource_version: str,
              timeout_s: int) -> WatchStream:
        self.counts["watch"] += 1
        return super().watch(version, field_selector, resource_version, timeout_s)

    def get(self, version: str, name: str) -> dict[str, Any] | None:
        self.counts["get"] += 1
        return super().get(version, name)

    def create(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.counts["create"] += 1
        return super().create(version, obj)

    def update(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.counts["update"] += 1
        return super().update(version, obj)

    def delete(self, version: str, name: str, uid: str | None,
               resource_version: str | None) -> str | None:
        self.counts["delete"] += 1
        return super().delete(version, name, uid, resource_version)


class Observer:
    """A scheduler's view: ``node``'s slices as a watch delivers them."""

    def __init__(self, http: KubeHTTP, node: str = NODE) -> None:
        self._client = KubeSliceClient(http)
        self._node = node
        self._cond = threading.Condition()
        self._devices: dict[str, tuple[int, int]] = {}  # name -> (devices, sliceCount)
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread = threading.Thread(target=self._run, name="bench-observer", daemon=True)
        self._thread.start()

    def _take(self, obj: Mapping[str, Any], deleted: bool) -> None:
        name = obj["metadata"]["name"]
        with self._cond:
            if deleted:
                self._devices.pop(name, None)
            else:
                spec = obj["spec"]
                self._devices[name] = (len(spec.get("devices") or ()),
                                       spec["pool"]["resourceSliceCount"])
            self._cond.notify_all()

    def _run(self) -> None:
        selector = f"spec.nodeName={self._node}"
        while not self._stop.is_set():
            try:
                listed = self._client.list("v1", selector)
                for obj in listed.items:
                    self._take(obj, False)
                self._stream = self._client.watch("v1", selector, listed.resource_version, 600)
                for event in self._stream:
                    if event.type != "BOOKMARK":
                        self._take(event.obj, event.type == "DELETED")
            except ApiError:
                self._stop.wait(0.05)

    def complete(self, count: int) -> bool:
        values = list(self._devices.values())
        return sum(v[0] for v in values) == count and all(v[1] == len(values) for v in values)

    def wait(self, count: int, timeout: float = 60.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.complete(count), timeout):
                raise TimeoutError(f"{count} devices not visible after {timeout}s")

    def close(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.close()
        self._thread.join(5)


@contextmanager
def fake_server() -> Iterator[Any]:
    """The fake API server in its own process; yields an ApiClient for it."""
    from kubernetes import client as k8s

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.apiserver", "--port", "0",
         "--bookmark-interval", "5"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        configuration = k8s.Configuration()
        configuration.host = url
        api_client = k8s.ApiClient(configuration)
        k8s.CoreV1Api(api_client).create_node({"metadata": {"name": NODE}})
        yield api_client
    finally:
        proc.terminate()
        proc.wait(10)


def _controller(client: CountingClient, resources: DriverResources | None) -> Controller:
    return start(client, DRIVER, Owner(name=NODE), resources)


def _publish_figures(count: int) -> list[Figure]:
    with fake_server() as api_client:
        http = as_kubehttp(api_client)  # the official backend, as FakeAPIServer.kube() gives
        client = CountingClient(http)
        observer = Observer(http)
        controller = _controller(client, DriverResources({}))
        try:
            controller.synced(30)
            client.counts.clear()
            started = time.perf_counter()
            controller.update(_resources(count))
            observer.wait(count)
            elapsed_ms = (time.perf_counter() - started) * 1000
            controller.synced(30)
            counts = dict(client.counts)
        finally:
            controller.stop()
            observer.close()
    verbs = ", ".join(f"{verb} {n}" for verb, n in sorted(counts.items()))
    return [
        Figure(f"slices update() to visible, {count} devices", elapsed_ms, "ms"),
        Figure(f"slices API requests, {count} devices ({verbs})", sum(counts.values()),
               "requests"),
    ]


def _steady_and_wipe(window_s: float, rounds: int) -> list[Figure]:
    from kubernetes import client as k8s

    figures: list[Figure] = []
    with fake_server() as api_client:
        http = as_kubehttp(api_client)  # the official backend, as FakeAPIServer.kube() gives
        client = CountingClient(http)
        observer = Observer(http)
        controller = _controller(client, _resources(2048))
        try:
            controller.synced(60)
            observer.wait(2048)
            client.counts.clear()
            time.sleep(window_s)
            writes = sum(client.counts[v] for v in WRITES)
            figures.append(Figure(
                f"slices writes in {window_s:g} s steady state, 2048 devices", writes,
                "writes", "0", writes == 0))  # fmt: skip
            api = k8s.ResourceV1Api(api_client)
            samples = []
            for _ in range(rounds):
                started = time.perf_counter()
                api.delete_collection_resource_slice(
                    field_selector=f"spec.nodeName={NODE}", _preload_content=False
                )
                observer.wait(2048)
                samples.append(time.perf_counter() - started)
                controller.synced(30)
        finally:
            controller.stop()
            observer.close()
    median, worst = statistics.median(samples), max(samples)
    figures.append(Figure("slices kubelet wipe to restored, 2048 devices (16 slices), median",
                          median, "s", "<= 2 s", median <= 2.0))
    figures.append(Figure(f"slices kubelet wipe to restored, 2048 devices, worst of {rounds}",
                          worst, "s", "<= 2 s", worst <= 2.0))
    return figures


def run(quick: bool, steady_s: float | None = None) -> list[Figure]:
    logging.getLogger("agent.slices").setLevel(logging.ERROR)
    if steady_s is None:
        env = os.environ.get("DRA_AGENT_BENCH_STEADY_S")
        steady_s = float(env) if env else (5.0 if quick else 60.0)
    figures: list[Figure] = []
    for count in (8, 128, 2048):
        figures += _publish_figures(count)
    figures += _steady_and_wipe(steady_s, 3 if quick else 10)
    return figures


if __name__ == "__main__":
    steady = None
    if "--steady-s" in sys.argv:
        steady = float(sys.argv[sys.argv.index("--steady-s") + 1])
    for figure in run(quick="--quick" in sys.argv, steady_s=steady):
        print(figure.row())
