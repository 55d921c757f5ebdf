"""The desired state as the worker keeps it: pools, their fingerprints and what was learned.

``update()`` hands over a DriverResources; it becomes one ``PoolState`` per pool. The worker
fills in the rest lazily (validation, fingerprints) the first time it syncs the pool, so
``update()`` stays cheap for the caller even with thousands of devices.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from agent.slices.owner import Owner
from agent.slices.sync import DesiredPool, SliceContent
from agent.slices.validate import Problem, validate_pool
from discovery.model import DriverResources, Pool


def fingerprint(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class PoolState:
    """One desired pool plus what the worker computed about it.

    The state is replaced, never edited, on update: what is computed from it is computed
    once. The fingerprints only serve the rarer paths (a pool refused or invalid, fields the
    server dropped), so they are computed when first asked for, not on every publish: for
    2,048 devices they cost as much as validating them.
    """

    pool: DesiredPool
    model: Pool
    checked: bool = False
    problems: list[Problem] = field(default_factory=list)
    _slice_fingerprints: tuple[str, ...] | None = field(default=None, repr=False)
    _fingerprint: str | None = field(default=None, repr=False)

    def check(self, driver: str) -> list[Problem]:
        """Validate once."""
        if not self.checked:
            self.problems = validate_pool(driver, self.pool.name, self.model)
            if not self.pool.has_node_selection:
                self.problems.append(Problem(
                    self.pool.name, None, "spec",
                    "no node selection: without a Node owner the pool needs a node_selector "
                    "or all_nodes (allNodes is never implied)",
                ))
            self.checked = True
        return self.problems

    @property
    def slice_fingerprints(self) -> tuple[str, ...]:
        """One fingerprint per desired slice: its devices and counter sets."""
        if self._slice_fingerprints is None:
            self._slice_fingerprints = tuple(
                fingerprint([s.devices, s.shared_counters]) for s in self.pool.slices
            )
        return self._slice_fingerprints

    @property
    def fingerprint(self) -> str:
        """The whole pool's content: node selection, generation floor and every slice."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(
                [self.pool.node_selector, self.pool.all_nodes, self.pool.generation,
                 list(self.slice_fingerprints)]
            )
        return self._fingerprint


AcceptedContent = dict[tuple[str, int, str], SliceContent]


def effective(state: PoolState, accepted: AcceptedContent) -> DesiredPool:
    """The desired pool, with the server's accepted form of slices whose fields it dropped.

    Comparing against what the server can store (instead of what we asked for) is what keeps
    a disabled feature gate from causing an endless update loop.
    """
    if not any(key[0] == state.pool.name for key in accepted):
        return state.pool  # nothing was ever dropped from this pool: the common case
    slices = list(state.pool.slices)
    for index, fp in enumerate(state.slice_fingerprints):
        content = accepted.get((state.pool.name, index, fp))
        if content is not None:
            slices[index] = content
    pool = state.pool
    return DesiredPool(pool.name, tuple(slices), pool.node_name, pool.node_selector,
                       pool.generation, pool.all_nodes)


def to_desired(resources: DriverResources | None, owner: Owner | None) -> dict[str, PoolState]:
    """One PoolState per pool; node-local pools get the owner node's name."""
    out: dict[str, PoolState] = {}
    if resources is None:
        return out
    node_name = owner.name if owner is not None and owner.is_node else None
    for name, pool in resources.pools.items():
        desired = DesiredPool(
            name=name,
            slices=tuple(SliceContent(s.devices, s.shared_counters) for s in pool.slices),
            node_name=node_name if pool.node_selector is None and not pool.all_nodes else None,
            node_selector=pool.node_selector,
            all_nodes=pool.all_nodes,
            generation=pool.generation,
        )
        out[name] = PoolState(desired, pool)
    return out
