"""What the search walks and what it picks: every device of a usable pool at its place in
search order (``Entry``), each request alternative with its compiled selectors (``ReqData``),
and one device chosen for a request (``Result``); and how ``explain()`` builds the first two."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from agent.explain.cel_env import CelEnv, CompiledSelector
from agent.explain.devices import Device
from agent.explain.docs import InputError
from agent.explain.features import Features
from agent.explain.model import Claim, DeviceClass, DeviceID, Request
from agent.explain.pools import PoolView


@dataclass(slots=True)
class Entry:
    """A device of a usable pool, at its place in search order."""

    index: int
    device: Device
    did: DeviceID  # ``device.id``, built once: the search and the verdicts look it up often
    pool: PoolView
    slice_node_name: str
    slice_node_selector: Any
    per_device: bool
    #: Consumes counters while DRAPartitionableDevices is off: selectable, so it counts for an
    #: ``All`` request, but never allocated (upstream's allocateDevice refuses it).
    counters_off: bool = False


@dataclass(slots=True)
class ReqData:
    key: tuple[int, int]  # (request index, alternative index)
    req: Request
    cls: DeviceClass
    class_selectors: list[CompiledSelector]
    selectors: list[CompiledSelector]
    num: int = 0
    all_devices: list[Entry] | None = None


@dataclass(slots=True)
class Result:
    req: Request
    entry: Entry
    share_id: str | None = None
    consumed: dict[str, Fraction] | None = None


def search_order(pools: Sequence[PoolView], features: Features) -> list[Entry]:
    """The devices of the usable pools in search order, as the gates make them."""
    out: list[Entry] = []
    for pool in pools:
        if not pool.usable:
            continue
        for s in pool.slices:
            for published in s.devices:
                # Devices the allocator never selects with a gate off (isSelectable) are left
                # out; fields it ignores are cleared. One that consumes counters with
                # DRAPartitionableDevices off stays selectable (an All request counts it) but
                # is never allocated (allocateDevice refuses it).
                d = published
                counters_off = bool(d.consumes) and not features.partitionable_devices
                if d.binding_conditions and not features.binding_and_status:
                    continue
                if d.taints and not features.device_taints:
                    d = replace(d, taints=())
                if d.allow_multiple and not features.consumable_capacity:
                    d = replace(d, allow_multiple=False)
                out.append(Entry(len(out), d, (d.driver, d.pool, d.name), pool, s.node_name,
                                 s.node_selector, s.per_device, counters_off))
    return out


def request_data(claim: Claim, classes: Mapping[str, DeviceClass], env: CelEnv
                 ) -> dict[tuple[int, int], ReqData]:
    """Each (request, alternative) with its class and its selectors compiled."""
    data = {}
    for ri, creq in enumerate(claim.requests):
        for si, req in enumerate(creq.alternatives):
            cls = classes.get(req.device_class)
            if cls is None:
                known = ", ".join(sorted(classes)) or "none given"
                raise InputError(req.where, f"request {req.name}: DeviceClass "
                                 f"{req.device_class!r} not found (known: {known}; add --class)")
            data[(ri, si)] = ReqData(
                (ri, si), req, cls, [env.compile(s) for s in cls.selectors],
                [env.compile(s) for s in req.selectors], num=req.count)
    return data

