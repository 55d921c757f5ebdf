"""Dynamic MIG benchmarks (``--mig dynamic``, issue 17).

* Discovery of the simulated dgx-h100-mig with every MIG-mode GPU partitioned: goal <= 50 ms
  median; its slices within the 1.35 limits (counter sets in slices of their own, <= 64
  devices per slice with counters), checked by the agent's own validator.
* Prepare of a one-partition claim through real gRPC, the NVML fake creating the GPU and
  compute instance, beside an exclusive whole-GPU claim on the same agent, interleaved round
  by round: goal p50 <= 2x the GPU claim's. Real NVML create calls take longer (the driver
  reconfigures the GPU); measure them where a GPU with MIG mode is lent.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from agent.plugin import PluginServer
from agent.prepare.effects.migcontrol import MigPartitions
from agent.prepare.effects.miginstance import owned_instances
from agent.slices.validate import validate_pool
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import scratch_dir, simulated_sources
from discovery.sources import Sources
from hack.benches import Figure, median_ms, percentile
from hack.benches.plugin import served

DRIVER = "dra-agent.io"
NODE = "bench-node"
PARTITIONS = ["gpu-0-mig-1g10gb-0", "gpu-1-mig-3g40gb-4", "gpu-2-mig-7g80gb-0"]



def _claim(name: str, device: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "req", "exactly": {
            "deviceClassName": "mig" if "-mig-" in device else "gpu"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "req", "driver": DRIVER, "pool": NODE, "device": device}]}}},
    }


def _discovery(root: Path, runs: int) -> list[Figure]:
    base = simulated_sources("dgx-h100-mig", root / "disc")
    options = DiscoveryOptions(mig="dynamic")

    def fresh() -> Sources:
        return Sources(base.sysfs_root, base.gpu, base.dev_root, base.routes, base.proc_root)

    full = median_ms(lambda: discover(fresh(), options), runs)
    inventory = discover(fresh(), options)
    pool = build_resources(inventory, NODE).pools[NODE]
    problems = validate_pool(DRIVER, NODE, pool)
    biggest = max(len(s.devices) for s in pool.slices)
    apart = all(not (s.devices and s.shared_counters) for s in pool.slices)
    parts = sum(1 for d in inventory.devices if d.consumes)
    return [
        Figure("discovery dgx-h100-mig, --mig dynamic, median", full, "ms", "<= 50 ms",
               full <= 50),
        Figure(f"  its slices: {len(pool.slices)} ({parts} partitions, "
               f"{len(inventory.counter_sets)} counter sets)", biggest, "devices",
               "<= 64, valid", biggest <= 64 and apart and not problems),
    ]


def _prepare(root: Path, rounds: int) -> list[Figure]:
    from tests.fakes.apiserver import FakeAPIServer
    from tests.fakes.kubelet import ClaimRef as KubeletRef

    sources = simulated_sources("dgx-h100-mig", root / "sim")
    assert sources.gpu is not None
    server: PluginServer | None = None

    def owned() -> frozenset[tuple[str, int, int]]:
        if server is None:
            return frozenset()
        return owned_instances(server.preparer.checkpoint.claims())

    inventory = discover(sources, DiscoveryOptions(mig="dynamic", mig_owned=owned))
    gpu: list[float] = []
    mig: list[float] = []
    with (FakeAPIServer() as srv,
          served(root, lambda: inventory, srv.kube(),
                 mig=MigPartitions(sources.gpu)) as (serving, kubelet)):
        server = serving  # what owned() reads
        for i in range(rounds + 5):
            for device, out in (("gpu-6", gpu), (PARTITIONS[i % len(PARTITIONS)], mig)):
                claim = srv.put_object(_claim(f"c{i}-{device}", device))
                m = claim["metadata"]
                ref = KubeletRef(namespace=m["namespace"], name=m["name"], uid=m["uid"])
                start = time.perf_counter()
                answer = kubelet.prepare(DRIVER, [ref])[ref.uid]
                took = (time.perf_counter() - start) * 1000
                assert answer.ok, answer
                kubelet.unprepare(DRIVER, [ref])
                if i >= 5:
                    out.append(took)
    g50, m50 = statistics.median(gpu), statistics.median(mig)
    return [
        Figure("plugin prepare exclusive GPU claim (dgx-h100-mig), p50", g50, "ms"),
        Figure("plugin prepare dynamic MIG claim (fake NVML), p50", m50, "ms"),
        Figure("plugin prepare dynamic MIG claim (fake NVML), p99", percentile(mig, 0.99), "ms"),
        Figure("  dynamic MIG / exclusive GPU prepare, p50", m50 / g50, "x", "<= 2x",
               m50 <= 2 * g50),
    ]


def run(quick: bool) -> list[Figure]:
    with scratch_dir() as tmp:
        figures = _discovery(Path(tmp), 7 if quick else 31)
    root = Path(tempfile.mkdtemp(prefix="kp", dir="/tmp"))  # sockets: a short path
    try:
        figures += _prepare(root, 30 if quick else 150)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return figures


if __name__ == "__main__":
    for fig in run(quick=False):
        print(fig.row())
