"""A ResourceClaim as a node plugin needs it: the reference the kubelet sends (``ClaimRef``),
the allocated devices and opaque configs (``Claim``, ``AllocatedDevice``, ``OpaqueConfig``),
and the per-claim errors, each with a short reason label for metrics.

``agent.claim.parse`` reads these from the API server's claim dict; ``agent.claim.identity``
says which claim UIDs and names this node accepts; ``agent.claim.writable`` what can be
written to the checkpoint or a CDI spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ClaimError(Exception):
    """A per-claim failure; ``reason`` is a short label for metrics."""

    reason = "invalid"

    def __init__(self, claim: str, message: str) -> None:
        super().__init__(f"claim {claim}: {message}")
        self.claim = claim
        self.message = message


class ClaimNotFoundError(ClaimError):
    reason = "not_found"


class ClaimReplacedError(ClaimError):
    reason = "replaced"


class ClaimNotAllocatedError(ClaimError):
    reason = "not_allocated"


class ClaimFetchError(ClaimError):
    reason = "fetch"


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends for one claim."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry."""

    request: str  # "<request>" or "<request>/<subrequest>"
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    #: ``consumedCapacity`` of a share (name -> quantity), sorted by name; empty otherwise.
    consumed: tuple[tuple[str, str], ...] = ()

    @property
    def consumed_capacity(self) -> dict[str, str]:
        return dict(self.consumed)

    @property
    def base_request(self) -> str:
        """The request name containers reference: everything before the first ``/``."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """One ``status.allocation.devices.config[]`` entry with opaque parameters."""

    source: str  # "FromClass" or "FromClaim"
    requests: tuple[str, ...]  # empty: applies to every request
    driver: str
    parameters: Any

    def applies_to(self, result: AllocatedDevice) -> bool:
        if not self.requests:
            return True
        return result.request in self.requests or result.base_request in self.requests


#: Set by the resource claim controller on a claim it made from a template: the pod's entry
#: (``pod.spec.resourceClaims[].name``) the claim was generated for.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


@dataclass(frozen=True, slots=True)
class Claim:
    ref: ClaimRef
    allocated: bool
    results: tuple[AllocatedDevice, ...] = ()
    configs: tuple[OpaqueConfig, ...] = ()
    #: The ``POD_CLAIM_NAME_ANNOTATION`` value; None when the claim has none.
    pod_claim_name: str | None = None

    def results_for(self, driver: str) -> tuple[AllocatedDevice, ...]:
        return tuple(r for r in self.results if r.driver == driver)

    def configs_for(self, driver: str, result: AllocatedDevice) -> list[OpaqueConfig]:
        """Configs of ``driver`` that apply to ``result``, lowest precedence first.

        Class configs come before claim configs (the claim author overrides the admin's
        defaults); within a source, later entries win, so callers merge in list order.
        """
        mine = [c for c in self.configs if c.driver == driver and c.applies_to(result)]
        return [c for c in mine if c.source == "FromClass"] + [
            c for c in mine if c.source != "FromClass"
        ]
