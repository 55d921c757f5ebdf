"""Why a device was not picked for a request: one reason per device, the first one found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.explain.records import record

# Reason codes, in the order the checks run for the report.
SELECTOR = "selector"  # a class or request selector is false
SELECTOR_ERROR = "selector-error"  # a selector failed at runtime (the scheduler gives up)
NODE = "node"  # per-device node selection excludes this node
ALLOCATED = "allocated"  # held by another claim
CAPACITY = "capacity"  # not enough (consumable) capacity left, or not defined
COUNTERS = "counters"  # shared counters exhausted
TAINT = "taint"  # a NoSchedule/NoExecute taint the request does not tolerate
IN_CLAIM = "in-claim"  # already picked for another request of this claim
CONSTRAINT = "constraint"  # matchAttribute/distinctAttribute conflict with a chosen device
NOT_REACHED = "not-reached"  # the search never needed it (another alternative was chosen)


@record
class Reason:
    code: str
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.detail:
            out["detail"] = dict(self.detail)
        return out


@record
class DeviceVerdict:
    driver: str
    pool: str
    device: str
    chosen: bool = False
    reason: Reason | None = None  # None: a candidate (chosen or not needed)
    where: str = ""  # e.g. the PCIe root, to locate the device for the operator

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"driver": self.driver, "pool": self.pool, "device": self.device,
                               "chosen": self.chosen}
        if self.where:
            out["location"] = self.where
        if self.reason is not None:
            out["reason"] = self.reason.to_dict()
        return out


@dataclass(frozen=True, slots=True)
class RequestReport:
    request: str  # "gpu", or "gpu/h100" for a firstAvailable alternative
    device_class: str
    mode: str
    needed: int
    chosen: tuple[str, ...]
    devices: tuple[DeviceVerdict, ...]
    status: str  # "allocated", "unsatisfied", "skipped" (an earlier alternative won)

    @property
    def candidates(self) -> int:
        return sum(1 for d in self.devices if d.reason is None)

    @property
    def usable(self) -> int:
        """Devices this request could take if it were alone in the claim."""
        return sum(1 for d in self.devices
                   if d.reason is None or d.reason.code in (CONSTRAINT, IN_CLAIM))

    @property
    def matching(self) -> int:
        """Devices that pass the selectors (whatever else stops them)."""
        return sum(1 for d in self.devices
                   if d.reason is None or d.reason.code not in (SELECTOR, SELECTOR_ERROR, NODE))

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request, "deviceClassName": self.device_class,
                "allocationMode": self.mode, "needed": self.needed, "status": self.status,
                "candidates": self.candidates, "matching": self.matching,
                "chosen": list(self.chosen), "devices": [d.to_dict() for d in self.devices]}
