"""Executing plans (agent/slices/publish.py): how a pool's creates go out, and what a failure
among them leaves in the store. An in-memory SliceClient stands in for the server, so what
was sent, and how many at once, is observed directly."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from agent.common.metrics import Metrics
from agent.slices.api import ApiError, SliceList, WatchStream
from agent.slices.errors import RejectedSliceError
from agent.slices.publish import CREATE_CONCURRENCY, Publisher
from agent.slices.sync import DesiredPool, OwnerRef, PoolPlan, SliceContent, plan_pool
from agent.slices.watch import Scope
from tests.slices.helpers import DRIVER, NODE, devices

OWNER = OwnerRef("v1", "Node", NODE, "node-uid")
#: A guard against a hang only: no test waits this long when it passes.
GUARD_S = 10.0


class MemoryClient:
    """Stores what is created; ``on_create(index)`` runs inside each create call (its slice
    index, from the generated name) and may block or raise."""

    def __init__(self, on_create: Callable[[int], None] = lambda index: None) -> None:
        self.on_create = on_create
        self.created: list[int] = []  # slice indices, in the order the calls began
        self._lock = threading.Lock()
        self._rv = 0
        self.in_flight = 0
        self.most_in_flight = 0

    def create(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        index = int(obj["metadata"]["generateName"].split("-")[0], 16)
        with self._lock:
            self.created.append(index)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.on_create(index)
            with self._lock:
                self._rv += 1
                meta = {**obj["metadata"], "name": f"{obj['metadata']['generateName']}x",
                        "resourceVersion": str(self._rv), "uid": f"uid-{index}"}
            return {**obj, "metadata": meta}
        finally:
            with self._lock:
                self.in_flight -= 1

    # The rest of SliceClient: not used by a plan of creates.
    def served_versions(self) -> list[str]:
        return ["v1"]

    def node_uid(self, name: str) -> str:
        return OWNER.uid

    def list(self, version: str, field_selector: str) -> SliceList:
        return SliceList([], "1")

    def watch(self, version: str, field_selector: str, resource_version: str,
              timeout_s: int) -> WatchStream:
        raise NotImplementedError

    def get(self, version: str, name: str) -> dict[str, Any] | None:
        return None

    def update(self, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def delete(self, version: str, name: str, uid: str | None,
               resource_version: str | None) -> str | None:
        return None


def new_pool(slices: int) -> PoolPlan:
    pool = DesiredPool(NODE, tuple(SliceContent(tuple(devices(2, start=2 * i)))
                                   for i in range(slices)), node_name=NODE)
    return plan_pool(DRIVER, NODE, pool, [], OWNER)


def publisher(client: MemoryClient, scope: Scope) -> Publisher:
    return Publisher(client, "v1", lambda node: scope, lambda pool, name: scope,
                     metrics=Metrics(), report=lambda err: None)


def stored_indices(scope: Scope) -> list[int]:
    return sorted(int(o["metadata"]["name"].split("-")[0], 16) for o in scope.store.pool(NODE))


def test_creates_after_the_first_are_sent_concurrently() -> None:
    slices = 2 * CREATE_CONCURRENCY + 1
    # Every create after the first waits until CREATE_CONCURRENCY of them are in flight:
    # sent one after another, the barrier would break (after the guard) and the test fail.
    barrier = threading.Barrier(CREATE_CONCURRENCY, timeout=GUARD_S)
    first_alone: list[bool] = []
    client = MemoryClient()

    def on_create(index: int) -> None:
        if index == 0:
            first_alone.append(client.in_flight == 1)
        elif index <= CREATE_CONCURRENCY:  # the first window of the later creates
            barrier.wait()

    client.on_create = on_create
    scope = Scope(f"spec.nodeName={NODE}")
    publisher(client, scope).execute(new_pool(slices), None)
    assert client.created[0] == 0 and first_alone == [True]
    assert sorted(client.created) == list(range(slices))  # each once: the same requests
    assert client.most_in_flight == CREATE_CONCURRENCY  # bounded
    assert stored_indices(scope) == list(range(slices))  # every answer in the store


def test_a_refused_first_create_sends_no_other() -> None:
    def refuse(index: int) -> None:
        raise ApiError("POST", "/resourceslices", 422, "Invalid", "no")

    client = MemoryClient(refuse)
    scope = Scope(f"spec.nodeName={NODE}")
    with pytest.raises(RejectedSliceError) as caught:
        publisher(client, scope).execute(new_pool(5), None)
    assert client.created == [0] and caught.value.index == 0


def test_a_failed_later_create_raises_its_error_and_keeps_every_answer() -> None:
    # Slice 2 fails while 1 and 3 are in flight with it (the barrier holds all three
    # until each has been sent); 4 is not sent at all, or is sent and answered.
    barrier = threading.Barrier(3, timeout=GUARD_S)

    def on_create(index: int) -> None:
        if index in (1, 2, 3):
            barrier.wait()
        if index == 2:
            raise ApiError("POST", "/resourceslices", 500, "InternalError", "etcd")

    client = MemoryClient(on_create)
    scope = Scope(f"spec.nodeName={NODE}")
    with pytest.raises(ApiError) as caught:
        publisher(client, scope).execute(new_pool(5), None)
    assert caught.value.status == 500
    answered = [i for i in client.created if i != 2]
    assert {0, 1, 3} <= set(answered) and stored_indices(scope) == sorted(answered)
    assert sorted(client.created) == sorted(set(client.created))  # nothing sent twice
