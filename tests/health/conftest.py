"""Fixtures for the health tests: simulated nodes, a recording sink, a fake clock."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.health.model import Condition
from discovery.model import Inventory
from discovery.scan import discover
from discovery.simulate import FakeNvml, scratch_dir, simulated_sources
from discovery.sources import Sources


class Node:
    """A simulated node: its sources, the inventory discovery found, file flippers."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self.inventory = discover(sources)
        self.sys = sources.sysfs_root

    @property
    def nvml(self) -> FakeNvml:
        assert isinstance(self.sources.gpu, FakeNvml)
        return self.sources.gpu

    def device(self, name: str) -> Any:
        return self.inventory.by_name()[name]

    def provider(self) -> Callable[[], Inventory]:
        return lambda: self.inventory

    def set_carrier(self, if_name: str, up: bool) -> None:
        """The link goes down or up as the kernel shows it: each file replaced whole (a
        reader never sees one half-written, as write_text's truncate would let it), and the
        one the probe decides on (carrier) written after operstate when going down."""
        base = self.sys / "class/net" / if_name
        order = [("carrier", "1"), ("operstate", "up")] if up else [
            ("operstate", "down"), ("carrier", "0")]
        for name, value in order:
            tmp = base / f".{name}.new"
            tmp.write_text(value + "\n")
            os.replace(tmp, base / name)

    def set_port(self, rdma: str, state: str, port: int = 1) -> None:
        (self.sys / "class/infiniband" / rdma / "ports" / str(port) / "state").write_text(state)

    def remove_function(self, bdf: str) -> None:
        (self.sys / "bus/pci/devices" / bdf).unlink()


@pytest.fixture
def node_factory() -> Iterator[Callable[[str], Node]]:
    with scratch_dir() as tmp:
        count = 0

        def make(profile: str) -> Node:
            nonlocal count
            count += 1
            return Node(simulated_sources(profile, Path(tmp) / f"{profile}-{count}"))

        yield make


@pytest.fixture
def h100(node_factory: Callable[[str], Node]) -> Node:
    return node_factory("dgx-h100")


@pytest.fixture
def a100(node_factory: Callable[[str], Node]) -> Node:
    return node_factory("dgx-a100-mig")


@pytest.fixture
def sriov(node_factory: Callable[[str], Node]) -> Node:
    return node_factory("sriov-nic")


class RecordingSink:
    """A HealthSink that remembers what the GPU watcher told it."""

    def __init__(self) -> None:
        self.events: list[tuple[tuple[str, ...], str, Condition]] = []
        self.wakes = 0
        self.counts: dict[str, int] = {}

    def event(self, devices: Sequence[str], source: str, condition: Condition) -> None:
        self.events.append((tuple(devices), source, condition))

    def wake(self) -> None:
        self.wakes += 1

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
