"""What ``explain`` returns: the verdict, the would-be allocation and the per-request story."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.explain.reasons import RequestReport


@dataclass(frozen=True, slots=True)
class PoolReport:
    driver: str
    pool: str
    generation: int
    devices: int
    status: str  # "ok", "incomplete", "invalid"
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool,
                               "generation": self.generation, "devices": self.devices,
                               "status": self.status}
        if self.message:
            out["message"] = self.message
        return out


@dataclass(frozen=True, slots=True)
class ExplainResult:
    fits: bool
    claim: str  # namespace/name
    node: str
    allocation: dict[str, Any] | None  # a v1 ResourceClaim status.allocation
    requests: tuple[RequestReport, ...]
    pools: tuple[PoolReport, ...] = ()
    suggestion: str | None = None
    error: str | None = None  # the scheduler would fail with this error (not just "no fit")
    stats: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"claim": self.claim, "node": self.node, "fits": self.fits}
        if self.allocation is not None:
            out["allocation"] = self.allocation
        if self.error:
            out["error"] = self.error
        if self.suggestion:
            out["suggestion"] = self.suggestion
        out["requests"] = [r.to_dict() for r in self.requests]
        out["pools"] = [p.to_dict() for p in self.pools]
        out["stats"] = dict(self.stats)
        return out


@dataclass(frozen=True, slots=True)
class PodExplainResult:
    """All claims of one pod, allocated together: they fit only all at once."""

    fits: bool
    node: str
    claims: tuple[ExplainResult, ...]
    error: str | None = None  # the first claim's error that stops the whole pod

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "fits": self.fits}
        if self.error:
            out["error"] = self.error
        out["claims"] = [c.to_dict() for c in self.claims]
        return out
