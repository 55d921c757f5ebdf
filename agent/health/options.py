"""``HealthOptions``: what counts as a fault, how long recovery takes, what a taint does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agent.health.model import Kind
from agent.health.xids import DEFAULT_IGNORED_XIDS

#: Effects the resource.k8s.io API accepts for a device taint.
TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")

#: Faults keep new claims off the device (NoSchedule). Evicting running pods (NoExecute) is
#: the operator's decision, never ours by default. ``unmonitored`` is informational ("None"):
#: a monitoring failure must not take a healthy GPU out of service.
DEFAULT_EFFECTS: Mapping[Kind, str | None] = MappingProxyType({
    Kind.XID: "NoSchedule",
    Kind.ECC: "NoSchedule",
    Kind.GPU_LOST: "NoSchedule",
    Kind.LINK_DOWN: "NoSchedule",
    Kind.UNMONITORED: "None",
})


class HealthConfigError(ValueError):
    """A health option that cannot be used; the message names the option and the value."""


@dataclass(frozen=True, slots=True)
class HealthOptions:
    """Knobs of device health monitoring.

    ``effects`` maps a condition kind to its taint effect; ``None`` (the Python value) means
    "report it on the kubelet stream but publish no taint". ``quiet_period_s``: a device is
    healthy again once its signal stayed clear this long. ``min_publish_interval_s``: at most
    one published change per device per interval; the latest state is always published at
    the end of the window, so a flapping link costs a bounded number of API writes.
    """

    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    quiet_period_s: float = 60.0
    min_publish_interval_s: float = 5.0
    effects: Mapping[Kind, str | None] = field(default_factory=lambda: dict(DEFAULT_EFFECTS))
    #: sysfs link-state poll period (udev events only wake it earlier).
    nic_poll_s: float = 0.5
    #: The poll period instead while rtnetlink link messages wake it (the host's own sysfs):
    #: a carrier or operstate change is then read at once, and the poll is only the backstop
    #: for a lost message and for RDMA port states no netdev reflects. 0.5 s was 90 sysfs
    #: reads a second on an idle node of 12 NICs.
    nic_backstop_s: float = 5.0
    #: How long one NVML event wait blocks; bounds how fast stop() is noticed.
    gpu_wait_ms: int = 500
    #: Probe period for GPUs without events (polled fallback) and for lost GPUs.
    gpu_poll_s: float = 5.0
    #: Retry period when NVML cannot be initialised at all.
    gpu_retry_s: float = 30.0
    #: Wake the link poll on rtnetlink link messages (host sysfs only).
    link_events: bool = True

    def __post_init__(self) -> None:
        for kind, effect in self.effects.items():
            if Kind(kind) not in DEFAULT_EFFECTS:
                raise HealthConfigError(f"unknown health condition {kind!r}")
            if effect is not None and effect not in TAINT_EFFECTS:
                raise HealthConfigError(
                    f"taint effect {effect!r} for {kind} is not one of {', '.join(TAINT_EFFECTS)}"
                )
        for name in ("quiet_period_s", "min_publish_interval_s", "nic_poll_s", "nic_backstop_s",
                     "gpu_poll_s", "gpu_retry_s"):
            if getattr(self, name) < 0:
                raise HealthConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if (self.nic_poll_s == 0 or self.nic_backstop_s == 0 or self.gpu_poll_s == 0
                or self.gpu_wait_ms <= 0):
            raise HealthConfigError("poll periods and the NVML wait must be positive")

    def effect(self, kind: Kind) -> str | None:
        if kind in self.effects:
            return self.effects[kind]
        return DEFAULT_EFFECTS[kind]


def parse_xids(text: str | Iterable[str]) -> frozenset[int]:
    """``"13,31, 43"`` -> {13, 31, 43}. Unlike NVIDIA's flag, a bad entry is an error: a
    silently dropped Xid would taint GPUs the operator meant to keep in service."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    out: set[int] = set()
    for raw in parts:
        item = raw.strip()
        if not item:
            continue
        try:
            xid = int(item, 10)
        except ValueError:
            raise HealthConfigError(f"ignored Xid {item!r} is not a number") from None
        if xid <= 0:
            raise HealthConfigError(f"ignored Xid {xid} must be positive")
        out.add(xid)
    return frozenset(out)


def parse_effects(text: str) -> dict[Kind, str | None]:
    """``"xid=NoExecute,unmonitored=off"`` -> overrides on top of the defaults. ``off``
    disables the taint for that kind (the kubelet stream still reports it)."""
    out: dict[Kind, str | None] = dict(DEFAULT_EFFECTS)
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, effect = item.partition("=")
        if not sep:
            raise HealthConfigError(f"taint effect {item!r} is not KIND=EFFECT")
        try:
            kind = Kind(name.strip())
        except ValueError:
            known = ", ".join(k.value for k in Kind)
            raise HealthConfigError(f"unknown health condition {name!r}; known: {known}") from None
        value = effect.strip()
        if value.lower() == "off":
            out[kind] = None
        elif value in TAINT_EFFECTS:
            out[kind] = value
        else:
            raise HealthConfigError(
                f"taint effect {value!r} for {kind} is not one of {', '.join(TAINT_EFFECTS)}, off"
            )
    return out
