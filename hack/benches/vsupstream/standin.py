"""NodePrepareResources straight from the kubelet stand-in (tests/fakes/kubelet), with no
kubelet claim cache in between: one caller, then 16 at once, with each driver's peak resident
memory while they run, and the CPU each driver's process spent per claim prepared and
unprepared (every thread's, from ``/proc/<pid>/task/*/schedstat``: nanoseconds, not the
10 ms ticks of ``/proc/<pid>/stat``), which tells the driver's own work from waiting on the
disk and the API server.

Half of the claims are NICs. The agent writes a NIC claim's ``status.devices`` (one
server-side apply) after the prepare's answer, as DRANet, a Go NIC driver on the same helper,
writes it from its NRI hook after prepare; the peer writes none. So the latency rows compare
like for like, while the CPU rows and the 16 callers' throughput still count that write on
our side alone (docs/durability.md, "Per call beyond the peer")."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hack.benches.vsupstream.common import PEER, rss_mib


class _PeakRSS:
    """The highest resident memory of a process while the block runs (sampled every 5 ms)."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid, self.peak = pid, rss_mib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mib(self.pid))

    def __enter__(self) -> _PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def cpu_seconds(pid: int) -> float:
    """CPU time of every live thread of ``pid`` so far (a thread that ended is not counted:
    both drivers keep their threads, the agent's gRPC pool and Go's Ms)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return total / 1e9


def _parallel(call: Callable[[int], object], callers: int, rounds: int) -> float:
    """``call(i)`` ``rounds`` times on each of ``callers`` threads; seconds for all of it."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        for _ in range(rounds):
            call(i)

    start = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        for future in [pool.submit(one, i) for i in range(callers)]:
            future.result()
    return time.perf_counter() - start


def through_the_stand_in(cluster: Any, node: str, registry: Path, rounds: int,
                          times: dict[tuple[str, str, str], list[float]],
                          facts: dict[str, float], pids: Mapping[str, int]) -> None:
    """NodePrepareResources straight from the kubelet stand-in (no kubelet claim cache in
    between): one caller, then 16 at once on 16 claims of one device each (8 GPUs, 8 NICs),
    timing the calls and sampling each driver's resident memory while they run."""
    from tests.e2e.harness import DRIVER, GPU_CLASS, NIC_CLASS
    from tests.fakes.kubelet import ClaimRef, KubeletStandIn
    from tests.realk8s.agent import allocate
    from tests.realk8s.test_node_identity import pod_using

    callers = 16
    refs: dict[str, list[ClaimRef]] = {}
    for short, (gpu, nic) in (("ours", (GPU_CLASS, NIC_CLASS)),
                              ("theirs", (f"gpu.{PEER}", f"nic.{PEER}"))):
        refs[short] = []
        for i in range(callers):
            claim = cluster.create({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": f"{short}-par-{i}", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
                    "deviceClassName": gpu if i % 2 else nic}}]}}})
            allocate(cluster, claim, node, pod=pod_using(cluster, node, claim))
            meta = claim["metadata"]
            refs[short].append(ClaimRef(meta["namespace"], meta["name"], meta["uid"]))
    with KubeletStandIn(registry, retry_initial=0.05) as standin:
        drivers = {"ours": DRIVER, "theirs": PEER}
        for driver in drivers.values():
            standin.wait_registered(driver, timeout=30)

        cpu = {who: 0.0 for who in drivers}

        def cycle(who: str, ref: ClaimRef) -> tuple[float, float]:
            start = time.perf_counter()
            prepared = standin.prepare(drivers[who], [ref])[ref.uid]
            middle = time.perf_counter()
            if not prepared.ok:
                raise RuntimeError(f"{who} prepare through the stand-in: {prepared.error}")
            gone = standin.unprepare(drivers[who], [ref])[ref.uid]
            if not gone.ok:
                raise RuntimeError(f"{who} unprepare through the stand-in: {gone.error}")
            return middle - start, time.perf_counter() - middle

        for r in range(rounds):
            order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
            for i in range(callers // 2):
                for who in order:
                    before = cpu_seconds(pids[who])
                    prep, unprep = cycle(who, refs[who][i])
                    cpu[who] += cpu_seconds(pids[who]) - before
                    times.setdefault((who, "stand-in", "prepare"), []).append(prep)
                    times.setdefault((who, "stand-in", "unprepare"), []).append(unprep)
        for who in drivers:
            facts[f"{who} CPU per claim, 1 caller"] = cpu[who] / (rounds * (callers // 2))
        for who in ("ours", "theirs", "theirs", "ours"):  # twice each, alternating
            def one(i: int, w: str = who) -> object:
                return cycle(w, refs[w][i])

            before = cpu_seconds(pids[who])
            with _PeakRSS(pids[who]) as rss:
                seconds = _parallel(one, callers, rounds)
            spent = (cpu_seconds(pids[who]) - before) / (callers * rounds)
            key = f"{who} CPU per claim, 16 callers"
            facts[key] = min(facts.get(key, spent), spent)
            facts[f"{who} parallel claims/s"] = max(
                facts.get(f"{who} parallel claims/s", 0.0), callers * rounds / seconds)
            facts[f"{who} RSS under 16 callers"] = max(
                facts.get(f"{who} RSS under 16 callers", 0.0), rss.peak)
