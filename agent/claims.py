"""ResourceClaim dicts (as the API server returns them) -> the few facts a node plugin needs.

The claim is read as a plain dict (any of resource.k8s.io v1, v1beta2, v1beta1: the parts read
here, ``metadata`` and ``status.allocation``, have the same shape in all three). Each problem is
a ``ClaimError`` naming the claim and the JSON path, so the kubelet's event tells the operator
what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True, slots=True)
class Claim:
    ref: ClaimRef
    allocated: bool
    results: tuple[AllocatedDevice, ...] = ()
    configs: tuple[OpaqueConfig, ...] = ()

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


def parse_claim(obj: Mapping[str, Any], expected: ClaimRef | None = None) -> Claim:
    """Decode a ResourceClaim dict; with ``expected``, check that it is the claim asked for."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ClaimError(str(expected or "?"), "object has no metadata")
    ref = ClaimRef(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
    )
    if expected is not None and ref.uid != expected.uid:
        raise ClaimReplacedError(
            str(expected),
            f"the API server has a different claim under this name (uid {ref.uid}); "
            "the claim was deleted and re-created, so the pod must be re-created too",
        )
    label = str(expected or ref)
    status = obj.get("status") or {}
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not allocation:
        return Claim(ref=ref, allocated=False)
    devices = _get_mapping(allocation, "devices", label, "status.allocation") or {}
    results = tuple(
        _parse_result(r, label, i) for i, r in enumerate(_get_list(devices, "results", label))
    )
    configs = tuple(
        _parse_config(c, label, i) for i, c in enumerate(_get_list(devices, "config", label))
    )
    return Claim(ref=ref, allocated=True, results=results, configs=configs)


def _parse_result(item: Any, label: str, index: int) -> AllocatedDevice:
    path = f"status.allocation.devices.results[{index}]"
    if not isinstance(item, Mapping):
        raise ClaimError(label, f"{path} is not an object")
    fields = {}
    for key in ("request", "driver", "pool", "device"):
        value = item.get(key)
        if not isinstance(value, str) or not value:
            raise ClaimError(label, f"{path}.{key} is missing or not a string")
        fields[key] = value
    share = item.get("shareID")
    if share is not None and not isinstance(share, str):
        raise ClaimError(label, f"{path}.shareID is not a string")
    return AllocatedDevice(
        request=fields["request"],
        driver=fields["driver"],
        pool=fields["pool"],
        device=fields["device"],
        admin_access=item.get("adminAccess") is True,
        share_id=share or None,
    )


def _parse_config(item: Any, label: str, index: int) -> OpaqueConfig:
    path = f"status.allocation.devices.config[{index}]"
    if not isinstance(item, Mapping):
        raise ClaimError(label, f"{path} is not an object")
    opaque = item.get("opaque")
    if not isinstance(opaque, Mapping):
        raise ClaimError(label, f"{path} has no opaque configuration (the only kind supported)")
    driver = opaque.get("driver")
    if not isinstance(driver, str):
        raise ClaimError(label, f"{path}.opaque.driver is missing")
    requests = item.get("requests") or []
    if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
        raise ClaimError(label, f"{path}.requests must be a list of request names")
    return OpaqueConfig(
        source=str(item.get("source", "FromClaim")),
        requests=tuple(requests),
        driver=driver,
        parameters=opaque.get("parameters"),
    )


def _get_mapping(obj: Mapping[str, Any], key: str, label: str, where: str) -> Any:
    value = obj.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise ClaimError(label, f"{where}.{key} is not an object")
    return value


def _get_list(obj: Mapping[str, Any], key: str, label: str) -> list[Any]:
    value = obj.get(key) or []
    if not isinstance(value, list):
        raise ClaimError(label, f"status.allocation.devices.{key} is not a list")
    return value
