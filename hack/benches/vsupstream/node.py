"""Both drivers on one node of a real kube-apiserver, registered with the kubelet's own DRA
manager (``kubelet-dra``): each one's start (registration, slices, idle memory), slice writes
at rest and after the kubelet's wipe, then prepare and unprepare of 1-GPU and 8-GPU claims,
interleaved call by call; then the same through the kubelet stand-in (``standin``).

Our start is timed on the node layout: the simulated machine's sysfs tree written beforehand
(``hack.benches.nodestart``), as a node's /sys is there before the agent starts, and the peer
reads its devices file. The command as it is, ``--simulate`` writing that tree (about 1,500
files) before discovery reads it, is timed too, first, for the "(sim. tree)" information row:
that agent is stopped and its slices deleted before the node-layout agent starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from discovery.simulate.profiles import scratch_parent
from hack.benches.nodestart import prepare
from hack.benches.startup import node_layout_wrap
from hack.benches.vsupstream.common import AT_REST_S, MINOR, PEER, WIPE_TIMEOUT_S, rss_mib
from hack.benches.vsupstream.standin import through_the_stand_in

SMALL_PODS = 8  # one GPU each: every GPU of the profile


def _registered(socket: Path, timeout: float) -> float:
    """Seconds until ``socket`` answers the kubelet's GetInfo (from now)."""
    import grpc

    from protos.pluginregistration import api_pb2 as reg
    from protos.pluginregistration import api_pb2_grpc as reg_grpc

    start = time.perf_counter()
    deadline = start + timeout
    while time.perf_counter() < deadline:
        if socket.exists():
            with grpc.insecure_channel(f"unix://{socket}") as channel:
                try:
                    reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=1)
                    return time.perf_counter() - start
                except grpc.RpcError:
                    pass
        time.sleep(0.002)
    raise RuntimeError(f"{socket} never answered GetInfo")


def _peer_class(kind: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": f"{kind}.{PEER}"},
            "spec": {"selectors": [{"cel": {"expression": (
                f"device.driver == '{PEER}' && device.attributes['{PEER}'].type == '{kind}'")}}]}}


