"""End-to-end latencies of a running agent: slices wiped by a restarting kubelet until they are
back, and a NIC leaving or returning until the slices say so.

kubelet-wipe-to-restored runs the real ``dra-agent run`` process against the fake API server:
the kubelet stand-in deletes the node's slices with one DELETE of the collection (what a
kubelet does at start), and the clock stops when the API server holds every device again.

hotplug-to-published runs the daemon in-process on a simulated dgx-h100 tree this bench owns
(the process keeps its generated tree private), with the periodic rescan at 100 ms since
simulated hardware has no uevents. A NIC "leaves" when its links in ``bus/pci/devices`` and
``class/net`` go, as after an unbind, and comes back when they return. On real hardware a
uevent starts the rescan instead of the timer, after a 200 ms debounce.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack.benches import Figure

WIPE_GOAL_S = 2.0
HOTPLUG_GOAL_S = 1.0
RESCAN_S = 0.1


def _wait(check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Seconds until ``check()`` holds, polling every 2 ms."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(0.002)
    return time.monotonic() - start


def _devices(server: Any, node: str) -> list[str]:
    return sorted(d["name"] for s in server.list_objects("resourceslices")
                  if s["spec"].get("nodeName") == node for d in s["spec"]["devices"])


def wipe_to_restored(rounds: int) -> list[float]:
    from tests.e2e.harness import DRIVER, NODE, AgentProcess, Cluster, NodeDirs
    from tests.fakes.apiserver import FakeAPIServer
    from tests.fakes.kubelet import KubeletStandIn

    root = Path(tempfile.mkdtemp(prefix="w", dir="/tmp"))
    times: list[float] = []
    try:
        with FakeAPIServer() as server:
            cluster = Cluster(server, root)
            dirs = NodeDirs(root)
            agent = AgentProcess(dirs, cluster.kubeconfig)
            try:
                agent.wait_http("/readyz/slices")  # the stand-in kubelet starts below
                before = _devices(server, NODE)
                with KubeletStandIn(dirs.registry, api_client=server.api_client(),
                                    node_name=NODE) as kubelet:
                    kubelet.wait_registered(DRIVER, timeout=30)
                    for _ in range(rounds):
                        start = time.monotonic()
                        kubelet.wipe_slices()
                        _wait(lambda: _devices(server, NODE) == before)
                        times.append(time.monotonic() - start)
                        time.sleep(0.2)  # let the agent's watch settle between rounds
            finally:
                agent.terminate()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return times


class _Unplug:
    """Hide one NIC's sysfs links (as an unbind would) and put them back."""

    def __init__(self, sysfs: Path, nic_bdf: str) -> None:
        self.links = [sysfs / "bus" / "pci" / "devices" / nic_bdf]
        net = self.links[0].resolve() / "net"
        self.links += [sysfs / "class" / "net" / n for n in os.listdir(net)] if net.is_dir() else []
        self.targets = [os.readlink(link) for link in self.links]

    def remove(self) -> None:
        for link in self.links:
            link.unlink()

    def restore(self) -> None:
        for link, target in zip(self.links, self.targets, strict=True):
            link.symlink_to(target)


def hotplug_to_published(rounds: int) -> tuple[list[float], list[float]]:
    from agent.common.config import Config
    from agent.daemon import Daemon, RunOptions
    from discovery.simulate import simulated_sources
    from tests.fakes.apiserver import FakeAPIServer

    node = "bench-node"
    root = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))
    sources = simulated_sources("dgx-h100", root / "sim")

    gone_times: list[float] = []
    back_times: list[float] = []
    try:
        with FakeAPIServer() as server:
            server.put_object({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
            kubeconfig = server.write_kubeconfig(root / "kubeconfig")
            cfg = Config(node_name=node, kubeconfig=str(kubeconfig), kubelet_dir=root / "k",
                         cdi_dir=root / "cdi", simulate="dgx-h100", metrics_address="none")
            # The daemon on a tree this bench can change.
            daemon = Daemon(cfg, RunOptions(slow_rescan_s=RESCAN_S, boot_id_path=root / "boot"),
                            environ={}, sources=sources)
            thread = threading.Thread(target=daemon.run, daemon=True)
            thread.start()
            try:
                _wait(lambda: any(n.startswith("nic-") for n in _devices(server, node)))
                nic = next(d for d in daemon.inventory.devices if d.name.startswith("nic-"))
                assert nic.host.pci_address
                unplug = _Unplug(sources.sysfs_root, nic.host.pci_address)
                for _ in range(rounds):
                    start = time.monotonic()
                    unplug.remove()
                    _wait(lambda: nic.name not in _devices(server, node))
                    gone_times.append(time.monotonic() - start)
                    start = time.monotonic()
                    unplug.restore()
                    _wait(lambda: nic.name in _devices(server, node))
                    back_times.append(time.monotonic() - start)
            finally:
                daemon.request_stop("bench done")
                thread.join(30)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return gone_times, back_times


def run(quick: bool) -> list[Figure]:
    rounds = 3 if quick else 10
    wipe = wipe_to_restored(rounds)
    gone, back = hotplug_to_published(rounds)
    figures = []
    for name, values, goal in (
        ("kubelet wipe to slices restored", wipe, WIPE_GOAL_S),
        (f"NIC removed to published ({RESCAN_S * 1000:.0f} ms rescan)", gone, HOTPLUG_GOAL_S),
        (f"NIC back to published ({RESCAN_S * 1000:.0f} ms rescan)", back, HOTPLUG_GOAL_S),
    ):
        med, worst = statistics.median(values) * 1000, max(values) * 1000
        figures.append(Figure(f"{name}, median", med, "ms", f"<= {goal * 1000:.0f} ms",
                              med <= goal * 1000))
        figures.append(Figure(f"{name}, max of {len(values)}", worst, "ms"))
    return figures


if __name__ == "__main__":
    for figure in run(quick="--quick" in sys.argv):
        print(figure.row())
