"""The health vocabulary: condition kinds, conditions, device health and the change feed."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What is wrong; each kind is one taint key ``<driver>/<kind>``."""

    XID = "xid"
    ECC = "ecc"
    GPU_LOST = "gpu-lost"
    LINK_DOWN = "link-down"
    UNMONITORED = "unmonitored"


#: Order of kinds in messages and taint lists: the most telling first.
KIND_ORDER: dict[Kind, int] = {k: i for i, k in enumerate(
    (Kind.GPU_LOST, Kind.XID, Kind.ECC, Kind.LINK_DOWN, Kind.UNMONITORED)
)}


class HealthState(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    #: No signal source works for the device: we cannot say it is healthy.
    UNMONITORED = "unmonitored"


@dataclass(frozen=True, slots=True)
class Condition:
    """One reason a device is not healthy. ``value`` becomes the taint value, so it must be a
    label value (``79``, ``carrier``, ``rdma-port-1``); ``message`` is for people."""

    kind: Kind
    value: str
    message: str


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """The published health of one device.

    ``conditions`` holds every condition still in force: active ones and cleared ones whose
    quiet period has not passed yet (``recovering`` is then true). Equal values mean nothing
    to publish, so this type carries no timestamps.
    """

    device: str
    state: HealthState = HealthState.HEALTHY
    conditions: tuple[Condition, ...] = ()
    recovering: bool = False

    @property
    def healthy(self) -> bool:
        return self.state is HealthState.HEALTHY

    @property
    def message(self) -> str:
        if not self.conditions:
            return ""
        text = "; ".join(c.message for c in self.conditions)
        if self.recovering:
            text += " (cleared; healthy again after the quiet period)"
        return text


class ChangeFeed:
    """A version counter that waiters can block on: readers of the health state (the kubelet
    stream) wait for "anything newer than what I sent" without polling."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._closed = False

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def bump(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiter without a new version (a stream was cancelled)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the version differs from ``seen``, the feed closes, a wake, or timeout."""
        with self._cond:
            if self._version == seen and not self._closed:
                self._cond.wait(timeout)
            return self._version
