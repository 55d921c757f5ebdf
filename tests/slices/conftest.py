"""Fixtures for the controller's integration tests: the fake API server and controllers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent.common.metrics import Metrics
from agent.slices import Controller, Owner, Timing, start
from discovery.model import DriverResources
from tests.fakes.apiserver import FakeAPIServer
from tests.slices.helpers import DRIVER, NODE, node

#: Short delays so the suite stays fast; the daemon's defaults are longer.
FAST = Timing(event_delay_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.5, watch_timeout_s=30)
WRITE_VERBS = ("create", "update", "patch", "delete")


def our_slices(srv: FakeAPIServer, version: str = "v1") -> list[dict[str, Any]]:
    return [o for o in srv.list_objects("resourceslices", version)
            if o["spec"]["driver"] == DRIVER]


def writes(srv: FakeAPIServer) -> list[tuple[str, str, int]]:
    return [(r.verb, r.path, r.status) for r in srv.requests if r.verb in WRITE_VERBS]


def listings(srv: FakeAPIServer) -> int:
    """The full reads of slices: lists, and watch-lists (a watch whose first events are the
    current state)."""
    return sum(1 for r in srv.requests if (r.verb == "list" and "resourceslices" in r.path)
               or (r.verb == "watch" and r.query.get("sendInitialEvents") == "true"))


def slice_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("slices-")]


@pytest.fixture
def srv() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.5) as server:
        server.put_object(node())
        yield server


class Harness:
    """Starts controllers against a server and remembers what they reported."""

    def __init__(self) -> None:
        self.errors: list[Exception] = []
        self.controllers: list[Controller] = []
        self.metrics = Metrics()

    def start(
        self,
        server: FakeAPIServer,
        resources: DriverResources | None,
        owner: Owner | None = None,
        **kw: Any,
    ) -> Controller:
        kw.setdefault("timing", FAST)
        kw.setdefault("resync_period_s", 3600)
        controller = start(
            server.kube(), DRIVER, owner if owner is not None else Owner(name=NODE),
            resources, metrics=self.metrics, on_error=self.errors.append, **kw,
        )
        self.controllers.append(controller)
        return controller

    def errors_of(self, kind: type[Exception]) -> list[Exception]:
        return [e for e in self.errors if isinstance(e, kind)]

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    for controller in h.controllers:
        controller.stop()
    assert slice_threads() == [], "stop() left threads behind"
