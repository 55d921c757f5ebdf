"""The daemon's health glue, reduced to what the tests need: monitor -> taints -> controller."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agent import slices
from agent.common.metrics import Metrics
from agent.health import DeviceHealth, HealthMonitor, HealthOptions
from agent.slices import Owner, Timing
from discovery.pools import build_resources
from tests.fakes.apiserver import FakeAPIServer
from tests.health.conftest import Node

DRIVER = "dra-agent.io"
NODE = "node1"
FAST = Timing(event_delay_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.5, watch_timeout_s=30)
WRITE_VERBS = ("create", "update", "patch", "delete")


def node_object(name: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def slice_writes(srv: FakeAPIServer) -> int:
    return sum(1 for r in srv.requests
               if r.verb in WRITE_VERBS and "resourceslices" in r.path)


def settled_writes(srv: FakeAPIServer) -> int:
    """The write count once it stops moving: the fake records a request just after it has
    answered it, so a client can see the result a moment before the record exists."""
    last = slice_writes(srv)
    while True:
        time.sleep(0.03)
        now = slice_writes(srv)
        if now == last:
            return now
        last = now


def published_taints(srv: FakeAPIServer) -> dict[str, list[tuple[str, str, str]]]:
    """Device name -> (key, value, effect) of every taint in this driver's stored slices."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for obj in srv.list_objects("resourceslices", "v1"):
        if obj["spec"]["driver"] != DRIVER:
            continue
        for dev in obj["spec"].get("devices") or []:
            taints = [(t["key"], t.get("value", ""), t["effect"]) for t in dev.get("taints") or []]
            if taints:
                out[dev["name"]] = taints
    return out


class Wiring:
    """A HealthMonitor whose changes re-publish the node's pool through the controller."""

    def __init__(self, node: Node, srv: FakeAPIServer, options: HealthOptions) -> None:
        self.node = node
        self.metrics = Metrics()
        self.errors: list[Exception] = []
        self.controller = slices.start(srv.kube(), DRIVER, Owner(name=NODE), None,
                                       metrics=self.metrics, on_error=self.errors.append,
                                       timing=FAST, resync_period_s=3600)
        self.monitor = HealthMonitor(node.sources, DRIVER, options, self.changed, self.metrics)
        self.monitor.start(node.provider())
        self.publish()

    def changed(self, _health: Mapping[str, DeviceHealth]) -> None:
        self.publish()

    def publish(self) -> None:
        tainted = self.monitor.apply_taints(self.node.inventory)
        self.controller.update(build_resources(tainted, NODE))

    def events(self, kind: str) -> float:
        value = self.metrics.registry.get_sample_value("dra_agent_health_events_total",
                                                       {"kind": kind})
        return value or 0.0

    def close(self) -> None:
        self.monitor.stop()
        self.controller.stop()