def measure(rounds: int) -> tuple[dict[tuple[str, str, str], list[float]], dict[str, float]]:
    """(driver, claim size, op) -> seconds per call, and the start/memory figures."""
    from tests.e2e.harness import DRIVER, GPU_CLASS, AgentProcess, NodeDirs
    from tests.realk8s.agent import allocate, revisions, wait_settled
    from tests.realk8s.cluster import bin_dir, running
    from tests.realk8s.kubelet import KubeletDRA
    from tests.realk8s.test_kubelet_dra import get_pod
    from tests.realk8s.test_node_identity import pod_using
    from tests.waiting import wait_for

    node = "node-vs"
    times: dict[tuple[str, str, str], list[float]] = {}
    facts: dict[str, float] = {}
    root = Path(tempfile.mkdtemp(prefix="vs", dir="/tmp"))  # short: socket paths
    devices = root / "devices.json"
    devices.write_text(subprocess.run(
        [sys.executable, "-m", "agent.cli", "discover", "--simulate", "dgx-h100", "-o", "json",
         "--node-name", node], capture_output=True, text=True, check=True, timeout=60).stdout)
    peer_proc: subprocess.Popen[str] | None = None
    kubelet: KubeletDRA | None = None
    agent: AgentProcess | None = None
    shm: Path | None = None
    tree = Path(tempfile.mkdtemp(prefix="vs-node-", dir=scratch_parent()))
    try:
        prepare("dgx-h100", tree)  # the node's /sys, before anything is timed
        with running("vsupstream-") as cluster:
            cluster.apply_deploy("base")
            cluster.create(_peer_class("gpu"))
            cluster.create(_peer_class("nic"))
            cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": "default", "namespace": "default"}})
            cluster.ensure_node(node)
            kubeconfig = cluster.node_kubeconfig(node)
            (root / "n").mkdir()
            dirs = NodeDirs(root / "n")
            # Both drivers' CDI specs on tmpfs, as /var/run/cdi (the default of both) is on
            # every node: there a spec's fsync costs nothing, which the VM's disk would bill
            # to ours alone (the CDI library writes without one). The checkpoints stay on disk.
            shm = Path(tempfile.mkdtemp(prefix="vs-cdi-", dir=scratch_parent()))
            (shm / "ours").mkdir()
            (shm / "peer").mkdir()
            dirs.cdi.symlink_to(shm / "ours")
            registry = dirs.kubelet / "plugins_registry"

            def slices_of(driver: str) -> int:
                return sum(len(s["spec"].get("devices") or []) for s in cluster.slices(node)
                           if s["spec"]["driver"] == driver)

            expected = sum(len(s["spec"]["devices"])
                           for s in json.loads(devices.read_text())["items"])
            # Like for like: the peer, as the example driver, writes no device metadata files
            # (the helper's EnableDeviceMetadata is off by default; ours is on).
            like_peer = ("--no-health", "--no-device-metadata")
            facts["ours registration (sim. tree)"] = _simulated_start(
                cluster, root, str(kubeconfig), node, like_peer, slices_of)
            # Ours on the node layout, then theirs: each timed from its own process start.
            started = time.perf_counter()
            agent = AgentProcess(dirs, str(kubeconfig), *like_peer, node=node,
                                 wrap=node_layout_wrap(tree))
            facts["ours registration"] = (time.perf_counter() - started) + _registered(
                registry / f"{DRIVER}-reg.sock", 30)
            wait_for(lambda: slices_of(DRIVER) == expected, timeout=30, interval=0.01,
                     what="the agent's slices")
            facts["ours slices"] = time.perf_counter() - started
            wait_settled(cluster, node, agent)

            started = time.perf_counter()
            peer_log = (root / "peer.log").open("w")
            peer_proc = subprocess.Popen(
                [str(bin_dir(MINOR) / "peer-driver"), f"--kubeconfig={kubeconfig}",
                 f"--node-name={node}", f"--driver-name={PEER}", f"--kubelet-dir={dirs.kubelet}",
                 f"--cdi-dir={shm / 'peer'}", f"--devices={devices}",
                 # The kubelet's limits, as kubelet-dra has (the agent's client has none): at
                 # the example driver's defaults (5, 10) this would be a rate-limit figure.
                 "--kube-api-qps=50", "--kube-api-burst=100"],
                stdout=subprocess.DEVNULL, stderr=peer_log, text=True)
            facts["theirs registration"] = (time.perf_counter() - started) + _registered(
                registry / f"{PEER}-reg.sock", 30)
            wait_for(lambda: slices_of(PEER) == expected, timeout=30, interval=0.01,
                     what="the peer driver's slices")
            facts["theirs slices"] = time.perf_counter() - started
            facts["ours idle RSS"] = rss_mib(agent.pid)
            facts["theirs idle RSS"] = rss_mib(peer_proc.pid)
            _at_rest_and_wiped(cluster, node, expected, facts, slices_of)

            before = revisions(cluster, node)
            kubelet = KubeletDRA(MINOR, kubeconfig, node, dirs.kubelet)
            real = kubelet
            wait_for(lambda: all(real.registered(DRIVER, PEER).values()), timeout=30,
                     what="the kubelet registers both drivers")
            # The kubelet's start wipes the node's slices; both drivers publish them again.
            wait_for(lambda: set(revisions(cluster, node)).isdisjoint(before)
                     and slices_of(DRIVER) == expected and slices_of(PEER) == expected,
                     timeout=60, what="slices restored after the kubelet's wipe")

            pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for driver, cls in ((DRIVER, GPU_CLASS), (PEER, f"gpu.{PEER}")):
                short = "ours" if driver == DRIVER else "theirs"
                for size, count, n in (("1-device", 1, SMALL_PODS), ("8-device", 8, 1)):
                    made = []
                    for i in range(n):
                        claim = cluster.create({
                            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": {"name": f"{short}-{size}-{i}", "namespace": "default"},
                            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                                "deviceClassName": cls, "count": count}}]}}})
                        pod = pod_using(cluster, node, claim)
                        made.append((claim, pod))
                    pods[(short, size)] = [
                        {"claim": c, "pod": p} for c, p in made]
            calls: dict[str, Callable[[Mapping[str, Any]], str]] = {
                "prepare": real.prepare, "unprepare": real.unprepare}
            for size in ("1-device", "8-device"):
                # One size at a time: the 8-GPU claims need every GPU, the small ones too.
                ready: dict[str, list[dict[str, Any]]] = {}
                for short in ("ours", "theirs"):
                    ready[short] = []
                    for entry in pods[(short, size)]:
                        allocate(cluster, entry["claim"], node, pod=entry["pod"])
                        ready[short].append(get_pod(cluster, entry["pod"]))
                kubelet.active([p for ps in ready.values() for p in ps])
                for r in range(rounds):
                    order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
                    for i in range(len(ready["ours"])):
                        for who in order:
                            for op in ("prepare", "unprepare"):
                                start = time.perf_counter()
                                error = calls[op](ready[who][i])
                                times.setdefault((who, size, op), []).append(
                                    time.perf_counter() - start)
                                if error:
                                    raise RuntimeError(f"{who} {size} {op}: {error}")
                for short in ("ours", "theirs"):  # free the GPUs for the next size
                    for entry in pods[(short, size)]:
                        meta = entry["claim"]["metadata"]
                        cluster.admin.request(
                            "DELETE", f"/apis/resource.k8s.io/v1/namespaces/default/"
                            f"resourceclaims/{meta['name']}").raise_for_status()
            facts["ours RSS after calls"] = rss_mib(agent.pid)
            facts["theirs RSS after calls"] = rss_mib(peer_proc.pid)
            through_the_stand_in(cluster, node, registry, rounds, times, facts,
                                  {"ours": agent.pid, "theirs": peer_proc.pid})
    finally:
        if kubelet is not None:
            kubelet.stop()
        if peer_proc is not None:
            peer_proc.terminate()
            peer_proc.wait(10)
        if agent is not None:
            agent.terminate()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(tree, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    return times, facts


def _simulated_start(cluster: Any, root: Path, kubeconfig: str, node: str,
                     extra: tuple[str, ...], slices_of: Callable[[str], int]) -> float:
    """Seconds from the process start to registration answered for the command as it is
    (``--simulate`` writes the tree first), in its own node directories; then that agent is
    stopped and whatever it published deleted, so that the node-layout agent starts afresh."""
    from tests.e2e.harness import DRIVER, AgentProcess, NodeDirs
    from tests.waiting import wait_for

    (root / "sim").mkdir()
    dirs = NodeDirs(root / "sim")
    started = time.perf_counter()
    agent = AgentProcess(dirs, kubeconfig, *extra, node=node, name="sim")
    try:
        seconds = (time.perf_counter() - started) + _registered(
            dirs.kubelet / "plugins_registry" / f"{DRIVER}-reg.sock", 30)
    finally:
        agent.terminate()
    cluster.admin.request("DELETE", "/apis/resource.k8s.io/v1/resourceslices", query=[
        ("fieldSelector", f"spec.nodeName={node},spec.driver={DRIVER}")]).raise_for_status()
    wait_for(lambda: slices_of(DRIVER) == 0, timeout=30, interval=0.05,
             what="the simulated start's slices deleted")
    return seconds


def _at_rest_and_wiped(cluster: Any, node: str, expected: int, facts: dict[str, float],
                       slices_of: Callable[[str], int]) -> None:
    """Slice writes while nothing changes (a window of AT_REST_S), then each driver's slices
    deleted as the kubelet does at its start (one DeleteCollection for the node and driver)
    and the time until they are all back."""
    from tests.e2e.harness import DRIVER

    def versions(driver: str) -> dict[str, str]:
        return {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
                for s in cluster.slices(node) if s["spec"]["driver"] == driver}

    drivers = {"ours": DRIVER, "theirs": PEER}
    time.sleep(2)  # both settled: what follows is rest
    before = {who: versions(d) for who, d in drivers.items()}
    time.sleep(AT_REST_S)
    for who, driver in drivers.items():
        after = versions(driver)
        facts[f"{who} writes at rest"] = float(sum(
            1 for name, rv in after.items() if before[who].get(name) != rv)
            + len(before[who].keys() - after.keys()))
    for who, driver in drivers.items():
        selector = f"spec.nodeName={node},spec.driver={driver}"
        start = time.perf_counter()
        cluster.admin.request("DELETE", "/apis/resource.k8s.io/v1/resourceslices",
                              query=[("fieldSelector", selector)]).raise_for_status()
        deadline = start + WIPE_TIMEOUT_S
        while slices_of(driver) != expected:
            if time.perf_counter() > deadline:
                break  # reported as the timeout: upstream may wait for its resync
            time.sleep(0.01)
        facts[f"{who} wipe -> restored"] = time.perf_counter() - start
