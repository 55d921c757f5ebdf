"""Kubelet plugin benchmark: prepare/unprepare latency through real gRPC, beside the floor.

The floor is measured in the same run on the same disk: one GET of the claim from the fake API
server (through the same kubernetes client) plus the two file writes a prepare makes, with its one
fsync (the CDI spec, atomic; the checkpoint, fsynced: docs/durability.md). Prepare does that plus
the gRPC round trip, the validation and the in-memory PrepareStarted reservation, so its goal is
p50 <= 1.5x floor and p99 <= 10 ms. Floor, prepare and unprepare are measured in turn, round by
round, so disk noise from neighbours hits all alike; the floor's own p99 is printed to show how
much of a prepare's p99 is the disk's.

A 1-NIC claim is measured beside them: its prepare also writes the claim's ``status.devices``
(one server-side apply on ``/status``), after the answer (``agent.plugin.statusqueue``, as
DRANet writes it from its NRI hook, after prepare): timed to the answer, and to the status
written (the answer, then ``PluginFramework.settle``), one more API round trip than the floor.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent.claim.model import ClaimRef
from agent.common.metrics import Metrics
from agent.daemon.wiring import plugin_server
from agent.kube.transport import KubeHTTP
from agent.plugin import PluginOptions, PluginServer
from agent.plugin.apiclaims import APIClaimSource
from agent.prepare import EnvOnlyEdits
from agent.prepare.options import PrepareOptions
from cdi.atomicfile import write_atomic
from discovery.model import Device, DeviceType, HostInfo, Inventory
from hack.benches import Figure, percentile

DRIVER = "dra-agent.io"
NODE = "bench-node"


def prepare_options(root: Path, **changes: Any) -> PrepareOptions:
    """A bench node's preparation under ``root`` (its boot ID file there)."""
    return PrepareOptions(driver_name=DRIVER, node_name=NODE, cdi_dir=root / "cdi",
                          plugin_dir=root / "kubelet" / "plugins" / DRIVER,
                          boot_id_path=root / "boot_id", **changes)


@contextmanager
def served(root: Path, inventory: Callable[[], Inventory], api: KubeHTTP,
           max_workers: int = 16, **server_args: Any) -> Iterator[tuple[PluginServer, Any]]:
    """The plugin on real unix sockets under ``root`` (kubelet dir, CDI dir, boot ID there),
    registered with the kubelet stand-in: (server, kubelet); both stopped on the way out.
    The benches that call the plugin through gRPC share it."""
    from tests.fakes.kubelet import KubeletStandIn

    boot = root / "boot_id"
    boot.write_text("bench\n")
    options = PluginOptions(driver_name=DRIVER, kubelet_dir=root / "kubelet",
                            max_workers=max_workers)
    server = plugin_server(options, prepare_options(root), inventory, EnvOnlyEdits(),
                           APIClaimSource(api), metrics=Metrics(), **server_args)
    server.start()
    kubelet = KubeletStandIn(options.kubelet_dir / "plugins_registry").start()
    try:
        kubelet.wait_registered(DRIVER)
        yield server, kubelet
    finally:
        kubelet.stop()
        server.stop(0)


def _claim(name: str, devices: list[str], device_class: str = "gpu") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "req", "exactly": {
            "deviceClassName": device_class, "allocationMode": "All"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "req", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
        ]}}},
    }


