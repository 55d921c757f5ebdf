"""Parts of one GPU on the real node: shares (--sharing gpu=shares:N) and MIG partitions made
on demand (--mig dynamic), each installed by helm upgrade. N Pods fit; the next stays Pending
with the scheduler's reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import DRIVER, apply_example, example, install, node_slices
from tests.cluster.node import Node, stays
from tests.cluster.test_pods import allocated, env_of, pod_claim

SHARES = 2


@pytest.fixture
def sharing_agent(agent: Node) -> Iterator[Node]:
    install(agent, **{"sharing[0]": f"gpu=shares:{SHARES}"})
    try:
        yield agent
    finally:
        install(agent)


@pytest.fixture
def mig_agent(agent: Node) -> Iterator[Node]:
    install(agent, simulate="dgx-h100-mig", mig="dynamic")
    try:
        yield agent
    finally:
        install(agent)


def pending_for_good(node: Node, ns: str, pod: str) -> str:
    message = node.scheduling_message(ns, pod)
    assert stays(lambda: (node.pod(ns, pod) or {}).get("status", {}).get("phase") == "Pending", 5)
    return message


def device_attributes(node: Node) -> dict[str, dict[str, Any]]:
    return {d["name"]: d.get("attributes", {}) for s in node_slices(node)
            for d in s["spec"].get("devices", []) if s["spec"]["driver"] == DRIVER}


def test_n_pods_share_one_gpu_and_the_next_waits(sharing_agent: Node, ns: str) -> None:
    node = sharing_agent
    apply_example(node, ns, "gpu-shares.yaml")
    for i in range(2, SHARES + 2):
        node.kubectl("-n", ns, "apply", "-f", "-",
                     input=example("gpu-shares.yaml", pod=f"share-{i}"))
    for i in range(1, SHARES + 1):
        node.wait_running(ns, f"share-{i}")
    devices = {tuple(allocated(pod_claim(node, ns, f"share-{i}", "gpu")))
               for i in range(1, SHARES + 1)}
    assert devices == {("gpu-0",)}
    for i in range(1, SHARES + 1):
        env = env_of(node.wait_logged(ns, f"share-{i}", "ready"))
        assert env["DRA_AGENT_DEVICE_GPU_0_NAME"] == "gpu-0"
    message = pending_for_good(node, ns, f"share-{SHARES + 1}")
    assert "cannot allocate all claims" in message, message
    # A share freed lets the waiting Pod in.
    node.kubectl("-n", ns, "delete", "pod", "share-1", "--wait=true")
    node.wait_running(ns, f"share-{SHARES + 1}", timeout=120)


def test_two_mig_partitions_on_one_gpu_and_an_overlapping_third_waits(mig_agent: Node,
                                                                      ns: str) -> None:
    node = mig_agent
    apply_example(node, ns, "mig.yaml")
    node.kubectl("-n", ns, "apply", "-f", "-", input=example_third())
    for pod in ("mig-a", "mig-b"):
        node.wait_running(ns, pod, timeout=120)
    attrs = device_attributes(node)
    spans = []
    for pod in ("mig-a", "mig-b"):
        (device,) = allocated(pod_claim(node, ns, pod, "mig"))
        a = attrs[device]
        assert a["profile"]["string"] == "3g.40gb" and a["parentMinor"]["int"] == 0
        start, size = a["placementStart"]["int"], a["placementSize"]["int"]
        spans.append(set(range(start, start + size)))
        log = node.wait_logged(ns, pod, "ready")
        assert any(k.endswith("_MIG_GI") for k in env_of(log)), log
        listing = node.kubectl("-n", ns, "exec", pod, "--", "ls", "/dev", "/dev/nvidia-caps")
        assert "nvidia0" in listing.split() and "nvidia-cap" in listing, listing
    assert not spans[0] & spans[1]
    message = pending_for_good(node, ns, "mig-c")
    assert "cannot allocate all claims" in message, message


def example_third() -> str:
    """mig.yaml's first Pod again, as mig-c: a third 3g partition of GPU 0."""
    (doc,) = [d for d in example("mig.yaml").split("\n---\n") if "name: mig-a\n" in d]
    return doc.replace("name: mig-a\n", "name: mig-c\n")
