"""numaNode's form against a real API server: with DRAListTypeAttributes off (every release's
default) the probe's list is refused and the int is published; with it on (1.37) the list is
published, and the dry-run probe stores nothing. Node credentials, as a kubelet-identity agent
has."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agent.slices import KubeSliceClient, Owner, Timing, start
from agent.slices.listattrs import server_takes_lists
from discovery.model import NUMA_NODE, Device, DeviceType, Inventory
from discovery.pools import build_resources
from tests.e2e.harness import DRIVER
from tests.realk8s.cluster import RealCluster

# Versioned: the numaNode probe's answer: 1.35 has no DRAListTypeAttributes gate at all.
pytestmark = pytest.mark.versioned

FAST = Timing(event_delay_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.5, watch_timeout_s=30)


def published(cluster: RealCluster, node: str) -> list[Any]:
    """numaNode of every device the node's controller published (and nothing else)."""
    client = KubeSliceClient(cluster.admin)
    items = client.list("v1", f"spec.nodeName={node}").items
    return [d["attributes"].get(NUMA_NODE) for o in items for d in o["spec"]["devices"]]


def publish(cluster: RealCluster, node: str) -> tuple[bool | None, list[Any], list[Exception]]:
    kubeconfig = cluster.node_kubeconfig(node)
    inventory = Inventory(devices=(Device("gpu-0", DeviceType.GPU, {NUMA_NODE: (1, 3)}, {}),))
    errors: list[Exception] = []
    c = start(cluster.client(kubeconfig), DRIVER, Owner(name=node),
              build_resources(inventory, node), on_error=errors.append, timing=FAST)
    try:
        assert c.synced(30), errors
        return c.list_attributes, published(cluster, node), errors
    finally:
        c.stop()


def test_default_gates_publish_the_int(cluster: RealCluster, node: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    client = KubeSliceClient(cluster.client(cluster.node_kubeconfig(node)))
    with caplog.at_level(logging.INFO, logger="agent.slices"):
        assert server_takes_lists(client, DRIVER, Owner(name=node), "v1") is False
    # The real server's 422 names the attribute: the gate's answer, not a failure.
    assert [r.getMessage() for r in caplog.records if r.name == "agent.slices"] == [
        "API server refuses list attributes (DRAListTypeAttributes off): numaNode published "
        "as int"]
    lists, values, errors = publish(cluster, node)
    assert lists is False and values == [{"int": 1}] and errors == []


def test_list_gate_on_publishes_the_list(minor: str, start_cluster: Any) -> None:
    if minor != "1.37":
        # No 1.35 server can take lists: the gate does not exist there (alpha in 1.36), so
        # the scalar the default-gates test sees is all 1.35 ever gets.
        with pytest.raises(RuntimeError, match="unrecognized feature gate: DRAListTypeAttributes"):
            start_cluster("--feature-gates", "DRAListTypeAttributes=true")
        return
    cluster = start_cluster("--feature-gates", "DRAListTypeAttributes=true")
    cluster.ensure_node("node-lists")
    lists, values, errors = publish(cluster, "node-lists")
    assert lists is True and values == [{"ints": [1, 3]}] and errors == []