def _ref(claim: dict[str, Any]) -> Any:
    from tests.fakes.kubelet import ClaimRef as KubeletRef

    m = claim["metadata"]
    return KubeletRef(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def run(quick: bool) -> list[Figure]:
    from tests.fakes.apiserver import FakeAPIServer

    rounds = 40 if quick else 200
    callers, per_caller = 16, (5 if quick else 20)
    root = Path(tempfile.mkdtemp(prefix="kb", dir="/tmp"))
    gpus = [
        Device(name=f"gpu-{i}", type=DeviceType.GPU, attributes={}, capacity={},
               host=HostInfo(pci_address=f"0000:{i // 32:02x}:{i % 32:02x}.0"))
        for i in range(callers * 8)
    ]
    nic = Device(name="nic-0", type=DeviceType.NIC, attributes={"macAddress": "b8:3f:d2:00:00:01"},
                 capacity={}, host=HostInfo(pci_address="0000:c0:00.0", if_name="ens1f0"))
    devices = (*gpus, nic)
    figures: list[Figure] = []
    try:
        with FakeAPIServer() as srv:
            api = srv.kube()
            with served(root, lambda: Inventory(devices=devices), api, callers) as (server,
                                                                                     kubelet):
                figures += _latency(srv, api, kubelet, root, rounds, server.framework.settle)
                figures += _throughput(srv, kubelet, callers, per_caller)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures


def _floor_step(srv: Any, api: KubeHTTP, root: Path) -> Callable[[], object]:
    """One floor operation: GET the claim, write two small files as a prepare does (one
    fsync, the checkpoint's)."""
    source = APIClaimSource(api)
    claim = srv.put_object(_claim("floor", ["gpu-0"]))
    ref = ClaimRef("bench", "floor", claim["metadata"]["uid"])
    spec, state = b"x" * 900, b"y" * 1200
    floor_dir = root / "floor"
    floor_dir.mkdir()

    def once() -> None:
        source.get(ref)
        write_atomic(floor_dir / "spec.json", spec, exact_mode=False, durable=False)
        write_atomic(floor_dir / "checkpoint.json", state, exact_mode=False, sync_dir=False)

    return once


def _latency(srv: Any, api: KubeHTTP, kubelet: Any, root: Path, rounds: int,
             settle: Callable[[], object]) -> list[Figure]:
    """Floor, prepare and unprepare measured in turn, round by round, so that a noisy
    neighbour (2 shared cores) hits all of them alike; ``settle`` waits for the claim status
    writes queued by the prepares."""
    floor_once = _floor_step(srv, api, root)
    floor: list[float] = []
    prep: dict[int, list[float]] = {1: [], 8: [], 0: []}
    unprep: dict[int, list[float]] = {1: [], 8: [], 0: []}
    reported: list[float] = []  # the 1-NIC claim's prepare until its status is written
    for i in range(rounds + 5):
        f = _timed(floor_once)
        for size in (1, 8, 0):  # 0: the 1-NIC claim
            devices = [f"gpu-{d}" for d in range(size)] if size else ["nic-0"]
            claim = srv.put_object(_claim(f"c{size}-{i}", devices, "gpu" if size else "nic"))
            ref = _ref(claim)
            start = time.perf_counter()
            kubelet.prepare(DRIVER, [ref])
            p = (time.perf_counter() - start) * 1000
            settle()
            written = (time.perf_counter() - start) * 1000
            u = _timed(lambda r=ref: kubelet.unprepare(DRIVER, [r]))
            if i >= 5:  # warm-up
                prep[size].append(p)
                unprep[size].append(u)
                if not size:
                    reported.append(written)
        if i >= 5:
            floor.append(f)
    floor_p50 = statistics.median(floor)
    out = [
        Figure("plugin floor (GET claim + 2 writes, 1 fsync), p50", floor_p50, "ms"),
        Figure("plugin floor (GET claim + 2 writes, 1 fsync), p99", percentile(floor, 0.99),
               "ms"),
    ]
    for size in (1, 8):
        p50, p99 = statistics.median(prep[size]), percentile(prep[size], 0.99)
        u99 = percentile(unprep[size], 0.99)
        out += [
            Figure(f"plugin prepare {size}-device claim, p50", p50, "ms",
                   f"<= {1.5 * floor_p50:.2f} ms", p50 <= 1.5 * floor_p50),
            Figure(f"plugin prepare {size}-device claim, p99", p99, "ms", "<= 10 ms",
                   p99 <= 10),
            Figure(f"plugin unprepare {size}-device claim, p50",
                   statistics.median(unprep[size]), "ms"),
            Figure(f"plugin unprepare {size}-device claim, p99", u99, "ms", "<= 10 ms",
                   u99 <= 10),
        ]
    nic50, nic99 = statistics.median(prep[0]), percentile(prep[0], 0.99)
    out += [
        Figure("plugin prepare 1-NIC claim, p50", nic50, "ms"),
        Figure("plugin prepare 1-NIC claim, p99", nic99, "ms", "<= 10 ms", nic99 <= 10),
        Figure("plugin prepare 1-NIC claim until its status is written, p50",
               statistics.median(reported), "ms"),
    ]
    return out


def _throughput(srv: Any, kubelet: Any, callers: int, per_caller: int) -> list[Figure]:
    work = [
        [srv.put_object(_claim(f"t{c}-{i}", [f"gpu-{c * 8 + i % 8}"])) for i in range(per_caller)]
        for c in range(callers)
    ]
    failures: list[str] = []

    def caller(claims: list[dict[str, Any]]) -> None:
        for claim in claims:
            ref = _ref(claim)
            if not kubelet.prepare(DRIVER, [ref])[ref.uid].ok:
                failures.append(ref.uid)
            kubelet.unprepare(DRIVER, [ref])

    threads = [threading.Thread(target=caller, args=(w,)) for w in work]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return [
        Figure(f"plugin prepare+unprepare, {callers} parallel callers",
               callers * per_caller / elapsed, "claims/s"),
        Figure("plugin failed prepares under parallel load", len(failures), "claims",
               "0", not failures),
    ]


if __name__ == "__main__":
    for fig in run(quick=False):
        print(fig.row())
