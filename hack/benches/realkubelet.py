"""Prepare and unprepare through the real kubelet's DRA manager, beside the stand-in's.

A real etcd + kube-apiserver (hack/realk8s/up.sh), the agent with the node's credentials, and
two kubelets driving it on the same plugins_registry: the kubelet's own ``pkg/kubelet/cm/dra``
Manager (``hack/realk8s/bin/<minor>/kubelet-dra``, its ``prepare``/``unprepare`` ops) and the
stand-in's ``PodClaims`` (tests/fakes/kubelet), which GETs claims with the same node
credentials. Single-GPU pods, allocated by the scheduler's own allocator, are prepared and
unprepared by each in turn, interleaved (which goes first alternates per round), so both see
the same agent, checkpoint size and machine load. The clock runs from the request to the
answer: for kubelet-dra that includes one JSON line each way on a pipe (tens of µs).

kubelet-dra's API client runs at the kubelet's own limits (kubeAPIQPS 50, kubeAPIBurst 100):
at client-go's defaults (5, 10) every prepare past the tenth waited for the limiter before its
claim GET, and the figure read about 170 ms instead of about 20 ms.

Skipped with one line when the binaries are not built (``hack/realk8s/build.sh <minor>``).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hack.benches import Figure, percentile

PODS = 8  # one GPU each: every GPU of the dgx-h100 profile


def _measure(rounds: int) -> dict[tuple[str, str], list[float]]:
    """(kubelet, op) -> seconds per call."""
    from tests.e2e.harness import DRIVER, GPU_CLASS, AgentProcess, NodeDirs
    from tests.fakes.kubelet import KubeletStandIn, PodClaims
    from tests.realk8s.agent import allocate, make_claim, revisions, wait_settled
    from tests.realk8s.cluster import RESOURCE, running
    from tests.realk8s.kubelet import KubeletDRA
    from tests.realk8s.test_kubelet_dra import get_pod
    from tests.realk8s.test_node_identity import pod_using
    from tests.waiting import wait_for

    node = "node-bench"
    times: dict[tuple[str, str], list[float]] = {
        (k, op): [] for k in ("real", "stand-in") for op in ("prepare", "unprepare")}
    root = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))  # short: socket paths
    try:
        with running("realkubelet-") as cluster:
            cluster.apply_deploy("base")
            cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": "default"}})
            cluster.ensure_node(node)
            kubeconfig = cluster.node_kubeconfig(node)
            dirs = NodeDirs(root)
            agent = AgentProcess(dirs, str(kubeconfig), node=node)
            kubelet: KubeletDRA | None = None
            try:
                before = wait_settled(cluster, node, agent)
                kubelet = KubeletDRA(cluster.minor, kubeconfig, node, dirs.kubelet)
                real = kubelet
                wait_for(lambda: real.registered(DRIVER)[DRIVER], timeout=20,
                         what="the kubelet's plugin manager registers the agent")
                # The kubelet's start wipes the node's slices; wait until they are back.
                wait_for(lambda: set(revisions(cluster, node)).isdisjoint(before) and
                         revisions(cluster, node), timeout=30, what="slices restored")
                wait_settled(cluster, node, agent)

                pods = []
                for i in range(PODS):
                    claim = make_claim(cluster, f"bench-{i}", [("gpu", GPU_CLASS)])
                    pod = pod_using(cluster, node, claim)
                    allocate(cluster, claim, node, pod=pod)
                    pods.append(get_pod(cluster, pod))
                kubelet.active(pods)

                node_client = cluster.client(kubeconfig)

                def get_claim(namespace: str, name: str) -> Mapping[str, Any]:
                    resp = node_client.request(
                        "GET", f"{RESOURCE}/v1/namespaces/{namespace}/resourceclaims/{name}")
                    if not resp.ok:
                        raise resp.error()
                    found: Mapping[str, Any] = resp.json()
                    return found

                def real_call(op: str, pod: Mapping[str, Any]) -> None:
                    error = real.prepare(pod) if op == "prepare" else real.unprepare(pod)
                    if error:
                        raise RuntimeError(f"kubelet-dra {op}: {error}")

                with KubeletStandIn(dirs.registry, retry_initial=0.05) as standin:
                    standin.wait_registered(DRIVER, timeout=30)
                    claims = PodClaims(standin, get_claim)
                    drivers: dict[str, Callable[[str, Mapping[str, Any]], None]] = {
                        "real": real_call,
                        "stand-in": lambda op, pod: (claims.prepare(pod) if op == "prepare"
                                                     else claims.unprepare(pod)),
                    }
                    for r in range(rounds):
                        order = ("real", "stand-in") if r % 2 == 0 else ("stand-in", "real")
                        for pod in pods:
                            for who in order:
                                for op in ("prepare", "unprepare"):
                                    start = time.perf_counter()
                                    drivers[who](op, pod)
                                    times[(who, op)].append(time.perf_counter() - start)
                    claims_left = dirs.records()
                    if claims_left:
                        raise RuntimeError(f"claims left prepared: {sorted(claims_left)}")
            finally:
                if kubelet is not None:
                    kubelet.stop()
                agent.terminate()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return times


def run(quick: bool) -> list[Figure]:
    from tests.realk8s.cluster import bin_dir, minor_under_test

    minor = minor_under_test()
    missing = [b for b in ("etcd", "kube-apiserver", "allocate", "kubelet-dra")
               if not (bin_dir(minor) / b).is_file()]
    if missing:
        print(f"# realkubelet: skipped, hack/realk8s/bin/{minor} lacks {', '.join(missing)}: "
              f"build it with hack/realk8s/build.sh {minor}")
        return []
    rounds = 3 if quick else 25
    times = _measure(rounds)
    figures: list[Figure] = []
    for op in ("prepare", "unprepare"):
        real, standin = times[("real", op)], times[("stand-in", op)]
        for who, values in ((f"real kubelet {minor}", real), ("stand-in", standin)):
            figures.append(Figure(f"{op} 1-GPU pod via {who}, p50",
                                  statistics.median(values) * 1000, "ms"))
            figures.append(Figure(f"{op} 1-GPU pod via {who}, p99 of {len(values)}",
                                  percentile(values, 0.99) * 1000, "ms"))
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            figures.append(Figure(f"{op} 1-GPU pod, real kubelet / stand-in, {name}",
                                  percentile(real, q) / percentile(standin, q), "x"))
    return figures


if __name__ == "__main__":
    for figure in run(quick="--quick" in sys.argv):
        print(figure.row())
